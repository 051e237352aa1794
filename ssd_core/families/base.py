"""The base-model contract every family implements.

A family adapter turns a transformers model into a `GridModel`: it says how a prompt becomes token ids,
how ids are embedded, where the final norm and the image head are, and how a token grid is laid out
(row-end tokens, forced tail tokens). The KV cache, masks, positions and classifier-free guidance as one
batch of 2 live once in ../session.py.
"""
from __future__ import annotations

import torch

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

    family: str = "base"
    hidden_size: int
    image_vocab_size: int
    default_grid: tuple[int, int]
    class_names: list[str] | None = None
    text_prompts: bool = False
    negative_prompts: bool = False
    defaults: dict  # sampler defaults: cfg, temperature, top_k, top_p

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()

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

    def start(self, prompt: Prompt) -> Session:
        static = getattr(self, "static", None)  # set by static_cache.enable (the loaders' compile option)
        if static is not None:
            from ..static_cache import StaticSession

            return StaticSession(self, prompt, static)
        return Session(self, prompt)
