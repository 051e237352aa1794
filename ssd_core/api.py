"""The calls everything else uses: load a model, load heads, generate."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from . import calibrate, memory, model_files, static_cache, threads
from .decoders import DecoderParams, make_policy, own_loop, picks_rows, uses_heads, with_model_defaults
from .engine import Generation, decode_batch
from .errors import SSDError, mps_op_errors
from .families import detect_family, family_class
from .heads import DraftHeads, load_heads_file
from .limits import whole_number
from .sampling import check_seed, settings_from
from .trace import Trace

REFERENCE_DIR = Path(__file__).parent / "reference"
# the bundled models: `reference` (24x24 tokens, 96 px) and its 48x48 sibling (192 px; also samples 32x32)
BUNDLED_MODELS = {"reference": REFERENCE_DIR / "model", "reference-48": REFERENCE_DIR / "model48"}
BUNDLED_HEADS = {name: folder / "heads.safetensors" for name, folder in BUNDLED_MODELS.items()}


def list_bundled() -> dict[str, list[str]]:
    return {"models": [k for k, v in BUNDLED_MODELS.items() if (v / "config.json").is_file()],
            "heads": [k for k, v in BUNDLED_HEADS.items() if v.is_file()]}


def resolve_dtype(dtype: str | torch.dtype | None, device) -> torch.dtype:
    """The dtype to load in; 'auto' (or None) picks by device:

    - CUDA with native bf16 (Ampere / sm80 and newer; ROCm): bf16, the released models' own dtype.
    - CUDA without it, with fp16 tensor cores (Volta, Turing: V100, T4, RTX 20xx): fp16. Not bf16, which torch
      only emulates there (slowly); not fp32, which doubles the weights (a 7B model: 28 GB, more than those GPUs
      have) and misses the tensor cores. fp16's risk: a model whose activations pass 65,504 overflows (inf /
      NaN, a broken image); pick dtype fp32 for that model.
    - older CUDA GPUs (Pascal GTX 10xx, Maxwell): fp32, as they run fp16 at a fraction of their fp32 speed
      (1/64 on the GTX 10xx); quantization 8-bit / 4-bit is what fits a large model there.
    - MPS (Apple GPUs): fp16, which every macOS with MPS runs natively. Not bf16 (macOS 14 and newer only, with
      fewer kernels), not fp32 (the GPU shares the Mac's memory with everything else: a 7B model would take
      28 GB). Same fp16 caveat: dtype fp32 for a model that overflows.
    - CPU: fp32 (fp16 / bf16 matmuls are slow there).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        kind = torch.device(device).type
        if kind == "cuda":
            if torch.cuda.is_bf16_supported(including_emulation=False):
                return torch.bfloat16
            return torch.float16 if torch.cuda.get_device_capability(device)[0] >= 7 else torch.float32
        return torch.float16 if kind == "mps" else torch.float32
    return model_files.parse_dtype(dtype)


