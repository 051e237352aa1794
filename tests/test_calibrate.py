"""Defaults that fit the device (calibrate.py): ssd-exact's draft rows 0 = picked from a short measured calibration
(forward cost against window size, the time of an op), with or without heads; the pick changes steps and time,
never the image. Deterministic here: the choices come from cost tables given to them."""
import json

import pytest
import torch

import ssd_core
from ssd_core import calibrate
from ssd_core.calibrate import Costs, choose
from ssd_core.decoders import make_policy
from ssd_core.errors import SSDError
from ssd_core.run import Run
from ssd_core.sampling import SamplerSettings
from tiny import tiny_model_and_heads

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

STRIDE = 25
WINDOWS = sorted({1} | {Costs({}, 0, STRIDE).window(r) for r in range(1, calibrate.MAX_ROWS + 1)})


def table(forward, op_s: float) -> Costs:
    """Costs whose forward of w slots takes forward(w) seconds and whose ops take op_s each."""
    return Costs({w: forward(w) for w in WINDOWS}, op_s, STRIDE)


def flat(op_s=1e-6) -> Costs:
    """A GPU-like device: every window costs what one token does."""
    return table(lambda w: 4e-3, op_s)


def steep() -> Costs:
    """A CPU-like device: the forward grows with the window (about the bundled model on this CPU)."""
    return table(lambda w: 0.014 + 0.001 * w, 4e-6)


def dear() -> Costs:
    """Ops dear against the forward (a small model on a launch-bound device)."""
    return table(lambda w: 1e-3, 2e-5)


def test_a_flat_forward_picks_the_most_rows_and_the_heads():
    choice = choose(flat(), heads=True)
    assert (choice.rows, choice.heads) == (4, True) and choice.speedup > 5


def test_a_steep_forward_picks_fewer_rows():
    choice = choose(steep(), heads=True)
    assert choice.rows <= 2 and choice.speedup > 1
    assert choose(steep(), heads=True).rows < choose(flat(), heads=True).rows


def test_costly_ops_make_the_heads_not_pay():
    """When ops are dear against the forward (a launch-bound device), the heads' extra ops a step outweigh the
    steps they save; without heads to use, the choice never has them."""
    assert choose(dear(), heads=True).heads is False
    assert choose(flat(), heads=False).heads is False


def test_the_choice_is_the_least_expected_time_or_a_tie_with_fewer_rows():
    for costs in (flat(), steep(), dear(), flat(op_s=5e-6)):
        best = choose(costs, heads=True)
        mine = calibrate.STEPS_SHARE[best.rows, best.heads] * costs.step_s(best.rows, best.heads)
        for (rows, heads), share in calibrate.STEPS_SHARE.items():
            other = share * costs.step_s(rows, heads)
            assert other * (1 + calibrate.TIE) >= mine and (other >= mine or rows >= best.rows)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_and_heads(tmp_path_factory.mktemp("m") / "model", grid=(4, 5), row_end=True)


def _begin(model, heads, costs):
    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, SamplerSettings(seed=0, cfg=2.0), session.last_features)
    policy = make_policy("ssd-exact", choice=calibrate.choose(costs, heads is not None))
    policy.begin(run)
    return policy


def test_draft_rows_0_picks_and_the_trace_says_what(tiny, monkeypatch):
    model, heads = tiny
    policy = _begin(model, heads, flat())
    assert policy.rows == 4 and policy.drafter.uses_heads
    assert policy.params["draft_rows_picked"] == 4 and policy.params["heads_used"] is True
    policy = _begin(model, heads, dear())
    assert not policy.drafter.uses_heads and policy.params["heads_used"] is False
    monkeypatch.setattr(calibrate, "pick", lambda *a, **k: calibrate.choose(dear(), True))
    kw = dict(prompt=1, seed=3, cfg=2.0, top_k=6, score=False)
    r = ssd_core.generate(model, heads, decoder="ssd-exact", **kw)
    assert r.trace.settings["heads_used"] is False and r.trace.settings["draft_rows_picked"] == \
        choose(dear(), True).rows
    assert ssd_core.generate(model, heads, decoder="ssd-exact", draft_rows=2, **kw).trace.settings.get(
        "draft_rows_picked") is None  # rows asked for: nothing picked


