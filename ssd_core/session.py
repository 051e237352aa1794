"""One generation's sequence: where image cells and forced tokens sit (Layout), the prompt ids (Prompt), and
the CFG-batched KV-cache Session every family shares (masks, positions, the pre-norm features)."""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """Where image cells and forced tokens sit in the flat sequence that follows the prompt."""

    grid: tuple[int, int]
    forced: torch.Tensor  # [L] long: the forced token id at a slot, -1 at an image cell
    slot_of_cell: torch.Tensor  # [H*W] long: the slot of cell y*W+x

    @property
    def num_slots(self) -> int:
        return int(self.forced.numel())

    @functools.cached_property
    def row_stride(self) -> int:
        H, W = self.grid
        return int(self.slot_of_cell[W]) if H > 1 else W

    @staticmethod
    def build(grid: tuple[int, int], row_end: int | None = None, tail: list[int] | tuple[int, ...] = ()) -> "Layout":
        H, W = grid
        forced: list[int] = []
        slot_of_cell: list[int] = []
        for _ in range(H):
            for _ in range(W):
                slot_of_cell.append(len(forced))
                forced.append(-1)
            if row_end is not None:
                forced.append(int(row_end))
        forced.extend(int(t) for t in tail)
        forced_t = torch.tensor(forced, dtype=torch.long)
        return Layout((H, W), forced_t, torch.tensor(slot_of_cell, dtype=torch.long))


@dataclass
class Prompt:
    """Token ids of the prompt: row 0 conditional, row 1 unconditional when CFG is on (left-padded)."""

    ids: torch.Tensor  # [B, P] long
    mask: torch.Tensor  # [B, P] bool: True at real tokens, False at left padding


def cache_kwarg(module: torch.nn.Module) -> str:
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@contextlib.contextmanager
def capture_input(module: torch.nn.Module):
    """Record the input of `module` (the final norm) during a forward: the pre-norm last-layer features."""
    box: dict[str, torch.Tensor] = {}

    def hook(_mod, args, kwargs):
        box["x"] = args[0] if args else next(iter(kwargs.values()))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield box
    finally:
        handle.remove()


class Session:
    """One generation's KV cache over [prompt ; slots]. Batch row 0 is conditional, row 1 unconditional."""

    def __init__(self, model, prompt: Prompt):
        """model: the GridModel (families/base.py) whose backbone, embeddings and final norm run the steps."""
        from transformers import DynamicCache

        self.m = model
        dev = model.device
        self.prompt_mask = prompt.mask.to(dev)
        self.batch, self.prompt_len = prompt.ids.shape
        self.real_len = self.prompt_mask.long().sum(1)  # [B] real prompt tokens per row
        self.cache = DynamicCache()
        self.cache_kw = cache_kwarg(model.backbone())  # 'cache' in transformers 5, else 'past_key_values'
        self.cached = 0  # image-sequence slots whose keys are in the cache
        pos = (self.prompt_mask.long().cumsum(1) - 1).clamp(min=0)
        feats = self._run(prompt.ids.to(dev), pos, self._mask(self.prompt_len, 0, None, prefill=True))
        self.last_features = feats[:, -1]  # [B, d]: features predicting slot 0

    def _mask(self, n: int, past_slots: int, visible: torch.Tensor | None, prefill: bool = False) -> torch.Tensor:
        """Float additive mask [B, 1, n, keys]: prompt padding, cached slots, causal (and visible) window.

        visible: [n] or [B, n] bool, the window slots other slots may attend to (each slot sees itself)."""
        dev, dtype = self.m.device, self.m.dtype
        P = self.prompt_len
        win = torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None]  # [1 or B, n, n]
        if visible is not None:  # keys of invisible window slots are hidden from every other query
            win = win & (visible.to(dev).view(-1, 1, n) | torch.eye(n, dtype=torch.bool, device=dev))
        if prefill:  # the prompt itself: causal over the prompt's real tokens
            allowed = win & self.prompt_mask[:, None, :]
        else:
            allowed = torch.ones(self.batch, n, P + past_slots + n, dtype=torch.bool, device=dev)
            allowed[:, :, :P] &= self.prompt_mask[:, None, :]
            allowed[:, :, P + past_slots:] = win
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None]

    def _run(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        embeds = self.m.embed(ids)
        with torch.no_grad(), capture_input(self.m.final_norm()) as box:
            self.m.backbone()(inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                              use_cache=True, **{self.cache_kw: self.cache})
        return box["x"]

    def forward(self, slot_ids: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        """Feed slots [cached, cached + n) ([n] for all streams, or [B, n]) -> pre-norm features [B, n, d].

        visible ([n] or [B, n]): window slots the others may attend to; right padding of a batch is invisible."""
        n = slot_ids.shape[-1]
        dev = self.m.device
        ids = slot_ids.to(dev).view(-1, n).expand(self.batch, n)  # one row for every stream, or [B, n]
        pos = self.real_len[:, None] + self.cached + torch.arange(n, device=dev)[None]
        feats = self._run(ids, pos, self._mask(n, self.cached, visible))
        self.cached += n
        return feats

    def crop(self, slots: int) -> None:
        """Keep the prompt and the first `slots` slots in the cache."""
        drop = self.cached - slots
        if drop > 0:
            self.cache.crop(-drop)
            self.cached = slots

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (in this order): the streams of images that are still generating."""
        rows = rows.to(self.m.device)
        self.cache.batch_select_indices(rows)
        self.prompt_mask, self.real_len = self.prompt_mask[rows], self.real_len[rows]
        self.last_features = self.last_features[rows]
        self.batch = int(rows.numel())

    def cache_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        layers = getattr(self.cache, "layers", None)
        if layers is not None:
            return [(layer.keys, layer.values) for layer in layers]
        return list(zip(self.cache.key_cache, self.cache.value_cache))


def stack_prompts(prompts: list[Prompt]) -> Prompt:
    """Several prompts as one batch: all conditional rows first, then all unconditional rows, left-padded."""
    rows = [p.ids[i] for i in range(max(p.ids.shape[0] for p in prompts)) for p in prompts if i < p.ids.shape[0]]
    masks = [p.mask[i] for i in range(max(p.ids.shape[0] for p in prompts)) for p in prompts if i < p.ids.shape[0]]
    width = max(r.numel() for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, width - r.numel():] = r
        mask[i, width - r.numel():] = m
    return Prompt(ids, mask)
