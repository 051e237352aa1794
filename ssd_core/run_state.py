"""The parts of one generation's state; a Run (run.py) holds one of each (docs/engine.md, "The state of a run"):

Counts   what the run counts (host numbers): steps, head calls, host copies, the verification records
Tokens   the token state per slot (device tensors): ids, codes, which are final and how each got its value
Window   how far the run is fixed (host slot numbers): cached <= final_end, and the window's end
Draws    the run's randomness: its seeded generator, the open slots' draft distributions and Gumbel noise
Outputs  what the model computed that the run keeps: features per slot, the logits for the next slot

Policies and drafters change them only through their methods (Tokens.write, finalize, fill_holes; Window.advance,
set_end; Draws.put_q; Outputs.set_features); only the engine moves Window.cached (Run.begin_step, end_step,
finish)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import trace as T
from .sampling import (SamplerSettings, draw, gumbel_argmax, inverse_cdf, gumbel_bits, gumbel_key, gumbel_of,
                       seeded_generator, uniforms)
from .slots import SlotIndex


@dataclass
class Counts:
    """What a run counts (host numbers): the trace's figures, and what the policies pace themselves by."""

    steps: int = 0  # steps that fed a window (Run.begin_step); a slot finalized now records this number
    head_calls: int = 0  # calls of a draft head's network (Run.call_heads)
    syncs: int = 0  # device-to-host copies made by Run.sync
    checks: list = field(default_factory=list)  # per verification: (round, ranks a, b, [n] rejected, [n] mass)

    def add_check(self, check: tuple) -> None:
        """One verification for the trace (acceptance.record_checks)."""
        self.checks.append(check)


class Tokens:
    """The token state per slot (device tensors [L], on the model's device). Policies and drafters write it only
    through write, finalize and fill_holes; the engine counts the forwards (Run.begin_step) and Run.note_near_ties
    marks the near-ties."""

    def __init__(self, index: SlotIndex, counts: Counts, region=lambda fn: fn):
        self.index, self.counts = index, counts  # counts: the step number that finalize records
        self.region = region  # fn -> fn compiled as a graph of its own (static_cache.region with compile 'compiled')
        L, dev = index.L, index.slot_ids.device
        self.ids = index.forced_ids.clone()  # [L] sequence ids; -1 = empty
        self.codes = torch.full((L,), -1, dtype=torch.long, device=dev)  # [L] image code per slot; -1 = none
        self.final = self.ids >= 0  # [L] bool: final slots (forced slots are final from the start)
        self.drafted = torch.full((L,), -1, dtype=torch.long, device=dev)  # [L] first draft code of a slot
        self.step_of = torch.zeros(L, dtype=torch.int32, device=dev)  # [L] the step that made a slot final
        self.verified = torch.zeros(L, dtype=torch.int32, device=dev)  # [L] forwards each slot has been fed in
        self.value_seen = torch.zeros(L, dtype=torch.int32, device=dev)  # [L] `verified` when a slot took its value
        self.near_tie = torch.zeros(L, dtype=torch.bool, device=dev)  # [L] final decisions that rounding could flip

    @property
    def status(self) -> torch.Tensor:
        """[L] int8 status codes (trace.STATUSES), from the first drafts and the final tokens."""
        made = torch.where(self.drafted < 0, T.AR, torch.where(self.drafted == self.codes, T.ACCEPTED, T.CORRECTED))
        return torch.where(self.index.forced_mask, T.FORCED, torch.where(self.final, made, T.PENDING)).to(torch.int8)

    @property
    def round_of(self) -> torch.Tensor:
        """[L] int32: the verification round (0 = the first check) in which a final slot took its value."""
        return torch.where(self.final, (self.value_seen - 1).clamp(min=0), 0).to(torch.int32)

    def write(self, slots: torch.Tensor, codes: torch.Tensor, draft=True) -> None:
        """Write codes [n] at slots [n]; draft (True, False or a [n] mask): record them as first drafts."""
        self.region(write_tokens)(self, slots, codes, draft)

    def finalize(self, slots: torch.Tensor, mask=None) -> None:
        """Mark image slots final with their current token (only where `mask`, a [n] or 0-d bool tensor)."""
        self.region(finalize_tokens)(self, slots, mask, self.counts.steps)

    def fill_holes(self, lo: int, hi: int) -> None:
        """The open slots in [lo, hi) get a placeholder id (code 0's): fed where no other slot may see them (zipar)."""
        window = slice(lo, hi)
        self.ids[window] = self.ids[window].where(self.final[window], self.index.id_of_code[0])


