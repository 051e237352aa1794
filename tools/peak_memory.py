"""On a CUDA GPU: the weights' memory and the peak memory of one generation at each quantization, on a
random-weight model of a released shape (no download). `make gpu-memory` runs it:

    python -m tools.peak_memory --shapes Janus-Pro-7B --quantizations none,8-bit,4-bit
    python -m tools.peak_memory --dry --json dry.json   # the same code on the CPU at a tiny shape (seconds)

The random model is built once, in bf16 on the GPU (no float32 copy: random_models.build_random), and `none`
is measured on it as built. Only when a quantization is asked for is it saved, once, as bf16 safetensors into
--folder (a run that finds the folder complete skips the save) and loaded through load_model with that
quantization (bitsandbytes quantizes while loading, as it does for the real checkpoint). --dry: a tiny Janus
shape in fp32 on the CPU, measured as built and once more saved and loaded (quantization none), so that the
save and load path runs too; its memory figures are the process's, not a GPU's.

Each row: quantization, source (built / loaded), weights_gib, peak_gib (over the build or load and the
generation), grid, steps, ready_s (build or save + load), wall_s (the generation).
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ssd_core.families import family_class
from tools.memory_table import RELEASED
from tools.random_models import random_model

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 512, "codes": 64,
        "image_size": 64, "patch_size": 8, "vq_base_channels": 32, "vq_channel_multiplier": [1, 1],
        "vq_latent_channels": 32}  # --dry: an 8x8 grid (bench_gpu's tiny shape)
PROMPT = [5, 6, 7, 8]  # token ids: the random model has no tokenizer


def allocated(dev: torch.device) -> int:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0


def weight_bytes(model, dev: torch.device, base: int) -> int:
    """Bytes the model's weights hold: the allocator's growth on a GPU, the tensors' own bytes on the CPU."""
    if dev.type == "cuda":
        return allocated(dev) - base
    return sum(t.numel() * t.element_size() for t in [*model.model.parameters(), *model.model.buffers()])


def complete(folder: Path) -> bool:
    """A whole saved model is there: its config and every shard its index names (save_once renames a folder into
    place only once it is written; this also refuses one an older, non-atomic save left half written)."""
    index = folder / "model.safetensors.index.json"
    if not (folder / "config.json").is_file():
        return False
    if index.is_file():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        return bool(shards) and all((folder / name).is_file() for name in shards)
    return (folder / "model.safetensors").is_file()


def save_once(model, folder: Path) -> tuple[Path, bool]:
    """The model as safetensors in `folder` (kept from an earlier run when complete) -> (folder, saved now).
    Written to a sibling folder and renamed, so a run stopped midway never leaves a folder that looks whole."""
    if complete(folder):
        return folder, False
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.model.save_pretrained(partial)
    if hasattr(model.model, "generation_config"):
        model.model.generation_config.save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder, True


def measure(model, dev: torch.device, base: int, quantization: str, source: str, ready_s: float,
            draft_rows: int = 3) -> dict:
    """One ssd-exact generation on `model` (built or loaded since the peak statistics were reset at `base`)."""
    import ssd_core

    weights = weight_bytes(model, dev, base)
    t = time.perf_counter()
    result = ssd_core.generate(model, None, prompt=PROMPT, decoder="ssd-exact", draft_rows=draft_rows, seed=0,
                               score=False, decode_pixels=False)
    wall = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated(dev) - base if dev.type == "cuda" else result.trace.peak_memory_mb * 2**20
    return {"quantization": quantization, "source": source, "device": str(dev),
            "weights_gib": round(weights / 2**30, 4 if dev.type == "cpu" else 2),
            "peak_gib": round(peak / 2**30, 4 if dev.type == "cpu" else 2), "grid": list(result.tokens.shape),
            "steps": result.trace.steps, "ready_s": round(ready_s, 1), "wall_s": round(wall, 2)}


def fresh(dev: torch.device) -> int:
    """Free what the last model held and reset the peak statistics -> the allocated bytes now."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return allocated(dev)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.peak_memory", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="Janus-Pro-7B", choices=list(RELEASED))
    p.add_argument("--quantizations", default="none,8-bit,4-bit")
    p.add_argument("--folder", default=None, help="where to keep the saved random model (default: a temporary "
                   "folder); only written when a quantization other than none is asked for")
    p.add_argument("--json", default=None, help="write the rows here (rewritten after each row)")
    p.add_argument("--dry", action="store_true", help="the CPU, a tiny Janus shape, fp32: built and loaded rows")
    args = p.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.dry:
        dev, dtype, dtype_name, shapes, family = torch.device("cpu"), torch.float32, "fp32", TINY, "janus"
        plan = [("none", "built"), ("none", "loaded")]
    else:
        if not torch.cuda.is_available():
            print("this measures GPU memory: run it on a machine with a CUDA GPU (or --dry on the CPU)")
            return 2
        dev, dtype, dtype_name, shapes = torch.device("cuda"), torch.bfloat16, "bf16", args.shapes
        family = family_class(RELEASED[args.shapes]).family
        asked = [q.strip() for q in args.quantizations.split(",") if q.strip()]
        plan = [("none", "built")] * ("none" in asked) + [(q, "loaded") for q in asked if q != "none"]
    name = "tiny" if args.dry else args.shapes
    temporary = tempfile.TemporaryDirectory(prefix="ssd-peak-") if args.folder is None else None
    folder = Path(args.folder or temporary.name) / name
    rows: list[dict] = []
    model = None
    base = fresh(dev)
    t = time.perf_counter()
    if any(source == "built" for _, source in plan) or not complete(folder):
        model = random_model(family, shapes, device=dev, dtype=dtype)
        log(f"{name}: random-init {dtype_name} on {dev} in {time.perf_counter() - t:.1f} s")
    built_s = time.perf_counter() - t
    for quantization, source in plan:
        if source == "built":
            rows.append(measure(model, dev, base, quantization, source, built_s))
        else:
            import ssd_core

            if model is not None:  # saved once, then the built model is freed before the first load
                t = time.perf_counter()
                folder, saved = save_once(model, folder)
                log(f"{'saved' if saved else 'kept'} {folder} ({time.perf_counter() - t:.1f} s)")
                model = None
            base = fresh(dev)
            t = time.perf_counter()
            loaded = ssd_core.load_model(folder, dtype_name, str(dev), family=family, quantization=quantization)
            rows.append(measure(loaded, dev, base, quantization, source, time.perf_counter() - t))
            del loaded
            base = fresh(dev)
        log(json.dumps(rows[-1]))
        if args.json:
            Path(args.json).write_text(json.dumps({"shapes": name, "rows": rows}, indent=1))
    if temporary is not None:
        temporary.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
