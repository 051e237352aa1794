"""Drafters: what proposes the window's new tokens, apart from the verification (the policies).

HeadsDrafter drafts with the heads (Hh chains along a row, Hv a row from the row above); RowCopyDrafter drafts
without them (copies of the row above); WindowDrafter keeps sjd's window of guesses. A policy holds drafter
objects and never asks whether heads exist (`drafter_for` does, once). The functions below are their parts."""
from __future__ import annotations

import torch

from ..run import Run
from ..sampling import inverse_cdf, processed
from ..static_cache import compiles_regions, region


def feature(run: Run, slot: int) -> torch.Tensor:
    """[B, d] latest feature of a slot (-1: the prompt's last position)."""
    return run.outputs.prompt_features if slot < 0 else run.outputs.features[:, slot]


def _embed(run: Run, ids: torch.Tensor) -> torch.Tensor:
    return run.model.embed(ids[None])[0]  # [n] ids -> [n, d]


def _embed_codes(run: Run, codes: torch.Tensor) -> torch.Tensor:
    """[n] image codes -> [n, d] their tokens' embeddings (one launch with compile 'compiled')."""
    return region(run.model, _code_embeddings)(run.model, run.index.id_of_code, codes)


def _code_embeddings(model, id_of_code: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    return model.embed(id_of_code[codes][None])[0]


class Drafter:
    """What a policy drafts with, apart from how it verifies (as transformers keeps its CandidateGenerator apart
    from the verify loop): `draft` proposes tokens for the window's new slots [run.window.end, target) (get candidates),
    `corrected` hears that the verifier corrected a slot under the exact rule (update), so that the drafter may
    re-draft the window's cells after it. A policy holds its drafters (made in its `begin`, one per run)."""

    uses_heads = False  # it drafts with the run's heads (bench and stats say so)

    def draft(self, run: Run, target: int, latest: torch.Tensor | None = None, can_sync: bool = False) -> None:
        """Fill the slots [run.window.end, target) with drafts and move the window's end there; latest [V]: the
        verifier's latest log p (the exact rule's outputs), for drafters that start from it. can_sync: nothing
        was copied to the host in this step yet, so the drafter may make the step's one copy (Run.sync)."""
        raise NotImplementedError

    def corrected(self, run: Run, slot: int) -> None:
        """The verifier just corrected `slot` (final, not yet fed); the window's later cells keep the verifier's
        outputs unless the drafter re-drafts them."""


class RowCopyDrafter(Drafter):
    """Without heads: a cell below the first row starts as a copy of the cell above; a first-row cell as the
    Gumbel pick of the verifier's latest log p with its own slot's noise (draft_without_heads)."""

    def draft(self, run: Run, target: int, latest: torch.Tensor | None = None, can_sync: bool = False) -> None:
        draft_without_heads(run, target, latest)


def coupled(run: Run, logp: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The exact rule's pick: the Gumbel-max draw of log p [n, V] with each slot's own noise (image ranks [a, b)),
    the draw the verifier makes for the same slot and distribution."""
    return run.draws.gumbel_sample(logp, a, b)


def sampled(run: Run, logp: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The lossy rule's pick (ssd): an independent draw from each q = exp(log p) [n, V] by the run's generator,
    q recorded for the acceptance test (put_q)."""
    p = logp.exp()
    run.draws.put_q(a, p)
    return run.draws.sample_probs(p)


class HeadsDrafter(Drafter):
    """Drafts with the heads: an Hh chain along the first row, Hv for the rows below (from the row above;
    vertical_left heads left to right, or by `sweeps` Jacobi sweeps over the whole row, _jacobi_row); after a
    correction, an Hh chain re-drafts the cells after the corrected token (reanchor_row).

    pick(run, logp [n, V], a, b) -> codes [n] for the image slots of ranks [a, b): `coupled` (the exact rule) or
    `sampled` (ssd; its left-to-right rows are found by certified sweeps, _certified_row, when the step may copy
    to the host: the same drafts for ~2.5x fewer ops). redraft: cells re-drafted after a correction in the first
    row (None: the rest of the row); one cell below it."""

    uses_heads = True

    def __init__(self, pick=coupled, sweeps: int = 0, redraft: int | None = None):
        self.pick, self.sweeps, self.redraft = pick, sweeps, redraft

    def draft(self, run: Run, target: int, latest: torch.Tensor | None = None, can_sync: bool = False) -> None:
        sweeps = CERTIFY_SWEEPS_COMPILED if compiles_regions(run.model) else CERTIFY_SWEEPS
        certify = sweeps if self.pick is sampled and can_sync else 0
        draft(run, target, lambda logp, a, b: self.pick(run, logp, a, b), self.sweeps, certify)

    def corrected(self, run: Run, slot: int) -> None:
        first_row = slot < run.layout.row_stride
        cells = (self.redraft or run.layout.grid[1]) if first_row else 1
        reanchor_row(run, slot, cells)


def drafter_for(run: Run, use_heads: bool = True, **options) -> Drafter:
    """The drafter of a decoder that drafts with heads when the run has them (and `use_heads`): HeadsDrafter(
    **options), else RowCopyDrafter. The one place that asks whether there are heads."""
    return HeadsDrafter(**options) if use_heads and run.heads is not None else RowCopyDrafter()


CERTIFY_SWEEPS = 6  # ssd's rows below: Jacobi sweeps before the one host copy (_certified_row; the fewest ops
#                    on the bundled model: 6-7 sweeps, then ~4 cells a row left to the chain)
CERTIFY_SWEEPS_COMPILED = 9  # the same with compile 'compiled', where a sweep is one launch and a chain's cell five
#                    (bundled model, 24x24, seed 7: 6 / 9 / 12 sweeps -> 41.2 / 35.6 / 34.3 eager ops a step)


def draft(run: Run, target: int, pick, jacobi: int = 0, certify: int = 0) -> None:
    """Fill slots [run.window.end, target) with drafts; pick(logp [n, V], a, b) -> codes [n] for the image slots
    of ranks [a, b).

    Each image slot's draft distribution q comes from the feature of the slot before it. Features of new
    slots come from Hv (whole row at once, from the row above, shifted by heads.vertical_shift columns) or,
    in the first row, from an Hh chain.
    Heads with `vertical_left` draft a Hv row left to right: each cell's feature also reads the token just
    drafted there (acceptance.vertical_drafts); jacobi > 0: instead, every cell of the stretch at once, that
    many sweeps from the row above's tokens (_jacobi_row: a few head calls a row instead of one per cell).
    certify > 0 (`sampled` picks, once a step): the left-to-right drafts themselves, by that many sweeps and one
    host copy (_certified_row; at most one row of a step, since a step copies once).
    """
    heads, stride = run.heads, run.layout.row_stride
    W = run.layout.grid[1]
    s = run.window.end
    target = min(target, run.index.L)
    while s < target:
        _forced_features(run, s)
        row_start = (s // stride) * stride
        stop = min(target, row_start + W)  # image cells of this row to draft now
        slots = run.index.slots(s, stop)
        if s >= stride:  # vertical: from the row above
            if heads.vertical_left and jacobi and stop - s > 1:  # the whole stretch at once, a few sweeps
                codes = _jacobi_row(run, s, stop, pick, jacobi)
            elif heads.vertical_left and certify and stop - s > 1:  # the chain's drafts, found by sweeps
                codes = _certified_row(run, s, stop, certify)
                certify = 0  # the step's one host copy is made
            elif heads.vertical_left:  # left to right: each cell's feature also reads the token drafted there
                codes = _chain(run, feature(run, s - 1), s, stop, pick, _left_steps(run, s, stop))
            else:  # the whole stretch in one call from the row above
                src = [_above(run, t) for t in range(s, stop)]
                above = run.outputs.features[:, src], _embed(run, run.tokens.ids[src])  # the cells above
                pred = run.call_heads(heads.vertical, *above)  # [B, n, d]
                prev = torch.cat([feature(run, s - 1)[:, None], pred[:, :-1]], dim=1)  # features predicting slots
                run.check_heads(prev, slots)
                before = run.index.images_before
                codes = pick(run.draft_logp(prev, slots), before[s], before[stop])
                run.outputs.set_features(slice(s, stop), pred)
        else:  # horizontal chain, one slot at a time
            codes = _chain(run, feature(run, s - 1), s, stop, pick)
        run.tokens.write(slots, codes)
        run.window.set_end(stop)
        s = run.window.end


def _chain(run: Run, prev: torch.Tensor, lo: int, hi: int, pick, step=None, last_feature: bool = True,
           before: torch.Tensor | None = None) -> torch.Tensor:
    """A chain along the image slots [lo, hi) of one row from prev [B, d], the feature of the slot before lo: each
    slot's code is pick's draw from the q of the feature before it, then its feature is step(run, t, prev, e(code),
    e(code before it in the chain; at lo `before`, None: the step's own)) (default Hh(prev, e(code)); `_left_steps`
    for a vertical_left Hv); the features are written (last_feature False: not the last slot's, which nothing
    drafts from); the features that drafted the slots are checked once (Run.check_heads). -> codes [hi - lo]."""
    picked, made = [], [prev]
    for t in range(lo, hi):
        r = run.index.images_before[t]
        code = pick(run.draft_logp(prev[:, None], run.index.slots(t, t + 1)), r, r + 1)
        picked.append(code)
        if t == hi - 1 and not last_feature:
            break
        token = _embed_codes(run, code)[0]
        prev = run.call_heads(run.heads.horizontal, prev, token) if step is None else step(run, t, prev, token, before)
        before = token
        made.append(prev)
    feats = torch.stack(made, 1)  # [B, 1 + written, d]: the feature before lo, then those of lo, lo + 1, ...
    run.check_heads(feats[:, :hi - lo], run.index.slots(lo, hi))
    run.outputs.set_features(slice(lo, lo + len(made) - 1), feats[:, 1:])  # one write for the chain
    return torch.cat(picked)


def _jacobi_row(run: Run, lo: int, hi: int, pick, sweeps: int) -> torch.Tensor:
    """Drafts of the image slots [lo, hi) of one row below the first, all cells at once: each sweep computes
    every cell's vertical_left Hv feature from the row above and the current tokens on its left, then every
    cell's code from the feature before it; the first guess is the row above's tokens. The left-to-right
    chain (_chain with _left_steps) is the fixed point this iteration reaches after at most hi - lo sweeps; a
    few sweeps give nearly its drafts for `sweeps` + 1 head calls instead of hi - lo (the rest of the
    per-cell ops alike). -> codes [hi - lo]; the features are written."""
    slots = run.index.slots(lo, hi)  # [n]
    above, before_lo = _row_above(run, lo, hi)
    codes = run.tokens.codes[slots - run.layout.row_stride]  # [n] first guess: the row above's tokens
    start = feature(run, lo - 1)[:, None]  # [B, 1, d] the feature that drafts slot lo
    for sweep in range(sweeps + 1):
        tokens = _embed_codes(run, codes)  # [n, d] the current tokens
        feats = _vertical(run, above, tokens, torch.cat([before_lo, tokens[:-1]]))  # [B, n, d] each cell's feature
        if sweep == sweeps:
            break
        prev = torch.cat([start, feats[:, :-1]], dim=1)  # [B, n, d] the features predicting the slots
        run.check_heads(prev, slots)
        before = run.index.images_before
        codes = pick(run.draft_logp(prev, slots), before[lo], before[hi])
    run.outputs.set_features(slice(lo, hi), feats)
    return codes


def _certified_row(run: Run, lo: int, hi: int, sweeps: int) -> torch.Tensor:
    """ssd's drafts of the image slots [lo, hi) of a row below the first with vertical_left heads: exactly the
    left-to-right chain's (each cell an independent draw from its q, the same numbers of the run's generator), for
    `sweeps` Jacobi sweeps over the whole row, one host copy and a chain over the cells the sweeps left uncertain.

    Each cell's draw is made first (`uniforms`, the numbers the chain takes one a cell), so a cell's code is a
    function of the two codes on its left: code[t] = F_t(code[t-1], code[t-2]). Each sweep applies every F_t to the
    last sweep's codes (the first guess: the row above's tokens). If the last sweep moved no code before cell m,
    the inputs of every cell up to m were already their final values, so codes [0, m] are the chain's (Jacobi's
    fixed point, reached from the left). The host learns m with the step's one copy (Run.sync); the chain drafts
    the cells after m. Bundled model: 6 sweeps leave ~4 of 24 cells to the chain (measured: the chain ~1,070 ops
    a row, this ~400). The q of every drafted cell is recorded, the features written, as the chain does."""
    stride, a, n = run.layout.row_stride, run.index.images_before[lo], hi - lo
    slots = run.index.slots(lo, hi)
    u = run.draws.uniforms_ahead(n)  # [n, 1] the chain's draws, one a cell in slot order
    parts = _row_above(run, lo, hi)
    above, before_lo = parts
    start = feature(run, lo - 1)[:, None]  # [B, 1, d] the feature that drafts slot lo
    codes = run.tokens.codes[slots - stride]  # the first guess: the row above's tokens
    sweep, network = region(run.model, _sweep), run.heads_network(run.heads.vertical)
    for k in range(sweeps):
        codes, p, feats, prev, finite, m = sweep(run.model, network, run.settings, run.index.id_of_code, codes,
                                                 above, before_lo, start, u, k == sweeps - 1)
        run.counts.head_calls += network is run.heads.vertical  # (else call_heads counted it)
    run.check_heads(prev, slots, finite)
    m = run.sync(m)[0]  # cells before the first that the last sweep moved
    if m >= n:  # a fixed point: every code, q and feature is the chain's
        run.draws.put_q(a, p)
        run.outputs.set_features(slice(lo, hi), feats)
        return codes
    run.outputs.set_features(slice(lo, lo + m), feats[:, :m])  # features of cells whose two codes were final
    qs = [p[:m + 1]]
    step = _left_steps(run, lo, hi, parts)
    e = _embed_codes(run, codes[max(m - 1, 0):m + 1])  # [1 or 2, d] the codes of cells m-1, m
    f = step(run, lo + m, None, e[-1], e[0] if m > 0 else None)  # the feature at cell m, which drafts cell m + 1
    run.outputs.set_features(lo + m, f)
    if m + 1 < n:
        def pick(logp, i, j):  # the chain's draw with the cell's own uniform
            q = logp.exp()
            qs.append(q)
            return run.draws.sample_probs(q, u[i - a:j - a])

        codes = torch.cat([codes[:m + 1], _chain(run, f, lo + m + 1, hi, pick, step, before=e[-1])])
    run.draws.put_q(a, torch.cat(qs))
    return codes


def _sweep(model, network, settings, id_of_code, codes, above, before_lo, start, u, last: bool):
    """One Jacobi sweep of a certified row (_certified_row; one launch with compile 'compiled'): the current codes
    [n] -> (the codes each cell's q draws now with its uniform u [n, 1], those q [n, V], each cell's feature
    [B, n, d], the features that drafted the cells [B, n, d], 0-d bool: those are finite, 0-d: the cells before the
    first whose code moved; the last two None unless `last`). above, before_lo: _row_above's; start [B, 1, d]: the
    feature that drafts the first cell."""
    tokens = _code_embeddings(model, id_of_code, codes)  # [n, d] the current codes' embeddings
    feats = network(*_vertical_inputs(above, tokens, torch.cat([before_lo, tokens[:-1]])))  # [B, n, d]
    prev = torch.cat([start, feats[:, :-1]], dim=1)  # [B, n, d] the features drafting the cells
    q = processed(model.image_logits(prev), settings)[1].exp()  # [n, V] each cell's draft distribution
    moved = inverse_cdf(q, u)
    if not last:
        return moved, q, feats, prev, None, None
    return moved, q, feats, prev, prev.isfinite().all(), (moved == codes).long().cumprod(0).sum()


def _above(run: Run, t: int, right: int = 0) -> int:
    """The slot in the row above that Hv reads for the feature at slot t (heads.vertical_shift columns right,
    plus `right`; within the row above's image cells)."""
    stride = run.layout.row_stride
    first = (t // stride) * stride - stride
    return max(first, min(t - stride + run.heads.vertical_shift + right, first + run.layout.grid[1] - 1))


def _row_above(run: Run, lo: int, hi: int) -> tuple[list, torch.Tensor]:
    """What a vertical_left Hv reads from the row above for the cells [lo, hi) of a row below the first, looked up
    once: -> ([(features [B, n, d], token embeddings [n, d])] of the cell above and above-right, and at level 2
    above-left, in Hv's order; [1, d] the embedding of the token before lo)."""
    columns = (0, 1, -1) if run.heads.vertical_left >= 2 else (0, 1)
    slots = [[_above(run, t, k) for t in range(lo, hi)] for k in columns]
    e = _embed(run, run.tokens.ids[[t for c in slots for t in c] + [lo - 1]])  # one lookup for the whole stretch
    n = hi - lo
    return [(run.outputs.features[:, c], e[i * n:(i + 1) * n]) for i, c in enumerate(slots)], e[-1:]


def _vertical(run: Run, above: list, token: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """A vertical_left Hv's features from the row above's parts (_row_above, or one cell of them), the drafted
    cells' token embeddings and (level 2) the embeddings of the tokens just before them."""
    return run.call_heads(run.heads.vertical, *_vertical_inputs(above, token, before))


def _vertical_inputs(above: list, token: torch.Tensor, before: torch.Tensor) -> tuple:
    """The inputs of a vertical_left Hv, in its order (see _vertical)."""
    (f_up, e_up), (f_right, e_right), *upleft = above
    return (f_up, e_up, token, f_right, e_right, *([before, *upleft[0]] if upleft else []))


def _left_steps(run: Run, lo: int, hi: int, parts: tuple | None = None):
    """The step of a vertical_left Hv chain over slots [lo, hi) of a row below the first: step(run, t, prev, token,
    before) -> [B, d] the feature at slot t (which drafts slot t + 1), from the row above and t's token embedding
    [d] (not from prev, the feature on the left); vertical_left 2 also reads the token of slot t - 1 (`before`,
    drafted just before in this chain; None at lo: the slot's id) and the cell above-left. The row above's parts
    are looked up once for the whole chain (_row_above; `parts`: already looked up)."""
    above, before_lo = parts or _row_above(run, lo, hi)

    def step(run: Run, t: int, prev: torch.Tensor, token: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
        i = t - lo
        return _vertical(run, [(f[:, i], e[i]) for f, e in above], token, before_lo[0] if before is None else before)

    return step


def reanchor_row(run: Run, k: int, cells: int) -> None:
    """Slot k's token was just corrected (final, not yet fed): re-draft up to `cells` window slots after it in
    its row by an Hh chain from the exact feature before k and k's token, Gumbel-coupled as every exact draft
    is (the verifier's outputs there saw the rejected token)."""
    stride, W = run.layout.row_stride, run.layout.grid[1]
    stop = min((k // stride) * stride + W, run.window.end, k + 1 + cells)  # cells of this row inside the window
    if k + 1 >= stop:
        return
    before, token = feature(run, k - 1), _embed(run, run.tokens.ids[k:k + 1])[0]
    at_k = run.call_heads(run.heads.horizontal, before, token)  # [B, d] the feature at k
    # the last re-drafted slot's feature is not written (one Hh call fewer): no draft of this window reads it
    codes = _chain(run, at_k, k + 1, stop, run.draws.gumbel_sample, last_feature=False)
    run.tokens.write(run.index.slots(k + 1, stop), codes)


def _forced_features(run: Run, s: int) -> None:
    """Forced slots just before slot s that no forward has fed yet (a row end in a drafted block): their
    features continue the horizontal chain, so that slot s is not drafted from an empty feature."""
    f = s
    while f > 0 and not run.index.is_image(f - 1) and f - 1 >= run.window.fed_end:
        f -= 1
    for t in range(f, s):
        token = _embed(run, run.tokens.ids[t:t + 1])[0]
        run.outputs.set_features(t, run.call_heads(run.heads.horizontal, feature(run, t - 1), token))


def rows_end(run: Run, first_slot: int, rows: int) -> int:
    """The slot after the last slot of the `rows` rows starting at the row of `first_slot`."""
    stride = run.layout.row_stride
    H = run.layout.grid[0]
    last_row = min(H, first_slot // stride + rows)
    return run.index.L if last_row >= H else last_row * stride


def draft_without_heads(run: Run, target: int, first_row_logp: torch.Tensor | None = None) -> None:
    """Fill slots [run.window.end, target) without heads: a cell below the first row starts as a copy of the cell
    above; a first-row cell as the Gumbel pick of `first_row_logp` [V] (the verifier's latest log p) with
    its own slot's noise (nothing is drafted in the first row without it). Forced slots keep their ids."""
    stride = run.layout.row_stride
    target = min(target, run.index.L)
    while run.window.end < target:
        s = run.window.end
        stop = min(target, (s // stride + 1) * stride)  # this row (its forced slots are skipped)
        a, b = run.index.images_before[s], run.index.images_before[stop]
        if b > a:
            slots = run.index.image_ids[a:b]
            if s >= stride:  # copies of the row above (drafted before this row)
                codes = run.tokens.codes[slots - stride]
            elif first_row_logp is not None:
                codes = run.draws.gumbel_sample(first_row_logp[None].expand(b - a, -1), a, b)
            else:
                return
            run.tokens.write(slots, codes)
        run.window.set_end(stop)


class WindowDrafter(Drafter):
    """sjd's guesses (as its authors release them): the window keeps `window` open image slots, grown a row (or
    less) at a time; a new cell starts as the token above it (q one-hot on it), in the first row (or with nothing
    drafted above) as a uniform random code (q uniform).

    above False: every new cell a uniform random code (the peers' 'random' initialisation: scd, gsd, sjd-pac);
    random_q: the q recorded for a random code, "uniform" (what it was drawn from) or "onehot" (on the code: the
    scores SJD's, SCD's and GSD's get_multi_token_for_preparation give it; a draft that is certain, which the
    min(1, p/q) test and its residual keep lossless too)."""

    def __init__(self, window: int, above: bool = True, random_q: str = "uniform"):
        self.window, self.above, self.onehot = window, above, random_q == "onehot"

    def draft(self, run: Run, target: int, latest: torch.Tensor | None = None, can_sync: bool = False) -> None:
        stride, V, win = run.layout.row_stride, run.index.V, run.window
        while win.end < min(target, run.index.L):
            a, b = win.open_span(win.cached, win.end)
            need = self.window - max(0, b - a)
            if need <= 0:
                return
            s = win.end
            lo = run.index.images_before[s]
            hi = min(lo + need, run.index.images_before[min(run.index.L, s + stride)])  # slots above: drafted already
            if hi <= lo:
                return
            slots = run.index.image_ids[lo:hi]
            above = run.tokens.codes[(slots - stride).clamp(min=0)]
            first_row = (slots < stride) | (above < 0) | (not self.above)  # nothing above: uniform random
            codes = torch.where(first_row, run.draws.random_codes(hi - lo), above)
            onehot = torch.nn.functional.one_hot(codes, V).float()
            q = torch.where(first_row[:, None] & (not self.onehot), 1.0 / V, onehot)
            run.tokens.write(slots, codes)
            run.draws.put_q(lo, q)
            win.set_end(run.index.image_slots[hi - 1] + 1)
