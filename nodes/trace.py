"""The trace of a run for ComfyUI: its compact form for the browser widget, its stats line, and SSD Trace to
Image. Statuses, palette, JSON-safe numbers and the status image are ssd_core/trace.py's (web/ssd_grid_core.js
matches them, a test checks)."""

import math

import torch

from ..ssd_core.limits import whole_number
from ..ssd_core.trace import STATUSES, finite_or_none, json_safe, status_image
from ._io import io
from .types import CATEGORY, SSD_TRACE

STATUS_CODE = {name: str(i) for i, name in enumerate(STATUSES)}  # the compact string's digit per status


def encode_status(status):
    """H lists of W status names -> one string of H*W digit codes."""
    code = STATUS_CODE
    try:
        return "".join(code[s] for row in status for s in row)
    except KeyError as e:
        raise ValueError(f"unknown cell status {e.args[0]!r}; known: {', '.join(STATUSES)}") from None


def _flat(rows):
    return [int(v) for row in rows for v in row]


def check_trace(trace):
    """Return the trace dict or raise a message saying what is wrong with it."""
    if not isinstance(trace, dict) or "grid" not in trace or "status" not in trace:
        raise ValueError("this input is not an SSD trace: connect the 'trace' output of an SSD Sampler.")
    h, w = (int(v) for v in trace["grid"])
    status = trace["status"]
    if len(status) != h or any(len(r) != w for r in status):
        raise ValueError(f"the trace is damaged: its status grid is not {h} x {w}. Run the SSD Sampler again.")
    return trace


def compact(trace, done=True):
    """The widget's form of a full trace dict (``result.trace.to_dict()``): JSON, small."""
    check_trace(trace)
    h, w = (int(v) for v in trace["grid"])
    out = {
        "v": 1,
        "done": bool(done),
        "decoder": trace.get("decoder"),
        "grid": [h, w],
        "status": encode_status(trace["status"]),
        "steps": int(trace.get("steps", 0)),
        "wall_s": finite_or_none(trace.get("wall_s", 0.0) or 0.0),
        "prefill_s": finite_or_none(trace.get("prefill_s", 0.0) or 0.0),
        "counts": {k: int(v) for k, v in (trace.get("counts") or {}).items()},
        "seed": trace.get("seed"),
    }
    exact = trace.get("exact")
    if isinstance(exact, dict) and exact.get("first_near_tie") is not None:  # ssd-exact: where it may differ
        out["first_near_tie"] = [int(v) for v in exact["first_near_tie"]]
    if "step" in trace:
        out["step"] = _flat(trace["step"])
    if "round" in trace:
        out["round"] = _flat(trace["round"])
    for key in ("tokens_per_step", "nll"):
        if trace.get(key) is not None:
            out[key] = finite_or_none(trace[key])
    return json_safe(out)  # strict JSON: the browser's JSON.parse refuses Infinity and NaN


def live(progress, decoder, t0_wall):
    """The ``ssd.grid`` event payload for one engine step (no per-cell steps: cheap)."""
    h, w = (int(v) for v in progress.grid)
    return json_safe({
        "v": 1,
        "done": False,
        "decoder": decoder,
        "grid": [h, w],
        "status": encode_status(progress.status),
        "steps": int(progress.step),
        "final": int(progress.final_cells),
        "wall_s": float(t0_wall),
    })


# what each cell status means, in the words of the widget's legend and the node help (web/docs)
STATUS_WORDS = {"accepted": "drafted right", "corrected": "fixed by the model", "ar": "one at a time",
                "forced": "forced", "pending": "pending"}
EXACT_DECODERS = ("ssd-exact",)  # the same rule as plain ar: the same picture in float32


def _seconds(s):
    s = float(s or 0.0)
    if not math.isfinite(s):
        return "time unknown"
    return f"{s:.1f} s" if s >= 10 else f"{s:.2f} s"


def _dtype_name(dtype):
    return None if dtype is None else str(dtype).replace("torch.", "")


def headline(trace, dtype=None, time=True):
    """What an artist reads first: the speed-up in model steps against one token at a time (plain AR) for the same
    picture, the time, and for exact decoders whether the picture is plain AR's."""
    decoder = trace.get("decoder")
    h, w = (int(v) for v in trace["grid"])
    counts = trace.get("counts") or {}
    # plain AR's steps: one per token it samples, less the first, which the prompt's forward gives every decoder
    ar_steps = max(h * w - int(counts.get("forced", 0) or 0) - 1, 0)
    steps = int(trace.get("steps", 0))
    if decoder == "ar":
        parts = [f"ar: one token at a time, {steps} model steps (the reference)"]
    elif steps > 0:
        parts = [f"{decoder}: {ar_steps / steps:.1f}x fewer model steps than one token at a time "
                 f"({steps} instead of {ar_steps})"]
    else:
        parts = [f"{decoder}: no model steps"]
    if time:
        parts.append(_seconds(trace.get("wall_s")))
    if decoder in EXACT_DECODERS:
        parts.append(exact_words(trace, _dtype_name(dtype)))
    return " | ".join(parts)


