"""The yardstick's class accuracy and FD of a bundled model's images at several sampler settings (issue 41: can a
sampler default lift reference-48's class accuracy?). Each setting draws the same images (classes in turn, seeds
from --seed), so the settings are compared on paired seeds; per class it prints how many were called right.

    python tools/sampler_sweep.py --model reference-48 --images 48 --seed 16 \
        --settings "defaults; cfg=8; cfg=8,top_k=10; top_k=10" [--decoder ar] [--json out.json]

The images are drawn with ssd-exact by default: the tokens `ar` draws for the seed in fewer steps (the tool's test
checks that its figures equal ar's); --decoder ar draws them the slow way.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ssd_core  # noqa: E402
from ssd_core import yardstick  # noqa: E402
from ssd_core.bench import prompts_for  # noqa: E402

SAMPLER_KEYS = {"cfg": float, "temperature": float, "top_k": int, "top_p": float, "min_p": float}


def parse_settings(text: str) -> list[dict]:
    """'defaults; cfg=8,top_k=10' -> [{}, {"cfg": 8.0, "top_k": 10}] (the model's defaults where none is given)."""
    out = []
    for part in text.split(";"):
        part = part.strip()
        if part in ("", "defaults"):
            out.append({})
            continue
        setting = {}
        for pair in part.split(","):
            key, _, value = pair.partition("=")
            key = key.strip()
            if key not in SAMPLER_KEYS or not value.strip():
                raise SystemExit(f"--settings: {pair.strip()!r} is not NAME=VALUE with NAME one of "
                                 f"{sorted(SAMPLER_KEYS)}")
            setting[key] = SAMPLER_KEYS[key](value)
        out.append(setting)
    return out


def sweep(model, heads, settings: list[dict], images: int, seed: int, decoder: str = "ssd-exact", grid=None,
          log=print) -> list[dict]:
    """One row per setting: class_acc, fd, the classes called and nll_full per image, per class how many were right."""
    stick = yardstick.for_model(model)
    if stick is None:
        raise SystemExit("sampler_sweep needs a model whose folder ships a yardstick (the bundled reference models)")
    asked = prompts_for(model, images, None)  # class index asked for, in turn (as bench asks)
    rows = []
    for setting in settings:
        t0 = time.time()
        runs = [ssd_core.generate(model, heads if decoder != "ar" else None, prompt=c, seed=seed + i, decoder=decoder,
                                  grid=grid, **setting) for i, c in enumerate(asked)]
        pictures = [r.image for r in runs]
        score = stick.report(pictures, asked)  # called: the class the yardstick sees, per image
        row = {"setting": setting or "defaults", "class_acc": score["class_acc"], "fd": score["fd"],
               "called": score["called"],
               "nll_full": [round(r.trace.nll_full, 4) for r in runs],  # per image: the bench's quality figure
               "per_class": score["per_class"], "seconds": round(time.time() - t0, 1)}
        rows.append(row)
        log(f"{json.dumps(row['setting'])}: class accuracy {row['class_acc'] * 100:.1f}%, FD {row['fd']}, "
            f"per class {row['per_class']}")
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="reference-48")
    ap.add_argument("--settings", default="defaults", help="';'-separated settings, each 'defaults' or NAME=VALUE,...")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decoder", default="ssd-exact", choices=["ssd-exact", "ar"])
    ap.add_argument("--heads", help="heads file or bundled name for ssd-exact (default: the bundled model's own)")
    ap.add_argument("--grid", help="HxW (default: the model's)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    model = ssd_core.load_model(a.model)
    heads = ssd_core.load_heads(a.heads or a.model, model) if a.decoder != "ar" else None
    grid = tuple(int(x) for x in a.grid.split("x")) if a.grid else None
    out = {"model": a.model, "images": a.images, "seed": a.seed, "decoder": a.decoder,
           "defaults": dict(model.defaults),
           "rows": sweep(model, heads, parse_settings(a.settings), a.images, a.seed, a.decoder, grid)}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