# Tokens.write and finalize, as functions a compiled region (static_cache.region) runs or calls
def write_tokens(tokens: Tokens, slots: torch.Tensor, codes: torch.Tensor, draft) -> None:
    changed = tokens.codes[slots] != codes  # the round in which a slot took its current value
    tokens.value_seen[slots] = torch.where(changed, tokens.verified[slots], tokens.value_seen[slots])
    tokens.codes[slots] = codes
    tokens.ids[slots] = tokens.index.id_of_code[codes]
    if draft is not False:
        drafted = tokens.drafted[slots]
        first = drafted < 0 if draft is True else (drafted < 0) & draft
        tokens.drafted[slots] = torch.where(first, codes, drafted)


def finalize_tokens(tokens: Tokens, slots: torch.Tensor, mask, step: int) -> None:
    if mask is None:
        tokens.final[slots] = True
        tokens.step_of[slots] = step
        return
    tokens.final[slots] |= mask
    tokens.step_of[slots] = torch.where(mask, step, tokens.step_of[slots])


class Window:
    """How far a run is fixed, as host slot numbers, each an end (the slots [0, x)):

      cached     slots whose keys are in this image's rows of the KV cache, computed from final tokens only
                 (session.cached is another number: the batch's cache columns, the most any row holds). The window
                 starts here: a step's logits[:, j] predict slot cached + j. Only the engine moves it: after a step
                 to Run.cached_next(), the fed slots that keep their keys.
      final_end  the final prefix: every slot below it is final; its first open slot (L when done). The policy
                 moves it (advance); cached <= final_end.
      end        the window end: the window [cached, end) is fed in the next forward. The policy and its drafter
                 move it (set_end).
      fed_end    every slot below it has been fed at least once (so it has a feature of the model)."""

    def __init__(self, index: SlotIndex):
        self.index = index
        self.cached = 0
        self.final_end = index.next_image[0]
        self.end = 0
        self.fed_end = 0
        self.final_cells = 0  # image cells that are final (advance)
        self.fed: torch.Tensor | None = None  # [k] ids fed at slots [cached, cached + k) this step
        self.fed_visible: torch.Tensor | None = None  # [k] which of them other slots could see (None: all)
        self.next_cached: int | None = None  # cached after this step, once synced (Run.cached_next)

    @property
    def done(self) -> bool:
        return self.final_end >= self.index.L

    def open_span(self, lo: int, hi: int) -> tuple[int, int]:
        """Ranks [a, b) of the open image slots in [lo, hi) (decoders whose final slots form a prefix)."""
        before, L = self.index.images_before, self.index.L
        return before[min(max(lo, self.final_end), L)], before[min(max(hi, lo), L)]

    def advance(self, slot: int, cells: int | None = None) -> None:
        """Every image slot below `slot` is final; cells: the image cells final in all (None: those below it, for
        decoders whose final slots form a prefix)."""
        self.final_end = self.index.next_image[min(slot, self.index.L)]
        self.final_cells = self.index.images_before[self.final_end] if cells is None else cells

    def set_end(self, end: int) -> None:
        """The window now ends at `end`, and the forced slots right after it join it (they are fed with the
        tokens before them)."""
        self.end = end
        while self.end < self.index.L and self.index.forced[self.end]:
            self.end += 1


