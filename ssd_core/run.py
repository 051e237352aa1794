"""One generation's state (Run) and the decoder contract (Policy): what every decoder reads and writes.

A policy decides, after each forward of the base model, which window tokens become final, which are
corrected, and how far the window grows; it touches the state only through Run's helpers.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from .errors import SSDError
from .exactness import near_ties
from .observer import NONE
from .sampling import (SamplerSettings, all_rows_finite, check_finite, draw, draw_probs, guide, gumbel, gumbel_argmax,
                       log_probs, not_finite_message, seeded_generator, uniforms)
from .session import KVSession, Layout
from .run_state import Counts, Tokens
from .slots import SlotIndex


class Run:
    """Everything one generation knows; policies read and write it through the helpers below.

    Per-slot state lives in tensors on the model's device; the host keeps only whole numbers (window bounds,
    the first open slot, step counts). A step copies device values to the host once (`sync`): the policy's
    decision, the next `cached` and the deferred finiteness checks together."""

    def __init__(self, model, heads, layout: Layout, settings: SamplerSettings, last_features: torch.Tensor):
        """last_features [B, d]: the prompt's last pre-norm features of this image's streams."""
        self.model, self.heads, self.layout, self.settings = model, heads, layout, settings
        self.session: KVSession | None = None  # the (batch's) KV cache, set by the engine
        self.observer = NONE  # what watches the generation (observer.Observers), set by the engine
        dev = model.device
        self.index = ix = SlotIndex.of(layout, model)  # shared by every run of this layout
        self.counts = Counts()  # steps, head calls, host copies, verification records
        self.tokens = Tokens(ix, self.counts)  # token state per slot: ids, codes, final, ...
        # How far the run is fixed, as host slot numbers (each an end: the slots [0, x)); only the engine moves cached
        #   cached     slots whose keys are in this image's rows of the KV cache, computed from final tokens only
        #              (session.cached is another number: the batch's cache columns, the most any row holds). The
        #              window starts here: a step's logits[:, j] predict slot cached + j. After a step it moves to
        #              cached_next(), the fed slots that keep their keys.
        #   final_end  the final prefix: every slot below it is final; its first open slot (L when done). The
        #              policy moves it (advance); cached <= final_end.
        #   end        the window end: the window [cached, end) is fed in the next forward (set_end, the drafters).
        #   fed_end    every slot below it has been fed at least once (so it has a feature of the model).
        self.cached = 0
        self.final_end = ix.next_image[0]
        self.end = 0
        self.fed_end = 0
        self.final_cells = 0  # host: image cells that are final
        self.fed: torch.Tensor | None = None  # [k] ids fed at slots [cached, cached + k) this step
        self.fed_visible: torch.Tensor | None = None  # [k] which of them other slots could see (None: all)
        self.pending: list = []  # deferred checks: (0-d bool tensor, function raising the error when False)
        self._cached_next: int | None = None  # cached after this step, once synced
        self.rng = seeded_generator(settings.seed, dev)
        B, d = last_features.shape
        self.features = torch.zeros(B, ix.L, d, dtype=model.dtype, device=dev)  # latest feature per slot
        self.next_logits = model.image_logits(last_features)  # [B, V] raw logits for slot `cached`
        self.prompt_features = last_features  # [B, d] features predicting slot 0
        self.q = SlotTable(self.index.V, dev)  # per open slot: the distribution its token was drawn from
        self.noise = SlotTable(self.index.V, dev)  # per open slot: its Gumbel noise (a function of seed, slot)
        self.guided: torch.Tensor | None = None  # [n, V] the guided logits of the latest `logp`
        self.prompt = None  # this image's Prompt (set by the engine; the exactness probe feeds it)
        self.exact_error: torch.Tensor | None = None  # 0-d: bound on the window's raw-logit rounding; None: untracked
        self.branch_logits: torch.Tensor | None = None  # [B, m, V] raw logits of the step's Branches (the engine's)

    # ---- views ----------------------------------------------------------------------------------
    @property
    def L(self) -> int:
        """Slots of the layout (index.L)."""
        return self.index.L

    @property
    def image_slots(self) -> list[int]:
        """Host: the image slots in order (self.index.image_slots; kept for tests/tiny.py)."""
        return self.index.image_slots

    @property
    def done(self) -> bool:
        return self.final_end >= self.L

    def open_span(self, lo: int, hi: int) -> tuple[int, int]:
        """Ranks [a, b) of the open image slots in [lo, hi) (decoders whose final slots form a prefix)."""
        before = self.index.images_before
        return before[min(max(lo, self.final_end), self.L)], before[min(max(hi, lo), self.L)]

    def logp(self, logits: torch.Tensor, slots: torch.Tensor, source: str = "model") -> torch.Tensor:
        """[B, n, V] raw per-stream logits -> [n, V] processed log p for those slots (source: model or heads).

        The finiteness check is deferred to the step's sync (it names the slots when it fails)."""
        guided = guide(logits, self.settings.cfg, self.settings.min_p)
        self.guided = guided  # [n, V] kept for note_near_ties (the window's latest)
        if source != "heads":  # drafts: the heads' features are checked once a chain (check_heads)
            self.expect(all_rows_finite(guided),
                        lambda: check_finite(guided, self.settings, slots, logits, source))
        return log_probs(guided, self.settings, check=False)

    def check_heads(self, features: torch.Tensor, slots: torch.Tensor) -> None:
        """At the step's sync: the features [B, n, d] the heads drafted slots [n] from are finite (else the heads
        are broken; non-finite logits from finite features would be the model's, caught at its verification)."""
        def fail():
            bad = ~features.isfinite().all(-1).all(0)  # [n] slots drafted from a non-finite feature
            raise SSDError(not_finite_message(bad, self.settings, slots, None, "heads"))

        self.expect(features.isfinite().all(), fail)

    # ---- the one host copy per step ---------------------------------------------------------------
    def expect(self, ok: torch.Tensor, fail) -> None:
        """Check the 0-d bool `ok` at the next sync; `fail()` raises the error when it is False."""
        self.pending.append((ok, fail))

    # ---- the engine's step (the only code that moves `cached`) ---------------------------------------
    def begin_step(self, fed: torch.Tensor, visible: torch.Tensor | None, features: torch.Tensor | None,
                   logits: torch.Tensor | None) -> torch.Tensor:
        """The engine fed ids [k] at slots [cached, cached + k) (visible: which others could see them; features
        [B, k, d] and raw logits [B, k, V] their outputs, None when k = 0) -> the step's raw logits [B, k + 1, V]
        predicting slots cached..cached + k, for the policy's update."""
        C, k = self.cached, fed.numel()
        self.tokens.verified[C:self.end] += 1
        self.fed, self.fed_visible, self._cached_next = fed, visible, None
        self.fed_end = max(self.fed_end, C + k)
        if not k:
            return self.next_logits[:, None]
        self.counts.steps += 1
        self.features[:, C:C + k] = features
        return torch.cat([self.next_logits[:, None], logits], dim=1)

    def end_step(self, logits: torch.Tensor) -> int:
        """After the policy's update: `cached` moves to cached_next() (the step's one host copy, unless the policy
        made it), the logits predicting it are kept for the next step. -> the new `cached`."""
        C = self.cached
        self.cached = self.cached_next()
        self.next_logits = logits[:, self.cached - C]
        return self.cached

    def finish(self, cached: int) -> None:
        """The run is over: raise any deferred check that failed; `cached`: the slots the cache holds now."""
        self.flush()
        self.cached = cached

    def sync(self, *values: torch.Tensor) -> list[int]:
        """Copy these 0-d integer tensors, the step's cached_next and the pending checks to the host at once.

        Call it after the fed slots' final tokens are written (cached_next is read then)."""
        flags = [ok for ok, _ in self.pending]
        kept = self._fed_kept() if self._cached_next is None else None
        parts = [v.reshape(1).long() for v in values] + ([kept.reshape(1)] if kept is not None else []) + \
            [f.reshape(1).long() for f in flags]
        out = torch.cat(parts).tolist() if parts else []
        self.counts.syncs += 1
        checks, self.pending = self.pending, []
        for ok, (_, fail) in zip(out[len(out) - len(flags):], checks):
            if not ok:
                fail()
        if kept is not None:
            self._cached_next = self.cached + out[len(values)]
        return out[:len(values)]

    def cached_next(self) -> int:
        """`cached` after this step: it ends at the first fed slot that is not final, changed since fed, or fed
        after a slot that was hidden."""
        if self._cached_next is None:
            self.sync()
        return self._cached_next

    def flush(self) -> None:
        """Raise any deferred check that failed (end of the run)."""
        if self.pending:
            self.sync()

    def _fed_kept(self) -> torch.Tensor:
        """0-d: how many fed slots from `cached` keep their keys."""
        k = 0 if self.fed is None else self.fed.numel()
        if k == 0:
            return self.index.slot_ids[0]
        C = self.cached
        ok = self.tokens.final[C:C + k] & (self.tokens.ids[C:C + k] == self.fed)
        if self.fed_visible is not None:  # no slot before them was hidden when fed
            ok[1:] &= self.fed_visible[:k - 1].to(ok.device).cumprod(0).bool()
        return ok.long().cumprod(0).sum()

    # ---- the window (host) and the features (device) ------------------------------------------------
    def advance(self, slot: int, cells: int | None = None) -> None:
        """Every image slot below `slot` is final (host bookkeeping); cells: the image cells final in all (None:
        those below it, for decoders whose final slots form a prefix)."""
        self.final_end = self.index.next_image[min(slot, self.L)]
        self.final_cells = self.index.images_before[self.final_end] if cells is None else cells

    def set_features(self, slots, features: torch.Tensor) -> None:
        """The drafters' features at slots (an int with features [B, d], or a slice with [B, n, d])."""
        self.features[:, slots] = features

    def call_heads(self, network: torch.nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
        """One call of a draft head's network (self.heads.horizontal or .vertical) on inputs, without autograd:
        the one place the drafters call the heads, seen by the observers (the heads' share of a step's time and
        ops) and counted in counts.head_calls (the trace's)."""
        with torch.no_grad(), self.observer.heads():
            out = network(*inputs)
        self.counts.head_calls += 1
        return out

    def track_exactness(self, error_bound: torch.Tensor) -> None:
        """From now on note_near_ties marks the final decisions a raw-logit error of error_bound (0-d) could flip."""
        self.exact_error = error_bound

    def set_end(self, end: int) -> None:
        """The window now ends at `end`, and the forced slots right after it join it (they are fed with the
        tokens before them)."""
        self.end = end
        while self.end < self.L and self.index.forced[self.end]:
            self.end += 1

    def q_at(self, a: int, b: int) -> torch.Tensor:
        """[n, V] the distributions the current tokens of the open image slots of ranks [a, b) were drawn from."""
        return self.q.get(a, b)

    def put_q(self, a: int, dist: torch.Tensor) -> None:
        """dist [n, V] for the open image slots of ranks [a, a + n)."""
        self.q.span(self.index.images_before[self.final_end], a + dist.shape[0])
        self.q.put(a, dist)

    def sample(self, logp: torch.Tensor) -> torch.Tensor:
        """Independent samples from rows of log p (the seeded generator of this run)."""
        return draw(logp, self.rng)

    def sample_probs(self, p: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """sample() from probabilities p [n, V]; u [n, 1]: with the uniforms drawn earlier by draws_ahead."""
        return draw_probs(p, self.rng, u)

    def draws_ahead(self, n: int) -> torch.Tensor:
        """[n, 1] the uniforms that the next n rows of sample_probs would take, drawn now (sampling.uniforms)."""
        return uniforms(self.rng, n)

    def random_codes(self, n: int) -> torch.Tensor:
        """[n] uniform random image codes from the run's generator."""
        return torch.randint(self.index.V, (n,), generator=self.rng, device=self.index.slot_ids.device)

    def gumbel_sample(self, logp: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """Gumbel-max samples for the image slots of ranks [a, b), keyed by (seed, slot): the same slot always
        gets the same noise."""
        if self.settings.temperature == 0:
            return logp.argmax(-1)
        if b > self.noise.hi:  # each slot's noise is made once, a row ahead (of the first open slot and of b)
            first, W = self.index.images_before[self.final_end], self.layout.grid[1]
            lo, hi = max(self.noise.hi, first), min(len(self.index.image_slots), max(b + W - 1, first + W))
            self.noise.span(first, hi)
            self.noise.put(lo, gumbel(self.settings.seed, self.index.image_ids[lo:hi], self.index.V))
        return gumbel_argmax(logp.float(), self.noise.get(a, b))

    def note_near_ties(self, raw: torch.Tensor, logp: torch.Tensor, a: int, n: int) -> None:
        """Mark the decisions just made final at the open image slots of ranks [a, a + n) that a raw-logit error
        of exact_error could flip (exactness.near_ties; raw [B, >= n, V] and logp [>= n, V] from the window's
        first open slot: only their first n rows, the final ones, are scored)."""
        if self.exact_error is None:
            return
        noise = None if self.settings.temperature == 0 else self.noise.get(a, a + n)
        ties = near_ties(raw[:, :n], self.guided[:n], logp[:n], noise, self.settings, self.exact_error)
        self.tokens.near_tie[self.index.image_ids[a:a + n]] |= ties

    def uniform(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.rng, device=self.index.slot_ids.device)


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


@dataclass(frozen=True)
class Branches:
    """Tokens a step feeds after its window that are no slot of the sequence: a draft tree's side branches (sjd-pac).
    Each stands at `slots[i]`'s position, sees the cache, the fed window's slots below `sees[i]`, its parent chain and
    itself; no window slot sees it, and its keys leave the cache after the step. Their raw logits reach the policy's
    update as run.branch_logits [B, m, V]."""

    ids: torch.Tensor  # [m] sequence ids, on the model's device
    slots: tuple[int, ...]  # host: the slot (position) each stands for
    sees: tuple[int, ...]  # host: each sees the window's slots below this one
    parent: tuple[int, ...]  # host: its parent's index among the branches (a smaller one), -1: it hangs from the window


class Policy:
    """A decoder: `update` finalizes / corrects after a forward and extends the window with drafts."""

    name = "policy"
    needs_heads = False  # refuses to run without heads
    uses_heads = False  # drafts with heads when they are given
    params: Mapping[str, int | None] = MappingProxyType({})  # the decoder parameters it runs with (make_policy
    #                                                           sets them; the trace records them)

    def begin(self, run: Run) -> None:
        pass

    def visible(self, run: Run) -> torch.Tensor | None:
        """Which window slots other slots may attend to (None: all, plain causal)."""
        return None

    def branches(self, run: Run) -> Branches | None:
        """Tokens to feed after the window this step (a draft tree's side branches), or None."""
        return None

    def update(self, run: Run, logits: torch.Tensor, features: torch.Tensor | None) -> None:
        """logits [B, n+1, V] raw per stream for slots cached..end; features [B, n, d] of the window."""
        raise NotImplementedError
