"""Hv reading the cell above the drafted cell (vertical_shift 1) instead of the cell above the predicted
feature's cell (the paper, 0): the same features offline (trainer, scorer) and online (ssd drafting), on
layouts with and without row-end tokens; the heads file records it; warm starts; exactness kept."""
import pytest
import torch

import ssd_core
from ssd_core.acceptance import vertical_drafts
from ssd_core.errors import SSDError
from ssd_core.training import TrainConfig, train_heads
from tiny import drafted_rows, heads_with, make_heads, tiny_model_and_heads

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module", params=[True, False], ids=["row-end", "no-row-end"])
def tiny(request, tmp_path_factory):
    return tiny_model_and_heads(tmp_path_factory.mktemp("m") / "model", grid=(4, 5), row_end=request.param)


def shifted(model, plain, shift):
    return heads_with(model, plain, vertical_shift=shift)


@pytest.mark.parametrize("shift", [0, 1])
def test_online_vertical_drafts_read_the_shifted_cell_and_match_the_offline_ones(tiny, shift):
    model, plain = tiny
    heads = shifted(model, plain, shift)
    assert heads.vertical_shift == shift
    layout = model.layout(None)
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    run, seen = drafted_rows(model, heads, rows=3)
    e = model.embed(run.tokens.ids.clamp(min=0)[None].to(model.device))[0]  # [L, d]
    for y in (1, 2):  # row 2 reads row 1's drafted features and tokens
        src = cells[y - 1, [min(x + shift, W - 1) for x in range(W)]]
        with torch.no_grad():
            want = heads.vertical(run.outputs.features[:, src], e[src])  # [B, W, d]
        assert torch.allclose(run.outputs.features[:, cells[y]], want, atol=1e-5)
        for x in range(W - 1):  # cell x+1 of row y is drafted from the feature predicted at x
            q = run.logp(model.image_logits(want[:, x:x + 1]), cells[y, x + 1:x + 2], "heads")[0]
            assert torch.allclose(seen[int(cells[y, x + 1])], q, atol=1e-5)
    # offline (trainer and scorer), on the same features taken as teacher-forced: the same predictions
    h = torch.cat([run.outputs.prompt_features[:, None], run.outputs.features], dim=1)[None]  # [1, S, L+1, d]
    off = vertical_drafts(heads, h, e[None], layout, all_columns=True)  # [1, S, H-1, W, d]
    assert torch.allclose(off[0, :, 0], run.outputs.features[:, cells[1]], atol=1e-5)


def test_the_shift_changes_what_hv_reads(tiny):
    model, plain = tiny
    layout = model.layout(None)
    cells = layout.slot_of_cell.view(*layout.grid)
    runs = [drafted_rows(model, shifted(model, plain, s), rows=2)[0] for s in (0, 1)]
    a, b = (run.outputs.features for run in runs)
    same_row0 = torch.allclose(a[:, cells[0]], b[:, cells[0]])  # Hh alike
    assert same_row0 and not torch.allclose(a[:, cells[1]], b[:, cells[1]], atol=1e-4)


def test_heads_file_records_the_shift_and_refuses_an_unknown_one(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    model, plain = tiny
    path = tmp_path / "s1.safetensors"
    shifted(model, plain, 1).save(path)
    assert ssd_core.load_heads(path, model).vertical_shift == 1
    assert ssd_core.load_heads(make_heads(model, tmp_path / "s0.safetensors"), model).vertical_shift == 0
    meta = shifted(model, plain, 1).metadata()
    meta["vertical_shift"] = "2"
    save_file(load_file(str(path)), str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(SSDError, match="vertical_shift '2'.*0 or 1"):
        ssd_core.load_heads(tmp_path / "bad.safetensors", model)


def test_train_heads_warm_start_with_shift_and_exactness(tiny, tmp_path):
    model, plain = tiny
    start = tmp_path / "start.safetensors"
    plain.save(start)
    with pytest.raises(SSDError, match="vertical_shift must be 0"):
        TrainConfig(samples=8, vertical_shift=2)
    with pytest.raises(SSDError, match="init .* is not a file"):
        TrainConfig(samples=8, init=str(tmp_path / "missing.safetensors"))
    out = tmp_path / "h.safetensors"
    cfg = TrainConfig(samples=8, heldout=4, epochs=1, batch_grids=4, max_steps=0, vertical_shift=1, init=str(start))
    _, report = train_heads(model, out, cfg, log=lambda *_: None)  # no step: the warm start is the start file
    loaded = ssd_core.load_heads(out, model)
    assert loaded.vertical_shift == 1 and report["init"] == "start.safetensors" and report["steps"] == 0
    for key, value in plain.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    cfg = TrainConfig(samples=8, heldout=4, epochs=1, batch_grids=4, max_steps=2, vertical_shift=1, init=str(start))
    train_heads(model, out, cfg, log=lambda *_: None)
    trained = ssd_core.load_heads(out, model)
    assert not torch.equal(trained.state_dict()["vertical.fuse.weight"], plain.state_dict()["vertical.fuse.weight"])
    ar = ssd_core.generate(model, None, prompt=2, decoder="ar", seed=3)
    exact = ssd_core.generate(model, trained, prompt=2, decoder="ssd-exact", seed=3)
    assert torch.equal(exact.tokens, ar.tokens) and exact.trace.steps < ar.trace.steps


def test_init_made_for_another_model_is_refused(tiny, tmp_path):
    model, _ = tiny
    other, other_heads = tiny_model_and_heads(tmp_path / "other", grid=(3, 5))
    path = tmp_path / "other_heads.safetensors"
    other_heads.save(path)
    with pytest.raises(SSDError, match="trained for grid 3x5"):
        train_heads(model, tmp_path / "h.safetensors", TrainConfig(samples=4, heldout=2, init=str(path)),
                    log=lambda *_: None)


def test_train_vertical_only_keeps_the_horizontal_head(tiny, tmp_path):
    model, plain = tiny
    start = tmp_path / "start.safetensors"
    plain.save(start)
    with pytest.raises(SSDError, match="keeps the other head as it starts: give init"):
        TrainConfig(samples=8, train="vertical")
    with pytest.raises(SSDError, match="both, vertical or horizontal"):
        TrainConfig(samples=8, train="hv", init=str(start))
    out = tmp_path / "v.safetensors"
    lines = []
    cfg = TrainConfig(samples=8, heldout=4, epochs=1, batch_grids=4, max_steps=2, train="vertical", init=str(start))
    _, report = train_heads(model, out, cfg, log=lines.append)
    trained = ssd_core.load_heads(out, model)
    assert report["trained"] == "vertical" and trained.metadata()["trained"] == "vertical"
    before, after = plain.state_dict(), trained.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items() if k.startswith("horizontal."))
    assert not torch.equal(after["vertical.fuse.weight"], before["vertical.fuse.weight"])
    epoch = next(line for line in lines if line.startswith("epoch"))
    assert "vertical" in epoch and "horizontal" not in epoch  # only Hv's losses were computed
