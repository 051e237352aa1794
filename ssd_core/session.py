"""One generation's sequence: where image cells and forced tokens sit (Layout), the prompt ids (Prompt), and
the CFG-batched KV-cache session every family shares: its interface and shared part (KVSession), and the
DynamicCache kind (Session; the static kind is static_cache.StaticSession)."""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
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
    def build(grid: tuple[int, int], row_end: int | None = None, tail: list[int] | tuple[int, ...] = (),
              last_row_end: bool = True) -> "Layout":
        """H rows of W cells, each row followed by `row_end` (the last row too unless last_row_end is False:
        Emu3.5 ends its last row with the image end instead), then the forced `tail`."""
        H, W = grid
        forced: list[int] = []
        slot_of_cell: list[int] = []
        for y in range(H):
            for _ in range(W):
                slot_of_cell.append(len(forced))
                forced.append(-1)
            if row_end is not None and (last_row_end or y < H - 1):
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
    """Record the input of `module` (the final norm) during a forward: the pre-norm last-layer features.

    Only this thread's forwards are recorded: the norm is shared by every generation on the model, and each
    generation in another thread registers its own hook on it."""
    box: dict[str, torch.Tensor] = {}
    owner = threading.get_ident()

    def hook(_mod, args, kwargs):
        if threading.get_ident() == owner:
            box["x"] = args[0] if args else next(iter(kwargs.values()))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield box
    finally:
        handle.remove()


