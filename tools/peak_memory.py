"""On a CUDA GPU: the weights' memory and the peak memory of one generation at each quantization, on a
random-weight model of a released shape (no download). `make gpu-memory` runs it:

    python -m tools.peak_memory --shapes Janus-Pro-7B --quantizations none,8-bit,4-bit

The random model is saved once as safetensors (bf16) into --folder, then loaded through load_model with each
quantization (bitsandbytes quantizes while loading, as it does for the real checkpoint).
"""
from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from ssd_core.families import family_class
from tools.memory_table import RELEASED
from tools.random_models import random_model


def save_random(shapes: str, folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    # random init of 7B weights takes minutes on the CPU and seconds on the GPU
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = random_model(RELEASED[shapes], shapes, device=device, dtype=torch.bfloat16)
    model.model.save_pretrained(folder)
    if hasattr(model.model, "generation_config"):
        model.model.generation_config.save_pretrained(folder)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return folder


def measure(folder: Path, family: str, quantization: str, draft_rows: int = 3) -> dict:
    import ssd_core

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = ssd_core.load_model(folder, "bf16", "cuda", family=family, quantization=quantization)
    weights = torch.cuda.memory_allocated() - base
    prompt = [5, 6, 7, 8]  # token ids: the random model has no tokenizer
    t = time.perf_counter()
    result = ssd_core.generate(model, None, prompt=prompt, decoder="ssd-exact", draft_rows=draft_rows, seed=0,
                               score=False, decode_pixels=False)
    wall = time.perf_counter() - t
    out = {"quantization": quantization, "weights_gib": round(weights / 2**30, 2),
           "peak_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 2),
           "grid": list(result.tokens.shape), "steps": result.trace.steps, "wall_s": round(wall, 2)}
    del model, result
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.peak_memory", description=__doc__)
    p.add_argument("--shapes", default="Janus-Pro-7B", choices=list(RELEASED))
    p.add_argument("--quantizations", default="none,8-bit,4-bit")
    p.add_argument("--folder", default=None, help="where to keep the random model (default: a temporary folder)")
    p.add_argument("--json", default=None, help="write the rows here (rewritten after each quantization)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("this measures GPU memory: run it on a machine with a CUDA GPU")
        return 2
    folder = Path(args.folder or tempfile.mkdtemp(prefix="ssd-peak-")) / args.shapes
    save_random(args.shapes, folder)
    family = family_class(RELEASED[args.shapes]).family
    rows = []
    for q in args.quantizations.split(","):
        rows.append(measure(folder, family, q.strip()))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"shapes": args.shapes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
