"""One device-to-host copy per step: every decoder keeps its per-slot state on the model's device and brings
the step's decision to the host once (Run.sync). On the CPU a copy is invisible, so the test counts the
calls that would make one on a GPU: item / tolist / bool / int / float / index / cpu / numpy / nonzero and
indexing with a bool mask, made outside the base model's forward, between one step's forward and the next."""
import contextlib

import pytest
import torch

import ssd_core
from ssd_core import trace
from ssd_core.session import Session

SYNCING = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


@contextlib.contextmanager
def count_syncs():
    """-> per_step: host copies between consecutive step forwards (the last step's tail is not counted)."""
    state = {"inside": 0, "count": 0, "started": False}
    per_step: list[int] = []
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING}
    get, put, forward, from_run = torch.Tensor.__getitem__, torch.Tensor.__setitem__, Session.forward, trace.from_run

    def counted(fn):
        def wrapper(*args, **kwargs):
            if not state["inside"]:
                state["count"] += 1
            return fn(*args, **kwargs)
        return wrapper

    def masked(index) -> bool:
        items = index if isinstance(index, tuple) else (index,)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in items)

    def getitem(self, index):
        if masked(index) and not state["inside"]:
            state["count"] += 1
        return get(self, index)

    def setitem(self, index, value):
        if masked(index) and not state["inside"]:
            state["count"] += 1
        return put(self, index, value)

    def step_forward(self, *args, **kwargs):
        if state["started"]:
            per_step.append(state["count"])
        state["started"], state["count"] = True, 0
        state["inside"] += 1
        try:
            return forward(self, *args, **kwargs)
        finally:
            state["inside"] -= 1

    def outside(fn):  # a finished image's trace is built once, not in a step
        def wrapper(*args, **kwargs):
            state["inside"] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                state["inside"] -= 1
        return wrapper

    try:
        trace.from_run = outside(from_run)
        for name, fn in originals.items():
            setattr(torch.Tensor, name, counted(fn))
        torch.Tensor.__getitem__, torch.Tensor.__setitem__ = getitem, setitem
        Session.forward = step_forward
        yield per_step
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        torch.Tensor.__getitem__, torch.Tensor.__setitem__, Session.forward = get, put, forward
        trace.from_run = from_run


@pytest.fixture(scope="module")
def bundled():
    model = ssd_core.load_model("reference")
    return model, ssd_core.load_heads("reference", model)


def test_the_counter_sees_a_host_copy(bundled):
    model, _ = bundled
    with count_syncs() as per_step:
        session = model.start(model.build_prompt(0, "", True, model.default_grid))
        session.forward(torch.zeros(1, dtype=torch.long))
        _ = int(torch.ones(()))
        _ = torch.arange(4)[torch.arange(4) > 1]
        session.forward(torch.zeros(1, dtype=torch.long))
    assert per_step == [2]


@pytest.mark.parametrize("decoder,heads", [("ssd", True), ("ssd-exact", True), ("ssd-exact", False)],
                         ids=["ssd", "ssd-exact", "ssd-exact-noheads"])
def test_one_host_copy_per_step_on_the_bundled_model(bundled, decoder, heads):
    model, drafter = bundled
    with count_syncs() as per_step:
        r = ssd_core.generate(model, drafter if heads else None, prompt=3, decoder=decoder, seed=5, grid=(10, 10),
                              decode_pixels=False, score=False)
    assert len(per_step) >= r.trace.steps - 2 > 10
    assert max(per_step) == 1, per_step


@pytest.mark.parametrize("decoder", ["ar", "sjd", "zipar", "ssd", "ssd-exact"])
def test_one_host_copy_per_image_and_step_single_and_batched(bundled, decoder):
    model, heads = bundled
    drafter = heads if decoder.startswith("ssd") else None
    with count_syncs() as per_step:
        single = ssd_core.generate(model, drafter, prompt=1, decoder=decoder, seed=2, grid=(5, 5),
                                   decode_pixels=False, score=False)
    assert max(per_step) == 1 and len(per_step) >= single.trace.steps - 2
    with count_syncs() as per_step:
        batch = ssd_core.generate_batch(model, drafter, prompts=[1, 2], seeds=[2, 3], decoder=decoder, grid=(5, 5),
                                        decode_pixels=False, score=False)
    assert max(per_step) <= 2  # one per image still generating
    assert torch.equal(batch[0].tokens, single.tokens)


def test_no_device_synchronize_in_the_step_loop(bundled, monkeypatch):
    """The engine's phase clock reads CUDA events once per trace, not torch.cuda.synchronize every step (on a GPU
    a synchronize per step stalls the launch queue). On the CPU the clock is checked on a fake CUDA device."""
    from ssd_core import engine

    calls = {"sync": 0, "record": 0, "elapsed": 0}

    class FakeEvent:
        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self):
            calls["record"] += 1

        def synchronize(self):
            calls["sync"] += 1

        def elapsed_time(self, other):
            calls["elapsed"] += 1
            return 1.0

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    clock = engine.Clock(torch.device("cuda"))
    for _ in range(50):  # fifty steps: marks only
        a, b = clock.mark(), clock.mark()
        clock.add("forward", a, b)
    assert calls == {"sync": 0, "record": 100, "elapsed": 0}
    assert clock.seconds("forward") == pytest.approx(0.05) and calls["sync"] == 1
    model, heads = bundled
    r = ssd_core.generate(model, heads, prompt=1, decoder="ssd-exact", seed=1, grid=(5, 5), decode_pixels=False)
    t = r.trace.timings
    assert t["forward"] > 0 and t["policy"] > 0 and t["forward"] + t["policy"] <= t["wall"]
