"""Fitting a model on a consumer GPU: quantization (bitsandbytes through transformers) and offload (accelerate).

The user's choice becomes from_pretrained arguments here: `quantization_config` (8-bit, or 4-bit NF4) that
leaves the modules the engine reads directly in full precision (the image-token head it slices, the image
embeddings and aligners, the pixel decoder), and a `device_map` ("auto" with a `max_memory` budget taken
from the free VRAM). A choice that cannot work on this machine is an SSDError naming what to install or pick.
`python -m tools.memory_table` prints the weights' memory of the released models at each quantization.

Under offload accelerate fills the GPU in module order, so the vocabulary head (the last module) is the first
to leave it. It is not pinned to the GPU: the families read only its image rows, which their ImageRowsHead
(families/base.py) loads once through accelerate's hook and keeps on the GPU (Emu3: 268 of the head's
1,512 MB in bf16; taken from RESERVE_BYTES), while the text rows stay offloaded and are never moved again.
"""
from __future__ import annotations

import importlib.util

import torch

from .errors import SSDError

QUANTIZATIONS = ("none", "8-bit", "4-bit")
OFFLOADS = ("none", "auto")
# modules kept in full precision, as full paths (transformers 5 matches them from the start, 4.57 as
# substrings): what the engine slices or feeds directly, and the pixel decoders
KEEP_FULL = {
    "llama-grid": ["lm_head"],
    "janus": ["lm_head", "model.generation_head", "model.generation_aligner", "model.generation_embeddings",
              "model.vqmodel"],
    "emu3": ["lm_head", "model.vqmodel"],
    "lumina": ["lm_head", "model.vqmodel"],
    "lumina2": ["lm_head", "model.vqmodel"],  # pixels: movqgan.safetensors, outside the model
    "emu3.5": ["lm_head"],  # its image rows are sliced; pixels: ibq.safetensors, outside the model
    # both heads' image rows are sliced; the gates weigh every cell's two predictions
    "emu3.5-flashar": ["horizontal_head", "vertical_head", "hv_gate_mlp", "hv_gate_corner"],
}
RESERVE_BYTES = 2 * 2**30  # VRAM left free under offload for the KV cache and activations
MIN_BNB_CPU = (0, 50)  # bitsandbytes runs 8-bit and 4-bit on the CPU too from here on (0.50.2 tested)


def check_choice(quantization: str, offload: str) -> None:
    if quantization not in QUANTIZATIONS:
        raise SSDError(f"unknown quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}")
    if offload not in OFFLOADS:
        raise SSDError(f"unknown offload {offload!r}: choose one of {', '.join(OFFLOADS)}")


def _bnb_version() -> tuple[int, ...] | None:
    if importlib.util.find_spec("bitsandbytes") is None:
        return None
    from importlib.metadata import version

    return tuple(int(p) for p in version("bitsandbytes").split(".")[:2] if p.isdigit())


def quantization_config(quantization: str, family: str, compute_dtype: torch.dtype, device, offload: str = "none"):
    """transformers' BitsAndBytesConfig for `quantization` ('none' -> None); the family's KEEP_FULL modules
    stay unquantized."""
    if quantization == "none":
        return None
    found = _bnb_version()
    if found is None:
        raise SSDError(f"quantization {quantization} needs the bitsandbytes package (pip install bitsandbytes, "
                       f"then restart); or choose quantization none (and offload auto on a GPU)")
    if torch.device(device).type != "cuda" and found < MIN_BNB_CPU:
        raise SSDError(f"bitsandbytes {'.'.join(map(str, found))} quantizes on CUDA GPUs only: load on a CUDA "
                       f"device, or install bitsandbytes>={'.'.join(map(str, MIN_BNB_CPU))} for the CPU, "
                       f"or choose quantization none")
    return bnb_config(quantization, family, compute_dtype, offload)


