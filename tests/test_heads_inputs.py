"""Hv as it meets its inputs in ssd (stale features) and Hv that also reads the token drafted on its left."""
import torch

import ssd_core
from ssd_core.acceptance import vertical_drafts
from ssd_core.sampling import SamplerSettings
from ssd_core.errors import SSDError
from ssd_core.heads import DraftHeads
from ssd_core.training import TrainConfig, collect_features, generate_grids, stale_features, start_heads, train_heads
from tiny import drafted_rows, tiny_model_and_heads

import pytest

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


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


@pytest.fixture(scope="module")
def left_heads(tiny, tmp_path_factory):
    """Random heads whose Hv reads the token on the left, saved and loaded back."""
    model, _ = tiny
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("left") / "left.safetensors"
    DraftHeads.for_model(model, vertical_left=1).save(path)
    return ssd_core.load_heads(path, model)


def test_vertical_left_drafts_each_cell_from_the_token_drafted_on_its_left(tiny, left_heads):
    model, plain = tiny
    heads = left_heads
    assert heads.vertical_left and not plain.vertical_left
    assert heads.vertical.fuse.weight.shape == (model.hidden_size, 5 * model.hidden_size)
    layout = model.layout(None)
    run, seen = drafted_rows(model, heads, rows=2)
    W = layout.grid[1]
    row0, row1 = layout.slot_of_cell[:W], layout.slot_of_cell[W:2 * W]
    e = model.embed(run.tokens.ids.clamp(min=0)[None].to(model.device))[0]  # [L, d] (slots past row 1: unused)
    with torch.no_grad():
        for x in range(W - 1):  # cell x+1 drafted from Hv(cell above x, the token drafted at x, cell above x+1)
            up, right = int(row0[x]), int(row0[x + 1])
            above = (run.outputs.features[:, up], e[up])
            f = heads.vertical(*above, e[int(row1[x])], run.outputs.features[:, right], e[right])
            assert torch.allclose(run.outputs.features[:, int(row1[x])], f, atol=1e-5)
            want = run.logp(model.image_logits(f[:, None]), row1[x + 1:x + 2], "heads")[0]
            assert torch.allclose(seen[int(row1[x + 1])], want, atol=1e-5)
            other = e[int(row1[x])].roll(1)  # another left token: another draft
            moved = heads.vertical(*above, other, run.outputs.features[:, right], e[right])
            assert not torch.allclose(model.image_logits(moved), model.image_logits(f), atol=1e-4)
    # the offline drafts (acceptance.vertical_drafts) are the same features as ssd's on teacher-forced inputs
    h = torch.cat([run.outputs.prompt_features[:, None], run.outputs.features], dim=1)[None]  # [1, S, L+1, d]
    off = vertical_drafts(heads, h, e[None], layout)  # [1, S, H-1, W-1, d]
    assert torch.allclose(off[0, :, 0], run.outputs.features[:, row1[:W - 1]], atol=1e-5)


@pytest.mark.parametrize("shift", [0, 1])
def test_vertical_left_2_also_reads_the_token_before_and_the_cell_above_left(tiny, tmp_path, shift):
    model, _ = tiny
    torch.manual_seed(5)
    DraftHeads.for_model(model, vertical_left=2, vertical_shift=shift).save(tmp_path / "left2.safetensors")
    heads = ssd_core.load_heads(tmp_path / "left2.safetensors", model)
    assert heads.vertical_left == 2 and heads.vertical.fuse.weight.shape == (model.hidden_size, 8 * model.hidden_size)
    layout = model.layout(None)
    assert layout.row_stride > layout.grid[1]  # a row-end slot: the first column's token before is that slot's
    run, seen = drafted_rows(model, heads, rows=3)
    W = layout.grid[1]
    e = model.embed(run.tokens.ids.clamp(min=0)[None].to(model.device))[0]  # [L, d]
    cell = layout.slot_of_cell.view(*layout.grid)
    with torch.no_grad():
        for y in (1, 2):
            for x in range(W):  # the feature at (y, x) drafts the next slot
                up, right, upleft = (int(cell[y - 1, min(max(x + shift + k, 0), W - 1)]) for k in (0, 1, -1))
                t = int(cell[y, x])
                feats = run.outputs.features
                f = heads.vertical(feats[:, up], e[up], e[t], feats[:, right], e[right], e[t - 1], feats[:, upleft],
                                   e[upleft])
                assert torch.allclose(feats[:, t], f, atol=1e-5)
                if x < W - 1:
                    want = run.logp(model.image_logits(f[:, None]), cell[y, x + 1:x + 2], "heads")[0]
                    assert torch.allclose(seen[int(cell[y, x + 1])], want, atol=1e-5)
                moved = heads.vertical(feats[:, up], e[up], e[t], feats[:, right], e[right],
                                       e[t - 1].roll(1), feats[:, upleft], e[upleft])  # another token before
                assert not torch.allclose(model.image_logits(moved), model.image_logits(f), atol=1e-4)
    h = torch.cat([run.outputs.prompt_features[:, None], run.outputs.features], dim=1)[None]  # [1, S, L+1, d]
    off = vertical_drafts(heads, h, e[None], layout, all_columns=True)  # the offline drafts: the same features
    assert torch.allclose(off[0, :, :2], run.outputs.features[:, cell[1:3]], atol=1e-5)
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=4)
    assert torch.equal(ssd_core.generate(model, heads, prompt=1, decoder="ssd-exact", seed=4).tokens, ar.tokens)
    assert ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=4).trace.steps < layout.num_slots


