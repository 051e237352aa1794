"""An Hv wider than Hh (`vertical_intermediate_size`) and the acceptance (total-variation) loss of the trainer."""
import pytest
import torch

import ssd_core
from ssd_core.acceptance import guided_logp, vertical_drafts
from ssd_core.errors import SSDError
from ssd_core.heads import DraftHeads
from ssd_core.sampling import SamplerSettings, guide
from ssd_core.training import TrainConfig, collect_features, generate_grids, head_losses, start_heads
from tiny import tiny_model_and_heads

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("m") / "model"


@pytest.fixture(scope="module")
def tiny(folder):
    return tiny_model_and_heads(folder, grid=(4, 5))


def test_a_wider_hv_round_trips_and_drafts(tiny, tmp_path):
    model, _ = tiny
    d = model.hidden_size
    torch.manual_seed(5)
    heads = DraftHeads.for_model(model, vertical_left=1, vertical_intermediate_size=3 * d)
    heads.save(tmp_path / "wide.safetensors")
    loaded = ssd_core.load_heads(tmp_path / "wide.safetensors", model)
    assert loaded.vertical_intermediate == 3 * d and loaded.intermediate == d
    assert loaded.vertical.gate.weight.shape == (3 * d, d) and loaded.vertical.down.weight.shape == (d, 3 * d)
    assert loaded.horizontal.gate.weight.shape == (d, d)
    assert loaded.metadata()["vertical_intermediate_size"] == str(3 * d)
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor)
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=4)
    exact = ssd_core.generate(model, loaded, prompt=1, decoder="ssd-exact", seed=4)
    assert torch.equal(exact.tokens, ar.tokens)
    assert ssd_core.generate(model, loaded, prompt=1, decoder="ssd", seed=4).trace.steps < model.layout(None).num_slots


def test_a_heads_file_whose_hv_width_disagrees_with_its_metadata_is_refused(tiny, tmp_path):
    from safetensors.torch import save_file

    model, plain = tiny
    tensors = {k: v.contiguous() for k, v in plain.state_dict().items()}
    save_file(tensors, str(tmp_path / "w.safetensors"), metadata={**plain.metadata(), "vertical_intermediate_size": "64"})
    with pytest.raises(SSDError, match=r"vertical.gate.weight of shape .*vertical_intermediate_size 64"):
        ssd_core.load_heads(tmp_path / "w.safetensors", model)
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={**plain.metadata(), "vertical_intermediate_size": "x"})
    with pytest.raises(SSDError, match="damaged heads metadata"):
        ssd_core.load_heads(tmp_path / "x.safetensors", model)


def test_a_narrow_hv_warm_starts_a_wider_one_as_itself(tiny, tmp_path):
    model, plain = tiny
    d = model.hidden_size
    path = tmp_path / "plain.safetensors"
    plain.save(path)
    heads = start_heads(model, TrainConfig(samples=4, init=str(path), vertical_left=True, vertical_intermediate=4 * d))
    assert heads.vertical_intermediate == 4 * d and heads.vertical_left
    assert heads.vertical.gate.weight[d:].abs().sum() > 0  # the new units have input weights to learn from
    layout = model.layout(None)
    h = torch.randn(2, 2, layout.num_slots + 1, d)
    e = torch.randn(2, layout.num_slots, d)
    with torch.no_grad():
        assert torch.allclose(vertical_drafts(heads, h, e, layout), vertical_drafts(plain, h, e, layout), atol=1e-5)
    wide = tmp_path / "wide.safetensors"
    heads.save(wide)
    again = start_heads(model, TrainConfig(samples=4, init=str(wide), vertical_left=True))  # keeps the file's width
    assert again.vertical_intermediate == 4 * d
    with pytest.raises(SSDError, match="width"):
        start_heads(model, TrainConfig(samples=4, init=str(wide), vertical_left=True, vertical_intermediate=d))
    with pytest.raises(SSDError, match="vertical_intermediate must be a whole number"):
        TrainConfig(samples=4, vertical_intermediate=0)
    with pytest.raises(SSDError, match="tv_weight must be a number >= 0"):
        TrainConfig(samples=4, tv_weight=-1.0)


def test_the_tv_loss_is_the_drafts_expected_rejection(tiny):
    model, heads = tiny
    layout = model.layout(None)
    s = SamplerSettings(seed=1, cfg=model.defaults["cfg"])
    prompts = [0, 1, 2, 0]
    h, ids = collect_features(model, prompts, generate_grids(model, prompts, s, layout, log=lambda *_: None), s, layout)
    cfg = TrainConfig(samples=4, kl_weight=0.0, ce_weight=0.0, tv_weight=3.0)
    losses = head_losses(model, heads, h, ids, layout, cfg, s)
    assert not any(k.startswith("kl_") for k in losses)
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    with torch.no_grad():  # Hv's drafts of cells x >= 1 below the first row, and the model's p there
        q_feats = vertical_drafts(heads, h, model.embed(ids), layout)
        logp = guided_logp(model, h[:, :, cells[1:, 1:]], s)
        q = guide(model.image_logits(q_feats).transpose(0, 1), s.cfg).softmax(-1)
    want = 3.0 * (1 - torch.minimum(logp.exp(), q).sum(-1)).mean()
    assert torch.allclose(losses["tv_v"], want, atol=1e-5)
    losses["tv_v"].backward()  # it trains Hv
    assert heads.vertical.fuse.weight.grad is not None and heads.vertical.fuse.weight.grad.abs().sum() > 0
    heads.zero_grad()


def test_train_heads_cli_with_a_wider_hv_and_the_tv_loss_writes_them(tiny, folder, tmp_path):
    from ssd_core.cli import main

    model, plain = tiny
    init = tmp_path / "init.safetensors"
    plain.save(init)
    out = tmp_path / "wide.safetensors"
    main(["train-heads", "--model", str(folder), "--out", str(out), "--samples", "8", "--heldout", "2",
          "--epochs", "1", "--batch", "4", "--init", str(init), "--train", "vertical", "--vertical-left",
          "--vertical-intermediate", str(2 * model.hidden_size), "--tv-weight", "2", "--kl-weight", "0"])
    loaded = ssd_core.load_heads(out, model)
    meta = loaded.metadata()
    assert loaded.vertical_intermediate == 2 * model.hidden_size and loaded.vertical_left
    assert meta["tv_weight"] == "2.0" and meta["kl_weight"] == "0.0" and meta["trained"] == "vertical"
    assert torch.equal(loaded.horizontal.fuse.weight, plain.horizontal.fuse.weight)  # Hh kept
    assert not torch.equal(loaded.vertical.down.weight[:, model.hidden_size:], torch.zeros_like(
        loaded.vertical.down.weight[:, model.hidden_size:]))  # the new units learnt
