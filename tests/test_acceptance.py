"""Acceptance: the overlap sum min(p, q) offline and in runs, and drafts after a row-end token."""
import math

import pytest
import torch

import ssd_core
from ssd_core.acceptance import heads_acceptance, overlap
from ssd_core.decoders.drafting import draft, rows_end
from ssd_core.heads import DraftHeads
from ssd_core.run import Run
from ssd_core.sampling import SamplerSettings
from tiny import make_heads, make_llama_grid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(4, 5), row_end=True)
    model = ssd_core.load_model(folder)
    heads = ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)
    return model, heads


def test_overlap_is_the_acceptance_probability():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    q = torch.tensor([[0.25, 0.25, 0.25, 0.25]])
    # sum_x q(x) min(1, p(x)/q(x)) = sum min(p, q)
    direct = sum(q[0, x] * min(1.0, float(p[0, x] / q[0, x])) for x in range(4))
    assert float(overlap(p.log(), q.log())[0]) == pytest.approx(float(direct)) == pytest.approx(0.7)
    assert float(overlap(p.log(), p.log())[0]) == pytest.approx(1.0)


@pytest.mark.parametrize("draft_rows", [2, 3])
def test_first_cell_after_a_row_end_is_drafted_from_a_feature(tiny, draft_rows):
    """A block of several rows on a row-end layout: the first cell of every later row gets a real q."""
    model, heads = tiny
    settings = SamplerSettings(seed=0, cfg=2.0)
    layout = model.layout(None)
    assert int(layout.forced[layout.row_stride - 1]) >= 0  # the layout has a row-end token
    run = Run(model, heads, layout, settings, model.start(model.build_prompt(1, "", True, layout.grid)))
    seen = {}

    def pick(logp, slots):
        for s, row in zip(slots.tolist(), logp):
            seen[s] = row.exp()
        return logp.argmax(-1).cpu()

    draft(run, rows_end(run, 0, draft_rows), pick)
    W, V = layout.grid[1], model.image_vocab_size
    for y in range(1, draft_rows):
        q = seen[int(layout.slot_of_cell[y * W])]
        assert float(q.max()) > 2.0 / V, f"row {y}'s first cell was drafted from a uniform q"
        row_end = int(layout.slot_of_cell[y * W]) - 1
        assert float(run.features[:, row_end].abs().sum()) > 0


def test_heads_acceptance_reports_depths_columns_and_beats_untrained(tiny, tmp_path):
    model, _ = tiny
    from ssd_core.train import TrainConfig, collect_features, generate_grids, train_heads

    heads, report = train_heads(model, tmp_path / "h.safetensors",
                                TrainConfig(samples=16, heldout=4, epochs=8, gen_batch=8), log=lambda *_: None)
    meta = ssd_core.load_heads(tmp_path / "h.safetensors", model).metadata()
    for key in ("expected_acceptance", "horizontal_expected_by_depth", "vertical_expected_by_column",
                "horizontal_top1", "vertical_top1"):
        assert key in meta and key in report
    layout = model.layout(None)
    s = SamplerSettings(seed=5, cfg=model.defaults["cfg"])
    codes = generate_grids(model, [0, 1, 2, 0, 1, 2], s, layout, log=lambda *_: None)
    h, ids = collect_features(model, [0, 1, 2, 0, 1, 2], codes, s, layout)
    torch.manual_seed(3)
    trained = heads_acceptance(model, heads, h, ids, layout, s)
    untrained = heads_acceptance(model, DraftHeads.for_model(model), h, ids, layout, s)
    W = layout.grid[1]
    assert len(trained["horizontal_expected_by_depth"]) == W - 1 == len(trained["vertical_expected_by_column"])
    assert 0.0 < untrained["expected_acceptance"] < trained["expected_acceptance"] <= 1.0


def test_run_records_measured_and_expected_acceptance_by_round(tiny):
    """Every ssd check is logged; over many checks the accepted share matches its expectation."""
    model, heads = tiny
    accepted = expected = checked = 0.0
    for seed in range(6):
        r = ssd_core.generate(model, heads, prompt=seed % 3, decoder="ssd", seed=seed, verify_rounds=1, score=False)
        rounds = r.trace.to_dict()["acceptance_by_verify_round"]
        assert set(rounds) >= {"0", "1"}
        r0 = rounds["0"]
        accepted += r0["accepted"] * r0["checked"]
        expected += r0["expected"] * r0["checked"]
        checked += r0["checked"]
        assert len(r.trace.to_dict()["acceptance_round0_by_column"]) == model.layout(None).grid[1]
    sd = math.sqrt(expected / checked * (1 - expected / checked) / checked)
    assert abs(accepted - expected) / checked < 4 * sd + 0.01
