"""Drafting with the heads: Hh chains along a row, Hv drafts a whole row from the row above."""
from __future__ import annotations

import torch

from ..run import Run


def feature(run: Run, slot: int) -> torch.Tensor:
    """[B, d] latest feature of a slot (-1: the prompt's last position)."""
    return run.prompt_features if slot < 0 else run.features[:, slot]


def _embed(run: Run, ids: torch.Tensor) -> torch.Tensor:
    return run.model.embed(ids[None])[0]  # [n] ids -> [n, d]


def draft(run: Run, target: int, pick) -> None:
    """Fill slots [run.end, target) with drafts; pick(logp [n, V], a, b) -> codes [n] for the image slots
    of ranks [a, b).

    Each image slot's draft distribution q comes from the feature of the slot before it. Features of new
    slots come from Hv (whole row at once, from the row above, shifted by heads.vertical_shift columns) or,
    in the first row, from an Hh chain.
    Heads with `vertical_left` draft a Hv row left to right: each cell's feature also reads the token just
    drafted there (acceptance.vertical_drafts).
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
            if heads.vertical_left:  # left to right: each cell's feature also reads the token drafted there
                codes = _chain(run, feature(run, s - 1), s, stop, pick, _left_step)
            else:  # the whole stretch in one call from the row above
                src = [_above(run, t) for t in range(s, stop)]
                with torch.no_grad():  # [B, n, d] -> h of `slots`
                    pred = heads.vertical(run.features[:, src], _embed(run, run.ids[src]))
                run.head_calls += 1
                prev = torch.cat([feature(run, s - 1)[:, None], pred[:, :-1]], dim=1)  # features predicting slots
                codes = pick(run.logp(run.model.image_logits(prev), slots, "heads"), run.rank[s], run.rank[stop])
                run.features[:, s:stop] = pred
        else:  # horizontal chain, one slot at a time
            codes = _chain(run, feature(run, s - 1), s, stop, pick)
        run.set_tokens(slots, codes)
        run.set_end(stop)
        s = run.end


def _chain(run: Run, prev: torch.Tensor, lo: int, hi: int, pick, step=None) -> torch.Tensor:
    """A chain along the image slots [lo, hi) of one row from prev [B, d], the feature of the slot before lo: each
    slot's code is pick's draw from the q of the feature before it, then its feature is step(run, t, prev, e(code),
    e(code before it in the chain, None at lo)) (default Hh(prev, e(code)); `_left_step` for a vertical_left Hv); the
    features are written. -> codes [hi - lo]."""
    picked, before = [], None
    for t in range(lo, hi):
        code = pick(run.logp(run.model.image_logits(prev[:, None]), run.slots(t, t + 1), "heads"), run.rank[t],
                    run.rank[t] + 1)
        picked.append(code)
        token = _embed(run, run.id_of_code[code])[0]
        with torch.no_grad():
            prev = run.heads.horizontal(prev, token) if step is None else step(run, t, prev, token, before)
        before = token
        run.features[:, t] = prev
        run.head_calls += 1
    return torch.cat(picked)


def _above(run: Run, t: int, right: int = 0) -> int:
    """The slot in the row above that Hv reads for the feature at slot t (heads.vertical_shift columns right,
    plus `right`; within the row above's image cells)."""
    stride = run.layout.row_stride
    first = (t // stride) * stride - stride
    return max(first, min(t - stride + run.heads.vertical_shift + right, first + run.layout.grid[1] - 1))


def _left_step(run: Run, t: int, prev: torch.Tensor, token: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
    """[B, d] a vertical_left Hv's feature at slot t (which drafts slot t + 1), below the first row: from the row
    above and t's token embedding [d] (not from prev, the feature on the left); vertical_left 2 also reads the
    token of slot t - 1 (`before`, drafted just before in this chain; None: the slot's id) and the cell above-left."""
    up, right = _above(run, t), _above(run, t, 1)
    if run.heads.vertical_left < 2:
        e = _embed(run, run.ids[[up, right]])  # [2, d]
        return run.heads.vertical(run.features[:, up], e[0], token, run.features[:, right], e[1])
    upleft = _above(run, t, -1)
    e = _embed(run, run.ids[[up, right, upleft] + ([t - 1] if before is None else [])])  # [3 or 4, d]
    before = e[3] if before is None else before
    return run.heads.vertical(run.features[:, up], e[0], token, run.features[:, right], e[1], before,
                              run.features[:, upleft], e[2])


def reanchor_row(run: Run, k: int, cells: int) -> None:
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
    run.set_tokens(run.slots(k + 1, stop), _chain(run, at_k, k + 1, stop, run.gumbel_sample))


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
