"""SSD Sampler: ComfyUI inputs -> ssd_core.generate, with progress, previews, cancel and live events."""

import re
import time

import torch

from .. import ssd_core
from ..ssd_core.families.llama_grid import class_index
from . import _comfy
from . import trace as trace_mod
from .loaders import SSDModel

SSDError = ssd_core.SSDError
AUTO = -1  # widget value meaning "the model's default" for cfg / temperature / top_k / top_p
PREVIEW_INTERVAL_S = 0.25


def resolve_prompt(model, text):
    """Class-conditional models take a class name or index (resolved by the engine); text models the text."""
    names = getattr(model, "class_names", None)
    text = "" if text is None else str(text)
    return text if names is None else class_index(names, text)


def parse_grid(text):
    """'auto' -> None; 'HxW' or 'N' (square) -> (H, W) in tokens."""
    t = str(text).strip().lower().replace(" ", "")
    if t in ("", "auto"):
        return None
    m = re.fullmatch(r"(\d+)(?:[x*,](\d+))?", t)
    if not m:
        raise SSDError(f"grid '{text}' is not understood: write auto, or rows x columns in tokens such as 16x16.")
    h = int(m.group(1))
    w = int(m.group(2)) if m.group(2) else h
    if h <= 0 or w <= 0:
        raise SSDError(f"grid '{text}' must be at least 1x1 tokens.")
    return (h, w)


def _auto(value, cast):
    return None if value is None or value < 0 else cast(value)


def _to_image(img):
    """Engine image [H, W, 3] -> ComfyUI IMAGE [1, H, W, 3] float32 on the CPU."""
    return img.detach().to("cpu", torch.float32).clamp(0, 1).unsqueeze(0).contiguous()


