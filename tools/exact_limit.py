"""What limits ssd-exact's steps: where each check's first mismatch falls, and how its drafts' match rate compares
with the overlap sum_v min(p, q) of the same drafts (the acceptance a min(1, p/q) test, sjd's and sjd-pac's, gives).

    python tools/exact_limit.py --rows 4 --images 8 --seed 5000 [--model reference] [--grid 24x24] [--json out.json]

A check finalizes the window's leading matches and the first mismatch (exact.verify), so a step makes
`leading matches + 1` tokens whatever the rows below hold. For every check it records the window row (0: the row of
the first open slot) the first mismatch is in, and for every checked slot whether its draft equalled ar's pick and
the overlap between p (the verifier's) and q (the distribution the draft was picked from: the heads' for a drafted
cell, the verifier's previous output for a slot Jacobi re-drafted; slots copied from the row above have no q and
are left out). Gumbel-coupled drafts match ar's pick about as often as a ratio test would accept them: the limit is
then the drafts' overlap and the raster prefix, not the coupling.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ssd_core  # noqa: E402
from ssd_core.decoders import exact  # noqa: E402
from ssd_core.decoders.drafting import coupled, drafter_for  # noqa: E402
from ssd_core.engine import Generation, decode_batch  # noqa: E402
from ssd_core.sampling import settings_from  # noqa: E402


class ProbedExact(exact.ExactPolicy):
    """ssd-exact at a fixed number of rows that records its checks (the same tokens and steps: it only reads)."""

    def __init__(self, rows: int, record: dict):
        super().__init__(rows)
        self.record = record

    def begin(self, run) -> None:
        super().begin(run)
        self.q = {}  # image rank -> log q [V] its current draft was picked from

        def pick(run, logp, a, b):  # the heads' drafts: their q
            for k in range(b - a):
                self.q[a + k] = logp[k]
            return coupled(run, logp, a, b)

        self.drafter = drafter_for(run, self.use_heads, pick=pick, sweeps=exact.JACOBI_SWEEPS,
                                   redraft=exact.FIRST_ROW_REDRAFT)

    def update(self, run, logits, features) -> None:
        win, W = run.window, run.layout.grid[1]
        C = win.cached
        a, b = win.open_span(C, win.end + 1)
        if b > a:
            slots = run.index.image_ids[a:b]
            fed = (b - a) if run.index.image_slots[b - 1] < win.end else b - a - 1  # the slot past the window: unfed
            drafts = run.tokens.codes[slots].clone()
            logp = run.logp(logits[:, slots - C], slots)
            picks = run.draws.gumbel_sample(logp, a, b)  # ar's picks (what verify computes again)
            for k in range(fed):
                row = (a + k) // W - a // W
                match = bool(drafts[k] == picks[k])
                self.record["match"][row].append(match)
                if a + k in self.q:
                    overlap = float(torch.minimum(logp[k].exp(), self.q[a + k].exp()).sum())
                    self.record["pairs"]["first" if k == 0 else ("row0" if row == 0 else "below")].append((overlap, match))
        super().update(run, logits, features)
        if b > a:
            final = run.tokens.final[slots]
            n_final = int(final.sum())
            self.record["checks"].append({"checked": b - a, "final": n_final,
                                          "mismatch_row": (a + n_final - 1) // W - a // W if n_final < b - a else None})
            for k in range(b - a):  # the open slots now hold the verifier's picks of logp (Jacobi)
                if not bool(final[k]):
                    self.q[a + k] = logp[k]


def summary(record: dict, steps: list[int]) -> dict:
    checks = record["checks"]
    rows = Counter(c["mismatch_row"] for c in checks)
    out = {"steps_median": statistics.median(steps), "checks": len(checks), "finalized": sum(c["final"] for c in checks),
           "final_per_check": round(statistics.mean(c["final"] for c in checks), 3),
           "checked_per_check": round(statistics.mean(c["checked"] for c in checks), 1),
           # share of checks whose first mismatch is in window row r (none: every fed slot matched)
           "first_mismatch_row": {("none" if r is None else str(r)): round(n / len(checks), 3)
                                  for r, n in sorted(rows.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))},
           "match_by_row": {str(r): round(statistics.mean(v), 3) for r, v in sorted(record["match"].items())},
           "overlap_vs_match": {}}
    for where, pairs in record["pairs"].items():
        if pairs:
            overlap, match = statistics.mean(p for p, _ in pairs), statistics.mean(float(m) for _, m in pairs)
            out["overlap_vs_match"][where] = {"slots": len(pairs), "overlap": round(overlap, 3),
                                              "match": round(match, 3), "ratio": round(match / overlap, 3)}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="reference")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--seed", type=int, default=5000)
    ap.add_argument("--grid", default=None, help="HxW (default: the model's)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    model = ssd_core.load_model(a.model)
    heads = ssd_core.load_heads(a.model, model)
    layout = model.layout(tuple(int(x) for x in a.grid.split("x")) if a.grid else None)
    record = {"checks": [], "match": defaultdict(list), "pairs": defaultdict(list)}
    steps = []
    for i in range(a.images):  # the bench's images: prompt i (a class), seed seed + i
        settings = settings_from(model.defaults, a.seed + i)
        prompt = model.build_prompt(i % len(model.class_names), "", settings.guided, layout.grid)
        with torch.no_grad():
            (_, trace), = decode_batch(model, heads, [prompt], layout, [settings], [ProbedExact(a.rows, record)],
                                       Generation(score=False))
        steps.append(trace.steps)
    out = {"model": a.model, "rows": a.rows, "images": a.images, "seed": a.seed, "grid": list(layout.grid),
           **summary(record, steps)}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
