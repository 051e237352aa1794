"""Judge a reference-48 candidate on the 64 (seed, class) pairs every extension of issue 41 was judged on.

    python -m reference_recipe.judge48 --model FOLDER [--procs 2] [--out judge.json]

The pairs: seeds 16-63 (the sampler sweep's 48 images) and 5000-5015 (the bench of record's 16), the classes in
turn from each block's first seed, the model's sampler defaults. Images are drawn by `ssd-exact`, whose tokens
are `ar`'s, with the heads given (default: the shipped reference-48's; stale heads only slow it), in `--procs`
processes of one thread each. The yardstick calls each image's class and scores the FD per block and over the
64; an image whose nll_full is under 0.1 is counted blank (nothing but white).
"""
from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

BLOCKS = {"16-63": (16, 48), "5000-5015": (5000, 16)}  # block: (first seed, images)
HEADS = "ssd_core/reference/model48/heads.safetensors"
BLANK_NLL = 0.1


def pairs(num_classes: int = 11, limit: int | None = None) -> list[tuple[int, int]]:
    """(seed, class) in order: each block asks the classes in turn from its first seed (limit: its first pairs)."""
    return [(first + i, i % num_classes) for first, count in BLOCKS.values() for i in range(min(count, limit or count))]


def draw(job) -> list[tuple[int, int, np.ndarray, float]]:
    """One process's share: (seed, class, image, nll_full) for each of its pairs."""
    model_dir, heads_path, grid, share = job
    import torch
    torch.set_num_threads(1)
    import ssd_core
    model = ssd_core.load_model(model_dir)
    heads = ssd_core.load_heads(heads_path, model)
    out = []
    for seed, cls in share:
        r = ssd_core.generate(model, heads, prompt=cls, seed=seed, decoder="ssd-exact", grid=grid)
        out.append((seed, cls, np.asarray(r.image), float(r.trace.nll_full)))
    return out


def judge(model_dir: str, heads_path: str = HEADS, procs: int = 2, grid=None, limit: int | None = None,
          log=print) -> dict:
    """Class accuracy, FD, blank images and per-class counts for each block and over all pairs."""
    import ssd_core
    from ssd_core import yardstick
    model = ssd_core.load_model(model_dir)
    stick = yardstick.for_model(model)
    if stick is None:
        raise SystemExit(f"{model_dir} names no yardstick: judge48 judges the bundled reference models")
    todo = pairs(len(model.class_names), limit)
    shares = [todo[i::procs] for i in range(procs)]  # round robin: every process gets both blocks' seeds
    with ProcessPoolExecutor(procs, mp_context=get_context("spawn")) as pool:
        drawn = [d for part in pool.map(draw, [(model_dir, heads_path, grid, s) for s in shares if s]) for d in part]
    drawn.sort(key=lambda d: todo.index(d[:2]))
    names = list(model.class_names)
    report = {"model": model_dir, "heads": heads_path, "grid": grid, "pairs": len(drawn), "blocks": {}}
    groups = {name: [d for d in drawn if first <= d[0] < first + count] for name, (first, count) in BLOCKS.items()}
    groups["all"] = drawn
    for name, group in groups.items():
        if not group:
            continue
        images, asked = [d[2] for d in group], [d[1] for d in group]
        score = stick.report(images, asked)
        called = score["called"]
        report["blocks"][name] = {
            "images": len(group), "class_acc": score["class_acc"], "fd": score["fd"],
            "blank": sum(d[3] < BLANK_NLL for d in group), "per_class": score["per_class"],
            "called_most": Counter(names[c] for c in called).most_common(3),
            "pairs": [[d[0], d[1], names[c], round(d[3], 4)] for d, c in zip(group, called)]}
        b = report["blocks"][name]
        log(f"{name}: {b['images']} images, class accuracy {b['class_acc']:.1%}, FD {b['fd']}, blank {b['blank']}, "
            f"per class {b['per_class']}, called most {b['called_most']}")
    return report


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m reference_recipe.judge48", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model folder to judge (r48 ship's output)")
    ap.add_argument("--heads", default=HEADS, help=f"heads for ssd-exact (default {HEADS})")
    ap.add_argument("--procs", type=int, default=2, help="processes drawing images, one thread each")
    ap.add_argument("--out", default=None, help="write the report here as JSON")
    ap.add_argument("--limit", type=int, default=None, help="only the first N pairs of each block (a quick check)")
    ap.add_argument("--grid", default=None, help="HxW tokens instead of the model's grid (a quick check)")
    a = ap.parse_args(argv)
    if a.procs < 1:
        ap.error(f"--procs {a.procs}: give 1 or more")
    if not os.path.isdir(a.model):
        ap.error(f"--model {a.model}: no such folder")
    if a.limit is not None and a.limit < 1:
        ap.error(f"--limit {a.limit}: give 1 or more pairs a block")
    report = judge(a.model, a.heads, a.procs, a.grid, a.limit)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