def test_every_decoder_runs_with_vertical_left_heads(tiny, left_heads):
    model, _ = tiny
    L = model.layout(None).num_slots
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=4)
    for decoder in ("ssd", "ssd-exact"):
        result = ssd_core.generate(model, left_heads, prompt=1, decoder=decoder, seed=4)
        assert result.trace.steps < L
        if decoder == "ssd-exact":
            assert torch.equal(result.tokens, ar.tokens)


def test_a_plain_hv_warm_starts_a_vertical_left_one_as_itself(tiny, tmp_path):
    model, plain = tiny
    path = tmp_path / "plain.safetensors"
    plain.save(path)
    heads = start_heads(model, TrainConfig(samples=4, init=str(path), vertical_left=True))
    assert heads.vertical_left
    layout = model.layout(None)
    h = torch.randn(2, 2, layout.num_slots + 1, model.hidden_size)
    e = torch.randn(2, layout.num_slots, model.hidden_size)
    with torch.no_grad():
        assert torch.allclose(vertical_drafts(heads, h, e, layout), vertical_drafts(plain, h, e, layout), atol=1e-6)
    left = tmp_path / "left.safetensors"
    heads.save(left)
    with pytest.raises(SSDError, match="--vertical-left 1"):
        start_heads(model, TrainConfig(samples=4, init=str(left)))
    more = start_heads(model, TrainConfig(samples=4, init=str(left), vertical_left=2))  # 1 -> 2: as itself too
    assert more.vertical_left == 2
    with torch.no_grad():
        assert torch.allclose(vertical_drafts(more, h, e, layout), vertical_drafts(plain, h, e, layout), atol=1e-6)
    more.save(tmp_path / "left2.safetensors")
    with pytest.raises(SSDError, match="vertical_left 2.*--vertical-left 2"):
        start_heads(model, TrainConfig(samples=4, init=str(tmp_path / "left2.safetensors"), vertical_left=1))
    for bad in (3, -1, 1.5):
        with pytest.raises(SSDError, match="vertical_left must be 0 .* got"):
            TrainConfig(samples=4, vertical_left=bad)


def test_a_heads_file_with_a_bad_vertical_left_is_refused(tiny, left_heads, tmp_path):
    from safetensors.torch import save_file

    model, plain = tiny
    meta = plain.metadata()
    tensors = {k: v.contiguous() for k, v in plain.state_dict().items()}
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={**meta, "vertical_left": "3"})
    with pytest.raises(SSDError, match="vertical_left '3'.* reads 0, 1 or 2"):
        ssd_core.load_heads(tmp_path / "bad.safetensors", model)
    save_file(tensors, str(tmp_path / "short.safetensors"), metadata={**meta, "vertical_left": "1"})
    with pytest.raises(SSDError, match=r"vertical.fuse.weight of shape .* vertical_left 1\) needs"):
        ssd_core.load_heads(tmp_path / "short.safetensors", model)


def test_train_heads_with_stale_inputs_and_vertical_left_writes_and_reports_them(tiny, tmp_path):
    model, _ = tiny
    out = tmp_path / "h.safetensors"
    lines = []
    _, report = train_heads(model, out, TrainConfig(samples=12, heldout=4, epochs=2, batch_grids=4, stale_share=0.2,
                                                    vertical_left=True, checkpoint_every=2), log=lines.append)
    assert [line.split(" (")[0] for line in lines if line.startswith("checkpoint")] == ["checkpoint step 2",
                                                                                         "checkpoint step 4",
                                                                                         "checkpoint step 6"]
    assert ssd_core.load_heads(tmp_path / "h.step4.safetensors", model).vertical_left
    loaded = ssd_core.load_heads(out, model)
    assert loaded.metadata()["stale_share"] == "0.2" and loaded.vertical_left and report["vertical_left"] == 1
    assert 0 < report["vertical_stale_expected"] <= 1 and 0 < report["expected_acceptance_stale"] <= 1
    result = ssd_core.generate(model, loaded, prompt=1, decoder="ssd", seed=0)
    assert result.trace.steps < model.layout(None).num_slots


def test_until_is_a_clock_time_later_today():
    import time

    from ssd_core.training.cli import clock_time as _clock_time
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
                            log=lambda *_: None, features=tmp_path / "f.safetensors")
    assert report["samples"] == 4 and report["steps"] == 0 and out.is_file()
