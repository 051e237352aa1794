"""Helpers the family adapters share: special-token ids, prompt rows, pixel un-normalization, default prompts."""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ..errors import SSDError, shown
from ..model_files import read_json_object

# prompts the head trainer samples when it is given none (self-distillation wants thousands: pass a prompt file)
TRAINING_PROMPTS = (
    "a photo of a cat sitting on a windowsill", "a red sports car on a mountain road at sunset",
    "a bowl of fresh fruit on a wooden table", "a lighthouse on a rocky coast in a storm",
    "an astronaut riding a horse, digital art", "a cozy cabin in a snowy forest at night",
    "a portrait of an old fisherman, oil painting", "a city skyline reflected in a river",
    "a field of sunflowers under a blue sky", "a steaming cup of coffee next to a book",
    "a watercolor painting of a hummingbird", "a futuristic robot in a neon-lit alley",
)


LISTED_RATIOS = ((1, 1), (4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16))  # width:height the grid lists offer


def nearest_ratios(grids, ratios=LISTED_RATIOS) -> list[tuple[int, int]]:
    """For each width:height ratio, the grid of `grids` (rows, cols) whose aspect is nearest (the larger on a tie);
    each grid once, in the ratios' order: a short list of a family's many sizes."""
    out = []
    for rw, rh in ratios:
        best = min(grids, key=lambda g: (abs(math.log(g[1] / g[0] * rh / rw)), -g[0] * g[1]))
        if tuple(best) not in out:
            out.append(tuple(best))
    return out


def first_id(*candidates) -> int | None:
    """The first token id given among candidates (None skipped; a list stands for its first id)."""
    for c in candidates:
        if isinstance(c, (list, tuple)):
            c = c[0] if c else None
        if c is not None:
            return int(c)
    return None


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows of different lengths -> (ids [B, P], mask [B, P]) left-padded with `pad_id`."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, P - len(r):] = True
    return ids, mask


def token_id(vocab: dict | None, tokenizer, name: str, fallback: int | None = None) -> int:
    """A special token's id by name: the model's vocabulary map, then its tokenizer, then a known default."""
    if vocab and name in vocab:
        return int(vocab[name])
    if tokenizer is not None:
        tid = tokenizer.convert_tokens_to_ids(name)
        unk = getattr(tokenizer, "unk_token_id", None)
        if isinstance(tid, int) and tid >= 0 and (tid != unk or unk is None):
            return tid
    if fallback is not None:
        return int(fallback)
    raise SSDError(f"the model's vocabulary has no {name!r} token")


def pixel_normalization(folder) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) [3] that map a VQ decoder's output back to [0, 1]: the folder's preprocessor_config.json
    (image_mean / image_std, as the model's image processor un-normalizes), else 0.5 / 0.5 (output in [-1, 1])."""
    mean, std = [0.5] * 3, [0.5] * 3
    name = "preprocessor_config.json"
    if folder is not None and os.path.lexists(Path(folder) / name):
        fix = "fix it (image_mean / image_std: a number or 3 numbers each), or re-download the model"
        cfg = read_json_object(folder, name, fix)
        out = []
        for key, value in (("image_mean", cfg.get("image_mean", mean)), ("image_std", cfg.get("image_std", std))):
            values = [value] * 3 if isinstance(value, (int, float)) else value
            if not (isinstance(values, list) and len(values) == 3 and
                    all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
                    and (key == "image_mean" or min(values) > 0)):
                raise SSDError(f"{Path(folder) / name}: {key} is {shown(value)}; {fix}")
            out.append([float(v) for v in values])
        mean, std = out
    return torch.tensor(mean), torch.tensor(std)


def to_unit_image(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[..., 3] channels-last VQ output -> [0, 1] pixels with the model's un-normalization."""
    mean, std = norm
    return (x.float().cpu() * std + mean).clamp(0, 1)


def token_id_list(prompt) -> list[int] | None:
    """A prompt given as already-tokenized ids (a list / tuple / 1-D tensor of ints) -> list; text -> None."""
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.flatten().tolist()
    if isinstance(prompt, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise SSDError("a prompt given as token ids must be a list of non-negative integers")
        return [int(t) for t in prompt]
    return None