def test_the_engine_wants_a_number_of_rows():
    with pytest.raises(SSDError, match="draft_rows 0 means rows picked for the model and device"):
        make_policy("ssd-exact")


@pytest.mark.parametrize("seed", [0, 5])
def test_the_image_is_ars_whatever_is_picked(tiny, monkeypatch, seed):
    model, heads = tiny
    kw = dict(prompt=seed % 3, seed=seed, cfg=3.0, top_k=8, score=False)
    ar = ssd_core.generate(model, None, decoder="ar", **kw)
    steps = set()
    for rows in (1, 2, 3, 4):
        for use in (True, False):
            forced = calibrate.Choice(rows, use, 1.0, "given")
            monkeypatch.setattr(calibrate, "pick", lambda *a, forced=forced, **k: forced)
            r = ssd_core.generate(model, heads, decoder="ssd-exact", **kw)
            assert torch.equal(r.tokens, ar.tokens), (rows, use)
            assert r.trace.settings["draft_rows_picked"] == rows and r.trace.settings["heads_used"] is use
            steps.add(r.trace.steps)
    assert len(steps) > 1  # the picks do change the steps


def test_measured_costs_are_cached_per_model_and_in_the_file(tiny, tmp_path, monkeypatch):
    """The first pick measures (a fraction of a second on a tiny model); later ones read the calibration, and a
    new process (here: a new Calibration) the JSON file; a damaged file is measured again."""
    model, heads = tiny
    path = tmp_path / "cal" / "calibration.json"
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(path))
    layout = model.layout(None)

    def pick(calibration):
        return calibrate.pick(model, heads, layout, 2, calibration)

    memory = calibrate.Calibration()
    first = pick(memory)
    assert first.source == "measured" and 1 <= first.rows <= calibrate.MAX_ROWS
    entry = next(iter(json.loads(path.read_text()).values()))
    assert set(entry) == {"forward_s", "op_s", "row_stride"} and entry["op_s"] > 0
    assert pick(memory).source == "cached"
    again = pick(calibrate.Calibration())
    assert again.source == "cached" and (again.rows, again.heads) == (first.rows, first.heads)
    path.write_text("{not json")
    assert pick(calibrate.Calibration()).source == "measured"
    data = json.loads(path.read_text())  # a file from a version that timed other windows: measured again
    for entry in data.values():
        entry["forward_s"] = {"1": 0.01, "7": 0.02}
    path.write_text(json.dumps(data))
    assert pick(calibrate.Calibration()).source == "measured"
    assert pick(calibrate.Calibration(path=str(tmp_path / "other.json"))).source == "measured"  # a file of its own
    assert calibrate.calibration_of(model) is calibrate.calibration_of(model)  # the model's own, kept with it


def test_a_one_token_forward_slowed_by_a_busy_machine_still_makes_a_cache_entry(tiny, monkeypatch):
    """The least of the timings counts, and one token can never cost more than a wider window (it reads the same
    weights): a one-token timing inflated by a busy machine is lowered to the cheapest window, so the entry passes
    the reader's plausibility check (a window at least PLAUSIBLE_FLOOR of one token) instead of being measured
    again by every later process."""
    import time

    from ssd_core.session import Session

    model, _ = tiny
    forward = Session.forward

    def slow_single(self, ids, *a, **k):  # one token 50 ms late: another job took the core
        if ids.shape[-1] == 1:
            time.sleep(0.05)
        return forward(self, ids, *a, **k)

    monkeypatch.setattr(Session, "forward", slow_single)
    costs = calibrate.measure(model, model.layout(None), 2)
    assert costs.forward_s[1] <= min(costs.forward_s.values())
    entry = {k: v for k, v in calibrate.asdict(costs).items() if k != "head_s"}
    entry["forward_s"] = {str(w): s for w, s in entry["forward_s"].items()}
    assert calibrate._costs_of(json.loads(json.dumps(entry))) is not None


