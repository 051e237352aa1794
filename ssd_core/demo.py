"""`make demo`: a few images of the bundled model with ar, ssd and ssd-exact; a sample sheet and a short table
in minutes, with a one-line progress bar on stderr. The full bench of record is `make bench`.

  python -m ssd_core.demo [--model reference | reference-48] [--images 4] [--decoders ar,ssd,ssd-exact] [--out-dir demo_out]
"""
from __future__ import annotations

import argparse
import sys
import time

from .bench import BenchOptions, _variants, run_bench
from .grid_text import parse_grid


class ProgressBar:
    """One stderr line, rewritten in place: share of the runs done, the image and decoder running, time."""

    def __init__(self, runs: int, images: int, stream=None, every: float = 0.25):
        self.runs, self.images, self.every = runs, images, every
        self.stream = stream if stream is not None else sys.stderr
        self.done_runs, self.current, self.t0, self.shown = 0, None, time.perf_counter(), 0.0

    def step(self, image: int, label: str, progress) -> None:
        if self.current is not None and self.current != (image, label):
            self.done_runs += 1
        self.current = (image, label)
        cells = progress.grid[0] * progress.grid[1]
        now = time.perf_counter()
        if now - self.shown >= self.every or progress.final_cells >= cells:
            self.shown = now
            self.draw((self.done_runs + progress.final_cells / cells) / self.runs,
                      f"image {image + 1}/{self.images} {label:<9} {progress.final_cells:>4}/{cells} tokens")

    def draw(self, fraction: float, text: str) -> None:
        width = 30
        filled = int(round(width * min(max(fraction, 0.0), 1.0)))
        elapsed = time.perf_counter() - self.t0
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * fraction:5.1f}%  {text}  "
                          f"{int(elapsed) // 60}:{int(elapsed) % 60:02d}\x1b[K")
        self.stream.flush()

    def log(self, line: str) -> None:
        """A log line above the bar (the bar is redrawn on the next step)."""
        self.stream.write("\r\x1b[K")
        self.stream.flush()
        print(line, flush=True)

    def close(self) -> None:
        self.draw(1.0, "done")
        self.stream.write("\n")
        self.stream.flush()


def main(argv=None) -> int:
    from . import load_heads, load_model

    p = argparse.ArgumentParser(prog="python -m ssd_core.demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="reference", choices=["reference", "reference-48"],
                   help="the bundled model: reference (24x24 tokens, 96 px) or reference-48 (48x48, 192 px)")
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--decoders", default="ar,ssd,ssd-exact")
    p.add_argument("--out-dir", default="demo_out")
    p.add_argument("--grid", default=None, help="token grid as HxW (default: the model's)")
    args = p.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar on stderr: ours
    t0 = time.perf_counter()
    model = load_model(args.model)
    heads = load_heads(args.model, model)
    options = BenchOptions(decoders=tuple(d.strip() for d in args.decoders.split(",") if d.strip()),
                           images=args.images, out_dir=args.out_dir, json=f"{args.out_dir}/bench.json",
                           model_name=args.model, grid=parse_grid(args.grid))
    bar = ProgressBar(args.images * len(_variants(options)), args.images)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if not line.startswith("image "):  # the bar already says which image runs
            bar.log(line)

    bar.draw(0.0, "loading done, sampling")
    run_bench(model, heads, options, log=log, on_step=bar.step)
    bar.close()
    table = [ln for ln in lines if not ln.startswith(("image ", "wrote "))]
    with open(f"{args.out_dir}/table.txt", "w") as f:
        f.write("\n".join(table) + "\n")
    print(f"wrote {args.out_dir}/samples_all_decoders.png (one row per decoder, same seeds in columns) and "
          f"{args.out_dir}/table.txt; {time.perf_counter() - t0:.0f} s in all. The full bench: make bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