def bnb_config(quantization: str, family: str, compute_dtype: torch.dtype, offload: str = "none"):
    """The BitsAndBytesConfig itself (no check that bitsandbytes can run it here)."""
    from transformers import BitsAndBytesConfig

    skip = list(KEEP_FULL.get(family, ["lm_head"]))
    spill = offload == "auto"  # modules accelerate puts on the CPU stay unquantized there
    if quantization == "8-bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip,
                                  llm_int8_enable_fp32_cpu_offload=spill)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype, llm_int8_skip_modules=skip,
                              llm_int8_enable_fp32_cpu_offload=spill)


def max_memory(device, free_bytes: int | None = None, reserve: int = RESERVE_BYTES) -> dict:
    """accelerate's max_memory for offload: what the GPU has free (ComfyUI's figure when given) minus a
    reserve for the KV cache; the rest of the model goes to the CPU."""
    dev = torch.device(device)
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(dev)[0]
    budget = int(free_bytes) - reserve
    if budget <= 0:
        raise SSDError(f"the GPU has {free_bytes / 2**30:.1f} GiB free, less than the "
                       f"{reserve / 2**30:.0f} GiB kept for the cache: free VRAM (unload other models) or load on the CPU")
    return {dev.index or 0: budget, "cpu": 2**40}


def placement(family: str, device, dtype: torch.dtype, quantization: str = "none", offload: str = "none",
              free_bytes: int | None = None) -> dict:
    """from_pretrained arguments for the choice: quantization_config, device_map and max_memory ({} = plain)."""
    check_choice(quantization, offload)
    dev = torch.device(device)
    kw: dict = {}
    if offload == "auto":
        if dev.type != "cuda":
            raise SSDError("offload auto spreads the model over the GPU and the CPU: it needs a CUDA device "
                           "(device cuda / auto on a GPU); on the CPU choose offload none")
        if importlib.util.find_spec("accelerate") is None:
            raise SSDError("offload auto needs the accelerate package (pip install accelerate, then restart); "
                           "or choose offload none")
        kw["device_map"] = "auto"
        kw["max_memory"] = max_memory(dev, free_bytes)
    q = quantization_config(quantization, family, dtype, dev, offload)
    if q is not None:
        kw["quantization_config"] = q
        kw.setdefault("device_map", {"": str(dev)})  # quantized weights are placed while loading (no .to())
    return kw


def is_placed(model) -> bool:
    """True when the weights must not be moved with .to(): quantized, or spread by a device_map."""
    return bool(getattr(model, "is_quantized", False) or getattr(model, "hf_device_map", None))


def out_of_memory(stage: str) -> SSDError:
    """The error for a CUDA out-of-memory while `stage` ('loading the model', 'sampling'): what to try."""
    return SSDError(f"out of GPU memory while {stage}: try quantization 4-bit (or 8-bit), offload auto, a smaller "
                    f"grid, a smaller model (Janus-Pro-1B), or free VRAM first (Unload models)")


def weights_bytes(model, quantization: str, family: str) -> int:
    """Bytes of a model's weights at `quantization` ('bf16' / 'fp16' / 'fp32' / '8-bit' / '4-bit'; the modules a
    quantization keeps in full precision at bf16): int8 plus a float32 scale per row (8-bit); NF4 plus
    double-quantized absmax per 64-block (4-bit). check-model's report and tools/memory_table.py's table."""
    if quantization in ("bf16", "fp16", "fp32"):
        return (4 if quantization == "fp32" else 2) * sum(p.numel() for p in model.parameters())
    skip = KEEP_FULL.get(family, ["lm_head"])
    total, quantized = 0, set()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not any(name == s or name.startswith(s + ".") for s in skip):
            n = mod.weight.numel()
            total += n + 4 * mod.out_features if quantization == "8-bit" else n // 2 + n // 64 + 4 * (n // 16384)
            quantized.add(id(mod.weight))
    return total + sum(2 * p.numel() for p in model.parameters() if id(p) not in quantized)


def free_memory() -> dict:
    """{"RAM": bytes available, "cuda:N": free bytes of each CUDA GPU} on this machine."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            out["RAM"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        try:
            import psutil

            out["RAM"] = int(psutil.virtual_memory().available)
        except ImportError:
            pass
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out[f"cuda:{i}"] = int(torch.cuda.mem_get_info(i)[0])
    return out
