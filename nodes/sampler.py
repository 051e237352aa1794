"""SSD Sampler (a V3 node): ComfyUI inputs -> ssd_core.generate, with progress, previews, cancel and live events.

``execute`` is ComfyUI's entry (the node id, for the widget's events, is its hidden ``unique_id``); ``sample`` is
the same work as a plain call returning ``{"ui": ..., "result": (...)}`` (tests, scripts)."""

import time

import torch

from .. import ssd_core
from ..ssd_core.api import MAX_BATCH  # one batch limit for the API, the CLI and the node
from ..ssd_core.decoders import DRAFT_ROWS, VERIFY_ROUNDS, DecoderParams, needs_heads, uses_heads, without_heads
from ..ssd_core.families import families_with_negative_prompts
from ..ssd_core.limits import whole_number
from ..ssd_core.memory import out_of_memory
from . import _devices, _patcher, _progress, grids
from . import trace as trace_mod
from ._io import io
from .loaders import SSDModel
from .types import CATEGORY, SSD_MODEL, SSD_TRACE

SSDError = ssd_core.SSDError
AUTO = -1  # widget value meaning "the model's default" for cfg / temperature / top_k / top_p / min_p / verify_rounds
PREVIEW_INTERVAL_S = 0.25


def _auto(value, cast, name):
    """-1 (AUTO) = the model's default; any other negative value is refused, never silently replaced; an INT input
    (cast int) that is not a whole number (NaN, inf, 3.7) is refused, never truncated."""
    if value is None or value == AUTO:
        return None
    if cast is int:
        value = whole_number(name, value)
    if value < 0:
        raise SSDError(f"{name} {value} is negative: set -1 for the model's default, or a value >= 0.")
    return cast(value)


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


class SSDSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SSDSampler",
            display_name="SSD Sampler",
            category=CATEGORY,
            description=("Makes an image with an autoregressive model in far fewer model steps: it guesses rows of "
                         "tokens ahead and the model checks them. decoder: ssd-exact = plain ar's picture, faster (in "
                         "float32 1,407 of 1,410 tests equal; the stats name any near-tie that may change it); ssd = "
                         "faster still, close in quality (needs heads); ar = one token at a time (the reference); "
                         "peers, other published methods for comparison: sjd, scd, sjd-pac (the AR distribution), "
                         "zipar, gsd (lossy)."),
            # new inputs go last: saved workflows keep their widget values by position
            inputs=[
                SSD_MODEL.Input("ssd_model"),
                io.String.Input("prompt", multiline=True, default="face",
                                tooltip="what to draw; the bundled reference model takes a class name (such as face) or its number"),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True),
                io.Float.Input("cfg", default=AUTO, min=AUTO, max=100.0, step=0.1, round=0.01,
                               tooltip="how strongly the picture follows the prompt (classifier-free guidance); -1 (shown as auto) = "
                                       "the model's default"),
                io.Float.Input("temperature", default=AUTO, min=AUTO, max=10.0, step=0.05, round=0.01,
                               tooltip="how adventurous each token choice is: lower = safer; 0 = always the most likely token; -1 (shown as "
                                       "auto) = the model's default"),
                io.Int.Input("top_k", default=AUTO, min=AUTO, max=1 << 20,
                             tooltip="pick only among the k most likely tokens; 0 = no limit; -1 (shown as auto) = the "
                                     "model's default"),
                io.Float.Input("top_p", default=AUTO, min=AUTO, max=1.0, step=0.01, round=0.001,
                               tooltip="pick only among the most likely tokens making up this share of the probability; 1 = no limit; "
                                       "-1 (shown as auto) = the model's default"),
                io.Combo.Input("decoder", options=list(ssd_core.DECODERS), default="ssd-exact",
                               tooltip="ssd-exact = plain ar's picture in fewer steps (in float32 1,407 of 1,410 tests "
                                       "equal; the stats name any near-tie that may change it); ssd = faster still, "
                                       "close in quality (needs heads); ar = one token at a time (the reference); "
                                       "peers, other published methods for comparison: sjd, scd, sjd-pac (the AR "
                                       "distribution), zipar, gsd (lossy)"),
                io.Int.Input("draft_rows", default=DRAFT_ROWS.default, min=DRAFT_ROWS.low, max=DRAFT_ROWS.high,
                             tooltip="rows guessed ahead and checked together (ssd, ssd-exact): more = fewer steps "
                                     "when the guesses are good, more work per step; 0 (shown as auto) = the decoder's "
                                     "default (ssd 1; ssd-exact: what is fastest on your device, measured once a model: "
                                     "the picture is the same either way)"),
                io.Int.Input("verify_rounds", default=AUTO, min=AUTO, max=VERIFY_ROUNDS.high,
                             tooltip="times the model may fix a guessed row before keeping it (ssd): more = closer "
                                     "to ar, fewer = fewer steps; -1 (shown as auto) = the model's default (the "
                                     f"bundled 48x48 model: 3 with its adaptive rule), else {VERIFY_ROUNDS.default}"),
                io.Combo.Input("grid", options=grids.choices(), default=grids.AUTO,
                               tooltip="image size in tokens (rows x columns), its pixels and aspect, and the "
                                       "model it is for (a bundled model's name, or a family: janus, emu3, lumina); "
                                       "auto = the model's default"),
                io.String.Input("negative_prompt", multiline=True, default="", optional=True, tooltip=(
                    f"what to steer away from: only {', '.join(families_with_negative_prompts())} models take one; "
                    "leave it empty for the others")),
                io.Int.Input("batch_size", default=1, min=1, max=MAX_BATCH, optional=True,
                             tooltip="images per run, seeds seed, seed+1, ...; one model step serves them all, so a "
                                     "batch costs far less than the images one by one"),
                io.Float.Input("min_p", default=AUTO, min=AUTO, max=0.99, step=0.005, round=0.0001, optional=True,
                               tooltip="leave out tokens far less likely than the best one (0.01 = under 1% of its "
                                       "probability); 0 = off; -1 (shown as auto) = the model's default"),
                io.Boolean.Input("official_suffix", default=True, optional=True,
                                 tooltip="Emu3 only: append ' masterpiece, film grained, best quality.' to the prompt, "
                                         "as BAAI's own script does (an empty negative prompt is its official one); "
                                         "off = your words alone. Other models have no such suffix: leave it on"),
            ],
            outputs=[
                io.Image.Output("image", display_name="image", tooltip="the decoded images (a batch of batch_size)"),
                SSD_TRACE.Output("trace", display_name="trace", tooltip="how every token was made (for SSD Trace "
                                 "to Image; a list for a batch)"),
                io.String.Output("stats", display_name="stats", tooltip="how many times fewer model steps than one "
                                 "token at a time, the time, same picture as plain AR or not; then a details line "
                                 "(a batch: its time once, then each image)"),
            ],
            hidden=[io.Hidden.unique_id],  # the node id that the widget's live events carry
            is_output_node=True,  # runs (and draws its grid) even with nothing connected; resends its trace cached
        )

    @classmethod
    def execute(cls, ssd_model, prompt="face", seed=0, cfg=AUTO, temperature=AUTO, top_k=AUTO, top_p=AUTO,
                decoder="ssd-exact", draft_rows=DRAFT_ROWS.default, verify_rounds=AUTO, grid="auto",
                negative_prompt="", batch_size=1, min_p=AUTO, official_suffix=True):
        out = cls.sample(ssd_model, prompt, seed, cfg, temperature, top_k, top_p, decoder, draft_rows, verify_rounds,
                         grid, negative_prompt, batch_size, min_p, official_suffix, unique_id=cls.hidden.unique_id)
        return io.NodeOutput(*out["result"], ui=out["ui"])

    @classmethod
    def sample(cls, ssd_model, prompt="face", seed=0, cfg=AUTO, temperature=AUTO, top_k=AUTO, top_p=AUTO,
               decoder="ssd-exact", draft_rows=DRAFT_ROWS.default, verify_rounds=AUTO, grid="auto",
               negative_prompt="", batch_size=1, min_p=AUTO, official_suffix=True, unique_id=None):
        model = _check(ssd_model, decoder, negative_prompt)
        seed = whole_number("seed", seed, 0, 2**64 - 1)  # INT inputs: NaN, inf and 1.7 refused, never truncated
        n = whole_number("batch_size", batch_size, 1, MAX_BATCH)
        kwargs = dict(
            # a class-conditional model takes a class name or index: the family resolves it (GridModel.build_prompt)
            prompt="" if prompt is None else str(prompt),
            negative_prompt=negative_prompt or "",
            decoder=decoder,
            cfg=_auto(cfg, float, "cfg"),
            temperature=_auto(temperature, float, "temperature"),
            top_k=_auto(top_k, int, "top_k"),
            top_p=_auto(top_p, float, "top_p"),
            min_p=_auto(min_p, float, "min_p"),
            # each checked by DecoderParams: a whole number within its limits; verify_rounds -1 = the model's default
            params=DecoderParams(draft_rows=draft_rows, verify_rounds=None if verify_rounds == AUTO else verify_rounds),
            grid=grids.parse(grid, getattr(model, "family", ""), ssd_model.name),
            official_suffix=bool(official_suffix),
        )
        heads = ssd_model.heads if uses_heads(decoder) else None
        live = _Live(model, n, kwargs["grid"] or tuple(model.default_grid), decoder, unique_id)
        try:
            _patcher.load_to_device(ssd_model.patcher)  # back on the GPU if ComfyUI unloaded it
            if heads is not None:
                heads.to(model.device)
            if n == 1:
                results = [ssd_core.generate(model, heads, seed=seed, on_step=live.on_step,
                                             should_cancel=_devices.processing_interrupted, **kwargs)]
            else:
                results = ssd_core.generate_batch(model, heads, seeds=[(seed + i) % 2**64 for i in range(n)],
                                                  batch_size=n, on_step=live.on_step,
                                                  should_cancel=_devices.processing_interrupted, **kwargs)
        except ssd_core.Cancelled:
            raise _devices.interrupt_exception()("SSD sampling was cancelled") from None
        except torch.OutOfMemoryError:
            _devices.soft_empty_cache()
            raise out_of_memory("sampling") from None
        return _outputs(results, getattr(model, "dtype", None), live.progress)


