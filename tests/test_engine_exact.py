"""ssd-exact gives the very token grid of ar for the same seed, across sampler settings, layouts and grids."""
import itertools

import pytest
import torch

import ssd_core
from tiny import make_heads, make_llama_grid

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module", params=[False, True], ids=["no-row-end", "row-end"])
def model_and_heads(request, tmp_path_factory):
    folder = make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(5, 6), row_end=request.param)
    model = ssd_core.load_model(folder)
    heads = ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)
    return model, heads


SETTINGS = [dict(temperature=t, top_k=k, top_p=p, cfg=c, min_p=0.0)
            for t, (k, p), c in itertools.product([0.0, 1.0], [(0, 1.0), (5, 1.0), (0, 0.8)], [1.0, 3.0])]
SETTINGS += [dict(temperature=1.0, top_k=0, top_p=1.0, cfg=3.0, min_p=0.05),  # min-p under guidance
             dict(temperature=1.0, top_k=5, top_p=1.0, cfg=1.0, min_p=0.2)]   # and as plain min-p sampling


@pytest.mark.parametrize("settings", SETTINGS,
                         ids=lambda s: "T{temperature}-k{top_k}-p{top_p}-cfg{cfg}-minp{min_p}".format(**s))
def test_exact_matches_ar(model_and_heads, settings):
    model, heads = model_and_heads
    seed = SETTINGS.index(settings)
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=seed, **settings)
    for rows in (1, 2, 3):
        ex = ssd_core.generate(model, heads, prompt=1, decoder="ssd-exact", seed=seed, draft_rows=rows,
                               score=rows == 1, **settings)
        assert torch.equal(ex.tokens, ar.tokens), rows
        assert ex.trace.steps <= ar.trace.steps
        if rows == 1:
            assert ex.trace.nll == pytest.approx(ar.trace.nll, rel=1e-5)


@pytest.mark.parametrize("grid", [(1, 6), (5, 1), (4, 4), (3, 6), (5, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_exact_matches_ar_on_every_grid_shape(model_and_heads, grid):
    model, heads = model_and_heads
    for temperature, cfg in [(0.0, 1.0), (1.0, 2.0)]:
        ar = ssd_core.generate(model, None, prompt=2, decoder="ar", seed=3, grid=grid, temperature=temperature, cfg=cfg,
                               score=False)
        assert tuple(ar.tokens.shape) == grid
        for rows in (1, 3):
            ex = ssd_core.generate(model, heads, prompt=2, decoder="ssd-exact", seed=3, grid=grid, draft_rows=rows,
                                   temperature=temperature, cfg=cfg, score=False)
            assert torch.equal(ex.tokens, ar.tokens)


def test_seed_changes_the_image_and_same_seed_repeats(model_and_heads):
    model, _ = model_and_heads
    a = ssd_core.generate(model, None, prompt=0, decoder="ar", seed=11).tokens
    b = ssd_core.generate(model, None, prompt=0, decoder="ar", seed=11).tokens
    c = ssd_core.generate(model, None, prompt=0, decoder="ar", seed=12).tokens
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_exact_statuses_and_steps(model_and_heads):
    model, heads = model_and_heads
    ex = ssd_core.generate(model, heads, prompt=1, decoder="ssd-exact", seed=0, draft_rows=2)
    counts = ex.trace.counts
    assert sum(counts.values()) == ex.tokens.numel()
    assert counts["accepted"] + counts["corrected"] > 0  # the heads drafted something
    step = ex.trace.step
    assert int(step.max()) <= ex.trace.steps
