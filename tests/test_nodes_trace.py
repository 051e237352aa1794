"""The trace of a run for ComfyUI: SSD Trace to Image, the widget's compact JSON, the stats line."""
import json

import pytest
import torch

from conftest import SMALL, load_pack, pack_module, run

nodes = load_pack()
trace_mod = pack_module("nodes.trace")
core_trace = pack_module("ssd_core.trace")


# ---- trace to image ------------------------------------------------------------------------------------------
def fake_trace():
    return {"decoder": "ssd", "grid": [2, 3], "steps": 2,
            "status": [["ar", "accepted", "corrected"], ["forced", "accepted", "pending"]],
            "step": [[1, 2, 2], [2, 2, -1]], "round": [[0, 0, 1], [0, 0, -1]], "counts": {}, "seed": 0}


def test_trace_to_image_colours():
    (img,) = nodes.SSDTraceToImage().render(fake_trace(), 10, "status", False)
    assert img.shape == (1, 20, 30, 3) and img.dtype == torch.float32
    for (r, c), name in {(0, 0): "ar", (0, 1): "accepted", (0, 2): "corrected", (1, 0): "forced",
                         (1, 2): "pending"}.items():
        px = (img[0, r * 10 + 5, c * 10 + 5] * 255).round().tolist()
        assert px == list(core_trace.STATUS_COLORS[name]), name
    (step,) = nodes.SSDTraceToImage().render(fake_trace(), 4, "step", True)
    assert step.shape == (1, 8, 12, 3)
    (rnd,) = nodes.SSDTraceToImage().render(fake_trace(), 1, "round", True)
    assert rnd.shape == (1, 2, 3, 3)


def test_trace_to_image_errors():
    with pytest.raises(ValueError, match="SSD Sampler"):
        nodes.SSDTraceToImage().render({"nope": 1}, 8, "status", True)
    bad = fake_trace()
    bad["status"] = bad["status"][:1]
    with pytest.raises(ValueError, match="damaged"):
        nodes.SSDTraceToImage().render(bad, 8, "status", True)
    with pytest.raises(ValueError, match="color_by"):
        nodes.SSDTraceToImage().render(fake_trace(), 8, "rainbow", True)


def test_trace_to_image_of_a_real_run(ref):
    trace = run(ref, decoder="ssd", grid=SMALL)["result"][1]
    H, W = trace["grid"]
    (img,) = nodes.SSDTraceToImage().render(trace, 8, "status", True)
    assert img.shape == (1, H * 8, W * 8, 3)
    colours = {tuple((img[0, r * 8 + 4, c * 8 + 4] * 255).round().int().tolist()) for r in range(H) for c in range(W)}
    assert tuple(core_trace.STATUS_COLORS["accepted"]) in colours


def test_compact_trace_is_strict_json():
    t = fake_trace()
    t.update(nll=float("inf"), wall_s=float("nan"), tokens_per_step=3.0)
    small = trace_mod.compact(t)
    json.dumps(small, allow_nan=False)
    assert small["nll"] is None and small["wall_s"] is None and small["tokens_per_step"] == 3.0
    assert "nll inf" in trace_mod.stats_text(t)
    t.update(nll=None, nll_full=2.5)  # as the engine writes it: null, with the untruncated figure
    assert "nll inf (untruncated 2.500)" in trace_mod.stats_text(t)


def test_stats_text():
    t = fake_trace()
    t.update(wall_s=1.5, nll=2.25, counts={"accepted": 2, "ar": 1}, seed=3)
    s = trace_mod.stats_text(t)
    assert s.startswith("ssd: 2x3 = 6 tokens in 2 steps") and "6/2 = 3.00 tokens per step" in s
    assert "ar 1, accepted 2" in s and "nll 2.250" in s and "seed 3" in s
