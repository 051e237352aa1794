"""`llama-grid`: any transformers decoder-only causal LM whose image tokens are one contiguous id range.

The folder holds the transformers files plus `ssd_model.json` (keys documented in docs/models-and-memory.md). A prompt is
a class id (or a class name from `class_names`); the unconditional stream is the null class token.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .. import model_files
from ..errors import SSDError, a_or_an, reason, shown
from ..sampling import SamplerSettings
from ..session import Layout, Prompt
from .base import GridModel

REQUIRED_KEYS = ("family", "grid", "image_token_start", "image_vocab_size", "row_end_token",
                 "num_classes", "class_token_start", "null_class_token")
SEE = model_files.SSD_MODEL_DOC


def read_spec(folder: Path, vocab: int | None = None) -> dict:
    """ssd_model.json, checked key by key (and against a vocabulary size when given) before any weights load."""
    path = folder / model_files.SSD_MODEL_JSON
    spec = model_files.read_ssd_model_json(folder, f"{folder} has no ssd_model.json: a llama-grid model needs one "
                                           f"beside config.json ({SEE})")
    missing = [k for k in REQUIRED_KEYS if k not in spec]
    if missing:
        raise SSDError(f"{path} lacks the keys {missing}; {SEE}")
    if spec["family"] != "llama-grid":
        raise SSDError(f"{path} names family {_short(spec['family'])}, expected 'llama-grid'")
    for key, low in (("image_token_start", 0), ("image_vocab_size", 1), ("num_classes", 1),
                     ("class_token_start", 0), ("null_class_token", 0)):
        _whole(path, key, spec[key], low)
    if spec["row_end_token"] is not None:
        _whole(path, "row_end_token", spec["row_end_token"], 0, "or null (no row-end token)")
    for i, grid in enumerate([spec["grid"]] + _list(path, spec, "grids")):
        key = "grid" if i == 0 else f"grids[{i - 1}]"
        if not (isinstance(grid, list) and len(grid) == 2 and all(_is_whole(v) and v >= 1 for v in grid)):
            raise SSDError(f"{path}: {key} must be [rows, columns] of whole numbers >= 1, got {_short(grid)}; {SEE}")
    names = spec.get("class_names")
    if names is not None and names != [] and not (isinstance(names, list) and len(names) == spec["num_classes"]
                                                  and all(isinstance(n, str) and n.strip() for n in names)):
        raise SSDError(f"{path}: class_names must be a list of num_classes ({spec['num_classes']}) non-empty "
                       f"names, or [] / left out (classes are then named by their index); {SEE}")
    try:
        SamplerSettings(0, spec.get("default_cfg", 3.0), spec.get("default_temperature", 1.0),
                        spec.get("default_top_k", 0), spec.get("default_top_p", 1.0), spec.get("default_min_p", 0.0))
    except SSDError as err:
        raise SSDError(f"{path}: a default_* sampler value is out of range ({err}); {SEE}") from None
    from ..decoders import check_model_defaults  # (the decoders' table imports the engine, which imports families)

    if "decoder_defaults" in spec:
        spec["decoder_defaults"] = check_model_defaults(spec["decoder_defaults"], str(path))
    vq = spec.get("vq_decoder")
    if vq is not None and not isinstance(vq, str):
        raise SSDError(f"{path}: vq_decoder must be a file name inside the model folder or null, got {_short(vq)}")
    if vocab is not None:
        check_token_ids(spec, vocab, path)
    return spec


def check_token_ids(spec: dict, vocab: int, where) -> None:
    """Every token id ssd_model.json names lies inside a vocabulary of `vocab` ids."""
    ranges = [("image_token_start + image_vocab_size", spec["image_token_start"] + spec["image_vocab_size"] - 1),
              ("class_token_start + num_classes", spec["class_token_start"] + spec["num_classes"] - 1),
              ("null_class_token", spec["null_class_token"])]
    if spec["row_end_token"] is not None:
        ranges.append(("row_end_token", spec["row_end_token"]))
    for key, last in ranges:
        if last >= vocab:
            raise SSDError(f"{where}: {key} reaches token id {last} but the model's vocabulary has only {vocab} "
                           f"ids (0..{vocab - 1}); fix {key.split(' ')[0]} or the model's vocab_size")


def _is_whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _whole(path, key: str, value, low: int, extra: str = "") -> None:
    if not _is_whole(value) or value < low:
        raise SSDError(f"{path}: {key} must be a whole number >= {low}{' ' + extra if extra else ''}, "
                       f"got {_short(value)}; {SEE}")


def _list(path, spec: dict, key: str) -> list:
    value = spec.get(key, [])
    if not isinstance(value, list):
        raise SSDError(f"{path}: {key} must be a list, got {_short(value)}; {SEE}")
    return value


_short = shown  # untrusted values in messages: repr-style, cut, no raw control characters


def folder_file(folder: Path, name: str, key: str) -> Path:
    """A file named in ssd_model.json, resolved inside the model folder (symlinks and '..' followed) or refused."""
    full = model_files.inside(folder, name, f"ssd_model.json's {key}", "put the file inside that folder and name it "
                      "relative to it (e.g. \"vq.safetensors\")")
    if not full.is_file():
        raise SSDError(f"ssd_model.json's {key} {_short(name)} is not a file in the model folder {folder}: "
                       f"add it, or set {key} to null")
    return full


def load_vq_decoder(folder: Path | None, spec: dict):
    """The pixel decoder ssd_model.json names (None when it names none), opened and checked now."""
    name = spec.get("vq_decoder")
    if not name:
        return None
    if folder is None:
        raise SSDError("this llama-grid model names a vq_decoder but no model folder to find it in")
    from ..pixel_decoders.reference_vq import load_vq

    path = folder_file(folder, name, "vq_decoder")
    try:
        vq = load_vq(str(path), device="cpu", dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 -- safetensors and the VQ loader raise several types
        raise SSDError(f"the vq_decoder {path.name} in {folder} is not a readable reference VQ file ({reason(err)}); "
                       "re-download the model, or set vq_decoder to null for tokens only") from None
    codes = int(vq.config.get("codebook_size", 0))
    if codes < spec["image_vocab_size"]:
        raise SSDError(f"the vq_decoder {path.name} in {folder} has {codes} codes but ssd_model.json's "
                       f"image_vocab_size is {spec['image_vocab_size']} (one code per image token): use the VQ "
                       "decoder the model was trained with")
    return vq


class LlamaGridModel(GridModel):
    family = "llama-grid"
    # the reference VQ decoder's 4 px a token; the grid list offers each bundled model's own sizes (nodes/grids.py),
    # a folder of this family lists none (its ssd_model.json names its sizes)
    pixels_per_token = 4

    def __init__(self, model: torch.nn.Module, spec: dict, folder: Path | None = None, vq=None):
        super().__init__(model)
        self.spec = spec
        self.folder = folder
        self.hidden_size = int(model.config.hidden_size)
        self.image_token_start = int(spec["image_token_start"])
        self.image_vocab_size = int(spec["image_vocab_size"])
        self.row_end_token = spec["row_end_token"]
        self.default_grid = (int(spec["grid"][0]), int(spec["grid"][1]))
        # the ids first: num_classes is then bounded by the vocabulary before range(num_classes) below
        check_token_ids(spec, model.get_input_embeddings().num_embeddings, "ssd_model.json")
        # class names: the file's, or the indices as text when it gives none ([] too)
        self.class_names = list(spec.get("class_names") or [str(i) for i in range(int(spec["num_classes"]))])
        self.defaults = {"cfg": float(spec.get("default_cfg", 3.0)),
                         "temperature": float(spec.get("default_temperature", 1.0)),
                         "top_k": int(spec.get("default_top_k", 0)),
                         "top_p": float(spec.get("default_top_p", 1.0)),
                         "min_p": float(spec.get("default_min_p", 0.0))}
        # its own decoder parameter defaults, e.g. ssd's verify rounds at a larger grid (read_spec checked them)
        self.decoder_defaults = spec.get("decoder_defaults") or {}
        for grid in self.grid_options():
            self._fits(grid, "set a smaller grid in ssd_model.json, or a larger max_position_embeddings in config.json")
        self._vq = vq if vq is not None else load_vq_decoder(folder, spec)

    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs) -> "LlamaGridModel":
        from transformers import AutoModelForCausalLM

        folder = cls.ensure_folder(folder, download)
        vocab = model_files.read_config(folder).get("vocab_size")  # ids are checked against it before the weights load
        spec = read_spec(folder, vocab if _is_whole(vocab) else None)
        vq = load_vq_decoder(folder, spec)
        # every file inside the folder, safetensors of float tensors only, no tensor missing (model_files.from_pretrained)
        model = model_files.from_pretrained(AutoModelForCausalLM, folder, dtype=dtype, trust_remote_code=False,
                                    low_cpu_mem_usage=True, **kwargs)
        return cls(model.to(device) if "device_map" not in kwargs else model, spec, folder, vq)

    def backbone(self):
        return self.model.model

    def final_norm(self):
        return self.model.model.norm

    def head_logits(self, normed):
        rows = slice(self.image_token_start, self.image_token_start + self.image_vocab_size)
        return self.rows_logits(normed, self.model.lm_head, rows)

    def code_to_id(self, codes):
        return codes + self.image_token_start

    def grid_options(self):
        extra = [tuple(g) for g in self.spec.get("grids", [])]
        return [self.default_grid] + [g for g in extra if g != self.default_grid]

    def check_grid(self, grid):
        grid = tuple(int(v) for v in grid) if grid is not None else self.default_grid
        return self._fits(grid, f"choose a grid of at most {self.default_grid[0]}x{self.default_grid[1]}")

    def _fits(self, grid, fix: str) -> tuple[int, int]:
        """A (rows, columns) grid whose sequence fits the model's positions, else an SSDError ending in `fix`."""
        if len(grid) != 2 or min(grid) < 1:
            raise SSDError(f"grid {grid} is not a (rows, columns) pair of whole numbers >= 1; {fix}")
        H, W = grid
        max_pos = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        length = H * (W + (self.row_end_token is not None)) + 2
        if length > max_pos:
            raise SSDError(f"{self.shown_name} cannot make {a_or_an(f'{H}x{W}')} token grid: it needs {length} "
                           "positions and "
                           f"the model has {max_pos}; {fix}")
        return (H, W)

    def layout(self, grid=None):
        return Layout.build(self.check_grid(grid), self.row_end_token)

    def class_id(self, prompt) -> int:
        return class_index(self.class_names, prompt)

    def build_prompt(self, prompt, negative_prompt, cfg, grid):
        cond = int(self.spec["class_token_start"]) + self.class_id(prompt)
        rows = [[cond], [int(self.spec["null_class_token"])]] if cfg else [[cond]]
        ids = torch.tensor(rows, dtype=torch.long)
        return Prompt(ids, torch.ones_like(ids, dtype=torch.bool))

    def decode(self, tokens):
        if self._vq is None:
            return None
        with torch.no_grad():
            img = self._vq.decode(tokens.long().cpu()[None])[0]  # [3, H_px, W_px]
        return img.permute(1, 2, 0).clamp(0, 1).float()


def class_index(names: list, prompt) -> int:
    """A class index from an int, a digit string, a class name, or a unique part of one."""
    text = str(prompt).strip()
    shown_prompt = _short(text)  # a long or multi-line prompt is echoed cut, on one line
    example = f"e.g. '{names[0]}' or 0" if names else "e.g. 0"
    if not text:
        raise SSDError(f"this model draws one of {len(names)} classes: type a class name or index in "
                       f"the prompt ({example}).")
    if re.fullmatch(r"[+-]?\d+", text):
        i = int(text) if len(text) < 20 else -1
        if not 0 <= i < len(names):
            raise SSDError(f"class {text if len(text) < 20 else shown_prompt} is out of range: this model has "
                           f"classes 0..{len(names) - 1}.")
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
        raise SSDError(f"the prompt {shown_prompt} matches several classes ({which}): type the full name or the index.")
    shown = ", ".join(f"{i}: {n}" for i, n in enumerate(names[:30]))
    more = f" ... ({len(names)} in all)" if len(names) > 30 else ""
    raise SSDError(f"prompt {shown_prompt} is not a class of this model. Type a class name or index: {shown}{more}.")
