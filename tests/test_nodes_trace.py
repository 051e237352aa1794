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
    s = trace_mod.stats_text(t)
    assert "inf" not in s and "nan" not in s and "NLL" not in s  # an infinite NLL is never shown
    t.update(nll=None, nll_full=2.5)  # as the engine writes it: null, with the untruncated figure
    s = trace_mod.stats_text(t)
    assert "NLL 2.500 nats a token before top-k / top-p" in s and "inf" not in s


def test_stats_text():
    """Headline first (the speed-up against one token at a time, the time), then a details line with the numbers;
    the statuses in the legend's words."""
    t = fake_trace()
    t.update(wall_s=1.5, nll=2.25, counts={"accepted": 2, "ar": 1, "corrected": 3}, seed=3)
    head, detail = trace_mod.stats_text(t).split("\n")
    assert head == "ssd: 2.5x fewer model steps than one token at a time (2 instead of 5) | 1.50 s"
    assert detail.startswith("details: 2x3 = 6 tokens in 2 steps | 3.00 tokens per step")
    assert "drafted right 2, fixed by the model 3, one at a time 1" in detail
    assert "NLL 2.250 nats a token" in detail and "seed 3" in detail
    t.update(counts={"accepted": 2, "ar": 1, "forced": 2})  # forced cells are not plain AR's steps
    assert "(2 instead of 3)" in trace_mod.stats_text(t)


def test_stats_text_says_when_the_picture_is_plain_ars():
    t = fake_trace()
    t.update(decoder="ssd-exact", wall_s=12.345, counts={"accepted": 5, "ar": 1})
    assert trace_mod.headline(t, torch.float32).endswith("| 12.3 s | same image as plain AR")
    assert trace_mod.headline(t).endswith("same image as plain AR (in float32)")
    bf16 = trace_mod.headline(t, torch.bfloat16)
    assert "same rule as plain AR" in bf16 and "bfloat16 the picture may differ slightly" in bf16
    # a near-tie in the run (ssd_core/exactness.py): the headline says from where the picture may differ
    t.update(exact={"error_bound": 6e-5, "near_ties": 2, "first_near_tie": [9, 2]})
    assert trace_mod.headline(t, torch.float32).endswith("plain AR's image up to row 9, column 2: a near-tie there "
                                                         "may change the rest (the same distribution)")
    assert trace_mod.compact(t)["first_near_tie"] == [9, 2]
    t.update(exact={"error_bound": 6e-5, "near_ties": 0, "first_near_tie": None})
    assert "first_near_tie" not in trace_mod.compact(t)
    assert trace_mod.headline(t, torch.float32).endswith("same image as plain AR")
    t.update(decoder="ar", steps=6)
    assert trace_mod.headline(t).startswith("ar: one token at a time, 6 model steps")
    t.update(decoder="ssd")
    assert "plain AR" not in trace_mod.headline(t, torch.float32)


def test_batch_stats_say_the_time_once():
    a, b = fake_trace(), fake_trace()
    a.update(wall_s=2.0, seed=1)
    b.update(wall_s=3.0, seed=2, steps=3)
    lines = trace_mod.batch_stats_text([a, b], notes=["", " | note"]).splitlines()
    assert lines[0].startswith("batch of 2 images: 3.00 s for all of them")
    assert lines[1].startswith("image 1: ssd: 2.5x fewer") and not lines[1].endswith(" s")
    assert lines[2].startswith("  details:") and "seed 1" in lines[2]
    assert lines[3].startswith("image 2: ssd: 1.7x fewer") and lines[3].endswith(" | note") and "seed 2" in lines[4]
    assert len(lines) == 5