class KVSession:
    """The KV-cache session the engine drives: one generation's (or one batch's) cache over [prompt ; slots].

    Batch row 0 is conditional, row 1 unconditional (a batch of N images: the N conditional rows, then the N
    unconditional ones). Each stream row holds its own number of slots (`held`): its keys sit at the slot
    columns [0, held), in slot order, and the columns past it (up to `cached`, the most any row holds) are
    masked out for it. One row's feed writes its slots held .. held + n - 1, whatever the other rows hold.

    Written once here: that bookkeeping, `forward`'s positions and key packing, `crop`, `select` (finished
    images leave) and `cache_tensors`. A kind of cache (Session: transformers' DynamicCache; StaticSession in
    static_cache.py: a preallocated one) implements the five methods under "a cache kind" below."""

    def __init__(self, model, prompt: Prompt):
        """model: the GridModel (families/base.py) whose backbone, embeddings and final norm run the steps.
        A subclass sets up its cache first: this runs the prompt (the prefill)."""
        self.m = model
        dev = model.device
        self.prompt_mask = prompt.mask.to(dev)
        self.batch, self.prompt_len = prompt.ids.shape
        self.real_len = self.prompt_mask.long().sum(1)  # [B] real prompt tokens per row
        self.held_host = [0] * self.batch  # [B] slots whose keys each row holds, as host numbers (read without a tensor op)
        self.cached = 0  # slot columns in the cache: the most slots any row holds
        self._ramps: dict[int, torch.Tensor] = {}  # width -> arange(width) on the device, made once (ramp)
        pos = (self.prompt_mask.long().cumsum(1) - 1).clamp(min=0)
        self.last_features = self._prefill(prompt.ids.to(dev), pos)[:, -1]  # [B, d]: features predicting slot 0

    @property
    def held(self) -> torch.Tensor:
        """[B] on the CPU: slots whose keys each row holds (a view of `held_host`, for checks; the steps use
        held_on_device)."""
        return torch.tensor(self.held_host, dtype=torch.long)

    def forward(self, slot_ids: torch.Tensor, visible: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, logits: bool = False):
        """Feed each row its slots [held, held + n) ([n] for all streams, or [B, n]) -> pre-norm features [B, n, d];
        logits: (features, their float32 image logits [B, n, V] where the session makes them with its forward (the
        static cache, inside its step graph), else None).

        visible ([n] or [B, n]): window slots the others may attend to; right padding of a batch is invisible.
        Or [1 or B, n, n] bool: the whole window mask, which fed token (query) sees which (key), in place of the
        causal window (a draft tree's branches, run.Branches). positions ([n] or [B, n]): each fed token's
        position counted from the row's held slots (default 0 .. n-1: slot order).
        Nothing here waits for the device: the held lengths reach it as fills from host numbers (held_on_device)."""
        n = slot_ids.shape[-1]
        dev = self.m.device
        ids = slot_ids.to(dev).view(-1, n).expand(self.batch, n)  # one row for every stream, or [B, n]
        held = held_on_device(self.held_host, dev)
        feats, raw = self._feed(ids, visible, held, positions, logits)
        pack_fed_keys(self._layers(), self.prompt_len, held, self.cached, n, min(self.held_host))
        self.held_host = [h + n for h in self.held_host]
        self.cached += n
        return (feats, raw) if logits else feats

    def crop(self, slots) -> None:
        """Keep the prompt and the first `slots` slots (an int for every row, or [B] per row) in the cache."""
        self.held_host = held_minimum(self.held_host, slots)
        drop = self.cached - max(self.held_host)
        if drop > 0:
            self._drop(drop)
            self.cached -= drop

    def select(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        """Keep only these batch rows (in this order): the streams of images that are still generating
        (host_rows: the same as host numbers, when the caller has them). The batch shrinks to them."""
        on_device = rows.to(self.m.device)
        self.held_host = [self.held_host[r] for r in (rows.tolist() if host_rows is None else host_rows)]
        self.batch = int(rows.numel())
        self._keep_rows(on_device)
        self.prompt_mask, self.real_len = self.prompt_mask[on_device], self.real_len[on_device]
        self.last_features = self.last_features[on_device]
        self.crop(self.held_host)  # slot columns no remaining row holds leave the cache

    def cache_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's valid keys and values ([B, heads, prompt + cached, head_dim])."""
        n = self.prompt_len + self.cached
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self._layers()]

    def _positions(self, held: torch.Tensor, width: int, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """[B, width] position ids of a feed: each row's slots from its own held count, after its real prompt;
        offsets ([n] or [B, n], n <= width): the fed tokens' own, from the held count (the padding's: slot order)."""
        steps = self.ramp(width)[None]
        if offsets is not None:
            offsets = offsets.to(held.device).view(-1, offsets.shape[-1])
            steps = torch.cat([offsets, steps[:, offsets.shape[1]:].expand(offsets.shape[0], -1)], dim=1)
        return self.real_len[:, None] + held[:, None] + steps

    def ramp(self, width: int) -> torch.Tensor:
        """arange(width) on the model's device, made once per width (a step's fixed index ranges: no op a step)."""
        if width not in self._ramps:
            self._ramps[width] = torch.arange(width, device=self.m.device)
        return self._ramps[width]

    # ---- a cache kind -------------------------------------------------------------------------------------
    def _prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Run the prompt ids [B, P] at positions pos [B, P] into the cache -> pre-norm features [B, P, d]."""
        raise NotImplementedError

    def _feed(self, ids: torch.Tensor, visible: torch.Tensor | None, held: torch.Tensor,
              positions: torch.Tensor | None, logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward of ids [B, n], each row at its own positions (held [B] on the device; `positions`: forward's),
        writing the keys at slot columns [cached, cached + n) of every row -> (pre-norm features [B, n, d] (forward
        packs them), their image logits [B, n, V] when asked, else None or them)."""
        raise NotImplementedError

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (keys, values) [B, heads, columns, head_dim] of the live rows, written in place."""
        raise NotImplementedError

    def _drop(self, columns: int) -> None:
        """The last `columns` slot columns leave the cache (no row holds them)."""
        raise NotImplementedError

    def _keep_rows(self, rows: torch.Tensor) -> None:
        """The cache keeps only these rows [B'] (on the device), in this order (held_host is theirs already)."""
        raise NotImplementedError


class Session(KVSession):
    """The session over transformers' DynamicCache: the cache grows with each feed and shrinks with each crop."""

    def __init__(self, model, prompt: Prompt):
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.cache_kw = cache_kwarg(model.backbone())  # 'cache' in transformers 5, else 'past_key_values'
        super().__init__(model, prompt)

    def _mask(self, n: int, visible: torch.Tensor | None, prefill: bool = False,
              held: torch.Tensor | None = None) -> torch.Tensor:
        """Float additive mask [B, 1, n, keys]: prompt padding, each row's held slots, causal (and visible) window.

        visible: [n] or [B, n] bool, the window slots other slots may attend to (each slot sees itself), or
        [1 or B, n, n]: the whole window mask (forward's);
        held: [B] on the device, each row's held slots (held_on_device): given for every feed after the prompt."""
        dev, dtype = self.m.device, self.m.dtype
        P, past = self.prompt_len, self.cached
        win = torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None]  # [1 or B, n, n]
        if visible is not None and visible.dim() == 3:  # the whole window mask, given
            win = visible.to(dev)
        elif visible is not None:  # keys of invisible window slots are hidden from every other query
            win = win & (visible.to(dev).view(-1, 1, n) | torch.eye(n, dtype=torch.bool, device=dev))
        if prefill:  # the prompt itself: causal over the prompt's real tokens
            allowed = win & self.prompt_mask[:, None, :]
        else:
            allowed = torch.ones(self.batch, n, P + past + n, dtype=torch.bool, device=dev)
            allowed[:, :, :P] &= self.prompt_mask[:, None, :]
            allowed[:, :, P:P + past] = held_columns(held, past)[:, None, :]
            allowed[:, :, P + past:] = win
        return additive_mask(allowed, dtype)

    def _run(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        embeds = self.m.embed(ids)
        with torch.no_grad(), capture_input(self.m.final_norm()) as box:
            self.m.backbone()(inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                              use_cache=True, **{self.cache_kw: self.cache})
        return box["x"]

    def _prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self._run(ids, pos, self._mask(self.prompt_len, None, prefill=True))

    def _feed(self, ids: torch.Tensor, visible: torch.Tensor | None, held: torch.Tensor,
              positions: torch.Tensor | None, logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = ids.shape[1]
        return self._run(ids, self._positions(held, n, positions), self._mask(n, visible, held=held)), None

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return layer_tensors(self.cache)

    def _drop(self, columns: int) -> None:
        self.cache.crop(-columns)

    def _keep_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, n, keys] bool -> the attention mask [B, 1, n, keys] in dtype: 0 where allowed, the dtype's min elsewhere."""
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[:, None]


def layer_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's whole (keys, values) [B, heads, columns, head_dim] (transformers 5 and 4.57)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache))


def held_on_device(held: list[int], dev) -> torch.Tensor:
    """Each row's held slots (host numbers) as a [B] long tensor on `dev`, without a host-to-device copy (which
    waits for the device's queue on CUDA): one fill per run of equal rows (a single image: one fill)."""
    if all(h == held[0] for h in held):
        return torch.full((len(held),), held[0], dtype=torch.long, device=dev)
    out = torch.empty(len(held), dtype=torch.long, device=dev)
    start = 0
    for i in range(1, len(held) + 1):
        if i == len(held) or held[i] != held[start]:
            out[start:i] = held[start]  # a fill of a slice: the number travels as a kernel argument
            start = i
    return out


def held_columns(held: torch.Tensor, columns: int) -> torch.Tensor:
    """[B, columns] bool on held's device: the slot columns each row holds (its keys), the rest masked out."""
    return torch.arange(columns, device=held.device)[None, :] < held[:, None]


def held_minimum(held: list[int], slots) -> list[int]:
    """Each row's held slots after a crop to `slots` (an int for every row, or one per row: list or tensor)."""
    if isinstance(slots, int):
        return [min(h, slots) for h in held]
    return [min(h, int(c)) for h, c in zip(held, slots if isinstance(slots, list) else slots.tolist())]


def pack_fed_keys(layers, prompt_len: int, held: torch.Tensor, cached: int, n: int, lo: int | None = None) -> None:
    """After a feed of n slots written at slot columns [cached, cached + n) for every row: move row b's to
    [held_b, held_b + n), so that every row's keys stay in slot order from column 0 (in place).

    layers: (keys, values) [B, heads, >= prompt_len + cached + n, head_dim]; held [B]: slots held before the
    feed (on the device: held_on_device); lo: the fewest of them (a host number; None reads it from held).
    The gather index is built once per call on held's device (and copied once to any other device a layer's
    cache sits on: a model split across GPUs), not once per layer."""
    lo = int(held.min()) if lo is None else lo  # the fewest slots a row held
    if lo == cached:  # every row held `cached` slots: the feed is in place already
        return
    col = torch.arange(lo, cached + n, device=held.device)[None]  # [1, W] the slot columns that may change
    offset = col - held[:, None]  # [B, W] column's index in the row's feed
    source = torch.where((offset >= 0) & (offset < n), cached + offset, col) - lo  # [B, W] column to read
    on: dict[torch.device, torch.Tensor] = {held.device: source[:, None, :, None]}
    a, b = prompt_len + lo, prompt_len + cached + n
    for keys, values in layers:
        if keys.device not in on:
            on[keys.device] = source.to(keys.device)[:, None, :, None]
        index = on[keys.device].expand(-1, keys.shape[1], -1, keys.shape[3])
        keys[:, :, a:b] = keys[:, :, a:b].gather(2, index)
        values[:, :, a:b] = values[:, :, a:b].gather(2, index)


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
