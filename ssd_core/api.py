"""The calls everything else uses: load a model, load heads, generate."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import hub, threads
from .decoders import make_policy
from .engine import decode
from .errors import SSDError
from .families import detect_family, family_class
from .heads import DraftHeads, load_heads_file
from .sampling import SamplerSettings
from .trace import Trace

REFERENCE_DIR = Path(__file__).parent / "reference"
BUNDLED_MODELS = {"reference": REFERENCE_DIR / "model"}
BUNDLED_HEADS = {"reference": REFERENCE_DIR / "model" / "heads.safetensors"}


def list_bundled() -> dict[str, list[str]]:
    return {"models": [k for k, v in BUNDLED_MODELS.items() if (v / "config.json").is_file()],
            "heads": [k for k, v in BUNDLED_HEADS.items() if v.is_file()]}


def resolve_dtype(dtype: str | torch.dtype | None, device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):  # bf16 on a GPU, fp32 on the CPU (fp16/bf16 matmuls are slow there)
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return hub.parse_dtype(dtype)


def load_model(name_or_path: str | Path, dtype: str | torch.dtype | None = "auto", device="cpu",
               family: str | None = None, download: str | bool | None = None, compile: str | bool = "off", **kwargs):
    """A model folder (or 'reference', the bundled model) -> a GridModel of its family.

    `family` skips detection; with `download` (True = the family's default repo id, or a repo id) a folder
    without files is fetched first. Nothing touches the network otherwise. `compile`: 'off' (DynamicCache),
    'static' (static KV cache, eager) or 'compiled' (static cache + torch.compile; True): static_cache.py.
    """
    from . import static_cache

    mode = static_cache.parse_mode(compile)
    return static_cache.enable(_load_model(name_or_path, dtype, device, family, download, **kwargs), mode)


def _load_model(name_or_path, dtype, device, family, download, **kwargs):
    folder = Path(BUNDLED_MODELS.get(str(name_or_path), name_or_path))
    if str(name_or_path) in BUNDLED_MODELS and not (folder / "config.json").is_file():
        raise SSDError(f"the bundled model's files are missing from {folder}; reinstall the pack")
    cls = family_class(family or detect_family(folder))  # a named family may not be on disk yet (download)
    return cls.load(folder, resolve_dtype(dtype, device), device, download=download, **kwargs)


def load_heads(name_or_path: str | Path, model) -> DraftHeads:
    """A heads file (or 'reference') checked against the model and moved to its device and dtype."""
    path = BUNDLED_HEADS.get(str(name_or_path), Path(name_or_path))
    heads = load_heads_file(path)
    heads.check_model(model)
    return heads.to(device=model.device, dtype=model.dtype).eval()


@dataclass
class Result:
    tokens: torch.Tensor  # [H, W] image codes
    image: torch.Tensor | None  # [H_px, W_px, 3] in [0, 1]
    trace: Trace


def generate(model, heads, *, prompt, negative_prompt: str = "", decoder: str = "ssd", seed: int = 0,
             cfg: float | None = None, temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, draft_rows: int = 1, verify_rounds: int = 2, window: int | None = None,
             grid=None, on_step=None, should_cancel=None, decode_pixels: bool = True, score: bool = True) -> Result:
    """Generate one image. Sampler values left as None take the model's defaults."""
    d = getattr(model, "defaults", {})
    settings = SamplerSettings(
        seed=int(seed), cfg=float(d.get("cfg", 1.0) if cfg is None else cfg),
        temperature=float(d.get("temperature", 1.0) if temperature is None else temperature),
        top_k=d.get("top_k", 0) if top_k is None else top_k,
        top_p=float(d.get("top_p", 1.0) if top_p is None else top_p))
    policy = make_policy(decoder, draft_rows, verify_rounds, window)
    layout = model.layout(grid)
    if heads is not None:
        heads.check_model(model)
    prompt_ids = model.build_prompt(prompt, negative_prompt, settings.guided, layout.grid)
    with torch.no_grad(), threads.for_sampling(model):  # the intra-op thread rule (threads.py)
        run, trace = decode(model, heads, prompt_ids, layout, settings, policy, decoder, on_step, should_cancel, score)
    image = model.decode(trace.tokens) if decode_pixels else None
    return Result(trace.tokens, image, trace)
