"""`bench --difficulty`: the bench at several sampler settings with how certain ar's own tokens were (ssd_core/
difficulty.py), on a tiny run of the bundled model: the JSON, the plot, and figures that follow the settings."""
import json

import pytest
import torch
from PIL import Image

import ssd_core
from ssd_core import cli, difficulty
from ssd_core.bench import BenchOptions
from ssd_core.sampling import guide, log_probs, settings_from


def test_the_sweep_writes_its_json_and_plot_and_follows_the_temperature(tmp_path):
    out, png = tmp_path / "difficulty.json", tmp_path / "difficulty.png"
    rc = cli.main(["bench", "--model", "reference", "--heads", "reference", "--decoders", "ar,ssd-exact",
                   "--images", "1", "--grid", "8x8", "--difficulty", "--temperatures", "0.8,1.6", "--json", str(out),
                   "--plot", str(png)])
    assert rc == 0
    result = json.loads(out.read_text())
    pts = result["points"]
    assert [(p["temperature"], p["cfg"]) for p in pts] == [(0.8, 4.0), (1.6, 4.0), (1.0, 2.5)]  # + the weaker cfg
    assert pts[0]["top1"] > pts[1]["top1"] and pts[0]["entropy"] < pts[1]["entropy"]  # hotter: less certain
    for p in pts:
        assert 0 < p["top1"] <= 1 and p["entropy"] >= 0 and set(p["rows"]) == {"ar", "ssd-exact"}
        assert p["rows"]["ar"]["step_ratio"] == 1.0 and p["rows"]["ssd-exact"]["identical_to_ar"] is True
    assert Image.open(png).size == (640, 440)


def test_certainty_is_the_distribution_ar_drew_from():
    """top1 / entropy recomputed here, cell by cell from a plain teacher-forced forward of ar's image."""
    model = ssd_core.load_model("reference", dtype="fp32")
    o = BenchOptions(decoders=("ar",), images=1, grid=(8, 8))
    r = ssd_core.generate(model, None, prompt=3, decoder="ar", seed=0, grid=(8, 8), temperature=1.3, score=False)
    got = difficulty.certainty(model, [r], [3], 4.0, 1.3, o)
    s = settings_from(model.defaults, 0, cfg=4.0, temperature=1.3)
    layout = model.layout((8, 8))
    prompt = model.build_prompt(3, "", True, layout.grid)
    ids = layout.forced.clone()
    ids[layout.slot_of_cell] = model.code_to_id(r.tokens.flatten())
    full = torch.cat([prompt.ids, ids[None, :-1].expand(2, -1)], 1)
    with torch.no_grad():
        h = model.backbone()(inputs_embeds=model.embed(full), attention_mask=torch.cat(
            [prompt.mask, torch.ones(2, ids.numel() - 1, dtype=torch.bool)], 1).long()).last_hidden_state
        logits = model.head_logits(h[:, prompt.ids.shape[1] - 1:]).float()
    p = log_probs(guide(logits, 4.0, s.min_p)[layout.forced < 0], s).exp()
    assert got["top1"] == pytest.approx(float(p.max(-1).values.mean()), abs=2e-4)
    assert got["entropy"] == pytest.approx(float(-(p * p.clamp(min=1e-30).log()).sum(-1).mean()), abs=2e-4)


def test_bad_sweeps_are_refused():
    with pytest.raises(SystemExit):
        cli.main(["bench", "--model", "reference", "--difficulty", "--temperatures", "0,1"])
    model = ssd_core.load_model("reference", dtype="fp32")
    with pytest.raises(ssd_core.SSDError, match="keep ar in --decoders"):
        difficulty.sweep(model, None, BenchOptions(decoders=("sjd",), images=1))