def exact_words(trace, name=None):
    """Whether an exact decoder's picture is plain AR's: yes in float32 unless its trace names a near-tie, a
    decision so close that rounding can flip it (ssd_core/exactness.py); in bf16 / fp16 it may differ."""
    tie = (trace.get("exact") or {}).get("first_near_tie")
    if name not in (None, "float32", "float64"):
        return f"same rule as plain AR; in {name} the picture may differ slightly from plain AR's"
    if tie is not None:
        return (f"plain AR's image up to row {tie[0]}, column {tie[1]}: a near-tie there may change the rest "
                "(the same distribution)")
    return "same image as plain AR" + ("" if name else " (in float32)")


def details(trace):
    """The numbers behind the headline: grid, tokens per step, how each token was made, NLL (never inf), seed."""
    h, w = (int(v) for v in trace["grid"])
    cells = h * w
    steps = int(trace.get("steps", 0))
    counts = trace.get("counts") or {}
    parts = [f"{h}x{w} = {cells} tokens in {steps} steps"]
    if steps:
        parts.append(f"{cells / steps:.2f} tokens per step")
    kinds = ", ".join(f"{STATUS_WORDS.get(k, k)} {counts[k]}" for k in ("accepted", "corrected", "ar", "forced")
                      if counts.get(k))
    if kinds:
        parts.append(kinds)
    nll, full = trace.get("nll"), trace.get("nll_full")
    if nll is not None and math.isfinite(float(nll)):  # the model's mean surprise at the tokens (lower: likelier)
        parts.append(f"NLL {float(nll):.3f} nats a token")
    elif full is not None and math.isfinite(float(full)):  # a token outside top-k / top-p: the untruncated figure
        parts.append(f"NLL {float(full):.3f} nats a token before top-k / top-p (a token fell outside them)")
    picked = (trace.get("settings") or {}).get("draft_rows_picked")
    if picked:  # ssd-exact's draft rows 0: what its calibration picked (ssd_core/calibrate.py)
        heads = "with the heads" if trace["settings"].get("heads_used") else "without heads (they do not pay here)"
        parts.append(f"{picked} draft row{'s' if picked > 1 else ''} {heads}, picked for this model and device")
    parts.append(f"seed {trace.get('seed')}")
    return "details: " + " | ".join(parts)


def stats_text(trace, dtype=None):
    """The SSD Sampler's stats for one image: the headline, then a details line."""
    return headline(trace, dtype) + "\n" + details(trace)


def batch_stats_text(traces, dtype=None, notes=None):
    """A batch: its time once (one model step serves every image), then per image its headline (without a time: the
    images finish together) and details."""
    notes = notes or [""] * len(traces)
    wall = max((float(t.get("wall_s") or 0.0) for t in traces), default=0.0)
    lines = [f"batch of {len(traces)} images: {_seconds(wall)} for all of them (one model step serves every image)"]
    for i, (t, note) in enumerate(zip(traces, notes)):
        lines.append(f"image {i + 1}: " + headline(t, dtype, time=False) + note)
        lines.append("  " + details(t))
    return "\n".join(lines)


def render(trace, cell_size=16, color_by="status", gridlines=True):
    """The grid as an IMAGE tensor [1, H*cell, W*cell, 3] in [0, 1]."""
    check_trace(trace)
    return status_image(trace, cell_size, color_by, gridlines).unsqueeze(0)


class SSDTraceToImage(io.ComfyNode):
    """The status grid of a run as an image: one colour per cell status (or step / round)."""

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SSDTraceToImage",
            display_name="SSD Trace to Image",
            category=CATEGORY,
            description=("Draws the token grid of an SSD Sampler run: green = drafted right, orange = fixed by "
                         "the model, grey = one at a time, blue = forced (set by the model's rules); or a gradient "
                         "by step / round."),
            inputs=[
                SSD_TRACE.Input("trace"),
                io.Int.Input("cell_size", default=16, min=1, max=64, tooltip="pixels per token cell"),
                io.Combo.Input("color_by", options=["status", "step", "round"], default="status",
                               tooltip="status = how each token was made (the colours above); step = early (dark "
                                       "blue) to late (yellow); round = how many checks before it was kept"),
                io.Boolean.Input("gridlines", default=True, tooltip="thin dark lines between the cells"),
                io.Int.Input("index", default=-1, min=-1, max=63,
                             tooltip="which image of a batch; -1 = every image, as an IMAGE batch"),
            ],
            outputs=[io.Image.Output("image", display_name="image")],
        )

    @classmethod
    def execute(cls, trace, cell_size=16, color_by="status", gridlines=True, index=-1):
        return io.NodeOutput(*cls.render(trace, cell_size, color_by, gridlines, index))

    @classmethod
    def render(cls, trace, cell_size=16, color_by="status", gridlines=True, index=-1):
        traces = trace if isinstance(trace, list) else [trace]
        if not traces:
            raise ValueError("this trace list is empty: connect the 'trace' output of an SSD Sampler.")
        cell_size = whole_number("cell_size", cell_size, 1, 64)  # NaN, 1.5: refused, never truncated
        index = whole_number("index", index, -1)
        if index >= len(traces):
            raise ValueError(f"index {index} is past the batch of {len(traces)} traces: pick 0..{len(traces) - 1} "
                             "or -1 for all.")
        chosen = traces if index < 0 else [traces[index]]
        images = [render(t, cell_size, color_by, bool(gridlines)) for t in chosen]
        if len({tuple(i.shape) for i in images}) > 1:
            raise ValueError("the traces of this batch have different grids: pick one with index.")
        return (torch.cat(images),)
