"""The measurement behind the thread rule (ssd_core/threads.py): the bundled model's wall for one image at
1 and 2 intra-op threads, on an idle machine and with busy-loop processes beside it (a loaded machine).

    python -m tools.threads_bench [--decoders ar,ssd-exact] [--loads 0,1] [--threads 1,2] [--repeats 3]

Prints one row per (load, decoder, threads): median / min / max wall over the repeats, and the ratio to
one thread. The busy loops are plain Python processes (one core each), killed at the end.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

BUSY_LOOP = "while True: pass"


def busy_processes(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def wall_of_one_image(model, heads, decoder: str, threads: int, seed: int, grid) -> float:
    from ssd_core import api
    from ssd_core import threads as thread_rule

    keep = thread_rule.sampling_threads
    thread_rule.sampling_threads = lambda _model: None  # measure the count we set, not the rule's
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        api.generate(model, heads, prompt="face", decoder=decoder, seed=seed, grid=grid)
        return time.perf_counter() - t0
    finally:
        thread_rule.sampling_threads = keep


def main(argv=None) -> int:
    from ssd_core import load_heads, load_model
    from ssd_core.grid_text import parse_grid

    p = argparse.ArgumentParser(prog="python -m tools.threads_bench", description=__doc__.splitlines()[0])
    p.add_argument("--decoders", default="ar,ssd-exact")
    p.add_argument("--loads", default="0,1", help="busy-loop processes beside the run, per row set")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--grid", default=None, help="token grid as HxW (default: the model's)")
    args = p.parse_args(argv)
    model = load_model("reference")
    heads = load_heads("reference", model)
    grid = parse_grid(args.grid)
    before = torch.get_num_threads()
    print(f"{'load':>4} {'decoder':<10} {'threads':>7} {'median_s':>9} {'min_s':>7} {'max_s':>7} {'vs_1_thread':>11}")
    for load in (int(x) for x in args.loads.split(",")):
        busy = busy_processes(load)
        try:
            time.sleep(0.5 if load else 0)
            for decoder in args.decoders.split(","):
                wall_of_one_image(model, heads, decoder, 1, 0, grid)  # warm-up
                one = None
                for threads in (int(x) for x in args.threads.split(",")):
                    walls = [wall_of_one_image(model, heads, decoder, threads, seed, grid) for seed in range(args.repeats)]
                    med = statistics.median(walls)
                    one = med if one is None else one
                    print(f"{load:>4} {decoder:<10} {threads:>7} {med:>9.2f} {min(walls):>7.2f} {max(walls):>7.2f} "
                          f"{med / one:>11.2f}", flush=True)
        finally:
            for proc in busy:
                proc.kill()
            torch.set_num_threads(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
