"""Drafting with the heads: Hh chains along a row, Hv drafts a whole row from the row above."""
from __future__ import annotations

import torch

from ..run import Run


def feature(run: Run, slot: int) -> torch.Tensor:
    """[B, d] latest feature of a slot (-1: the prompt's last position)."""
    return run.prompt_features if slot < 0 else run.features[:, slot]


def _embed(run: Run, ids: torch.Tensor) -> torch.Tensor:
    return run.model.embed(ids[None])[0]  # [n] ids -> [n, d]


def draft(run: Run, target: int, pick, jacobi: int = 0) -> None:
    """Fill slots [run.end, target) with drafts; pick(logp [n, V], a, b) -> codes [n] for the image slots
    of ranks [a, b).

    Each image slot's draft distribution q comes from the feature of the slot before it. Features of new
    slots come from Hv (whole row at once, from the row above, shifted by heads.vertical_shift columns) or,
    in the first row, from an Hh chain.
    Heads with `vertical_left` draft a Hv row left to right: each cell's feature also reads the token just
    drafted there (acceptance.vertical_drafts); jacobi > 0: instead, every cell of the stretch at once, that
    many sweeps from the row above's tokens (_jacobi_row: a few head calls a row instead of one per cell).
    """
    heads, stride = run.heads, run.layout.row_stride
    W = run.layout.grid[1]
    s = run.end
    target = min(target, run.L)
    while s < target:
        _forced_features(run, s)
        row_start = (s // stride) * stride
        stop = min(target, row_start + W)  # image cells of this row to draft now
        slots = run.slots(s, stop)
        if s >= stride:  # vertical: from the row above
            if heads.vertical_left and jacobi and stop - s > 1:  # the whole stretch at once, a few sweeps
                codes = _jacobi_row(run, s, stop, pick, jacobi)
            elif heads.vertical_left:  # left to right: each cell's feature also reads the token drafted there
                codes = _chain(run, feature(run, s - 1), s, stop, pick, _left_steps(run, s, stop))
            else:  # the whole stretch in one call from the row above
                src = [_above(run, t) for t in range(s, stop)]
                with torch.no_grad():  # [B, n, d] -> h of `slots`
                    pred = heads.vertical(run.features[:, src], _embed(run, run.ids[src]))
                run.head_calls += 1
                prev = torch.cat([feature(run, s - 1)[:, None], pred[:, :-1]], dim=1)  # features predicting slots
                run.check_heads(prev, slots)
                codes = pick(run.logp(run.model.image_logits(prev), slots, "heads"), run.rank[s], run.rank[stop])
                run.features[:, s:stop] = pred
        else:  # horizontal chain, one slot at a time
            codes = _chain(run, feature(run, s - 1), s, stop, pick)
        run.set_tokens(slots, codes)
        run.set_end(stop)
        s = run.end


def _chain(run: Run, prev: torch.Tensor, lo: int, hi: int, pick, step=None, last_feature: bool = True) -> torch.Tensor:
    """A chain along the image slots [lo, hi) of one row from prev [B, d], the feature of the slot before lo: each
    slot's code is pick's draw from the q of the feature before it, then its feature is step(run, t, prev, e(code),
    e(code before it in the chain, None at lo)) (default Hh(prev, e(code)); `_left_steps` for a vertical_left Hv); the
    features are written (last_feature False: not the last slot's, which nothing drafts from). -> codes [hi - lo]."""
    picked, before = [], None
    run.check_heads(prev, run.slots(lo, lo + 1))  # the feature drafting lo (the rest: checked below)
    for t in range(lo, hi):
        code = pick(run.logp(run.model.image_logits(prev[:, None]), run.slots(t, t + 1), "heads"), run.rank[t],
                    run.rank[t] + 1)
        picked.append(code)
        if t == hi - 1 and not last_feature:
            break
        token = _embed(run, run.id_of_code[code])[0]
        with torch.no_grad():
            prev = run.heads.horizontal(prev, token) if step is None else step(run, t, prev, token, before)
        before = token
        run.features[:, t] = prev
        run.head_calls += 1
    if hi - lo > 1:
        run.check_heads(run.features[:, lo:hi - 1], run.slots(lo + 1, hi))
    return torch.cat(picked)


def _jacobi_row(run: Run, lo: int, hi: int, pick, sweeps: int) -> torch.Tensor:
    """Drafts of the image slots [lo, hi) of one row below the first, all cells at once: each sweep computes
    every cell's vertical_left Hv feature from the row above and the current tokens on its left, then every
    cell's code from the feature before it; the first guess is the row above's tokens. The left-to-right
    chain (_chain with _left_steps) is the fixed point this iteration reaches after at most hi - lo sweeps; a
    few sweeps give nearly its drafts for `sweeps` + 1 head calls instead of hi - lo (the rest of the
    per-cell ops alike). -> codes [hi - lo]; the features are written."""
    slots = run.slots(lo, hi)  # [n]
    above, before_lo = _row_above(run, lo, hi)
    codes = run.codes[slots - run.layout.row_stride]  # [n] first guess: the row above's tokens
    start = feature(run, lo - 1)[:, None]  # [B, 1, d] the feature that drafts slot lo
    for sweep in range(sweeps + 1):
        tokens = _embed(run, run.id_of_code[codes])  # [n, d] the current tokens
        with torch.no_grad():  # [B, n, d] each cell's feature (it drafts the cell after it)
            feats = _vertical(run, above, tokens, torch.cat([before_lo, tokens[:-1]]))
        run.head_calls += 1
        if sweep == sweeps:
            break
        prev = torch.cat([start, feats[:, :-1]], dim=1)  # [B, n, d] the features predicting the slots
        run.check_heads(prev, slots)
        codes = pick(run.logp(run.model.image_logits(prev), slots, "heads"), run.rank[lo], run.rank[hi])
    run.features[:, lo:hi] = feats
    return codes


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
    e = _embed(run, run.ids[[t for c in slots for t in c] + [lo - 1]])  # one lookup for the whole stretch
    n = hi - lo
    return [(run.features[:, c], e[i * n:(i + 1) * n]) for i, c in enumerate(slots)], e[-1:]


def _vertical(run: Run, above: list, token: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """A vertical_left Hv's features from the row above's parts (_row_above, or one cell of them), the drafted
    cells' token embeddings and (level 2) the embeddings of the tokens just before them."""
    (f_up, e_up), (f_right, e_right), *upleft = above
    more = [before, *upleft[0]] if upleft else []
    return run.heads.vertical(f_up, e_up, token, f_right, e_right, *more)


def _left_steps(run: Run, lo: int, hi: int):
    """The step of a vertical_left Hv chain over slots [lo, hi) of a row below the first: step(run, t, prev, token,
    before) -> [B, d] the feature at slot t (which drafts slot t + 1), from the row above and t's token embedding
    [d] (not from prev, the feature on the left); vertical_left 2 also reads the token of slot t - 1 (`before`,
    drafted just before in this chain; None at lo: the slot's id) and the cell above-left. The row above's parts
    are looked up once for the whole chain (_row_above)."""
    above, before_lo = _row_above(run, lo, hi)

    def step(run: Run, t: int, prev: torch.Tensor, token: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
        i = t - lo
        return _vertical(run, [(f[:, i], e[i]) for f, e in above], token, before_lo[0] if before is None else before)

    return step


def reanchor_row(run: Run, k: int, cells: int, last_feature: bool = False) -> None:
    """Slot k's token was just corrected (final, not yet fed): re-draft up to `cells` window slots after it in
    its row by an Hh chain from the exact feature before k and k's token, Gumbel-coupled as every exact draft
    is (the verifier's outputs there saw the rejected token)."""
    stride, W = run.layout.row_stride, run.layout.grid[1]
    stop = min((k // stride) * stride + W, run.end, k + 1 + cells)  # cells of this row inside the window
    if k + 1 >= stop:
        return
    with torch.no_grad():
        at_k = run.heads.horizontal(feature(run, k - 1), _embed(run, run.ids[k:k + 1])[0])  # [B, d] feature at k
    run.head_calls += 1
    # last_feature False: the last re-drafted slot's old feature stays (the window's next rows are drafted already)
    run.set_tokens(run.slots(k + 1, stop), _chain(run, at_k, k + 1, stop, run.gumbel_sample, last_feature=last_feature))


def _forced_features(run: Run, s: int) -> None:
    """Forced slots just before slot s that no forward has fed yet (a row end in a drafted block): their
    features continue the horizontal chain, so that slot s is not drafted from an empty feature."""
    f = s
    while f > 0 and not run.is_image(f - 1) and f - 1 >= run.fed_hi:
        f -= 1
    for t in range(f, s):
        with torch.no_grad():
            run.features[:, t] = run.heads.horizontal(feature(run, t - 1), _embed(run, run.ids[t:t + 1])[0])
        run.head_calls += 1


def rows_end(run: Run, first_slot: int, rows: int) -> int:
    """The slot after the last slot of the `rows` rows starting at the row of `first_slot`."""
    stride = run.layout.row_stride
    H = run.layout.grid[0]
    last_row = min(H, first_slot // stride + rows)
    return run.L if last_row >= H else last_row * stride


def draft_without_heads(run: Run, target: int, first_row_logp: torch.Tensor | None = None) -> None:
    """Fill slots [run.end, target) without heads: a cell below the first row starts as a copy of the cell
    above; a first-row cell as the Gumbel pick of `first_row_logp` [V] (the verifier's latest log p) with
    its own slot's noise (nothing is drafted in the first row without it). Forced slots keep their ids."""
    stride = run.layout.row_stride
    target = min(target, run.L)
    while run.end < target:
        s = run.end
        stop = min(target, (s // stride + 1) * stride)  # this row (its forced slots are skipped)
        a, b = run.rank[s], run.rank[stop]
        if b > a:
            slots = run.image_ids[a:b]
            if s >= stride:  # copies of the row above (drafted before this row)
                codes = run.codes[slots - stride]
            elif first_row_logp is not None:
                codes = run.gumbel_sample(first_row_logp[None].expand(b - a, -1), a, b)
            else:
                return
            run.set_tokens(slots, codes)
        run.set_end(stop)
