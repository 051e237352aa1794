"""bf16 (what dtype auto picks on most GPUs): "the same image as ar" cannot hold, because a 1-token forward and
a 64-token window round differently, and after the first token that rounds the other way the two images part
(ar on the static cache parts from ar on the dynamic cache just the same; that control is not re-run here). What
holds is the rule: ssd-exact still draws every token from the model's own distribution with the same noise, so its
quality equals ar's within noise. Measured here on the bundled model in bf16 (10x12, 5 images); the share of cells equal to ar
is reported beside it, as bench does (same_cells_as_ar). 5 images, not 8: at 12x12 the gap was -0.036 +- 0.073 on
seeds 0-4 (its bound 0.24) against -0.058 +- 0.097 on seeds 0-7 (bound 0.31), the same or more room. 10x12: -0.022
+- 0.039 (bound 0.14), 119 against 40 steps, in 41 s against 12x12's 49 s (at 8x8 ssd-exact's steps are too close
to ar's for the 2.5x below)."""
import statistics

import pytest
import torch

import ssd_core


@pytest.fixture(scope="module")
def bf16_runs():
    model = ssd_core.load_model("reference", dtype="bf16")
    heads = ssd_core.load_heads("reference", model)
    assert model.dtype == torch.bfloat16
    kw = dict(grid=(10, 12), decode_pixels=False)
    runs = {"ar": [], "ssd-exact": []}
    for i in range(5):
        common = dict(prompt=i % 11, seed=i, **kw)
        runs["ar"].append(ssd_core.generate(model, None, decoder="ar", **common))
        # rows fixed: the pick's rows follow each CPU's costs and the runs observed (calibrate.py)
        runs["ssd-exact"].append(ssd_core.generate(model, heads, decoder="ssd-exact", draft_rows=2, **common))
    return runs


def _gap(runs, name):
    """Mean paired nll_full difference to ar, and its standard error."""
    diffs = [r.trace.nll_full - a.trace.nll_full for r, a in zip(runs[name], runs["ar"])]
    return statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5


def test_bf16_ssd_exact_quality_equals_ar_within_noise(bf16_runs):
    gap, se = _gap(bf16_runs, "ssd-exact")
    same = statistics.mean(float((r.tokens == a.tokens).float().mean())
                           for r, a in zip(bf16_runs["ssd-exact"], bf16_runs["ar"]))
    print(f"bf16 nll_full gap to ar: ssd-exact {gap:+.4f} +- {se:.4f}; ssd-exact cells equal to ar {same:.1%}")
    assert abs(gap) <= 3 * se + 0.02
    assert 0 < same < 1  # rounding moved some tokens (in fp32 every one is ar's: test_engine_exact)


def test_bf16_steps_still_shrink(bf16_runs):
    ar_steps = statistics.median(r.trace.steps for r in bf16_runs["ar"])
    exact_steps = statistics.median(r.trace.steps for r in bf16_runs["ssd-exact"])
    assert exact_steps * 2.5 < ar_steps
