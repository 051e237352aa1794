"""One generation's state (Run) and the decoder contract (Policy): what every decoder reads and writes.

A policy decides, after each forward of the base model, which window tokens become final, which are
corrected, and how far the window grows; it changes the state only through the methods of the run's parts
(run_state.py: tokens, window, draws, outputs) and Run's own below.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from .errors import SSDError
from .exactness import near_ties
from .observer import NONE
from .run_state import Counts, Draws, Outputs, Tokens, Window
from .sampling import SamplerSettings, all_rows_finite, check_finite, not_finite_message, processed
from .session import KVSession, Layout
from .static_cache import compiles_regions, region, sampler_graph
from .slots import SlotIndex


class Run:
    """Everything one generation knows: what it runs with (model, heads, layout, settings, session, prompt,
    observer), the per-layout index and its parts (run_state.py): tokens, window, counts, draws, outputs.

    Per-slot state lives in tensors on the model's device; the host keeps only whole numbers (window bounds,
    step counts). A step copies device values to the host once (`sync`): the policy's decision, the next
    `cached` and the deferred finiteness checks together. Run's own methods are what spans the parts: logp, the
    host copy (expect, sync), the heads' calls, the exactness record, and the engine's step (begin_step,
    end_step, finish: the only code that moves window.cached)."""

    def __init__(self, model, heads, layout: Layout, settings: SamplerSettings, last_features: torch.Tensor,
                 session: KVSession | None = None, prompt=None, observer=NONE):
        """last_features [B, d]: the prompt's last pre-norm features of this image's streams."""
        self.model, self.heads, self.layout, self.settings = model, heads, layout, settings
        self.session = session  # the (batch's) KV cache
        self.prompt = prompt  # this image's Prompt (the exactness probe feeds it)
        self.observer = observer  # what watches the generation (observer.Observers)
        self.index = ix = SlotIndex.of(layout, model)  # shared by every run of this layout
        self.counts = Counts()  # steps, head calls, host copies, verification records
        self.tokens = Tokens(ix, self.counts, lambda fn: region(model, fn))  # token state per slot: ids, codes, ...
        self.window = Window(ix)  # how far the run is fixed: cached <= final_end, end
        self.draws = Draws(settings, ix, self.window, layout.grid[1], model.device,  # generator; q, noise
                           lambda fn: region(model, fn))
        self.outputs = Outputs(model, ix, last_features)  # features per slot, logits for the next slot
        self.pending: list = []  # deferred checks: (0-d bool tensor, function raising the error when False)
        self.exact_error: torch.Tensor | None = None  # 0-d: bound on the window's raw-logit rounding; None: untracked
        self.sampler = sampler_graph(model, settings)  # the compiled guided sampling (compile 'compiled'), or None
        self.draft_sampler = sampler_graph(model, settings, features=True)  # the same from the heads' features

    def logp(self, logits: torch.Tensor, slots: torch.Tensor, source: str = "model") -> torch.Tensor:
        """[B, n, V] raw per-stream logits -> [n, V] processed log p for those slots (source: model or heads).

        The finiteness check is deferred to the step's sync (it names the slots when it fails)."""
        compiled = self.sampler
        if compiled is not None:  # compile 'compiled': one graph launch (static_cache.sampler_graph)
            with self.observer.graph(True):
                guided, finite, logp = compiled(logits)
        else:
            guided, logp = processed(logits, self.settings)
            finite = None
        self.outputs.guided = guided  # [n, V] kept for note_near_ties (the window's latest)
        if source != "heads":  # drafts: the heads' features are checked once a chain (check_heads)
            self.expect(all_rows_finite(guided) if finite is None else finite,
                        lambda: check_finite(guided, self.settings, slots, logits, source))
        return logp

    def check_heads(self, features: torch.Tensor, slots: torch.Tensor, finite: torch.Tensor | None = None) -> None:
        """At the step's sync: the features [B, n, d] the heads drafted slots [n] from are finite (else the heads
        are broken; non-finite logits from finite features would be the model's, caught at its verification).
        finite: that check, already made (0-d bool, by a region that made the features)."""
        def fail():
            bad = ~features.isfinite().all(-1).all(0)  # [n] slots drafted from a non-finite feature
            raise SSDError(not_finite_message(bad, self.settings, slots, None, "heads"))

        self.expect(region(self.model, _all_finite)(features) if finite is None else finite, fail)

    def draft_logp(self, features: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The heads' features [B, n, d] -> [n, V] processed log p of the slots [n] they draft: logp of the model's
        image logits (compile 'compiled': one graph launch for both, static_cache.sampler_graph)."""
        if self.draft_sampler is None:
            return self.logp(self.model.image_logits(features), slots, "heads")
        with self.observer.graph(True):
            self.outputs.guided, _, logp = self.draft_sampler(features)
        return logp

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
        w = self.window
        C, k = w.cached, fed.numel()
        w.fed, w.fed_visible, w.next_cached = fed, visible, None
        w.fed_end = max(w.fed_end, C + k)
        out = self.outputs
        if not k:
            self.tokens.verified[C:w.end] += 1
            return out.next_logits[:, None]
        self.counts.steps += 1
        return region(self.model, _begin_step)(self.tokens.verified[C:w.end], out.features[:, C:C + k], features,
                                               out.next_logits, logits)

    def end_step(self, logits: torch.Tensor) -> int:
        """After the policy's update: `cached` moves to cached_next() (the step's one host copy, unless the policy
        made it), the logits predicting it are kept for the next step. -> the new `cached`."""
        w = self.window
        C = w.cached
        w.cached = self.cached_next()
        self.outputs.next_logits = logits[:, w.cached - C]
        return w.cached

    def finish(self, cached: int) -> None:
        """The run is over: raise any deferred check that failed; `cached`: the slots the cache holds now."""
        self.flush()
        self.window.cached = cached

    def sync(self, *values: torch.Tensor) -> list[int]:
        """Copy these 0-d integer tensors, the step's cached_next and the pending checks to the host at once.

        Call it after the fed slots' final tokens are written (cached_next is read then)."""
        flags = [ok for ok, _ in self.pending]
        kept = self._fed_kept() if self.window.next_cached is None else None
        out = region(self.model, _stacked)(values, kept, flags).tolist() if values or kept or flags else []
        self.counts.syncs += 1
        checks, self.pending = self.pending, []
        for ok, (_, fail) in zip(out[len(out) - len(flags):], checks):
            if not ok:
                fail()
        if kept is not None:
            self.window.next_cached = self.window.cached + out[len(values)]
        return out[:len(values)]

    def cached_next(self) -> int:
        """`cached` after this step: it ends at the first fed slot that is not final, changed since fed, or fed
        after a slot that was hidden."""
        if self.window.next_cached is None:
            self.sync()
        return self.window.next_cached

    def flush(self) -> None:
        """Raise any deferred check that failed (end of the run)."""
        if self.pending:
            self.sync()

    def _fed_kept(self) -> tuple:
        """What _kept reads to count the fed slots from `cached` that keep their keys: (final flags [k], ids now [k],
        ids fed [k], visible [k - 1] or None)."""
        w = self.window
        k = 0 if w.fed is None else w.fed.numel()
        C = w.cached
        visible = None if w.fed_visible is None or k == 0 else w.fed_visible[:k - 1].to(self.tokens.ids.device)
        fed = self.tokens.ids[C:C] if k == 0 else w.fed
        return self.tokens.final[C:C + k], self.tokens.ids[C:C + k], fed, visible

    # ---- the heads and the exactness record ----------------------------------------------------------
    def call_heads(self, network: torch.nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
        """One call of a draft head's network (self.heads.horizontal or .vertical) on inputs, without autograd:
        the one place the drafters call the heads, seen by the observers (the heads' share of a step's time and
        ops) and counted in counts.head_calls (the trace's)."""
        with torch.no_grad(), self.observer.heads():
            out = region(self.model, _call)(network, *inputs)
        self.counts.head_calls += 1
        return out

    def heads_network(self, network: torch.nn.Module):
        """A draft head's network as a function that runs as one region (static_cache.region) calls it: the network
        itself when the region compiles (its ops inside the graph; the caller counts the call), else through
        call_heads (observed and counted as every call)."""
        if compiles_regions(self.model):
            return network
        return lambda *inputs: self.call_heads(network, *inputs)

    def track_exactness(self, error_bound: torch.Tensor) -> None:
        """From now on note_near_ties marks the final decisions a raw-logit error of error_bound (0-d) could flip."""
        self.exact_error = error_bound

    def note_near_ties(self, raw: torch.Tensor, logp: torch.Tensor, a: int, n: int) -> None:
        """Mark the decisions just made final at the open image slots of ranks [a, a + n) that a raw-logit error
        of exact_error could flip (exactness.near_ties; raw [B, >= n, V] and logp [>= n, V] from the window's
        first open slot: only their first n rows, the final ones, are scored)."""
        if self.exact_error is None:
            return
        noise = None if self.settings.temperature == 0 else self.draws.noise.get(a, a + n)
        region(self.model, _mark_near_ties)(self.tokens.near_tie, self.index.image_ids[a:a + n], raw[:, :n],
                                            self.outputs.guided[:n], logp[:n], noise, self.settings, self.exact_error)


# ---- the per-step work that compiles as a region of its own (static_cache.region) ---------------------------
def _all_finite(x: torch.Tensor) -> torch.Tensor:
    return x.isfinite().all()


def _call(network: torch.nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    return network(*inputs)


def _begin_step(verified, fed_features, features, next_logits, logits) -> torch.Tensor:
    """The fed window's slots count one forward more, keep their features; -> [B, k + 1, V] the step's raw logits."""
    verified += 1
    fed_features.copy_(features)
    return torch.cat([next_logits[:, None], logits], dim=1)


def _stacked(values: tuple, kept: tuple | None, flags: list) -> torch.Tensor:
    """What the step's one host copy reads, as [n] long: the 0-d integer values, how many fed slots keep their keys
    (_kept of these inputs, unless None), the 0-d bool flags."""
    counted = [] if kept is None else [_kept(*kept)]
    return torch.stack([v.reshape(()).long() for v in values] + counted + [f.reshape(()).long() for f in flags])


def _kept(final, ids, fed, visible) -> torch.Tensor:
    """0-d: how many fed slots (their final flags and ids now, the ids fed) keep their keys: a prefix of final slots
    whose token did not change, none after a slot that was hidden (visible [k - 1]: whether each could be seen)."""
    ok = final & (ids == fed)
    if visible is not None:  # no slot before them was hidden when fed
        ok[1:] &= visible.cumprod(0).bool()
    return ok.long().cumprod(0).sum()


def _mark_near_ties(near_tie, slots, raw, guided, logp, noise, settings, error) -> None:
    """near_tie[slots] |= the decisions at those slots that a raw-logit error could flip (exactness.near_ties)."""
    near_tie[slots] |= near_ties(raw, guided, logp, noise, settings, error)


@dataclass(frozen=True)
class Branches:
    """Tokens a step feeds after its window that are no slot of the sequence: a draft tree's side branches (sjd-pac).
    Each stands at `slots[i]`'s position, sees the cache, the fed window's slots below `sees[i]`, its parent chain and
    itself; no window slot sees it, and its keys leave the cache after the step. Their raw logits reach the policy's
    update as run.outputs.branch_logits [B, m, V]."""

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
