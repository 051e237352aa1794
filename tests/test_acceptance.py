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
from tiny import tiny_model_and_heads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_and_heads(tmp_path_factory.mktemp("m") / "model", grid=(4, 5))


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
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, settings, session.last_features)
    run.session = session
    seen = {}

    def pick(logp, a, b):
        for s, row in zip(run.index.image_slots[a:b], logp):
            seen[s] = row.exp()
        return logp.argmax(-1).cpu()

    draft(run, rows_end(run, 0, draft_rows), pick)
    W, V = layout.grid[1], model.image_vocab_size
    for y in range(1, draft_rows):
        q = seen[int(layout.slot_of_cell[y * W])]
        assert float(q.max()) > 2.0 / V, f"row {y}'s first cell was drafted from a uniform q"
        row_end = int(layout.slot_of_cell[y * W]) - 1
        assert float(run.outputs.features[:, row_end].abs().sum()) > 0


def test_heads_acceptance_reports_depths_columns_and_beats_untrained(tiny, tmp_path):
    model, _ = tiny
    from ssd_core.training import TrainConfig, collect_features, generate_grids, train_heads

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


def test_stable_first_row_is_greedy_ar_at_temperature_zero(tiny):
    """Row 0 verified until a round changes nothing: at temperature 0 that fixed point is greedy AR's row."""
    model, heads = tiny
    H, W = model.layout(None).grid
    ar = ssd_core.generate(model, None, prompt=2, decoder="ar", seed=0, temperature=0, score=False)
    stable = ssd_core.generate(model, heads, prompt=2, decoder="ssd", seed=0, temperature=0, verify_rounds=0,
                               stable_first_row=1, score=False)
    fixed = ssd_core.generate(model, heads, prompt=2, decoder="ssd", seed=0, temperature=0, verify_rounds=0,
                              stable_first_row=0, score=False)
    assert torch.equal(stable.tokens[0], ar.tokens[0])
    assert fixed.trace.steps == H and H <= stable.trace.steps <= H - 1 + W + 1
    assert stable.trace.settings["stable_first_row"] == 1 and fixed.trace.settings["stable_first_row"] == 0


@pytest.mark.parametrize("seed", [0, 5])
def test_exact_first_row_is_ar_first_row_at_any_temperature(tiny, seed):
    """stable_first_row 2: the first row by ssd-exact's rule is the very row ar draws for the seed (sampled,
    cfg on), in fewer steps than the row has cells; the rows below stay lossy ssd (verified and corrected)."""
    model, heads = tiny
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=seed, score=False)
    exact_row = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=seed, stable_first_row=2, score=False)
    stable = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=seed, stable_first_row=1, score=False)
    assert torch.equal(exact_row.tokens[0], ar.tokens[0])
    default = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=seed, score=False)
    assert exact_row.trace.settings["stable_first_row"] == 2 == default.trace.settings["stable_first_row"]
    assert exact_row.trace.steps < ar.trace.steps and stable.trace.steps < ar.trace.steps
    by_round = exact_row.trace.to_dict()["acceptance_by_verify_round"]
    assert {"0", "1", "2"} <= set(by_round)  # the rows below: ssd's three verify rounds (r=2)
    with pytest.raises(ssd_core.SSDError, match="stable_first_row must be a whole number from 0 to 2"):
        ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=seed, stable_first_row=3, score=False)


def test_adaptive_schedule_ends_blocks_early(tiny):
    model, heads = tiny
    kw = dict(prompt=1, decoder="ssd", seed=4, score=False, stable_first_row=0)
    r0 = ssd_core.generate(model, heads, verify_rounds=0, **kw)
    r2 = ssd_core.generate(model, heads, verify_rounds=2, **kw)
    everything = ssd_core.generate(model, heads, verify_rounds=2, adaptive_percent=100, **kw)
    assert torch.equal(everything.tokens, r0.tokens) and everything.trace.steps == r0.trace.steps < r2.trace.steps
    some = ssd_core.generate(model, heads, verify_rounds=2, adaptive_percent=20, **kw)
    assert r0.trace.steps <= some.trace.steps <= r2.trace.steps


def test_bench_rows_carry_acceptance_and_the_tradeoff_plot(tiny, tmp_path):
    import numpy as np
    from PIL import Image

    from ssd_core.bench import BenchOptions, run_bench

    model, heads = tiny
    o = BenchOptions(decoders=("ar", "ssd", "ssd-exact"), images=2, ssd_rounds=(0, 2), ssd_adaptive=(20,),
                     plot=str(tmp_path / "fresh" / "tradeoff.png"))
    report = run_bench(model, heads, o, log=lambda *_: None)
    rows = {r["decoder"]: r for r in report["rows"]}
    assert set(rows) == {"ar", "ssd r=0", "ssd r=0 a=20", "ssd r=2", "ssd r=2 a=20", "ssd-exact"}
    assert rows["ssd r=2 a=20"]["params"]["adaptive_percent"] == 20
    assert 0 < rows["ssd r=2"]["acceptance_round0"] <= 1 and 0 < rows["ssd r=2"]["expected_acceptance"] <= 1
    assert rows["ar"]["acceptance_round0"] is None and rows["ssd-exact"]["expected_acceptance"] is None
    by_round = rows["ssd r=2"]["acceptance_by_verify_round"]
    assert {"0", "1", "2"} <= set(by_round) and by_round["0"]["accepted"] == rows["ssd r=2"]["acceptance_round0"]
    assert rows["ssd-exact"]["same_cells_as_ar"] == rows["ar"]["same_cells_as_ar"] == 1.0  # fp32: identical
    assert 0 <= rows["ssd r=0"]["same_cells_as_ar"] < 1
    assert rows["ssd-exact"]["nll_full_gap_90"] == [0.0, 0.0]  # the very tokens: no image can move it
    low, high = rows["ssd r=0"]["nll_full_gap_90"]
    assert low <= high and low != high  # two images, drawn again: the interval has width
    for row in rows.values():  # per-step overhead outside the forward (opcount), the heads' ops among them
        assert row["ops_per_step"] > 0 and 0 <= row["head_ops_per_step"] < row["ops_per_step"]
    assert rows["ar"]["head_ops_per_step"] == 0  # ssd-exact's heads run where its calibration found they pay
    assert (rows["ssd-exact"]["head_ops_per_step"] > 0) is rows["ssd-exact"]["params"]["heads_used"]
    img = Image.open(tmp_path / "fresh" / "tradeoff.png")
    assert img.size[0] >= 400 and len(np.unique(np.asarray(img.convert("L")))) > 2  # drawn, not blank


def test_the_gap_interval_holds_the_gap_and_shrinks_with_more_images():
    import random

    from ssd_core.bench import _gap, gap_interval

    rng = random.Random(3)
    ar = [rng.uniform(0.4, 0.6) for _ in range(64)]
    same_law = [rng.uniform(0.4, 0.6) for _ in range(64)]  # another sample of ar's distribution
    shifted = [v * 1.3 for v in ar]  # every image 30% worse
    few, many = gap_interval(same_law[:8], ar[:8]), gap_interval(same_law, ar)
    assert few[0] < 0 < few[1] and many[0] < 0 < many[1]
    assert many[1] - many[0] < few[1] - few[0]
    assert gap_interval(shifted, ar) == [0.3, 0.3] == [_gap(1.3, 1.0)] * 2
    assert gap_interval([0.5, 0.5], [0.0, 0.0]) is None  # ar's nll 0 (top-k 1): no gap to bound