def _check(ssd_model, decoder, negative_prompt):
    """The engine model of an SSD_MODEL input, once the decoder, its heads and the negative prompt suit it."""
    if not isinstance(ssd_model, SSDModel):
        raise SSDError("the ssd_model input must come from 'Load AR Image Model (SSD)' "
                       "(or 'Load SSD Heads').")
    model = ssd_model.model
    if decoder not in ssd_core.DECODERS:
        raise SSDError(f"unknown decoder '{decoder}': pick one of {', '.join(ssd_core.DECODERS)}.")
    if needs_heads(decoder) and ssd_model.heads is None:
        raise SSDError(f"decoder '{decoder}' drafts with heads: add a 'Load SSD Heads' node between the "
                       f"model loader and this sampler, or pick decoder {without_heads()}.")
    if negative_prompt and negative_prompt.strip() and not getattr(model, "negative_prompts", False):
        raise SSDError(f"this model ({ssd_model.name}) takes no negative prompt: clear it "
                       f"(only {', '.join(families_with_negative_prompts())} models take one).")
    return model


class _Live:
    """What the user sees while a run goes: ComfyUI's progress bar with a preview of the first image, and the
    widget's live grid of each image in turn (round robin)."""

    def __init__(self, model, n, grid, decoder, unique_id):
        h, w = grid
        self.total, self.n, self.decoder = n * h * w, n, decoder
        self.progress = _progress.Progress(self.total, unique_id)
        self.preview = _Preview(model)
        self.finals = [0] * n  # final cells per image
        self.turn = 0  # the image whose live grid goes out next
        self.t0 = time.monotonic()

    def on_step(self, p):
        self.finals[p.image] = int(p.final_cells)
        shown = self.preview.image(p.tokens) if self.progress.bar is not None and p.image == 0 else None
        self.progress.update(sum(self.finals), self.total, _jpeg(shown))
        if self.progress.server is not None and p.image == self.turn and self.progress.due():
            self.progress.send("ssd.grid", {**trace_mod.live(p, self.decoder, time.monotonic() - self.t0),
                                            "image": p.image, "images": self.n})
            self.turn = (self.turn + 1) % self.n


def _outputs(results, dtype, progress):
    """The node's outputs of a run: images (the token grid drawn when the model has no pixel decoder), the
    trace (a list for a batch) and the stats text; each image's final grid goes to the widget."""
    n = len(results)
    fulls, smalls, notes, images = [], [], [], []
    for i, result in enumerate(results):
        full = result.trace.to_dict()
        small = trace_mod.compact(full, done=True)
        if n > 1:
            small.update(image=i, images=n)
        if result.image is not None:
            images.append(_to_image(result.image))
            notes.append("")
        else:
            images.append(trace_mod.render(full, cell_size=max(1, 512 // max(full["grid"]))))
            notes.append(" | this model has no pixel decoder here: the image shows the token grid")
        fulls.append(full)
        smalls.append(small)
    for small in smalls:
        progress.send("ssd.grid", small, force=True)
    if n == 1:
        head, detail = trace_mod.stats_text(fulls[0], dtype).split("\n")
        stats = head + notes[0] + "\n" + detail
    else:
        stats = trace_mod.batch_stats_text(fulls, dtype, notes)
    trace = fulls[0] if n == 1 else fulls
    return {"ui": {"ssd_trace": smalls}, "result": (torch.cat(images), trace, stats)}


def _jpeg(img):
    """ComfyUI's preview tuple: its max size is the image's own (ComfyUI scales a preview to fit max size, up
    as well as down: 512 would show a 96 x 96 picture blurred and labelled 512 x 512)."""
    return None if img is None else ("JPEG", img, max(img.size))
