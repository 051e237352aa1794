"""Is ssd-exact's picture ar's? Compare them over many (model, seed, sampler setting, decoder variant) pairs.

    python tools/exact_sweep.py --pairs 1000 --json docs/exactness_sweep.json [--log sweep.log]

One `ar` run per (model, seed, setting) is the reference; each ssd-exact variant (draft rows 1-4 and the pick,
heads and none, alone and inside a batch of 4 seeds) is compared with it token by token. Settings are drawn from
a fixed list of cfg, temperature, top-k / top-p / min-p values (--master-seed picks them). The JSON holds every
pair (equal or the number of differing cells and the first one), the share of equal images per variant, and
the machine it ran on. `--dtype bf16` (or fp16) measures the share of differing cells instead.
Runs resume: pairs already in the JSON are kept and not run again.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ssd_core  # noqa: E402
from ssd_core.api import generate_batch  # noqa: E402

CFGS = (1.0, 2.0, 3.0, 4.0, 5.5, 7.0)
TEMPERATURES = (0.0, 0.5, 0.8, 1.0, 1.0, 1.3)
TRUNCATIONS = ({}, {"top_k": 40}, {"top_k": 200}, {"top_p": 0.9}, {"top_p": 0.7}, {"min_p": 0.01},
               {"min_p": 0.05}, {"top_k": 40, "min_p": 0.01})
# (label, draft_rows, heads, batch): draft_rows 0 = the pick (calibrate.py)
VARIANTS = (("r1", 1, True, 1), ("r2", 2, True, 1), ("r3", 3, True, 1), ("r4", 4, True, 1),
            ("r2:noheads", 2, False, 1), ("r4:noheads", 4, False, 1), ("pick", 0, True, 1),
            ("r2@batch4", 2, False, 4), ("r4@batch4", 4, True, 4))
MODELS = {"reference": 1.0, "reference-48": 0.05}  # share of groups per model (reference-48's ar is ~7x slower)
# token grids: mostly a quarter of the model's (a pair then costs a quarter), some whole ones
GRIDS = {"reference": ([12, 12],) * 5 + ([24, 24],), "reference-48": ([16, 16],) * 5 + ([48, 48],)}


def settings_list(n: int, master_seed: int) -> list[dict]:
    rng = random.Random(master_seed)
    models = list(MODELS)
    out = []
    for i in range(n):
        model = rng.choices(models, weights=[MODELS[m] for m in models])[0]
        s = {"model": model, "prompt": rng.randrange(11), "seed": rng.randrange(2**32), "cfg": rng.choice(CFGS),
             "temperature": rng.choice(TEMPERATURES), "top_k": 0, "top_p": 1.0, "min_p": 0.0,
             "grid": rng.choice(GRIDS[model])}
        s.update(rng.choice(TRUNCATIONS))
        out.append(s)
    return out


def key(s: dict) -> str:
    return json.dumps(s, sort_keys=True)


def run(model, heads, seeds, s: dict, decoder: str, rows: int, with_heads: bool):
    sampler = {k: s[k] for k in ("cfg", "temperature", "top_k", "top_p", "min_p")}
    return generate_batch(model, heads if with_heads else None, prompts=[s["prompt"]] * len(seeds), seeds=seeds,
                          decoder=decoder, draft_rows=rows, decode_pixels=False, score=False, grid=tuple(s["grid"]),
                          **sampler)


def compare(ref: torch.Tensor, got: torch.Tensor, exact: dict | None) -> dict:
    """Equal or not, the first differing cell, and the run's own near-tie record (trace.exact): `flagged` says
    whether the trace named a near-tie at or before the first differing cell (it must, if the bound holds)."""
    diff = ref != got
    n = int(diff.sum())
    ties = (exact or {}).get("near_ties", 0)
    first_tie = (exact or {}).get("first_near_tie")
    out = {"equal": n == 0, "cells": n, "near_ties": ties, "first_near_tie": first_tie}
    if n:
        r, c = (int(v) for v in diff.nonzero()[0])
        out["first"] = [r, c]
        out["ar_token"], out["got_token"] = int(ref[r, c]), int(got[r, c])
        out["flagged"] = first_tie is not None and tuple(first_tie) <= (r, c)
    return out


def group(models, s: dict) -> list[dict]:
    """ar for 4 seeds (seed .. seed + 3) alone, then every variant -> the pairs of this group."""
    model, heads = models[s["model"]]
    seeds = [s["seed"] + i for i in range(4)]
    ars = {seed: run(model, heads, [seed], s, "ar", 0, False)[0].tokens for seed in seeds}
    pairs = []
    for label, rows, with_heads, batch in VARIANTS:
        use = seeds[:batch]
        t0 = time.perf_counter()
        results = run(model, heads, use, s, "ssd-exact", rows, with_heads)
        wall = time.perf_counter() - t0
        for seed, res in zip(use, results):
            pairs.append({**s, "seed": seed, "variant": label, "steps": res.trace.steps,
                          "wall_s": round(wall / len(use), 3), **compare(ars[seed], res.tokens, res.trace.exact)})
    return pairs


def summarize(pairs: list[dict]) -> dict:
    by = {}
    for p in pairs:
        for k in ("all", p["variant"], p["model"]):
            d = by.setdefault(k, {"pairs": 0, "equal": 0, "cells": 0, "total_cells": 0, "with_near_ties": 0,
                                  "near_ties": 0, "unflagged_differences": 0})
            d["pairs"] += 1
            d["equal"] += p["equal"]
            d["with_near_ties"] += p["near_ties"] > 0
            d["near_ties"] += p["near_ties"]
            d["unflagged_differences"] += (not p["equal"]) and not p.get("flagged")
            d["cells"] += p["cells"]
            d["total_cells"] += p["grid"][0] * p["grid"][1]
    for d in by.values():
        d["equal_share"] = round(d["equal"] / d["pairs"], 4)
        d["cell_share_differing"] = round(d["cells"] / d["total_cells"], 5)
        d["share_without_near_ties"] = round(1 - d["with_near_ties"] / d["pairs"], 4)
        d["near_tie_share_of_cells"] = round(d["near_ties"] / d["total_cells"], 6)
    return by


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=1000, help="stop once this many pairs are measured")
    p.add_argument("--json", required=True)
    p.add_argument("--master-seed", type=int, default=43)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--models", default=",".join(MODELS), help="comma list of bundled models to use")
    p.add_argument("--grid", default=None, help="HxW for every pair (default: drawn per model from GRIDS)")
    args = p.parse_args(argv)
    out = Path(args.json)
    data = json.loads(out.read_text()) if out.is_file() else {}
    pairs = data.get("pairs", [])
    fields = ("model", "prompt", "grid", "cfg", "temperature", "top_k", "top_p", "min_p")
    done = {key({k: v for k, v in q.items() if k in fields} | {"seed": q["seed"]}) for q in pairs}
    wanted = set(args.models.split(","))
    models = {}
    for s in settings_list(100_000, args.master_seed):
        if args.grid:
            s["grid"] = [int(v) for v in args.grid.lower().split("x")]
        if len(pairs) >= args.pairs:
            break
        if s["model"] not in wanted or key(s) in done:
            continue
        if s["model"] not in models:
            m = ssd_core.load_model(s["model"], dtype=args.dtype)
            models[s["model"]] = (m, ssd_core.load_heads(s["model"], m))
        t0 = time.perf_counter()
        new = group(models, s)
        pairs += new
        bad = [f"{q['variant']}:{q['cells']}{'' if q['flagged'] else ' UNFLAGGED'}" for q in new if not q["equal"]]
        ties = sum(q["near_ties"] > 0 for q in new)
        print(f"{len(pairs):5d} pairs  {s}  {time.perf_counter() - t0:.0f}s  with near-ties: {ties}  "
              f"differing: {bad or 'none'}", flush=True)
        data = {"command": "python tools/exact_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                "dtype": args.dtype, "machine": {"cpu": platform.processor() or platform.machine(),
                                                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                                                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                "summary": summarize(pairs), "pairs": pairs}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=0))
        tmp.replace(out)
    print(json.dumps(data.get("summary", {}).get("all", {})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
