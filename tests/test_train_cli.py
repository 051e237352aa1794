"""The trainer and the command line, end to end on a tiny real model."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ssd_core
from ssd_core.training import TrainConfig, train_heads
from tiny import make_heads, make_llama_grid

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

ROOT = Path(__file__).resolve().parent.parent


def test_trained_heads_agree_better_than_random(tmp_path):
    folder = make_llama_grid(tmp_path / "m", grid=(4, 5), row_end=True)
    model = ssd_core.load_model(folder)
    heads, report = train_heads(model, tmp_path / "h.safetensors",
                                TrainConfig(samples=24, heldout=6, epochs=12, gen_batch=8), log=lambda *_: None)
    assert (tmp_path / "h.safetensors").is_file()
    loaded = ssd_core.load_heads(tmp_path / "h.safetensors", model)
    assert torch.equal(loaded.vertical.down.weight, heads.vertical.down.weight)
    # a random head set scores the same held-out measure much lower
    from ssd_core.heads import DraftHeads
    from ssd_core.sampling import SamplerSettings
    from ssd_core.training import agreement, collect_features, generate_grids

    layout = model.layout(None)
    s = SamplerSettings(seed=99, cfg=model.defaults["cfg"])
    codes = generate_grids(model, [0, 1, 2, 0], s, layout, log=lambda *_: None)
    h, ids = collect_features(model, [0, 1, 2, 0], codes, s, layout)
    torch.manual_seed(1)
    from ssd_core.acceptance import heads_acceptance

    s = SamplerSettings(seed=99, cfg=model.defaults["cfg"], top_k=model.defaults["top_k"])
    trained = heads_acceptance(model, loaded, h, ids, layout, s)
    untrained = heads_acceptance(model, DraftHeads.for_model(model), h, ids, layout, s)
    # trained for acceptance: the expected acceptance sum min(p, q) of both heads' drafts rises
    assert trained["horizontal_expected"] > untrained["horizontal_expected"] + 0.05
    assert trained["vertical_expected"] > untrained["vertical_expected"]
    assert set(agreement(model, loaded, h, ids, layout)) == {"horizontal_top1", "vertical_top1"}
    assert report["samples"] == 24 and report["heldout"] == 6
    meta_keys = loaded.metadata()
    assert "horizontal_top1" in meta_keys


def _cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ssd_core", *map(str, args)], cwd=ROOT, capture_output=True, env=env,
                          text=True, timeout=300)


def _in_process(capsys, *args):
    """The same CLI in this process (no interpreter and torch start-up): -> (exit code, stdout, stderr)."""
    from ssd_core import cli

    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_generate_bench_and_errors(tmp_path, capsys):
    """generate and bench as real processes (python -m ssd_core), train-heads and the refusals in this process."""
    folder = make_llama_grid(tmp_path / "m", grid=(5, 5))
    model = ssd_core.load_model(folder)
    heads = make_heads(model, tmp_path / "h.safetensors")
    out = _cli("generate", "--model", folder, "--heads", heads, "--decoder", "ssd", "--seed", 3, "--class", 1,
               "--cfg", 2, "--temperature", 1, "--top-k", 8, "--top-p", 0.9, "--min-p", 0.05, "--draft-rows", 2,
               "--verify-rounds", 1,
               "--trace", tmp_path / "t.json", "--status-image", tmp_path / "s.png", "--out", tmp_path / "img.png")
    assert out.returncode == 0, out.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["decoder"] == "ssd" and trace["grid"] == [5, 5] and len(trace["tokens"]) == 5
    assert trace["settings"]["top_k"] == 8 and trace["settings"]["verify_rounds"] == 1
    assert trace["settings"]["min_p"] == 0.05
    assert (tmp_path / "s.png").stat().st_size > 0
    assert "no pixel decoder" in out.stdout  # vq_decoder null: tokens only
    out = _cli("bench", "--model", folder, "--heads", heads, "--decoders", "ar,ssd,ssd-exact,sjd,zipar",
               "--images", 3, "--verify-rounds", 2, "--min-p", 0.02, "--json", tmp_path / "b.json", "--batch", 2)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    rows = {r["decoder"]: r for r in report["rows"]}
    assert report["settings"]["min_p"] == 0.02
    batch = report["batch"]  # images/s in batches of 2 (a batch of 2, then of 1) vs one at a time
    assert batch["n"] == 2 and set(batch["images_per_s"]) == set(batch["single_images_per_s"]) == set(rows)
    assert all(v > 0 for v in batch["images_per_s"].values())
    assert all(0 < r["policy_share"] < 1 for r in rows.values())
    assert set(rows) == {"ar", "ssd", "ssd-exact", "sjd", "zipar"}
    assert rows["ar"]["step_ratio"] == 1.0 and rows["ssd-exact"]["identical_to_ar"] is True
    assert rows["ssd"]["identical_to_ar"] is None and rows["ssd"]["step_ratio"] > 1.0
    for key in ("steps", "step_ratio", "wall_ratio", "nll", "nll_gap"):
        assert key in rows["ssd"]
    assert "decoder" in out.stdout and "ssd-exact" in out.stdout
    code, _, err = _in_process(capsys, "generate", "--model", folder, "--heads", heads, "--top-p", 0)
    assert code == 2 and "top_p must be in (0, 1]" in err
    code, _, err = _in_process(capsys, "train-heads", "--model", folder, "--out", tmp_path / "t.safetensors",
                               "--samples", 8, "--heldout", 2, "--epochs", 1)
    assert code == 0, err
    assert ssd_core.load_heads(tmp_path / "t.safetensors", model).family == "llama-grid"
    from safetensors.torch import save_file

    torch.manual_seed(0)
    save_file({"tokens": torch.randint(0, 16, (6, 5, 5)), "classes": torch.tensor([0, 1, 2, 0, 1, 2])},
              str(tmp_path / "grids.safetensors"))
    code, out, err = _in_process(capsys, "train-heads", "--model", folder, "--out", tmp_path / "f.safetensors",
                                 "--grids", tmp_path / "grids.safetensors", "--heldout", 2, "--epochs", 1,
                                 "--vertical-left", 2)
    assert code == 0, err
    assert '"samples": 4' in out and "generating" not in out
    assert ssd_core.load_heads(tmp_path / "f.safetensors", model).vertical_left == 2
    code, _, err = _in_process(capsys, "train-heads", "--model", folder, "--out", tmp_path / "g.safetensors",
                               "--grids", heads)
    assert code == 2 and "needs the tensors 'tokens'" in err


def test_self_distilled_grids_sample_on_the_static_cache(tmp_path, monkeypatch):
    """train-heads samples its grids on the static cache (memory-bound loop) with the same codes as the dynamic
    cache gives, and leaves the model's own cache mode as it was."""
    from ssd_core import static_cache
    from ssd_core.training import data as train
    from ssd_core.sampling import SamplerSettings

    for row_end in (False, True):
        model = ssd_core.load_model(make_llama_grid(tmp_path / f"m{row_end}", grid=(4, 5), row_end=row_end))
        layout = model.layout(None)
        s = SamplerSettings(seed=5, cfg=3.0, top_k=8)
        dynamic = train._sample_grids(model, [0, 1, 2], s, layout, 2, lambda *_: None)
        sessions = []
        start = model.start
        monkeypatch.setattr(model, "start", lambda *a, **k: sessions.append(start(*a, **k)) or sessions[-1])
        codes = train.generate_grids(model, [0, 1, 2], s, layout, batch=2, log=lambda *_: None)
        assert torch.equal(codes, dynamic) and (codes[:, layout.forced < 0] >= 0).all()
        assert {type(x).__name__ for x in sessions} == {"StaticSession"}
        assert static_cache.mode_of(model) == "off"
        static_cache.enable(model, "static")
        kept = model.static
        train.generate_grids(model, [0], s, layout, log=lambda *_: None)
        assert model.static is kept
