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


def _begin(model, heads, costs, monkeypatch):
    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, SamplerSettings(seed=0, cfg=2.0), session.last_features)
    policy = make_policy("ssd-exact")
    monkeypatch.setattr(calibrate, "pick", lambda run: calibrate.choose(costs, run.heads is not None))
    policy.begin(run)
    return policy


def test_draft_rows_0_picks_and_the_trace_says_what(tiny, monkeypatch):
    model, heads = tiny
    policy = _begin(model, heads, flat(), monkeypatch)
    assert policy.rows == 4 and policy.drafter.uses_heads
    assert policy.params["draft_rows_picked"] == 4 and policy.params["heads_used"] is True
    policy = _begin(model, heads, dear(), monkeypatch)
    assert not policy.drafter.uses_heads and policy.params["heads_used"] is False
    kw = dict(prompt=1, seed=3, cfg=2.0, top_k=6, score=False)
    r = ssd_core.generate(model, heads, decoder="ssd-exact", **kw)
    assert r.trace.settings["heads_used"] is False and r.trace.settings["draft_rows_picked"] == \
        choose(dear(), True).rows
    assert ssd_core.generate(model, heads, decoder="ssd-exact", draft_rows=2, **kw).trace.settings.get(
        "draft_rows_picked") is None  # rows asked for: nothing picked


@pytest.mark.parametrize("seed", [0, 5])
def test_the_image_is_ars_whatever_is_picked(tiny, monkeypatch, seed):
    model, heads = tiny
    kw = dict(prompt=seed % 3, seed=seed, cfg=3.0, top_k=8, score=False)
    ar = ssd_core.generate(model, None, decoder="ar", **kw)
    steps = set()
    for rows in (1, 2, 3, 4):
        for use in (True, False):
            forced = calibrate.Choice(rows, use, 1.0, "given")
            monkeypatch.setattr(calibrate, "pick", lambda run, forced=forced: forced)
            r = ssd_core.generate(model, heads, decoder="ssd-exact", **kw)
            assert torch.equal(r.tokens, ar.tokens), (rows, use)
            assert r.trace.settings["draft_rows_picked"] == rows and r.trace.settings["heads_used"] is use
            steps.add(r.trace.steps)
    assert len(steps) > 1  # the picks do change the steps


def test_measured_costs_are_cached_per_model_and_in_the_file(tiny, tmp_path, monkeypatch):
    """The first pick measures (a fraction of a second on a tiny model); later ones read the memory, and a new
    process (here: an empty memory) the JSON file; a damaged file is measured again."""
    model, heads = tiny
    path = tmp_path / "cal" / "calibration.json"
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(path))
    monkeypatch.setattr(calibrate, "_memory", calibrate.weakref.WeakKeyDictionary())
    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, SamplerSettings(seed=0, cfg=2.0), session.last_features)
    first = calibrate.pick(run)
    assert first.source == "measured" and 1 <= first.rows <= calibrate.MAX_ROWS
    entry = next(iter(json.loads(path.read_text()).values()))
    assert set(entry) == {"forward_s", "op_s", "row_stride"} and entry["op_s"] > 0
    assert calibrate.pick(run).source == "cached"
    monkeypatch.setattr(calibrate, "_memory", calibrate.weakref.WeakKeyDictionary())
    again = calibrate.pick(run)
    assert again.source == "cached" and (again.rows, again.heads) == (first.rows, first.heads)
    path.write_text("{not json")
    monkeypatch.setattr(calibrate, "_memory", calibrate.weakref.WeakKeyDictionary())
    assert calibrate.pick(run).source == "measured"
    data = json.loads(path.read_text())  # a file from a version that timed other windows: measured again
    for entry in data.values():
        entry["forward_s"] = {"1": 0.01, "7": 0.02}
    path.write_text(json.dumps(data))
    monkeypatch.setattr(calibrate, "_memory", calibrate.weakref.WeakKeyDictionary())
    assert calibrate.pick(run).source == "measured"


def test_a_one_token_forward_slowed_by_a_busy_machine_still_makes_a_cache_entry(tiny, monkeypatch):
    """The least of the timings counts, and one token can never cost more than a wider window (it reads the same
    weights): a one-token timing inflated by a busy machine is lowered to the cheapest window, so the entry passes
    the reader's plausibility check (a window at least PLAUSIBLE_FLOOR of one token) instead of being measured
    again by every later process."""
    import time

    model, _ = tiny
    forward = calibrate.TimingSession.forward

    def slow_single(self, ids, *a, **k):  # one token 50 ms late: another job took the core
        if ids.shape[-1] == 1:
            time.sleep(0.05)
        return forward(self, ids, *a, **k)

    monkeypatch.setattr(calibrate.TimingSession, "forward", slow_single)
    costs = calibrate.measure(model, model.layout(None), 2)
    assert costs.forward_s[1] <= min(costs.forward_s.values())
    entry = {k: v for k, v in calibrate.asdict(costs).items() if k != "head_s"}
    entry["forward_s"] = {str(w): s for w, s in entry["forward_s"].items()}
    assert calibrate._costs_of(json.loads(json.dumps(entry))) is not None


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
