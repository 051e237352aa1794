"""The bench across grid sizes: every decoder on the bundled models at 24x24, 32x32 and 48x48, one table, one
JSON, one plot of step ratio against grid side.

    python tools/bench_sizes.py --images 16 --json docs/bench_sizes.json --plot docs/bench_sizes.png
    make bench-sizes

Each size is one `python -m ssd_core bench` run, in this process (one torch start for every size; the bench
times each decoder's runs itself): `reference` at 24x24, `reference-48` at 32x32 and at 48x48, with their
bundled heads, the decoders' defaults and the same seeds. `steps / side` shows how the steps grow with the
picture: `ar` takes side x side steps, so its steps / side grows with the side; `ssd` and `ssd-exact` take about
a constant number of steps a row, so theirs stays about flat.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python tools/bench_sizes.py` from anywhere: the pack's ssd_core

DECODERS = "ar,ssd,ssd-exact,ssd-exact:noheads,sjd,zipar"
SIZES = (("reference", 24), ("reference-48", 32), ("reference-48", 48))
COLUMNS = ("decoder", "steps", "step_ratio", "wall_ratio", "nll_full_gap", "class_acc", "fd", "same_cells_as_ar")


def run_size(model: str, side: int, images: int, seed: int, decoders: str, log) -> dict:
    from ssd_core import cli  # here: --merge and the table need no torch

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        argv = ["bench", "--model", model, "--heads", model, "--grid", f"{side}x{side}", "--decoders", decoders,
                "--images", str(images), "--seed", str(seed), "--json", out,
                "--no-step-ops"]  # its table has no ops column: no extra run per row
        log("$ python -m ssd_core " + " ".join(argv))
        if cli.main(argv) != 0:
            raise SystemExit(f"the bench of {model} at {side}x{side} failed (its error is above)")
        report = json.load(open(out))
    return {"model": model, "side": side, "grid": [side, side], "images": images, "rows": report["rows"],
            "yardstick": report.get("yardstick"), "settings": report.get("settings")}


def table(sizes: list[dict]) -> str:
    lines = ["| side | " + " | ".join(COLUMNS) + " | steps / side |", "|" + "---|" * (len(COLUMNS) + 2)]
    for s in sizes:
        for r in s["rows"]:
            cells = []
            for c in COLUMNS:
                v = r.get(c)
                cells.append("-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v))
            lines.append(f"| {s['side']} | " + " | ".join(cells) + f" | {r['steps'] / s['side']:.2f} |")
    return "\n".join(lines)


COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (140, 86, 75)]


def plot(sizes: list[dict], path: str) -> None:
    """Step ratio (x fewer steps than ar) against grid side, one line per decoder (PIL only)."""
    W, H, L, T, S = 640, 420, 60, 40, 320
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    sides = [s["side"] for s in sizes]
    labels = [r["decoder"] for r in sizes[0]["rows"] if r["decoder"] != "ar"]
    ymax = max(r["step_ratio"] for s in sizes for r in s["rows"]) * 1.1
    xlo, xhi = min(sides) - 4, max(sides) + 4

    def at(x, y):
        return L + (x - xlo) / (xhi - xlo) * S, T + S - y / ymax * S

    d.rectangle([L, T, L + S, T + S], outline="black")
    d.text((L, 10), "steps ratio vs ar (x fewer model steps) against the grid side", fill="black")
    for x in sides:
        px, _ = at(x, 0)
        d.line([px, T + S, px, T + S + 4], fill="black")
        d.text((px - 14, T + S + 8), f"{x}x{x}", fill="black")
    for i in range(6):
        y = ymax * i / 5
        _, py = at(xlo, y)
        d.line([L - 4, py, L, py], fill="black")
        d.text((L - 34, py - 6), f"{y:.1f}", fill="black")
    for k, label in enumerate(labels):
        colour = COLOURS[k % len(COLOURS)]
        pts = [at(s["side"], r["step_ratio"]) for s in sizes for r in s["rows"] if r["decoder"] == label]
        d.line(pts, fill=colour, width=2)
        for x, y in pts:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        d.text((L + S + 12, T + 14 * k), label, fill=colour)
    img.save(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/bench_sizes.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decoders", default=DECODERS)
    ap.add_argument("--sides", default="24,32,48", help="comma list out of 24, 32, 48")
    ap.add_argument("--json", default="bench_out/bench_sizes.json")
    ap.add_argument("--plot", default="bench_out/bench_sizes.png")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="no bench: join the sizes of these reports (e.g. sizes run in parallel) into --json / --plot")
    a = ap.parse_args(argv)
    wanted = {int(s) for s in a.sides.split(",")}
    if a.merge:
        sizes = sorted((s for path in a.merge for s in json.load(open(path))["sizes"]), key=lambda s: s["side"])
    else:
        sizes = [run_size(m, side, a.images, a.seed, a.decoders, print) for m, side in SIZES if side in wanted]
    report = {"command": "python tools/bench_sizes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "sizes": sizes}
    for p in (a.json, a.plot):
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    plot(sizes, a.plot)
    print(table(sizes))
    print(f"wrote {a.json} and {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
