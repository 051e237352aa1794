"""The base-model contract every family implements.

A family adapter turns a transformers model into a `GridModel`: it says how a prompt becomes token ids,
how ids are embedded, where the final norm and the image head are, and how a token grid is laid out
(row-end tokens, forced tail tokens). The KV cache, masks, positions and classifier-free guidance as one
batch of 2 live once in ../session.py.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import hub
from ..errors import SSDError
from ..session import Layout, Prompt, Session


def head_rows_logits(normed: torch.Tensor, head: torch.nn.Linear, rows) -> torch.Tensor:
    """Logits of a vocabulary head restricted to its image rows (a slice or an index tensor).

    The head may sit on another device than the features under a device_map.
    """
    weight = head.weight
    rows = rows.to(weight.device) if isinstance(rows, torch.Tensor) else rows
    out = normed.to(weight.device) @ weight[rows].t()
    bias = getattr(head, "bias", None)
    return out + bias[rows] if bias is not None else out


class GridModel:
    """A base AR image model behind one contract. Subclasses set the attributes and override the hooks."""

    # ---- what the family is (class attributes; the registry in __init__.py reads them) ------------
    family: str = "base"
    repo_ids: tuple[str, ...] = ()  # Hugging Face repos in transformers format; the first is the default download
    model_types: tuple[str, ...] = ()  # config.json model_type values of this family (empty: any causal LM)
    architectures: tuple[str, ...] = ()  # config.json architectures that name this family
    extra_files: str = ""  # what a folder needs besides the repo's files
    text_prompts: bool = False
    negative_prompts: bool = False  # the unconditional stream can be a negative prompt
    # ---- per model (set by __init__) --------------------------------------------------------------
    hidden_size: int
    image_vocab_size: int
    default_grid: tuple[int, int]
    class_names: list[str] | None = None
    defaults: dict  # sampler defaults: cfg, temperature, top_k, top_p

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()

    # ---- loading: every family has this one signature ------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs) -> "GridModel":
        """A model folder -> a GridModel. `download` (True = the first of repo_ids, or a repo id) fetches a
        folder without files first; kwargs are the family's options and transformers' loading options."""
        raise NotImplementedError

    @classmethod
    def where_to_get(cls, folder) -> str:
        text = f"download {' or '.join(cls.repo_ids)} from the Hugging Face Hub into {folder}" if cls.repo_ids \
            else f"put the model's files into {folder}"
        return text + (f", and add {cls.extra_files}" if cls.extra_files else "")

    @classmethod
    def check_folder(cls, folder) -> dict:
        """The folder exists, holds a transformers config, and that config is of this family's class."""
        from . import family_of_model_type

        folder = Path(folder)
        if not folder.is_dir():
            raise SSDError(f"{cls.family} model folder {folder} does not exist: {cls.where_to_get(folder)} "
                           "(or load with download=True to fetch it there)")
        cfg = hub.read_config(folder)
        model_type = cfg.get("model_type")
        if cls.model_types and model_type not in cls.model_types:
            other = family_of_model_type(model_type)
            hint = f"; it is a {other} model: load it as family {other!r}" if other else ""
            raise SSDError(f"{folder} holds a {model_type!r} model, not a {cls.family} model "
                           f"(expected model_type {' or '.join(cls.model_types)}){hint}")
        return cfg

    @classmethod
    def ensure_folder(cls, folder, download=None) -> Path:
        """The local folder of this family's model; with `download` (True = the first of repo_ids, or a repo
        id) a folder without config.json is fetched first. Never touches the network otherwise."""
        folder = Path(folder)
        if not (folder / "config.json").is_file() and download:
            if download is True and not cls.repo_ids:
                raise SSDError(f"{cls.family} has no default repo to download: {cls.where_to_get(folder)}")
            repo = cls.repo_ids[0] if download is True else str(download)
            hub.download(repo, folder, cls.extra_files)
        cls.check_folder(folder)
        return folder

    # ---- hooks a family overrides -------------------------------------------------------------
    def backbone(self) -> torch.nn.Module:
        """The decoder stack taking inputs_embeds / attention_mask / position_ids / cache."""
        raise NotImplementedError

    def final_norm(self) -> torch.nn.Module:
        raise NotImplementedError

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of sequence ids [..., n] -> [..., n, d] (image ids and forced ids alike)."""
        return self.model.get_input_embeddings()(ids)

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Final-normed features [..., d] -> logits over the image vocabulary [..., V_img]."""
        raise NotImplementedError

    def code_to_id(self, codes: torch.Tensor) -> torch.Tensor:
        """Image codes (0..V_img-1) -> sequence ids the model reads."""
        raise NotImplementedError

    def layout(self, grid: tuple[int, int] | None = None) -> Layout:
        raise NotImplementedError

    def grid_options(self) -> list[tuple[int, int]]:
        return [self.default_grid]

    def build_prompt(self, prompt, negative_prompt: str, cfg: bool, grid: tuple[int, int]) -> Prompt:
        raise NotImplementedError

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """A grid of image codes [H, W] -> pixels [H_px, W_px, 3] in [0, 1], or None without a decoder."""
        return None

    # ---- shared machinery ---------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where inputs go: the input embeddings' device (the first shard under a device_map)."""
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def to(self, device) -> "GridModel":
        self.model.to(device)
        return self

    def check_grid(self, grid) -> tuple[int, int]:
        grid = tuple(int(v) for v in grid) if grid is not None else tuple(self.default_grid)
        if len(grid) != 2 or min(grid) < 1:
            raise SSDError(f"grid {grid} is not a (rows, columns) pair of positive integers")
        options = self.grid_options()
        if grid not in [tuple(o) for o in options]:
            shown = ", ".join(f"{h}x{w}" for h, w in options[:12]) + (" ..." if len(options) > 12 else "")
            raise SSDError(f"{self.family} model cannot make a {grid[0]}x{grid[1]} token grid; choose one of: {shown}")
        return grid  # type: ignore[return-value]

    def image_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Pre-norm features [..., d] -> float32 logits over the image vocabulary."""
        return self.head_logits(self.final_norm()(features)).float()

    def start(self, prompt: Prompt, images: int = 1) -> Session:
        """The KV-cache session of a prompt (images: how many images its rows carry, for the static cache)."""
        static = getattr(self, "static", None)  # set by static_cache.enable (the loaders' compile option)
        if static is not None:
            from ..static_cache import StaticSession

            return StaticSession(self, prompt, static, images)
        return Session(self, prompt)