def check_device(device) -> torch.device | None:
    """A device name or torch.device this machine has (cpu, cuda, cuda:N, mps), else an SSDError saying which
    ones it has. mps (Apple GPUs) runs the engine; an op torch has no mps kernel for stops a generation with one
    line saying which op and how to go on (errors.mps_op_errors)."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise SSDError(f"unknown device {str(device)[:40]!r}: use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SSDError(f"device {device} was asked for but torch sees no CUDA GPU on this machine: use device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise SSDError(f"device {device} does not exist: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                       f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        why = "this torch is built without it" if not torch.backends.mps.is_built() else "this Mac has none, or " \
            "macOS is older than 12.3"
        raise SSDError(f"device {device} was asked for but torch sees no Apple GPU (MPS) here ({why}): use device "
                       "cpu")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise SSDError(f"device {device} is not supported: use cpu, cuda, cuda:N or mps")
    return dev


def check_negative_prompt(model, negative_prompt) -> None:
    """Refuse a negative prompt for a model that would silently ignore it."""
    if negative_prompt and str(negative_prompt).strip() and not getattr(model, "negative_prompts", False):
        raise SSDError(f"this model ({shown_name(model)}) takes no negative prompt: leave it empty")


def check_model_decoder(model, decoder: str) -> None:
    """A decoder with a loop of its own (flashar) refuses a model of another kind, in one line naming what to do."""
    if own_loop(decoder) and decoder not in getattr(model, "own_decoders", ()):
        raise SSDError(f"decoder {decoder} runs on a FlashAR checkpoint (lxazjk/Emu3.5-Image-FlashAR) only, and "
                       f"this model is {shown_name(model)}: pick another decoder, or load the FlashAR checkpoint")


def prompt_switches(model, official_suffix: bool | None = None) -> dict:
    """build_prompt keywords of the family prompt switches given (None: not given, the family's default).
    official_suffix: Emu3's official positive suffix (families/emu3.py); a family without a switch ignores it
    left on and refuses it turned off, so that it is never silently ignored."""
    if official_suffix is None:
        return {}
    if not isinstance(official_suffix, bool):
        raise SSDError(f"official_suffix must be true or false, got {str(official_suffix)[:40]!r}")
    if "official_suffix" in getattr(model, "prompt_switches", ()):
        return {"official_suffix": official_suffix}
    if official_suffix:
        return {}
    raise SSDError(f"this model ({shown_name(model)}) appends no official suffix to its prompts "
                   "(only emu3 models do): leave official_suffix on")


def load_model(name_or_path: str | Path, dtype: str | torch.dtype | None = "auto", device="cpu",
               family: str | None = None, download: str | bool | None = None, quantization: str = "none",
               offload: str = "none", free_bytes: int | None = None, compile: str | bool = "off", **kwargs):
    """A model folder (or 'reference', the bundled model) -> a GridModel of its family.

    `family` skips detection; with `download` (True = the family's default repo id, or a repo id) a folder
    without files is fetched first. Nothing touches the network otherwise. quantization none / 8-bit / 4-bit
    (bitsandbytes) and offload none / auto (accelerate, `free_bytes` of VRAM to use): see memory.py. `compile`:
    'off' (DynamicCache), 'static' (static KV cache, eager), 'compiled' (that cache + torch.compile; True): see
    static_cache.py.
    """
    check_device(device)
    model_files.check_path(name_or_path, "model folder")  # a NUL, a name of 256+ bytes: before any look at it
    folder = Path(BUNDLED_MODELS.get(str(name_or_path), name_or_path))
    if str(name_or_path) in BUNDLED_MODELS and not (folder / "config.json").is_file():
        raise SSDError(f"the bundled model's files are missing from {folder}; reinstall the pack")
    memory.check_choice(quantization, offload)
    mode = static_cache.parse_mode(compile)
    cls = family_class(family or detect_family(folder))  # a named family may not be on disk yet (download)
    kwargs.update(memory.placement(cls.family, device, resolve_dtype(dtype, device), quantization, offload, free_bytes))
    model = static_cache.enable(cls.load(folder, resolve_dtype(dtype, device), device, download=download, **kwargs), mode)
    # messages name the model as the user loaded it ('reference', the folder's name), never its family's code name
    model.shown_as = str(name_or_path) if str(name_or_path) in BUNDLED_MODELS else folder.name or str(folder)
    return model


def shown_name(model) -> str:
    """A model as messages name it: as it was loaded ('reference', its folder's name; GridModel.shown_name), else
    its family."""
    return getattr(model, "shown_name", None) or getattr(model, "family", None) or "?"


def load_heads(name_or_path: str | Path, model) -> DraftHeads:
    """A heads file (or 'reference') checked against the model and moved to its device and dtype."""
    path = BUNDLED_HEADS.get(str(name_or_path), Path(name_or_path))
    heads = load_heads_file(path)
    heads.check_model(model)
    return heads.to(device=model.device, dtype=model.dtype).eval()


def check_grid_value(grid):
    """None, 'HxW' / 'auto' (grid_text.parse_grid) or a (rows, columns) pair of whole numbers -> None or (H, W)."""
    from .grid_text import parse_grid

    if grid is None or isinstance(grid, str):
        return parse_grid(grid)
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise SSDError(f"grid must be (rows, columns) in tokens, e.g. (16, 16), or 'HxW', got {str(grid)[:40]}")
    return tuple(whole_number("grid " + side, v) for side, v in zip(("rows", "columns"), grid))


@dataclass
class Result:
    tokens: torch.Tensor  # [H, W] image codes
    image: torch.Tensor | None  # [H_px, W_px, 3] in [0, 1]
    trace: Trace


def generate(model, heads, *, prompt, seed: int = 0, **options) -> Result:
    """Generate one image: generate_batch's options (decoder, params / decoder parameters by name, sampler
    values, grid, callbacks) for a batch of one. Sampler values left as None take the model's defaults,
    decoder parameters left as None (or draft_rows 0) the decoder's (decoders.DECODER_SPECS)."""
    return generate_batch(model, heads, prompts=[prompt], seeds=[seed], **options)[0]


MAX_BATCH = 64


def generate_batch(model, heads, *, prompts=None, seeds=None, prompt=None, seed: int = 0, batch_size: int | None = None,
                   negative_prompt: str = "", decoder: str = "ssd-exact", params: DecoderParams | None = None,
                   cfg: float | None = None, temperature: float | None = None, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None, grid=None, on_step=None,
                   should_cancel=None, decode_pixels: bool = True, score: bool = True,
                   official_suffix: bool | None = None, calibration: calibrate.Calibration | None = None,
                   **decoder_params) -> list[Result]:
    """Generate a batch of images with one base-model forward per step for all of them -> one Result each.

    The images are `prompts` x `seeds` paired in order; a single `prompt` is repeated and a missing `seeds`
    list is seed, seed+1, ...; batch_size (default: the length of the lists given) says how many.
    Decoder parameters: `params` (a DecoderParams) and / or by name (draft_rows=2, ...: decoders.PARAMS), the
    names over params. Every image gets exactly the tokens its own run would get with `ar` and `ssd-exact`; the
    sampler values are shared. on_step receives a Progress whose `image` is the index in the batch.
    official_suffix False leaves Emu3's official positive suffix off its prompts (None / True: on; prompt_switches).
    calibration: where ssd-exact's pick of rows (draft_rows 0) keeps what it measured (None: the model's own).
    """
    prompts, seeds = _images(prompts, seeds, prompt, seed, batch_size)
    grid = check_grid_value(grid)
    params = DecoderParams.of(params, **decoder_params)  # each checked: a whole number within its limits
    if top_k is not None:
        whole_number("top_k", top_k)  # its limits: SamplerSettings
    d = getattr(model, "defaults", {})
    settings = [settings_from(d, s, cfg=cfg, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
                for s in seeds]
    params.for_decoder(decoder)  # an unknown decoder is refused before any work
    params = with_model_defaults(params, model, decoder)  # the model's own defaults where none is given
    check_model_decoder(model, decoder)
    check_negative_prompt(model, negative_prompt)
    switches = prompt_switches(model, official_suffix)
    layout = model.layout(grid)
    if heads is not None:
        heads.check_model(model)
    prompt_ids = [model.build_prompt(p, negative_prompt, settings[0].guided, layout.grid, **switches) for p in prompts]
    if own_loop(decoder):  # flashar: its checkpoint's own loop, one image at a time (flashar_decode.py)
        from . import flashar_decode

        with mps_op_errors(), torch.no_grad(), threads.for_sampling(model):
            traces = []
            for i, (p, s) in enumerate(zip(prompt_ids, settings)):
                step = None if on_step is None else (lambda progress, i=i: on_step(replace(progress, image=i)))
                traces.append(flashar_decode.generate(model, p, layout.grid, s, step, should_cancel))
                if score:  # its picture scored as every decoder's: under the checkpoint's raster distribution
                    flashar_decode.score(model, p, layout, traces[-1], s)
        return [Result(t.tokens, model.decode(t.tokens) if decode_pixels else None, t) for t in traces]
    choice = None
    if picks_rows(decoder, params):  # rows and heads that fit the device, measured once per model (calibrate.py)
        streams = sum(p.ids.shape[0] for p in prompt_ids)  # the batch's stream rows (cond and uncond per image)
        with mps_op_errors(), torch.no_grad(), threads.for_sampling(model):
            choice = calibrate.pick(model, heads if uses_heads(decoder) else None, layout, streams,
                                    calibration or calibrate.calibration_of(model), images=len(prompts))
    policies = [make_policy(decoder, params, choice=choice) for _ in seeds]
    # an op Apple's mps backend lacks: one line naming it and the fix (PYTORCH_ENABLE_MPS_FALLBACK=1, or cpu)
    with mps_op_errors():
        with torch.no_grad(), threads.for_sampling(model):  # the intra-op thread rule (threads.py)
            done = decode_batch(model, heads, prompt_ids, layout, settings, policies,
                                Generation(on_step, should_cancel, score))
        return [Result(trace.tokens, model.decode(trace.tokens) if decode_pixels else None, trace)
                for _, trace in done]


def _images(prompts, seeds, prompt, seed, batch_size) -> tuple[list, list[int]]:
    """generate_batch's ways to name its images -> (prompts, seeds), one each, checked."""
    if isinstance(prompts, (str, bytes, numbers.Integral)):  # one prompt ("12" is one prompt, never '1' and '2')
        if prompt is not None and prompt != prompts:
            raise SSDError(f"give one of prompt ({str(prompt)[:40]!r}) and prompts ({str(prompts)[:40]!r}), not both")
        prompt, prompts = prompts, None
    if isinstance(seeds, (str, bytes, numbers.Number)):  # one number: the first seed, as `seed`
        seed, seeds = seeds, None
    for name, value in (("prompts", prompts), ("seeds", seeds)):
        if value is not None and not isinstance(value, (list, tuple)):
            raise SSDError(f"{name} must be a list (one entry per image), got {type(value).__name__}")
    seed = whole_number("seed", seed)
    if seeds is not None:
        seeds = [whole_number("seed", s) for s in seeds]
    if batch_size is not None:
        batch_size = whole_number("batch_size", batch_size)
    n = batch_size if batch_size is not None else len(prompts if prompts is not None else seeds if seeds is not None else [0])
    if not 1 <= n <= MAX_BATCH:
        raise SSDError(f"batch_size must be a whole number from 1 to {MAX_BATCH}, got {batch_size}")
    if prompts is None:
        prompts = [prompt if prompt is not None else 0] * n
    if seeds is None:
        check_seed(seed)  # the first seed obeys the rule; the ones after it count on modulo 2^64
        seeds = [(int(seed) + i) % 2**64 for i in range(n)]
    if len(prompts) != n or len(seeds) != n:
        raise SSDError(f"a batch of {n} images needs {n} prompts and {n} seeds, got {len(prompts)} prompts "
                       f"and {len(seeds)} seeds")
    return list(prompts), seeds