# ---- the pick from what runs (issue 38): the generation's session kind, the model's own acceptance ----------------
def test_the_calibration_times_the_compiled_step_after_its_compile(tmp_path, monkeypatch):
    """A compiled model is timed through its static cache, in the shape its generation gets, each window run once
    before it is timed: a compile (here a 0.3 s sleep on each first call of a window size) is never in the costs."""
    from ssd_core import static_cache

    model, _ = tiny_model_and_heads(tmp_path / "m", grid=(4, 5), row_end=True)
    static_cache.enable(model, "compiled", backend="eager")  # graph capture only: quick
    seen, step = set(), static_cache.StaticSession._step

    def first_call_compiles(self, embeds, allowed, pos, start, compiled):
        if compiled and (self.rows, self.capacity, embeds.shape[1]) not in seen:
            seen.add((self.rows, self.capacity, embeds.shape[1]))
            time.sleep(0.3)
        return step(self, embeds, allowed, pos, start, compiled)

    import time

    monkeypatch.setattr(static_cache.StaticSession, "_step", first_call_compiles)
    layout = model.layout(None)
    costs = calibrate.measure(model, layout, 2)
    assert max(costs.forward_s.values()) < 0.3 and seen  # compiled windows ran, none timed with its compile
    generation_shape = (2, static_cache.capacity(model.static, 30))
    assert {(r, c) for r, c, _ in seen} == {generation_shape}  # the shape a prompt of the 256 class gets
    assert calibrate._key(model, layout, 2).endswith("|compiled")


def forced_costs(stride: int, forward, op_s: float = 1e-6) -> Costs:
    return Costs({w: forward(w) for w in Costs({}, 0, stride).windows()}, op_s, stride)


def test_a_first_image_starts_narrow_and_the_rows_follow_its_acceptance(tmp_path):
    """No acceptance observed yet: the first image starts at CONSERVATIVE_ROWS; on a device where every window
    costs one token's time (forced costs) the tuner widens the window as the image runs, and the next image starts
    from what the first observed. The tokens are ar's throughout."""
    model, heads = tiny_model_and_heads(tmp_path / "m", grid=(6, 5), row_end=True)
    layout = model.layout(None)
    memory = calibrate.Calibration(path="")  # no file
    memory.costs[calibrate._key(model, layout, 2)] = forced_costs(layout.row_stride, lambda w: 4e-3)
    kw = dict(prompt=1, seed=2, cfg=3.0, score=False, calibration=memory)
    ar = ssd_core.generate(model, None, decoder="ar", **{k: v for k, v in kw.items() if k != "calibration"})
    first = ssd_core.generate(model, heads, decoder="ssd-exact", **kw)
    assert torch.equal(first.tokens, ar.tokens)
    assert first.trace.settings["draft_rows_picked"] > calibrate.CONSERVATIVE_ROWS  # widened while it ran
    observed = memory.observed[calibrate._key(model, layout, 2)]
    used = first.trace.settings["heads_used"]
    assert (calibrate.CONSERVATIVE_ROWS, used) in observed and sum(c for c, _ in observed.values()) >= 20
    second = calibrate.pick(model, heads, layout, 2, memory)
    assert second.rows > calibrate.CONSERVATIVE_ROWS  # starts from the observed acceptance, not narrow again
    again = ssd_core.generate(model, heads, decoder="ssd-exact", **{**kw, "seed": 3})
    assert torch.equal(again.tokens, ssd_core.generate(model, None, decoder="ar", prompt=1, seed=3, cfg=3.0,
                                                       score=False).tokens)


