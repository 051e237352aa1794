"""Do the lossless peers draw from ar's distribution on the bundled model at full size? One prompt, many seeds:
each decoder's nll_full per image (the NLL of its tokens under the model with cfg and temperature, no truncation),
its mean, spread and quantiles, and two-sample tests against ar's (Kolmogorov-Smirnov, Mann-Whitney, Levene).

    python tools/peer_distribution.py --decoders ar,sjd-pac,scd,sjd --images 64 --prompt 0 --seed 9000 [--json out]

A sampler that keeps ar's distribution gives nll_full values from the same distribution as ar's (not the same
values: its tokens differ); a porting fault that favours likely or unlikely tokens moves them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssd_core  # noqa: E402


def nll_fulls(model, decoder: str, images: int, prompt, seed: int, grid=None, batch: int = 8) -> list[float]:
    out = []
    for s in range(0, images, batch):
        seeds = list(range(seed + s, seed + min(s + batch, images)))
        runs = ssd_core.generate_batch(model, None, prompts=[prompt] * len(seeds), seeds=seeds, decoder=decoder,
                                       decode_pixels=False, grid=grid)
        out += [r.trace.nll_full for r in runs]
    return out


def main(argv=None) -> dict:
    from scipy import stats

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="reference")
    ap.add_argument("--decoders", default="ar,sjd-pac,scd,sjd")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=0, help="the class index (bundled models)")
    ap.add_argument("--seed", type=int, default=9000)
    ap.add_argument("--grid", default=None, help="HxW (default: the model's)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = ssd_core.load_model(a.model)
    grid = tuple(int(x) for x in a.grid.split("x")) if a.grid else None
    decoders = a.decoders.split(",")
    if decoders[0] != "ar":
        decoders.insert(0, "ar")
    values = {d: nll_fulls(model, d, a.images, a.prompt, a.seed, grid) for d in decoders}
    out = {"model": a.model, "prompt": a.prompt, "seed": a.seed, "images": a.images, "rows": {}}
    for d, v in values.items():
        q = statistics.quantiles(v, n=10)
        row = {"mean": round(statistics.mean(v), 4), "sd": round(statistics.stdev(v), 4),
               "q10": round(q[0], 4), "median": round(statistics.median(v), 4), "q90": round(q[-1], 4),
               "values": [round(x, 5) for x in v]}
        if d != "ar":
            row.update(ks_p=round(stats.ks_2samp(values["ar"], v).pvalue, 4),
                       mann_whitney_p=round(stats.mannwhitneyu(values["ar"], v).pvalue, 4),
                       levene_p=round(stats.levene(values["ar"], v).pvalue, 4))
        out["rows"][d] = row
        print(f"{d:9s} nll_full mean {row['mean']:.4f} sd {row['sd']:.4f} q10 {row['q10']:.4f} median "
              f"{row['median']:.4f} q90 {row['q90']:.4f}" + ("" if d == "ar" else
              f" | against ar: KS p {row['ks_p']}, Mann-Whitney p {row['mann_whitney_p']}, Levene p {row['levene_p']}"),
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
