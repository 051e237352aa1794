"""Hv as it meets its inputs in ssd (stale features) and Hv drafts refined by one Hh step along the row."""
import torch

import ssd_core
from ssd_core.acceptance import vertical_drafts
from ssd_core.sampling import SamplerSettings
from ssd_core.train import TrainConfig, collect_features, generate_grids, stale_features, train_heads
from tiny import drafted_rows, heads_with, tiny_model_and_heads

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_and_heads(tmp_path_factory.mktemp("m") / "model", grid=(4, 5))


def test_stale_features_feed_other_tokens_at_about_their_share(tiny):
    model, _ = tiny
    layout = model.layout(None)
    s = SamplerSettings(seed=1, cfg=model.defaults["cfg"])
    prompts = [0, 1, 2, 0, 1, 2, 0, 1]
    h, ids = collect_features(model, prompts, generate_grids(model, prompts, s, layout, log=lambda *_: None),
                              s, layout)
    same, none = stale_features(model, prompts, h, ids, s, layout, share=0.0)
    assert not none.any() and torch.allclose(same, h, atol=1e-5)
    stale, changed = stale_features(model, prompts, h, ids, s, layout, share=0.5, seed=2)
    assert 0.3 < changed.float().mean() < 0.7
    cells = layout.slot_of_cell
    for n in range(len(prompts)):
        first = int(cells[changed[n]].min())  # the first slot fed another token
        assert torch.allclose(stale[n, :, :first + 1], h[n, :, :first + 1], atol=1e-5)  # causal: before it, equal
        assert not torch.allclose(stale[n, :, first + 1], h[n, :, first + 1], atol=1e-4)  # its own feature moves


def test_refined_vertical_drafts_see_the_token_drafted_on_their_left(tiny):
    model, plain = tiny
    heads = heads_with(model, plain, refine=1)
    assert heads.refine and not plain.refine
    layout = model.layout(None)
    run, seen = drafted_rows(model, heads, rows=2)
    W = layout.grid[1]
    row0, row1 = layout.slot_of_cell[:W], layout.slot_of_cell[W:2 * W]
    e = model.embed(run.ids.clamp(min=0)[None].to(model.device))[0]  # [L, d] (slots past row 1: unused)
    with torch.no_grad():
        pv = heads.vertical(run.features[:, row0], e[row0])  # [B, W, d] Hv's features of row 1
        base = run.features[:, int(row1[0]) - 1]  # the row-end slot before row 1
        for x in range(W - 1):  # cell x+1 drafted from Hh(feature before x, token drafted at x)
            base = heads.horizontal(base if x == 0 else pv[:, x - 1], e[int(row1[x])])
            want = run.logp(model.image_logits(base[:, None]), row1[x + 1:x + 2], "heads")[0]
            assert torch.allclose(seen[int(row1[x + 1])], want, atol=1e-5)
            unrefined = run.logp(model.image_logits(pv[:, x:x + 1]), row1[x + 1:x + 2], "heads")[0]
            assert not torch.allclose(want, unrefined, atol=1e-4)
    # the offline drafts (acceptance.vertical_drafts) are the same features as ssd's on teacher-forced inputs
    h = torch.cat([run.prompt_features[:, None], run.features], dim=1)[None]  # [1, S, L+1, d]
    off = vertical_drafts(heads, h, e[None], layout, refine=True)  # [1, S, H-1, W-1, d]
    assert torch.allclose(model.image_logits(off[0, :, 0, W - 2]), model.image_logits(base), atol=1e-4)


def test_train_heads_with_stale_inputs_and_refine_writes_and_reports_them(tiny, tmp_path):
    model, _ = tiny
    out = tmp_path / "h.safetensors"
    lines = []
    _, report = train_heads(model, out, TrainConfig(samples=12, heldout=4, epochs=2, batch_grids=4, stale_share=0.2,
                                                    refine=True, checkpoint_every=2), log=lines.append)
    assert [line.split(" (")[0] for line in lines if line.startswith("checkpoint")] == ["checkpoint step 2",
                                                                                         "checkpoint step 4",
                                                                                         "checkpoint step 6"]
    assert ssd_core.load_heads(tmp_path / "h.step4.safetensors", model).grid == model.default_grid
    loaded = ssd_core.load_heads(out, model)
    assert loaded.metadata()["stale_share"] == "0.2"
    assert 0 < report["vertical_stale_expected"] <= 1 and 0 < report["expected_acceptance_stale"] <= 1
    refined, unrefined = report["vertical_stale_expected_refined"], report["vertical_stale_expected_unrefined"]
    assert loaded.refine == (refined > unrefined) and report["vertical_stale_expected"] == max(refined, unrefined)
    result = ssd_core.generate(model, loaded, prompt=1, decoder="ssd", seed=0)
    assert result.trace.steps < model.layout(None).num_slots


def test_until_is_a_clock_time_later_today():
    import time

    from ssd_core.cli import _clock_time
    from ssd_core.errors import SSDError

    assert _clock_time(None) is None
    for bad, words in (("16h50", "HH:MM"), ("00:00", "has passed")):
        with pytest.raises(SSDError, match=words):
            _clock_time(bad)
    later = time.localtime(time.time() + 120)
    if later.tm_mday == time.localtime().tm_mday:  # not across midnight
        assert 0 < _clock_time(f"{later.tm_hour}:{later.tm_min:02d}") - time.time() <= 120


def test_train_heads_until_bounds_features_and_steps(tiny, tmp_path):
    """Past its time, the trainer still featurises one batch of grids, takes no step, and writes the heads."""
    import time

    model, _ = tiny
    out = tmp_path / "late.safetensors"
    _, report = train_heads(model, out, TrainConfig(samples=12, heldout=4, gen_batch=4, until=time.time() - 1),
                            log=lambda *_: None)
    assert report["samples"] == 4 and report["steps"] == 0 and out.is_file()
