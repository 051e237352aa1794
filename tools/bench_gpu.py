"""`make bench-gpu`: the compiled GPU path on a random-init Janus-Pro-7B-shaped model (bf16), in one run.

Prints, within its time budget (default 540 s after the model is built): the verify-cost curve (one window
forward of 1..128 tokens over a half-full cache, eager and compiled), then one image per decoder (ar, ssd,
ssd-exact, sjd, or those --decoders names) eager and compiled: steps, wall, ms per step, the step and wall
ratios against ar, and peak memory; compile time is shown apart. Random weights: acceptance (so the steps of
ssd and sjd) says nothing about a trained model; the cost of a step, eager vs compiled, does. The model and its
random heads are built in bf16 on the GPU (tools/random_models.py: no float32 copy, so a 24 GB card holds it).

  python -m tools.bench_gpu          # on a CUDA machine, no edit needed (make bench-gpu)
  python -m tools.bench_gpu --dry    # the same code on the CPU at a tiny shape, in seconds (a test runs it)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ssd_core import static_cache
from ssd_core.api import generate
from tools.random_models import random_heads, random_model

DECODERS = ("ar", "ssd", "ssd-exact", "sjd")
LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128)
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 512, "codes": 64,
        "image_size": 64, "patch_size": 8, "vq_base_channels": 32, "vq_channel_multiplier": [1, 1],
        "vq_latent_channels": 32}  # --dry: an 8x8 grid
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]  # token ids (a random model has no tokenizer)


def _sync(dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


@torch.no_grad()
def verify_curve(model, lengths=LENGTHS, repeats: int = 5) -> dict[int, float]:
    """Median ms of one window forward of n tokens (both CFG streams) over a half-full cache."""
    layout = model.layout(None)
    session = model.start(model.build_prompt(PROMPT, "", True, layout.grid))
    ids = model.code_to_id(torch.arange(layout.num_slots) % model.image_vocab_size).cpu()
    ctx = layout.num_slots // 2
    out = {}
    for n in [n for n in lengths if ctx + n <= layout.num_slots]:
        samples = []
        for _ in range(repeats + 2):  # the first two: warm-up (and, compiled, the capture of its bucket)
            t = _sync(model.device)
            session.forward(ids[ctx:ctx + n])
            samples.append(_sync(model.device) - t)
            session.crop(ctx)
        out[n] = 1000 * statistics.median(samples[2:])
    return out


def run_decoders(model, heads, seed: int, log, decoders=DECODERS) -> list[dict]:
    rows = []
    for decoder in decoders:
        r = generate(model, heads if decoder in ("ssd", "ssd-exact") else None, prompt=PROMPT, decoder=decoder,
                     seed=seed, decode_pixels=False, score=False)
        tr = r.trace
        wall = tr.timings["wall"] - tr.timings["prefill"]
        rows.append({"decoder": decoder, "steps": tr.steps, "wall_s": round(wall, 3),
                     "ms_per_step": round(1000 * wall / max(tr.steps, 1), 2),
                     "peak_memory_mb": round(tr.peak_memory_mb, 1), "tokens": r.tokens})
        log(f"  {decoder:<10} {tr.steps:>5} steps {wall:>8.2f} s {rows[-1]['ms_per_step']:>8.2f} ms/step "
            f"peak {tr.peak_memory_mb:>9.0f} MB")
    ar = rows[0]
    for row in rows:
        row["identical_to_ar"] = bool(torch.equal(row["tokens"], ar["tokens"]))
        row["step_ratio"] = round(ar["steps"] / max(row["steps"], 1), 3)
        row["wall_ratio"] = round(ar["wall_s"] / max(row["wall_s"], 1e-9), 3)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_gpu", description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="CPU, tiny shape, torch.compile backend 'eager' (seconds)")
    p.add_argument("--shapes", default="Janus-Pro-7B")
    p.add_argument("--budget", type=float, default=540.0, help="seconds after the build; later parts are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the figures here (rewritten after each mode, so that a run "
                   "stopped midway keeps what it measured)")
    p.add_argument("--buckets", default=None, help="comma list of padded window lengths to compile (default "
                   f"{','.join(map(str, static_cache.BUCKETS))}; fewer compile sooner)")
    p.add_argument("--lengths", default=None, help="comma list of window lengths of the verify-cost curve "
                   f"(default {','.join(map(str, LENGTHS))})")
    p.add_argument("--decoders", default=",".join(DECODERS), help=f"comma list, ar first (default "
                   f"{','.join(DECODERS)})")
    args = p.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    buckets, lengths = static_cache.BUCKETS, LENGTHS
    if args.dry:  # three buckets and lengths keep the CPU check short
        device, dtype, shapes, backend = torch.device("cpu"), torch.float32, TINY, "eager"
        buckets, lengths = (1, 8, 16), (1, 8, 16)
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device here; run with --dry for the CPU check", flush=True)
            return 2
        device, dtype, shapes, backend = torch.device("cuda"), torch.bfloat16, args.shapes, "inductor"
    if args.buckets:
        buckets = tuple(int(b) for b in args.buckets.split(","))
    if args.lengths:
        lengths = tuple(int(n) for n in args.lengths.split(","))
    decoders = tuple(d.strip() for d in args.decoders.split(",") if d.strip())
    if not decoders or decoders[0] != "ar" or any(d not in DECODERS for d in decoders):
        print(f"error: --decoders must start with ar and name only {', '.join(DECODERS)}, got {args.decoders!r}",
              flush=True)
        return 2
    t0 = time.perf_counter()
    model = random_model("janus", shapes, device=device, dtype=dtype, seed=args.seed)
    heads = random_heads(model, seed=args.seed)  # built on the device in the model's dtype
    built_s = time.perf_counter() - t0
    name = "tiny (dry)" if args.dry else args.shapes
    log(f"model {name} random-init {str(dtype).replace('torch.', '')} on {device} "
        f"({sum(p.numel() for p in model.model.parameters()) / 1e9:.2f} B parameters), grid "
        f"{model.default_grid[0]}x{model.default_grid[1]}, built in {built_s:.1f} s")
    if device.type == "cuda":
        log(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    start = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - start)  # noqa: E731
    report: dict = {"model": name, "dtype": str(dtype), "device": str(device), "buckets": list(buckets),
                    "decoders": list(decoders), "built_s": round(built_s, 1), "modes": {}}
    for mode in ("off", "compiled"):
        if left() <= 0:
            log(f"[{mode}] skipped: the {args.budget:.0f} s budget is spent")
            continue
        static_cache.enable(model, mode, buckets=buckets, backend=backend)
        log(f"[{mode}] verify forward, ms by window length (eager = DynamicCache; compiled = static cache, "
            f"window padded to {buckets}):")
        t = time.perf_counter()
        curve = verify_curve(model, lengths)
        warm = time.perf_counter() - t  # compiled: includes the compile of every bucket
        one = curve[1]
        log("  " + ", ".join(f"{n}: {ms:.2f} ms ({ms / one:.2f}x)" for n, ms in curve.items()))
        entry = {"verify_ms": {str(k): round(v, 3) for k, v in curve.items()}, "curve_s_with_compile": round(warm, 1)}
        if mode == "compiled":
            log(f"  (the curve's first calls compiled {len(curve)} buckets: {warm:.0f} s in all)")
        if left() <= 0:
            log(f"[{mode}] decoders skipped: the {args.budget:.0f} s budget is spent")
        else:
            log(f"[{mode}] one image per decoder, seed {args.seed}:")
            t = time.perf_counter()
            entry["rows"] = run_decoders(model, heads, args.seed, log, decoders)
            entry["decoders_s"] = round(time.perf_counter() - t, 1)
        report["modes"][mode] = entry
        _write(report, args.json)
    _summary(report, log)
    if args.json:
        _write(report, args.json)
        log(f"wrote {args.json}")
    return 0


def _write(report: dict, path: str | None) -> None:
    """The report as JSON (each row's tokens left out)."""
    if not path:
        return
    plain = {**report, "modes": {mode: {**entry, "rows": [{k: v for k, v in row.items() if k != "tokens"}
                                                         for row in entry.get("rows", [])]}
                                 for mode, entry in report["modes"].items()}}
    with open(path, "w") as f:
        json.dump(plain, f, indent=1)


def _summary(report: dict, log) -> None:
    modes = report["modes"]
    if "rows" not in modes.get("off", {}) or "rows" not in modes.get("compiled", {}):
        return
    log("summary: ratios against ar of the same mode; speedup = eager wall / compiled wall, same decoder")
    log(f"  {'decoder':<10}{'step x':>8}{'wall x eager':>14}{'wall x comp':>13}{'speedup':>9}{'same tokens':>13}")
    for e, c in zip(modes["off"]["rows"], modes["compiled"]["rows"]):
        same = bool(torch.equal(e["tokens"], c["tokens"]))
        c["same_tokens_as_eager"] = same
        log(f"  {e['decoder']:<10}{e['step_ratio']:>8.2f}{e['wall_ratio']:>14.2f}{c['wall_ratio']:>13.2f}"
            f"{e['wall_s'] / max(c['wall_s'], 1e-9):>9.2f}{str(same).lower():>13}")
    ar_e, ar_c = modes["off"]["rows"][0], modes["compiled"]["rows"][0]
    log(f"  ar ms/step: eager {ar_e['ms_per_step']:.2f}, compiled {ar_c['ms_per_step']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
