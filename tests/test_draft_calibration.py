"""Draft calibration (each head's q made with its own guidance share and temperature factor, from the heads
file) and the first row's re-anchored Hh chain: what q is, that calibration measures what the engine
drafts, that exactness holds, and the files and command line that carry it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ssd_core
from ssd_core.acceptance import calibrate_drafts, heads_acceptance
from ssd_core.decoders.drafting import _embed, draft, feature, reanchor_row, rows_end
from ssd_core.errors import SSDError
from ssd_core.run import Run
from ssd_core.sampling import SamplerSettings, guide, log_probs
from ssd_core.train import TrainConfig, calibrate, collect_features, generate_grids, train_heads
from tiny import heads_with, tiny_model_and_heads

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = SamplerSettings(seed=4, cfg=3.0, temperature=1.0, top_k=8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("m") / "model"


@pytest.fixture(scope="module")
def tiny(folder):
    return tiny_model_and_heads(folder, grid=(4, 5), row_end=True)


@pytest.fixture(scope="module")
def grids(tiny):
    model, _ = tiny
    layout = model.layout(None)
    prompts = [0, 1, 2, 0, 1, 2]
    codes = generate_grids(model, prompts, SETTINGS, layout, log=lambda *_: None)
    return collect_features(model, prompts, codes, SETTINGS, layout)


def test_draft_settings_follow_the_metadata(tiny):
    model, plain = tiny
    assert plain.draft_settings("horizontal", SETTINGS) is SETTINGS  # uncalibrated: the sampler's own
    heads = heads_with(model, plain, horizontal_draft_guidance=0, horizontal_draft_temperature=0.5,
                       vertical_draft_guidance=0.5, vertical_draft_temperature=1)
    h = heads.draft_settings("horizontal", SETTINGS)
    v = heads.draft_settings("vertical", SETTINGS)
    assert (h.cfg, h.temperature, h.top_k, h.seed) == (1.0, 0.5, 8, 4)
    assert (v.cfg, v.temperature) == (2.0, 1.0)
    run = Run(model, heads, model.layout(None), SETTINGS, torch.randn(2, model.hidden_size))
    logits = torch.randn(2, 3, model.image_vocab_size)  # [streams, n, V]
    slots = run.slots(0, 3)
    assert torch.allclose(run.logp(logits, slots, "horizontal"), log_probs(logits[0] / 0.5, SETTINGS))  # cond only
    assert torch.equal(run.logp(logits, slots, "vertical"), log_probs(guide(logits, 2.0), SETTINGS))
    assert torch.equal(run.logp(logits, slots), log_probs(guide(logits, 3.0), SETTINGS))  # the verifier's p


@pytest.mark.parametrize("key,value", [("horizontal_draft_guidance", "abc"), ("vertical_draft_temperature", "0"),
                                       ("vertical_draft_guidance", "nan"), ("horizontal_draft_temperature", "9")])
def test_heads_file_with_a_bad_calibration_is_refused(tiny, tmp_path, key, value):
    model, plain = tiny
    path = tmp_path / "bad.safetensors"
    heads_with(model, plain, **{key: value}).save(path)
    with pytest.raises(SSDError, match=f"{key} '{value}'.*must be a number in .*calibrate-heads"):
        ssd_core.load_heads(path, model)


def test_calibration_measures_what_the_engine_drafts(tiny, grids):
    model, plain = tiny
    h, ids = grids
    layout = model.layout(None)
    found = calibrate_drafts(model, plain, h, ids, layout, SETTINGS)
    for head in ("horizontal", "vertical"):
        assert found[f"{head}_draft_expected"] >= found[f"{head}_draft_expected_plain"] > 0
    calibrated = heads_with(model, plain, **{k: v for k, v in found.items() if k.endswith(("guidance", "temperature"))})
    before = heads_acceptance(model, plain, h, ids, layout, SETTINGS)
    after = heads_acceptance(model, calibrated, h, ids, layout, SETTINGS)  # the scorer uses the heads' q as the engine
    assert before["horizontal_row0_expected"] == pytest.approx(found["horizontal_draft_expected_plain"], abs=1e-4)
    assert after["horizontal_row0_expected"] == pytest.approx(found["horizontal_draft_expected"], abs=1e-4)
    assert after["vertical_expected"] == pytest.approx(found["vertical_draft_expected"], abs=1e-4)
    assert before["vertical_expected"] == pytest.approx(found["vertical_draft_expected_plain"], abs=1e-4)
    unguided = calibrate_drafts(model, plain, h[:, :1], ids, layout, SamplerSettings(seed=4, top_k=8))
    assert unguided["horizontal_draft_guidance"] == 1.0  # nothing to move without guidance


@pytest.mark.parametrize("seed", [0, 3])
def test_calibrated_heads_keep_ssd_exact_identical(tiny, seed):
    model, plain = tiny
    heads = heads_with(model, plain, horizontal_draft_guidance=0, horizontal_draft_temperature=0.7,
                       vertical_draft_guidance=0.25, vertical_draft_temperature=1.15)
    kw = dict(prompt=1, seed=seed, cfg=3.0, top_k=8, score=False)
    ar = ssd_core.generate(model, None, decoder="ar", **kw)
    exact = ssd_core.generate(model, heads, decoder="ssd-exact", **kw)
    lossy = ssd_core.generate(model, heads, decoder="ssd", **kw)
    assert torch.equal(exact.tokens, ar.tokens) and exact.trace.steps < ar.trace.steps
    assert torch.equal(lossy.tokens[0], ar.tokens[0])  # its first row by the exact rule


def test_reanchor_redrafts_the_rest_of_the_row_from_the_corrected_token(tiny):
    model, heads = tiny
    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, SETTINGS, session.last_features)
    W = layout.grid[1]
    draft(run, rows_end(run, 0, 2), run.gumbel_sample)  # the first two rows drafted, the window's end after them
    k = 2
    corrected = (run.codes[k] + 1) % model.image_vocab_size
    run.set_tokens(run.slots(k, k + 1), corrected[None], draft=False)
    below = run.codes[layout.row_stride:].clone()
    reanchor_row(run, k)
    with torch.no_grad():
        f = heads.horizontal(feature(run, k - 1), _embed(run, run.id_of_code[corrected[None]])[0])
        for t in range(k + 1, W):  # each later cell: the Gumbel pick of q from the chain through the corrected token
            q = run.logp(model.image_logits(f[:, None]), run.slots(t, t + 1), "horizontal")
            assert int(run.codes[t]) == int(run.gumbel_sample(q, run.rank[t], run.rank[t] + 1)[0])
            f = heads.horizontal(f, _embed(run, run.ids[t:t + 1])[0])
            assert torch.allclose(run.features[:, t], f)
    assert torch.equal(run.codes[layout.row_stride:], below)  # the rows below are left as they were


def test_train_heads_calibrates_and_records_it(tiny, tmp_path):
    model, _ = tiny
    lines = []
    _, report = train_heads(model, tmp_path / "h.safetensors", TrainConfig(samples=8, heldout=4, epochs=1,
                            batch_grids=4), SETTINGS, log=lines.append)
    meta = ssd_core.load_heads(tmp_path / "h.safetensors", model).metadata()
    for key in ("horizontal_draft_guidance", "horizontal_draft_temperature", "vertical_draft_guidance",
                "vertical_draft_temperature", "expected_acceptance_uncalibrated"):
        assert key in report and key in meta
    assert report["calibration_grids"] == 8
    assert any(line.startswith("draft calibration on 8 grids") for line in lines)


def test_calibrate_heads_command(tiny, folder, grids, tmp_path):
    from safetensors.torch import save_file

    model, plain = tiny
    stale = heads_with(model, plain, horizontal_draft_guidance=0.5)  # re-calibrated from the plain q
    stale.save(tmp_path / "in.safetensors")
    h, ids = grids
    layout = model.layout(None)
    tokens = (ids[:, layout.slot_of_cell] - int(model.code_to_id(torch.zeros(1, dtype=torch.long))[0]))
    save_file({"tokens": tokens.view(-1, *layout.grid).to(torch.int16).contiguous(),
               "classes": torch.tensor([0, 1, 2, 0, 1, 2])}, str(tmp_path / "grids.safetensors"))
    cmd = [sys.executable, "-m", "ssd_core", "calibrate-heads", "--model", str(folder), "--heads",
           str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "out.safetensors"), "--grids",
           str(tmp_path / "grids.safetensors"), "--count", "6", "--heldout-grids", str(tmp_path / "grids.safetensors"),
           "--cfg", "3", "--top-k", "8"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-2])
    out = ssd_core.load_heads(tmp_path / "out.safetensors", model)
    ref = calibrate_drafts(model, plain, h, ids, layout, SETTINGS)
    assert out.draft_calibration("horizontal") == (ref["horizontal_draft_guidance"], ref["horizontal_draft_temperature"])
    assert out.metadata()["expected_acceptance"] == str(report["expected_acceptance"])
    assert torch.equal(out.vertical.up.weight, plain.vertical.up.weight)
    bad = subprocess.run(cmd[:7] + [str(tmp_path / "missing.safetensors")] + cmd[8:], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "--heads" in bad.stderr and "is not a file" in bad.stderr


def test_calibrate_starts_from_the_plain_draft_distributions(tiny, grids):
    model, plain = tiny
    h, ids = grids
    layout = model.layout(None)
    odd = heads_with(model, plain, vertical_draft_guidance=0, vertical_draft_temperature=4)
    report = calibrate(model, odd, h, ids, layout, SETTINGS, h, ids, log=lambda *_: None)
    ref = calibrate_drafts(model, plain, h, ids, layout, SETTINGS)
    assert odd.draft_calibration("vertical") == (ref["vertical_draft_guidance"], ref["vertical_draft_temperature"])
    assert report["expected_acceptance_uncalibrated"] == heads_acceptance(model, plain, h, ids, layout,
                                                                          SETTINGS)["expected_acceptance"]
