"""`llama-grid`: any transformers decoder-only causal LM whose image tokens are one contiguous id range.

The folder holds the transformers files plus `ssd_model.json` (keys documented in the README). A prompt is
a class id (or a class name from `class_names`); the unconditional stream is the null class token.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..errors import SSDError
from ..session import Layout, Prompt
from .base import GridModel, head_rows_logits

REQUIRED_KEYS = ("family", "grid", "image_token_start", "image_vocab_size", "row_end_token",
                 "num_classes", "class_token_start", "null_class_token")


def read_spec(folder: Path) -> dict:
    path = folder / "ssd_model.json"
    if not path.is_file():
        raise SSDError(f"{folder} has no ssd_model.json: a llama-grid model needs one beside config.json "
                       "(see the README, section 'ssd_model.json')")
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SSDError(f"{path} is not valid JSON: {err}") from None
    missing = [k for k in REQUIRED_KEYS if k not in spec]
    if missing:
        raise SSDError(f"{path} lacks the keys {missing}; see the README, section 'ssd_model.json'")
    if spec["family"] != "llama-grid":
        raise SSDError(f"{path} names family {spec['family']!r}, expected 'llama-grid'")
    return spec


class LlamaGridModel(GridModel):
    family = "llama-grid"

    def __init__(self, model: torch.nn.Module, spec: dict, folder: Path | None = None):
        super().__init__(model)
        self.spec = spec
        self.folder = folder
        self.hidden_size = int(model.config.hidden_size)
        self.image_token_start = int(spec["image_token_start"])
        self.image_vocab_size = int(spec["image_vocab_size"])
        self.row_end_token = spec["row_end_token"]
        self.default_grid = (int(spec["grid"][0]), int(spec["grid"][1]))
        self.class_names = spec.get("class_names")
        self.defaults = {"cfg": float(spec.get("default_cfg", 3.0)),
                         "temperature": float(spec.get("default_temperature", 1.0)),
                         "top_k": int(spec.get("default_top_k", 0)),
                         "top_p": float(spec.get("default_top_p", 1.0))}
        vocab = model.get_input_embeddings().num_embeddings
        last = max(self.image_token_start + self.image_vocab_size, int(spec["null_class_token"]) + 1)
        if last > vocab:
            raise SSDError(f"ssd_model.json uses token ids up to {last - 1} but the model's vocabulary has {vocab}")
        self._vq = None

    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs) -> "LlamaGridModel":
        from transformers import AutoModelForCausalLM

        folder = cls.ensure_folder(folder, download)
        spec = read_spec(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False,
                                                     low_cpu_mem_usage=True, **kwargs)
        return cls(model.to(device) if "device_map" not in kwargs else model, spec, folder)

    def backbone(self):
        return self.model.model

    def final_norm(self):
        return self.model.model.norm

    def head_logits(self, normed):
        rows = slice(self.image_token_start, self.image_token_start + self.image_vocab_size)
        return head_rows_logits(normed, self.model.lm_head, rows)

    def code_to_id(self, codes):
        return codes + self.image_token_start

    def grid_options(self):
        extra = [tuple(g) for g in self.spec.get("grids", [])]
        return [self.default_grid] + [g for g in extra if g != self.default_grid]

    def check_grid(self, grid):
        H, W = tuple(int(v) for v in grid) if grid is not None else self.default_grid
        max_pos = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        length = H * (W + (self.row_end_token is not None)) + 2
        if H < 1 or W < 1 or length > max_pos:
            raise SSDError(f"llama-grid model cannot make a {H}x{W} token grid: it needs {length} positions and "
                           f"the model has {max_pos}; choose a grid of at most {self.default_grid[0]}x"
                           f"{self.default_grid[1]}")
        return (H, W)

    def layout(self, grid=None):
        return Layout.build(self.check_grid(grid), self.row_end_token)

    def class_id(self, prompt) -> int:
        names = self.class_names or [str(i) for i in range(int(self.spec["num_classes"]))]
        return class_index(names, prompt)

    def build_prompt(self, prompt, negative_prompt, cfg, grid):
        cond = int(self.spec["class_token_start"]) + self.class_id(prompt)
        rows = [[cond], [int(self.spec["null_class_token"])]] if cfg else [[cond]]
        ids = torch.tensor(rows, dtype=torch.long)
        return Prompt(ids, torch.ones_like(ids, dtype=torch.bool))

    def decode(self, tokens):
        path = self.spec.get("vq_decoder")
        if not path:
            return None
        if self._vq is None:
            from ..pixel_decoders.reference_vq import load_vq

            full = Path(path) if Path(path).is_absolute() else (self.folder or Path(".")) / path
            self._vq = load_vq(full, device="cpu", dtype=torch.float32)
        with torch.no_grad():
            img = self._vq.decode(tokens.long().cpu()[None])[0]  # [3, H_px, W_px]
        return img.permute(1, 2, 0).clamp(0, 1).float()


def class_index(names: list, prompt) -> int:
    """A class index from an int, a digit string, a class name, or a unique part of one."""
    if isinstance(prompt, int):
        text = str(prompt)
    else:
        text = str(prompt).strip()
    example = f"e.g. '{names[0]}' or 0" if names else "e.g. 0"
    if not text:
        raise SSDError(f"this model draws one of {len(names)} classes: type a class name or index in "
                       f"the prompt ({example}).")
    if re.fullmatch(r"[+-]?\d+", text):
        i = int(text)
        if not 0 <= i < len(names):
            raise SSDError(f"class {i} is out of range: this model has classes 0..{len(names) - 1}.")
        return i
    low = text.lower()
    exact = [i for i, n in enumerate(names) if str(n).lower() == low]
    if exact:
        return exact[0]
    partial = [i for i, n in enumerate(names) if low in str(n).lower()]
    if len(partial) == 1:
        return partial[0]
    if partial:
        which = ", ".join(str(names[i]) for i in partial[:10])
        raise SSDError(f"the prompt '{text}' matches several classes ({which}): type the full name or the index.")
    shown = ", ".join(f"{i}: {n}" for i, n in enumerate(names[:30]))
    more = f" ... ({len(names)} in all)" if len(names) > 30 else ""
    raise SSDError(f"prompt '{text}' is not a class of this model. Type a class name or index: {shown}{more}.")