class Draws:
    """The run's randomness: its seeded generator (independent draws, in the order the policy asks for them) and,
    per open image slot (by rank, from the window's first open slot on), the distribution its token was drawn from
    (q) and its Gumbel noise (a function of the seed and the slot)."""

    def __init__(self, settings: SamplerSettings, index: SlotIndex, window: Window, width: int, device,
                 region=lambda fn: fn):
        self.settings, self.index, self.window = settings, index, window
        self.region = region  # as Tokens.region
        self.width = width  # image cells a row: the noise is made a row ahead
        self.rng = seeded_generator(settings.seed, device)
        self.q = SlotTable(index.V, device)  # [open slots, V] the distribution each token was drawn from
        self.noise = SlotTable(index.V, device)  # [open slots, V] each slot's Gumbel noise
        self.key = torch.tensor(gumbel_key(settings.seed), device=device)  # 0-d: the noise's key (gumbel_bits)
        self.codes = torch.arange(index.V, device=device)  # [V] every image code

    def sample(self, logp: torch.Tensor) -> torch.Tensor:
        """Independent samples from rows of log p (the seeded generator of this run)."""
        return draw(logp, self.rng)

    def sample_probs(self, p: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """sample() from probabilities p [n, V]; u [n, 1]: with the uniforms drawn earlier by uniforms_ahead."""
        u = uniforms(self.rng, p.shape[0]) if u is None else u  # the generator's numbers, drawn eagerly
        return self.region(inverse_cdf)(p, u)

    def uniforms_ahead(self, n: int) -> torch.Tensor:
        """[n, 1] the uniforms that the next n rows of sample_probs would take, drawn now (sampling.uniforms)."""
        return uniforms(self.rng, n)

    def random_codes(self, n: int) -> torch.Tensor:
        """[n] uniform random image codes from the run's generator."""
        return torch.randint(self.index.V, (n,), generator=self.rng, device=self.index.slot_ids.device)

    def uniform(self, n: int) -> torch.Tensor:
        """[n] uniforms in [0, 1) from the run's generator."""
        return torch.rand(n, generator=self.rng, device=self.index.slot_ids.device)

    def gumbel_sample(self, logp: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """Gumbel-max samples for the image slots of ranks [a, b), keyed by (seed, slot): the same slot always
        gets the same noise."""
        if self.settings.temperature == 0:
            return logp.argmax(-1)
        if b > self.noise.hi:  # each slot's noise is made once, a row ahead (of the first open slot and of b)
            first, W = self.index.images_before[self.window.final_end], self.width
            lo, hi = max(self.noise.hi, first), min(len(self.index.image_slots), max(b + W - 1, first + W))
            self.noise.span(first, hi)
            bits = self.region(gumbel_bits)(self.key, self.index.image_ids[lo:hi], self.codes)
            self.noise.put(lo, gumbel_of(bits))  # sampling.gumbel's noise
        return self.region(gumbel_argmax)(logp.float(), self.noise.get(a, b))

    def q_at(self, a: int, b: int) -> torch.Tensor:
        """[n, V] the distributions the current tokens of the open image slots of ranks [a, b) were drawn from."""
        return self.q.get(a, b)

    def put_q(self, a: int, dist: torch.Tensor) -> None:
        """dist [n, V] for the open image slots of ranks [a, a + n)."""
        self.q.span(self.index.images_before[self.window.final_end], a + dist.shape[0])
        self.q.put(a, dist)


class Outputs:
    """What the model (and the heads) computed that the run keeps, per stream (B: this image's CFG streams), on the
    model's device. The engine writes the model's (Run.begin_step, end_step; branch_logits), Run.logp the guided
    logits, the drafters the heads' features (set_features)."""

    def __init__(self, model, index: SlotIndex, last_features: torch.Tensor):
        B, d = last_features.shape
        self.features = torch.zeros(B, index.L, d, dtype=model.dtype, device=model.device)  # [B, L, d] per slot
        self.prompt_features = last_features  # [B, d] the prompt's last pre-norm features: they predict slot 0
        self.next_logits = model.image_logits(last_features)  # [B, V] raw logits for slot window.cached
        self.branch_logits: torch.Tensor | None = None  # [B, m, V] raw logits of the step's Branches
        self.guided: torch.Tensor | None = None  # [n, V] the guided logits of the latest Run.logp

    def set_features(self, slots, features: torch.Tensor) -> None:
        """The drafters' features at slots (an int with features [B, d], or a slice with [B, n, d])."""
        self.features[:, slots] = features


class SlotTable:
    """Rows [V] for a moving span [lo, hi) of image slots (by rank) on the model's device: what open slots
    need across steps. The span's rows sit in a buffer with room to grow: moving lo up or hi within the room
    copies nothing (a drafted cell's q used to reallocate and copy the whole table); when the span outgrows
    it, its rows move to a new buffer half again as large (about window-sized). Rows never written are 0."""

    def __init__(self, V: int, device):
        self.base = 0  # rank of the buffer's first row
        self.lo = self._hi = 0
        self.rows = torch.zeros(0, V, device=device)  # the buffer

    @property
    def hi(self) -> int:
        return self._hi

    def get(self, a: int, b: int) -> torch.Tensor:
        return self.rows[a - self.base:b - self.base]

    def span(self, lo: int, hi: int) -> None:
        """Cover ranks [lo, max(hi, self.hi)), dropping rows below lo (lo never moves down)."""
        hi = max(hi, self._hi)
        if lo < self.base or hi - self.base > self.rows.shape[0]:  # out of room: a new buffer from lo
            size = hi - lo + max(16, (hi - lo) // 2)
            rows = torch.zeros(size, self.rows.shape[1], device=self.rows.device)
            a, b = max(lo, self.lo), min(self._hi, hi)
            if b > a:
                rows[a - lo:b - lo] = self.rows[a - self.base:b - self.base]
            self.rows, self.base = rows, lo
        self.lo, self._hi = lo, hi

    def put(self, a: int, values: torch.Tensor) -> None:
        """values [n, V] for ranks [a, a + n) inside the span."""
        self.rows[a - self.base:a - self.base + values.shape[0]] = values
