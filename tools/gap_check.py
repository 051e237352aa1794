"""The nll_full gap of lossy rows (ssd) against `ar` on many images, cheaply (issue 41: is ssd's gap at 48x48 within
10%? At 16 images its 90% interval spans 50 points).

    python tools/gap_check.py --model reference-48 --images 64 --seed 5000 --ssd-rounds 2,3 --ssd-adaptive 10 \
        [--adaptive-percent 0] [--json out.json]
    python tools/gap_check.py --model reference-48 --decoders ssd,ssd-exact@3,sjd-pac --images 16 --seed 5000 \
        --difficulty --json out.json --plot out.png     # bench --difficulty's curve, ar's images by ssd-exact

`ar`'s images are drawn by `ssd-exact` with the heads: `ar`'s very tokens for each prompt and seed (fp32), so its
nll_full is `ar`'s, in less time (at the rows ssd-exact picks). One real `ar` image (the first) gives `ar`'s step
count and checks that.
Each row gets the bench's figures for the gap: the median nll_full, the gap of medians and its 90% bootstrap
interval (bench.gap_interval), its median steps and its step ratio against `ar`; and the paired view the median
hides: the mean of (the row's nll_full - ar's) over the images, each pair sharing prompt and seed, with its 90%
bootstrap interval.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import ssd_core  # noqa: E402
from ssd_core import difficulty  # noqa: E402
from ssd_core.bench import BenchOptions, _gap, _row_call, _variants, gap_interval, prompts_for  # noqa: E402
from ssd_core.decoders import DecoderParams  # noqa: E402


def check(model, heads, o: BenchOptions, log=print, keep: dict | None = None) -> dict:
    """{"ar": ar's figures, "rows": one per row} for o.images images (classes in turn, seeds from o.seed).
    keep: given a dict, it receives ar's runs ("ar") and the prompts ("prompts")."""
    prompts = prompts_for(model, o.images, o.prompt)
    seeds = [o.seed + i for i in range(o.images)]
    sampler = {"cfg": o.cfg, "temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p, "min_p": o.min_p,
               "grid": o.grid}
    t0 = time.time()
    slow = ssd_core.generate(model, None, prompt=prompts[0], seed=seeds[0], decoder="ar", decode_pixels=False,
                             **sampler)
    ar = [ssd_core.generate(model, heads, prompt=p, seed=s, decoder="ssd-exact", decode_pixels=False, **sampler)
          for p, s in zip(prompts, seeds)]
    if not torch.equal(ar[0].tokens, slow.tokens):
        raise SystemExit("ssd-exact did not give ar's tokens on the first image: its nll_full cannot stand for ar's "
                         "here (fp32 is needed)")
    ar_full = [r.trace.nll_full for r in ar]
    if keep is not None:
        keep.update(ar=ar, prompts=prompts)
    out = {"images": o.images, "seed": o.seed, "settings": slow.trace.settings,
           "ar": {"steps": slow.trace.steps, "nll_full": round(statistics.median(ar_full), 4),
                  "seconds": round(time.time() - t0, 1)}, "rows": []}
    log(f"ar (by ssd-exact): {slow.trace.steps} steps, nll_full median {out['ar']['nll_full']}")
    for label, decoder, params in _variants(o):
        if decoder == "ar":
            continue
        t0 = time.time()
        drafter, kw = _row_call(heads, o, label, decoder, params)
        kw = {k: v for k, v in kw.items() if k in ("decoder", "params")}
        runs = [ssd_core.generate(model, drafter, prompt=p, seed=s, decode_pixels=False, **sampler, **kw)
                for p, s in zip(prompts, seeds)]
        fulls = [r.trace.nll_full for r in runs]
        excess = [f - a for f, a in zip(fulls, ar_full)]  # per image: the row's nll_full minus ar's (same prompt, seed)
        row = {"decoder": label, "steps": statistics.median(r.trace.steps for r in runs),
               "step_ratio": round(statistics.median(slow.trace.steps / max(r.trace.steps, 1) for r in runs), 3),
               "nll_full": round(statistics.median(fulls), 4),
               "nll_full_gap": _gap(statistics.median(fulls), statistics.median(ar_full)),
               "nll_full_gap_90": gap_interval(fulls, ar_full),
               "nll_full_excess": round(statistics.mean(excess), 4), "nll_full_excess_90": mean_interval(excess),
               "nll_full_per_image": [round(v, 4) for v in fulls], "seconds": round(time.time() - t0, 1)}
        out["rows"].append(row)
        low, high = row["nll_full_gap_90"] or (float("nan"), float("nan"))
        log(f"{label}: {row['steps']} steps, {row['step_ratio']}x fewer than ar, nll_full gap "
            f"{row['nll_full_gap'] * 100:+.1f}% (90%: {low * 100:+.1f}% to {high * 100:+.1f}%); paired mean excess "
            f"{row['nll_full_excess']:+.3f} nats (90%: {row['nll_full_excess_90'][0]:+.3f} to "
            f"{row['nll_full_excess_90'][1]:+.3f})")
    out["ar"]["nll_full_per_image"] = [round(v, 4) for v in ar_full]
    return out


# a row's figures kept at each point of the curve
CURVE_KEYS = ("steps", "step_ratio", "nll_full", "nll_full_gap", "nll_full_gap_90", "nll_full_excess")


def curve_point(model, heads, o: BenchOptions, log=print):
    """One point of the difficulty sweep by `check` -> (rows {label: figures}, ar's runs, their prompts)."""
    kept: dict = {}
    got = check(model, heads, o, log=log, keep=kept)
    rows = {"ar": {"steps": got["ar"]["steps"], "step_ratio": 1.0, "nll_full": got["ar"]["nll_full"],
                   "nll_full_gap": 0.0}}
    rows.update({r["decoder"]: {k: r[k] for k in CURVE_KEYS} for r in got["rows"]})
    return rows, kept["ar"], kept["prompts"]


def difficulty_curve(model, heads, o: BenchOptions, temperatures=difficulty.TEMPERATURES, log=print) -> dict:
    """`bench --difficulty`'s curve with `ar`'s images drawn by ssd-exact: at each of difficulty.points, every row's
    steps, step ratio and nll_full gap, and the top-1 probability and entropy of ar's tokens, in the layout
    difficulty.write and difficulty.plot read (no class accuracy or wall: no pixels are decoded)."""
    return {**difficulty.sweep(model, heads, o, temperatures, log=log, measure=curve_point), "ar_by": "ssd-exact"}


def mean_interval(values: list, draws: int = 2000, seed: int = 0) -> list:
    """A 90% bootstrap interval [low, high] of the mean of `values` (the images drawn again with replacement)."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(values, k=len(values))) for _ in range(draws))
    return [round(means[int(0.05 * (draws - 1))], 4), round(means[int(0.95 * (draws - 1))], 4)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="reference-48")
    ap.add_argument("--heads", default=None, help="heads file or bundled name (default: the model's own)")
    ap.add_argument("--decoders", default="ssd", help="comma list of rows besides ar (bench's names)")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--seed", type=int, default=5000)
    ap.add_argument("--ssd-rounds", default="", help="comma list, as bench's")
    ap.add_argument("--ssd-adaptive", default="", help="comma list, as bench's")
    ap.add_argument("--adaptive-percent", type=int, default=None, help="every ssd row's own adaptive percent")
    ap.add_argument("--grid", help="HxW (default: the model's)")
    ap.add_argument("--difficulty", action="store_true", help="bench --difficulty's points (temperatures, a weaker "
                    "cfg), each with ar's top-1 probability and entropy")
    ap.add_argument("--temperatures", default=",".join(f"{t:g}" for t in difficulty.TEMPERATURES),
                    help="with --difficulty: the temperatures at the model's cfg (the weaker cfg is added at 1)")
    ap.add_argument("--plot", help="with --difficulty: the step-ratio plot (PNG)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    ints = lambda text: tuple(int(x) for x in text.split(",") if x.strip())  # noqa: E731
    model = ssd_core.load_model(a.model)
    heads = ssd_core.load_heads(a.heads or a.model, model)
    o = BenchOptions(decoders=tuple(d.strip() for d in a.decoders.split(",")), images=a.images, seed=a.seed,
                     ssd_rounds=ints(a.ssd_rounds), ssd_adaptive=ints(a.ssd_adaptive),
                     params=DecoderParams(adaptive_percent=a.adaptive_percent),
                     grid=tuple(int(x) for x in a.grid.split("x")) if a.grid else None, model_name=a.model)
    if a.difficulty:
        out = difficulty_curve(model, heads, o, tuple(float(t) for t in a.temperatures.split(",")))
        difficulty.write(out, a.json, a.plot)
        return out
    out = {"model": a.model, **check(model, heads, o)}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