class _Preview:
    """Decodes the finished top rows for ComfyUI's preview (grey below), at most every
    PREVIEW_INTERVAL_S seconds and only when a new row is done."""

    def __init__(self, model):
        self.model = model
        self.rows = 0
        self.last = 0.0
        self.disabled = not callable(getattr(model, "decode", None))

    def image(self, tokens):
        if self.disabled:
            return None
        done = (tokens >= 0).all(dim=1)
        rows = int(done.to(torch.int64).cumprod(0).sum())
        if rows <= self.rows or time.monotonic() - self.last < PREVIEW_INTERVAL_S:
            return None
        try:
            part = self.model.decode(tokens[:rows])
        except Exception:  # a preview must never break a run
            self.disabled = True
            return None
        if part is None:
            self.disabled = True
            return None
        self.rows, self.last = rows, time.monotonic()
        from PIL import Image

        h, w = tokens.shape
        px_per_row = part.shape[0] / rows
        full_h = int(round(px_per_row * h))
        arr = (part.detach().to("cpu", torch.float32).clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        canvas = Image.new("RGB", (arr.shape[1], max(full_h, arr.shape[0])), (64, 64, 64))
        canvas.paste(Image.fromarray(arr), (0, 0))
        return canvas


class SSDSampler:
    CATEGORY = "sampling/SSD"
    RETURN_TYPES = ("IMAGE", "SSD_TRACE", "STRING")
    RETURN_NAMES = ("image", "trace", "stats")
    OUTPUT_TOOLTIPS = ("the decoded image", "how every token became final (for SSD Trace to Image)",
                       "steps, tokens per step, time, acceptance counts")
    FUNCTION = "sample"
    OUTPUT_NODE = True  # runs (and draws its grid) even with nothing connected; resends its trace when cached
    DESCRIPTION = ("Generates an image token by token with an autoregressive model. decoder: ar = one "
                   "token per step (the reference); ssd = spatially speculative decoding (needs heads); "
                   "ssd-exact = the same image as ar for the same seed, in fewer steps; sjd, zipar = peers.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "ssd_model": ("SSD_MODEL",),
                "prompt": ("STRING", {"multiline": True, "default": "face",
                           "tooltip": "text; for class-conditional models (the reference) a class name or index"}),
                "negative_prompt": ("STRING", {"multiline": True, "default": "",
                                    "tooltip": "only for families with negative prompts (janus, emu3, lumina)"}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True}),
                "cfg": ("FLOAT", {"default": AUTO, "min": AUTO, "max": 100.0, "step": 0.1, "round": 0.01,
                        "tooltip": "classifier-free guidance scale; -1 = the model's default"}),
                "temperature": ("FLOAT", {"default": AUTO, "min": AUTO, "max": 10.0, "step": 0.05, "round": 0.01,
                                "tooltip": "-1 = the model's default; 0 = greedy"}),
                "top_k": ("INT", {"default": AUTO, "min": AUTO, "max": 1 << 20,
                          "tooltip": "-1 = the model's default; 0 = no top-k"}),
                "top_p": ("FLOAT", {"default": AUTO, "min": AUTO, "max": 1.0, "step": 0.01, "round": 0.001,
                          "tooltip": "-1 = the model's default; 1 = no top-p"}),
                "decoder": (list(ssd_core.DECODERS), {"default": "ssd"}),
                "draft_rows": ("INT", {"default": 1, "min": 1, "max": 16,
                               "tooltip": "rows drafted and verified together (ssd, ssd-exact)"}),
                "verify_rounds": ("INT", {"default": 2, "min": 0, "max": 8,
                                  "tooltip": "correction rounds per row before it is committed (ssd)"}),
                "grid": ("STRING", {"default": "auto",
                         "tooltip": "image size in tokens, rows x columns (e.g. 16x16); auto = the model's default"}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def sample(self, ssd_model, prompt="face", negative_prompt="", seed=0, cfg=AUTO, temperature=AUTO,
               top_k=AUTO, top_p=AUTO, decoder="ssd", draft_rows=1, verify_rounds=2, grid="auto",
               unique_id=None):
        if not isinstance(ssd_model, SSDModel):
            raise SSDError("the ssd_model input must come from 'Load AR Image Model (SSD)' "
                           "(or 'Load SSD Heads').")
        model = ssd_model.model
        if decoder not in ssd_core.DECODERS:
            raise SSDError(f"unknown decoder '{decoder}': pick one of {', '.join(ssd_core.DECODERS)}.")
        if decoder in ("ssd", "ssd-exact") and ssd_model.heads is None:
            raise SSDError(f"decoder '{decoder}' drafts with heads: add a 'Load SSD Heads' node between the "
                           f"model loader and this sampler, or pick decoder ar, sjd or zipar.")
        if negative_prompt and negative_prompt.strip() and not getattr(model, "negative_prompts", False):
            raise SSDError(f"this model ({getattr(model, 'family', '?')}) takes no negative prompt: clear it.")
        kwargs = dict(
            prompt=resolve_prompt(model, prompt),
            negative_prompt=negative_prompt or "",
            decoder=decoder,
            seed=int(seed),
            cfg=_auto(cfg, float),
            temperature=_auto(temperature, float),
            top_k=_auto(top_k, int),
            top_p=_auto(top_p, float),
            draft_rows=int(draft_rows),
            verify_rounds=int(verify_rounds),
            grid=parse_grid(grid),
        )
        heads = ssd_model.heads if decoder in ("ssd", "ssd-exact") else None

        h, w = kwargs["grid"] or tuple(model.default_grid)
        progress = _comfy.Progress(h * w, unique_id)
        preview = _Preview(model)
        t0 = time.monotonic()

        def on_step(p):
            cells = int(p.grid[0]) * int(p.grid[1])
            progress.update(int(p.final_cells), cells, None if progress.bar is None else
                            _jpeg(preview.image(p.tokens)))
            if progress.server is not None and progress.due():
                progress.send("ssd.grid", trace_mod.live(p, decoder, time.monotonic() - t0))

        try:
            result = ssd_core.generate(model, heads, on_step=on_step,
                                       should_cancel=_comfy.processing_interrupted, **kwargs)
        except ssd_core.Cancelled:
            raise _comfy.interrupt_exception()("SSD sampling was cancelled") from None

        full = result.trace.to_dict()
        small = trace_mod.compact(full, done=True)
        stats = trace_mod.stats_text(full)
        if result.image is not None:
            image = _to_image(result.image)
        else:
            image = trace_mod.render(full, cell_size=max(1, 512 // max(full["grid"])))
            stats += " | this model has no pixel decoder here: the image shows the token grid"
        progress.send("ssd.grid", small, force=True)
        return {"ui": {"ssd_trace": [small]}, "result": (image, full, stats)}


def _jpeg(img):
    return None if img is None else ("JPEG", img, 512)
