"""What decides acceptance: the overlap sum_v min(p, q) of the processed (guided, temperature, top-k/top-p)
distributions of the verifier (p) and of the draft (q). A draft x ~ q is accepted with probability
min(1, p(x)/q(x)), so its expected acceptance is exactly sum_v min(p_v, q_v).

Offline (teacher-forced grids, `heads_acceptance`): per head, the horizontal head by chain depth (its
drafts along a row, each from its own previous output, as in row 0), the vertical head by column.
In a run (`record_checks` from the ssd policy, `summarize_checks` in traces and bench): the accepted share
and the expected acceptance of every check, by verify round and, in round 0, by column.
"""
from __future__ import annotations

import torch

from .sampling import SamplerSettings, guide, log_probs

DEPTH_BUCKETS = ((1, 5), (6, 11), (12, 23), (24, 10_000))


def overlap(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """[..., V] log p, log q -> [...] sum_v min(p_v, q_v): the expected acceptance of a draft x ~ q under p."""
    return torch.minimum(logp.exp(), logq.exp()).sum(-1)


def guided_logp(model, feats: torch.Tensor, settings: SamplerSettings) -> torch.Tensor:
    """Per-stream features [N, S, ..., d] (S = 2 with CFG: conditional, unconditional) -> processed log p
    [N, ..., V] as the sampler sees it: guided (min-p), then temperature / top-k / top-p."""
    logits = model.image_logits(feats).transpose(0, 1)  # [S, N, ..., V]
    return log_probs(guide(logits, settings.cfg, settings.min_p), settings)


def horizontal_chain(heads, h: torch.Tensor, e: torch.Tensor, layout, depth: int | None = None) -> torch.Tensor:
    """Hh unrolled along every row from the true feature before the row's first cell, on its own outputs.

    h [N, S, L+1, d] teacher-forced features (index j+1 = slot j, 0 = prompt end); e [N, L, d] embeddings.
    -> [N, S, H, D, d]: the chain's feature after k+1 steps (k < D = depth or W-1), which drafts cell k+1.
    """
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    D = min(W - 1, depth or W - 1)
    f = h[:, :, cells[:, 0]]  # [N, S, H, d]: the feature of the slot before each row (prompt end for row 0)
    out = []
    for k in range(D):
        f = heads.horizontal(f, e[:, None, cells[:, k]].expand(-1, h.shape[1], -1, -1))
        out.append(f)
    return torch.stack(out, dim=3)


def vertical_drafts(heads, h: torch.Tensor, e: torch.Tensor, layout, all_columns: bool = False) -> torch.Tensor:
    """Hv on the row above: [N, S, H-1, W-1, d] the feature predicted at cell (y, x) for y >= 1, x < W-1,
    which drafts cell (y, x+1) (all_columns: x < W, [N, S, H-1, W, d]); Hv reads cell (y-1, x + shift)
    (heads.vertical_shift, clamped to the last column); with heads.vertical_left also the token at (y, x), the
    one drafted on the left of cell (y, x+1) (here the true token: teacher-forced), and cell (y-1, x + shift + 1);
    with vertical_left 2 also the token of the slot before (y, x) and cell (y-1, x + shift - 1)."""
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    S = h.shape[1]
    n = W if all_columns else W - 1
    x = torch.arange(n)
    above = cells[:-1][:, (x + heads.vertical_shift).clamp(max=W - 1)]  # the cell Hv reads for each (y, x)
    cell_input = lambda c: (h[:, :, c + 1], e[:, None, c].expand(-1, S, -1, -1, -1))  # noqa: E731 (its h, e)
    if not heads.vertical_left:
        return heads.vertical(*cell_input(above))
    right = cells[:-1][:, (x + heads.vertical_shift + 1).clamp(max=W - 1)]  # the cell above-right
    token = lambda c: e[:, None, c].expand(-1, S, -1, -1, -1)  # noqa: E731
    more = [token(cells[1:, :n]), *cell_input(right)]  # the token on the left of the drafted cell, above-right
    if heads.vertical_left == 2:  # the token before that one, the cell above-left
        more += [token(cells[1:, :n] - 1), *cell_input(cells[:-1][:, (x + heads.vertical_shift - 1).clamp(0, W - 1)])]
    return heads.vertical(*cell_input(above), *more)


@torch.no_grad()
def heads_acceptance(model, heads, h: torch.Tensor, ids: torch.Tensor, layout, settings: SamplerSettings,
                     chunk: int = 8, h_stale: torch.Tensor | None = None) -> dict:
    """Expected acceptance of the heads' drafts on teacher-forced grids h [N, S, L+1, d], ids [N, L].

    horizontal: row chains (the first row's drafts), by depth 1..W-1; vertical: by drafted column 1..W-1;
    expected: both over every head-drafted cell as ssd drafts them (row 0 by Hh, the rows below by Hv).
    Top-1 agreement of the guided argmax beside it. h_stale [N, S, L+1, d]: features of the same grids with
    some tokens changed (as a row's features from before its last verify round): also scores Hv on them
    (`vertical_stale_expected`, the realistic figure).
    """
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    dev, dtype = model.device, model.dtype
    sums = {"h": torch.zeros(W - 1), "v": torch.zeros(W - 1), "h0": torch.zeros(W - 1),
            "h_top1": torch.zeros(W - 1), "v_top1": torch.zeros(W - 1), "v_stale": torch.zeros(W - 1)}
    n = 0
    for b in range(0, h.shape[0], chunk):
        hb = h[b:b + chunk].to(dev, dtype)
        e = model.embed(ids[b:b + chunk].to(dev))
        p = guided_logp(model, hb[:, :, cells[:, 1:]], settings)  # [n, H, W-1, V] true p of cells x >= 1
        qh = guided_logp(model, horizontal_chain(heads, hb, e, layout), settings)  # [n, H, W-1, V]
        acc_h = overlap(p, qh)  # [n, H, W-1]
        sums["h"] += acc_h.sum((0, 1)).cpu()
        sums["h0"] += acc_h[:, 0].sum(0).cpu()
        sums["h_top1"] += (p.argmax(-1) == qh.argmax(-1)).float().sum((0, 1)).cpu()
        if H > 1:
            qv = guided_logp(model, vertical_drafts(heads, hb, e, layout), settings)  # [n, H-1, W-1, V]
            sums["v"] += overlap(p[:, 1:], qv).sum((0, 1)).cpu()
            if h_stale is not None:
                hs = h_stale[b:b + chunk].to(dev, dtype)
                qs = guided_logp(model, vertical_drafts(heads, hs, e, layout), settings)
                sums["v_stale"] += overlap(p[:, 1:], qs).sum((0, 1)).cpu()
            sums["v_top1"] += (p[:, 1:].argmax(-1) == qv.argmax(-1)).float().sum((0, 1)).cpu()
        n += hb.shape[0]
    by_depth = sums["h"] / (n * H)  # every row's chain
    by_col = sums["v"] / max(1, n * (H - 1))
    row0 = sums["h0"] / n
    expected = (sums["h0"].sum() + sums["v"].sum()) / (n * (W - 1) * H)
    out = {"expected_acceptance": _r(expected), "horizontal_expected": _r(by_depth.mean()),
           "horizontal_row0_expected": _r(row0.mean()),
           "horizontal_top1_chain": _r(sums["h_top1"].sum() / (n * H * (W - 1)))}
    for lo, hi in DEPTH_BUCKETS:
        if lo <= W - 1:
            out[f"horizontal_expected_depth_{lo}-{min(hi, W - 1)}"] = _r(by_depth[lo - 1:hi].mean())
    out["horizontal_expected_by_depth"] = [_r(v) for v in by_depth]
    if H > 1:
        out["vertical_expected"] = _r(by_col.mean())
        out["vertical_top1_guided"] = _r(sums["v_top1"].sum() / (n * (H - 1) * (W - 1)))
        out["vertical_expected_by_column"] = [_r(v) for v in by_col]
        if h_stale is not None:
            out["vertical_stale_expected"] = _r(sums["v_stale"].sum() / (n * (H - 1) * (W - 1)))
            out["expected_acceptance_stale"] = _r((sums["h0"].sum() + sums["v_stale"].sum()) / (n * (W - 1) * H))
    return out


def _r(x) -> float:
    return round(float(x), 4)


def record_checks(run, round_: int, a: int, b: int, rejected: torch.Tensor, mass: torch.Tensor) -> None:
    """Log one verification (round `round_`) of the image slots of ranks [a, b): rejected [n] bool and the
    residual mass [n, 1] or [n] (sum_v max(0, p - q) = 1 - the expected acceptance, `residual_and_mass`). Both stay
    on the device as they are, no op spent in the step; `check_rows` reads them all once when the run ends."""
    run.counts.add_check((round_, a, b, rejected, mass))


def check_rows(run) -> list[torch.Tensor]:
    """The checks of a run as [n, 4] rows on the CPU: round, column, accepted, expected."""
    if not run.counts.checks:
        return []
    W, stride = run.layout.grid[1], run.layout.row_stride
    col = (torch.tensor(run.index.image_slots) % stride).clamp(max=W - 1).float()
    rejected = torch.cat([c[3].reshape(-1) for c in run.counts.checks])
    mass = torch.cat([c[4].reshape(-1) for c in run.counts.checks])
    values = torch.stack([(~rejected).float(), 1 - mass.float()]).cpu()  # one copy for the whole run
    rounds = torch.cat([torch.full((b - a,), float(r)) for r, a, b, *_ in run.counts.checks])
    cols = torch.cat([col[a:b] for _, a, b, *_ in run.counts.checks])
    rows = torch.stack([rounds, cols, values[0], values[1]], 1)
    return list(rows.split([b - a for _, a, b, *_ in run.counts.checks]))


def summarize_checks(checks: list) -> dict:
    """The checks of a run -> {round: {checked, accepted, expected}} and round 0 by column."""
    if not checks:
        return {}
    c = torch.cat(checks).cpu()
    by_round = {}
    for r in c[:, 0].unique().long().tolist():
        sel = c[c[:, 0] == r]
        by_round[str(r)] = {"checked": int(sel.shape[0]), "accepted": _r(sel[:, 2].mean()),
                            "expected": _r(sel[:, 3].mean())}
    r0 = c[c[:, 0] == 0]
    by_col = []
    for x in range(int(c[:, 1].max()) + 1):
        sel = r0[r0[:, 1] == x]
        by_col.append(None if sel.numel() == 0 else _r(sel[:, 2].mean()))
    return {"by_round": by_round, "round0_by_column": by_col}
