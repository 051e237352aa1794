"""Draft heads on the real families: trained, saved and loaded on each; refused by another family."""
import pytest
import torch

import ssd_core
from ssd_core.training import TrainConfig, train_heads
from tiny_families import BUILDERS

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

GRIDS = {"janus": (4, 4), "emu3": (3, 4), "lumina": (4, 4)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, build in BUILDERS.items():
        folder = build(root / name)
        kw = {} if name == "janus" else {"grid": GRIDS[name]}  # Janus's grid is fixed by its config
        out[name] = ssd_core.load_model(folder, dtype="fp32", **kw)
    return out


@pytest.mark.parametrize("family", sorted(GRIDS))
def test_train_save_load_and_use(models, family, tmp_path):
    model = models[family]
    assert model.default_grid == GRIDS[family]
    path = tmp_path / f"{family}.safetensors"
    cfg = TrainConfig(samples=4, heldout=2, epochs=1, batch_grids=4, gen_batch=4, seed=0)
    heads, report = train_heads(model, path, cfg, log=lambda *a: None)
    assert path.is_file() and "horizontal_top1" in report
    loaded = ssd_core.load_heads(path, model)
    assert loaded.family == family and loaded.hidden == model.hidden_size
    assert loaded.image_vocab == model.image_vocab_size and loaded.grid == GRIDS[family]
    for k, v in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[k].float(), v.float()), k
    ar = ssd_core.generate(model, None, prompt="a red cat", negative_prompt="", decoder="ar", seed=5,
                           decode_pixels=False, score=False)
    exact = ssd_core.generate(model, loaded, prompt="a red cat", negative_prompt="", decoder="ssd-exact", seed=5,
                              decode_pixels=False, score=False)
    assert torch.equal(ar.tokens, exact.tokens)


@pytest.mark.parametrize("family", sorted(GRIDS))
def test_heads_of_another_family_are_refused(models, family, tmp_path):
    path = tmp_path / "h.safetensors"
    ssd_core.DraftHeads.for_model(models[family]).save(path)
    for other in GRIDS:
        if other == family:
            continue
        with pytest.raises(ssd_core.SSDError, match=f"family {family}"):
            ssd_core.load_heads(path, models[other])
        heads = ssd_core.load_heads(path, models[family])
        with pytest.raises(ssd_core.SSDError, match="family"):
            ssd_core.generate(models[other], heads, prompt="a", negative_prompt="", decoder="ssd", decode_pixels=False)


@pytest.mark.parametrize("family", sorted(GRIDS))
def test_bench_plumbing(family, tmp_path, capsys):
    """`bench` runs every decoder on each tiny family (from the command line, as a user would)."""
    import json

    from ssd_core.cli import main

    folder = BUILDERS[family](tmp_path / family)
    heads = tmp_path / "heads.safetensors"
    ssd_core.DraftHeads.for_model(ssd_core.load_model(folder, dtype="fp32")).save(heads)
    H, W = GRIDS[family]
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", str(folder), "--dtype", "fp32", "--heads", str(heads), "--grid", f"{H}x{W}",
               "--images", "1", "--json", str(out), "--draft-rows", "2", "--verify-rounds", "1"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    rows = {r["decoder"]: r for r in report["rows"]}
    assert set(rows) >= set(ssd_core.ENGINE_DECODERS) and rows["ssd-exact"]["identical_to_ar"] is True
    assert report["grid"] == [H, W]