def test_a_model_whose_heads_draft_worse_than_the_bundled_ones_gets_fewer_rows():
    """The same costs, two models: one whose observed steps per cell are the bundled table's, one whose wider
    windows gain nothing (its heads' drafts are rejected): the second is picked fewer rows."""
    costs = forced_costs(STRIDE, lambda w: 0.004 + 0.0001 * w)
    like_bundled, poor = calibrate.Calibration(path=""), calibrate.Calibration(path="")
    for rows in (1, 2, 3):
        like_bundled.observe("k", (rows, True), 1000, round(1000 * calibrate.STEPS_SHARE[rows, True]))
        poor.observe("k", (rows, True), 1000, 900)  # ~ar: a step makes about one cell whatever the window
    good = choose(costs, True, shares=like_bundled.shares("k"), fixed_heads=True)
    bad = choose(costs, True, shares=poor.shares("k"), fixed_heads=True)
    assert good.rows >= 2 and bad.rows == 1
    share = calibrate.STEPS_SHARE  # unobserved: the table's, scaled as the nearest observed choice (3 rows) is
    assert poor.shares("k")[4, True] == pytest.approx(share[4, True] * 0.9 / share[3, True])
    assert like_bundled.shares("k")[4, True] == pytest.approx(calibrate.STEPS_SHARE[4, True], rel=0.01)
    few = calibrate.Calibration(path="")
    few.observe("k", (2, True), calibrate.MIN_OBSERVED - 1, 10)  # too few cells to count yet
    assert few.shares("k") == calibrate.STEPS_SHARE


def test_bench_and_the_stats_say_what_was_picked():
    from conftest import pack_module
    from ssd_core.bench import _rows

    node_trace = pack_module("nodes.trace")  # the pack as ComfyUI loads it

    assert _rows({"draft_rows": 0, "draft_rows_picked": 1, "heads_used": True}) == "1*+h"
    assert _rows({"draft_rows": 0, "draft_rows_picked": 4, "heads_used": False}) == "4*"
    assert _rows({"draft_rows": 3}) == "3" and _rows({"window": 16}) == "-"
    trace = {"grid": [2, 3], "steps": 2, "counts": {}, "seed": 1,
             "settings": {"draft_rows": 0, "draft_rows_picked": 2, "heads_used": False}}
    assert "2 draft rows without heads (they do not pay here), picked for this model and device" in \
        node_trace.details(trace)
    trace["settings"].update(draft_rows_picked=1, heads_used=True)
    assert "| 1 draft row with the heads, picked for this model and device |" in node_trace.details(trace)


def test_a_model_loaded_again_keeps_its_calibration_and_its_pick():
    """ComfyUI loads a model again after /free or a dtype switch: the same model, dtype and device share one
    Calibration in the process, so its measured costs and observed acceptance (and so its pick) stay; another dtype
    gets its own, and a model built in memory (no folder to know it by) its own."""
    first = ssd_core.load_model("reference")
    again = ssd_core.load_model("reference")
    assert first is not again and calibrate.calibration_of(first) is calibrate.calibration_of(again)
    half = ssd_core.load_model("reference", dtype=torch.bfloat16)
    assert calibrate.calibration_of(half) is not calibrate.calibration_of(first)
    layout = first.layout(None)
    cal = calibrate.calibration_of(first)
    key = calibrate._key(first, layout, 2)
    cal.costs[key] = forced_costs(layout.row_stride, lambda w: 4e-3)  # a GPU-like device, so the rows can widen
    cal.observe(key, (2, False), 200, 40)  # what the first load's images made: 5 cells a step at 2 rows
    picks = [calibrate.pick(m, None, layout, 2, calibrate.calibration_of(m)) for m in (first, again)]
    assert picks[0].source == picks[1].source == "cached" and picks[0].rows == picks[1].rows > 1
    anon = ssd_core.load_model("reference")
    anon.model.config._name_or_path = ""  # as a model built in memory has it
    assert calibrate.calibration_of(anon) is not calibrate.calibration_of(first)
