"""Host syncs of the step loop. Between one step's forward and the next, every decoder keeps its per-slot state
on the model's device and brings the step's decision to the host once (Run.sync). Inside a step forward
(Session.forward, StaticSession.forward) nothing but the base model's own forward may wait for the device:
no read of a device value, no blocking copy of a host tensor to the device.

On the CPU a copy is invisible, so the test counts the calls that would make one on a GPU:
- device -> host: item / tolist / bool / int / float / index / cpu / numpy / nonzero and indexing with a bool mask;
- host -> device: a tensor made on the host (no device given, or computed from such tensors only) moved to the
  device by .to / .cuda / copy_ / assignment into a device tensor / indexing a device tensor with it, without
  non_blocking; and torch.tensor / as_tensor of host data with a device (tracked by a TorchFunctionMode).
Calls inside the backbone's forward (the base model: transformers' code, or the compiled step) are not ours and
are not counted. The counter is one of the generation's observers (ssd_core/observer.py): the engine tells it
where each forward begins and ends; a test that runs a session itself brackets its forwards (Counts.forward)."""
import contextlib
import functools
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode

import ssd_core
from ssd_core import static_cache, trace
from ssd_core.observer import Observer, observing
from ssd_core.session import held_on_device, pack_fed_keys

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

SYNCING = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


class Counts(list, Observer):
    """Per step (the list): device -> host calls between consecutive forwards of a generation (steps and the
    finalize forward; the prefill's and the last step's tail are not counted). in_forward: per such forward, the
    host syncs (names) made inside it but outside the backbone. The sessions of ssd-exact's one-time work (its
    calibration and exactness probe) are no generation's: not seen."""

    def __init__(self):
        super().__init__()
        self.in_forward: list[list[str]] = []
        self.state = {"backbone": 0, "quiet": 0, "forward": 0, "count": 0, "started": False}

    def seen(self, name: str) -> None:
        state = self.state
        if state["backbone"] or state["quiet"]:
            return
        if state["forward"]:
            self.in_forward[-1].append(name)
        else:
            state["count"] += 1

    def forward_begin(self, kind: str) -> None:
        if kind == "prefill":
            return
        state = self.state
        if state["started"]:
            self.append(state["count"])
        state["started"], state["count"] = True, 0
        self.in_forward.append([])
        state["forward"] += 1

    def forward_end(self, kind: str) -> None:
        self.state["forward"] -= kind != "prefill"

    @contextlib.contextmanager
    def forward(self, kind: str = "step"):
        """A forward the test runs itself, counted as the engine's are."""
        self.forward_begin(kind)
        try:
            yield
        finally:
            self.forward_end(kind)

    def forward_syncs(self) -> list[str]:
        return [name for names in self.in_forward for name in names]


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def masked(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in items)


class HostTensors(TorchFunctionMode):
    """Counts the device -> host calls (SYNCING, bool-mask indexing) and marks the tensors that would live on the host on a GPU machine and reports each blocking host -> device
    copy of one to `seen`. A tensor is a host one when a factory made it without a device, when .cpu() made it,
    or when every tensor an op read was one; an explicit device (the model's, here the CPU) makes a device one."""

    def __init__(self, state, seen):
        super().__init__()
        self.state, self.seen, self.host = state, seen, {}

    def is_host(self, t) -> bool:
        ref = self.host.get(id(t))
        return ref is not None and ref() is t

    def mark(self, out, host: bool) -> None:
        for t in _tensors(out):
            if host:
                self.host[id(t)] = weakref.ref(t)
            else:
                self.host.pop(id(t), None)

    def copies(self, func, args, kwargs) -> bool:
        """Would this call copy host data to the device and wait for it?"""
        name = getattr(func, "__name__", "")
        if kwargs.get("non_blocking"):
            return False
        if name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            return not (args and isinstance(args[0], torch.Tensor) and not self.is_host(args[0]))
        if not args or not isinstance(args[0], torch.Tensor):
            return False
        me = args[0]
        if name == "cuda":
            return self.is_host(me)
        if name == "to":
            target = [a for a in args[1:] if isinstance(a, (torch.device, str, int)) and not isinstance(a, bool)]
            target += [a for a in args[1:] if isinstance(a, torch.Tensor) and not self.is_host(a)]
            return self.is_host(me) and bool(target or kwargs.get("device") is not None)
        if self.is_host(me):
            return False
        if name == "copy_":
            return len(args) > 1 and self.is_host(args[1]) and args[1].dim() > 0
        if name in ("__setitem__", "__getitem__"):
            moved = [t for t in _tensors(args[1:]) if self.is_host(t) and t.dim() > 0]
            return bool(moved)
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.state["backbone"]:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in SYNCING and args and isinstance(args[0], torch.Tensor):
            self.seen(name)
        elif name in ("__getitem__", "__setitem__") and len(args) > 1 and masked(args[1]):
            self.seen(f"bool-mask {name}")
        copy = self.copies(func, args, kwargs)
        out = func(*args, **kwargs)
        if copy:
            self.seen(f"host->device {name}")
        if name.endswith("_") or name == "__setitem__":
            return out  # in place: the tensor stays where it is
        inputs = list(_tensors((args, kwargs)))
        if name in ("cpu", "numpy"):
            host = True
        elif name in ("to", "cuda") and (copy or kwargs.get("non_blocking") or name == "cuda" or
                                         any(isinstance(a, (torch.device, str)) for a in args[1:]) or
                                         kwargs.get("device") is not None):
            host = False
        elif kwargs.get("device") is not None:
            host = False
        else:
            host = all(self.is_host(t) for t in inputs)  # no tensor read: a factory on the default device
        self.mark(out, host)
        return out


@contextlib.contextmanager
def count_syncs(model):
    """-> Counts for generations on `model` (its backbone's class is the base model's forward)."""
    counts = Counts()
    state = counts.state
    from_run = trace.from_run
    backbone_cls = type(model.backbone())
    backbone_forward = backbone_cls.forward

    def within(key, fn):
        @functools.wraps(fn)  # the signature stays readable (session.cache_kwarg)
        def wrapper(*args, **kwargs):
            state[key] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                state[key] -= 1
        return wrapper

    try:
        trace.from_run = within("quiet", from_run)  # a finished image's trace is built once, not in a step
        backbone_cls.forward = within("backbone", backbone_forward)
        with observing(counts), HostTensors(state, counts.seen):
            yield counts
    finally:
        backbone_cls.forward = backbone_forward
        trace.from_run = from_run


@pytest.fixture(scope="module")
def bundled_static():
    model = ssd_core.load_model("reference", compile="static")
    return model, ssd_core.load_heads("reference", model)


def test_the_counter_sees_a_host_copy(bundled, monkeypatch):
    """Each kind of host sync is seen where it is made: between steps, or inside a forward (not inside the
    backbone); an asynchronous copy and device-side fills are not syncs."""
    model, _ = bundled
    dev = model.device
    with count_syncs(model) as per_step:
        session = model.start(model.build_prompt(0, "", True, model.default_grid))
        with per_step.forward():
            session.forward(torch.zeros(1, dtype=torch.long, device=dev))
        _ = int(torch.ones((), device=dev))
        _ = torch.arange(4, device=dev)[torch.arange(4, device=dev) > 1]
        with per_step.forward():
            session.forward(torch.zeros(1, dtype=torch.long, device=dev))
    assert per_step == [2] and per_step.forward_syncs() == []

    embed = model.embed

    def syncing_embed(ids):  # what the forward must not do: read a device value, copy host numbers over blocking
        _ = bool(ids.any())
        _ = torch.tensor([0, 1]).to(dev)  # the held lengths as they were sent before (a CPU tensor each step)
        _ = torch.tensor([2, 3], device=dev)
        _ = torch.ones(3, device=dev)[torch.arange(2)]  # a host index into a device tensor
        _ = torch.tensor([4, 5]).to(dev, non_blocking=True)  # asynchronous: not a sync
        _ = torch.full((2,), 7, device=dev) + torch.arange(2, device=dev)  # device-side: not a sync
        return embed(ids)

    def inside_the_base_model(*_):
        _ = int(torch.ones((), device=dev))

    handle = model.backbone().layers[0].register_forward_hook(inside_the_base_model)
    monkeypatch.setattr(model, "embed", syncing_embed)
    try:
        with count_syncs(model) as per_step:
            session = model.start(model.build_prompt(0, "", True, model.default_grid))
            with per_step.forward():
                session.forward(torch.zeros(1, dtype=torch.long, device=dev))
    finally:
        handle.remove()
    assert per_step.in_forward == [["__bool__", "host->device to", "host->device tensor", "host->device __getitem__"]]


def test_held_lengths_reach_the_device_without_a_copy(bundled):
    model, _ = bundled
    seen = []
    with HostTensors({"backbone": 0}, seen.append):
        cases = [(held, held_on_device(held, model.device)) for held in ([4, 4, 4, 4], [3, 5, 3, 5], [0, 2, 2, 7, 7])]
        keys = torch.arange(2 * 6 * 1 * 1, dtype=torch.float, device=model.device).view(2, 1, 6, 1)
        before = keys.clone()
        pack_fed_keys([(keys, keys.clone())], 1, held_on_device([1, 3], model.device), 3, 2, 1)
    assert seen == []
    assert all(on_device.tolist() == held for held, on_device in cases)
    # row 0 held 1 slot: its 2 fed keys (slot columns 3, 4 = positions 4, 5 after the prompt) move to slots 1, 2
    assert keys[0, 0, :, 0].tolist() == [before[0, 0, i, 0].item() for i in (0, 1, 4, 5, 4, 5)]
    assert torch.equal(keys[1], before[1])


def forget_exactness_probe(model):
    """ssd-exact's rounding probe (exactness.error_bound) runs once per model, device, dtype and streams, before
    the first step, with forwards and sessions of its own (their prompt copies to the device): forgotten here, so
    that the generation counted next runs it. Those are no generation's forwards, so the counts do not see them;
    its result stays on the device (no copy to the host)."""
    model.__dict__.pop("_exact_error", None)


@pytest.mark.parametrize("decoder,heads", [("ssd", True), ("ssd-exact", True), ("ssd-exact", False)],
                         ids=["ssd", "ssd-exact", "ssd-exact-noheads"])
def test_one_host_copy_per_step_on_the_bundled_model(bundled, decoder, heads):
    model, drafter = bundled
    forget_exactness_probe(model)
    with count_syncs(model) as per_step:
        r = ssd_core.generate(model, drafter if heads else None, prompt=3, decoder=decoder, seed=5, grid=(10, 10),
                              decode_pixels=False, score=False)
    assert len(per_step) >= r.trace.steps - 2 > 10
    assert max(per_step) == 1, per_step
    assert per_step.forward_syncs() == []


@pytest.fixture(scope="module")
def dynamic_tokens():
    """decoder -> the tokens of prompt 1, seed 2 at 5x5 on the bundled model's DynamicCache: the single image of
    test_one_host_copy_per_image_and_step_single_and_batched, kept for the static-cache test to compare with (made
    there when that test has not run first)."""
    return {}


@pytest.mark.parametrize("decoder", ["ar", "sjd", "zipar", "ssd", "ssd-exact"])
def test_one_host_copy_per_image_and_step_single_and_batched(bundled, dynamic_tokens, decoder):
    model, heads = bundled
    drafter = heads if decoder.startswith("ssd") else None
    forget_exactness_probe(model)
    with count_syncs(model) as per_step:
        single = ssd_core.generate(model, drafter, prompt=1, decoder=decoder, seed=2, grid=(5, 5),
                                   decode_pixels=False, score=False)
    dynamic_tokens[decoder] = single.tokens
    assert max(per_step) == 1 and len(per_step) >= single.trace.steps - 2
    assert per_step.forward_syncs() == []
    with count_syncs(model) as per_step:
        batch = ssd_core.generate_batch(model, drafter, prompts=[1, 2], seeds=[2, 3], decoder=decoder, grid=(5, 5),
                                        decode_pixels=False, score=False)
    assert max(per_step) <= 2  # one per image still generating
    assert per_step.forward_syncs() == []  # rows holding different lengths included
    assert torch.equal(batch[0].tokens, single.tokens)


@pytest.mark.parametrize("decoder", ["ar", "ssd", "ssd-exact"])
def test_one_host_copy_per_step_on_the_static_cache(bundled, bundled_static, dynamic_tokens, decoder):
    """StaticSession's forwards are the steps there: one host copy per step between them, none inside. The grid
    and image are the single-and-batched test's (5x5, prompt 1, seed 2): its DynamicCache tokens are the ones the
    static cache must give, and the DynamicCache's ssd-exact calibration at 5x5 is already measured."""
    model, heads = bundled_static
    assert static_cache.mode_of(model) == "static"
    drafter = heads if decoder.startswith("ssd") else None
    forget_exactness_probe(model)
    with count_syncs(model) as per_step:
        single = ssd_core.generate(model, drafter, prompt=1, decoder=decoder, seed=2, grid=(5, 5),
                                   decode_pixels=False, score=False)
    assert len(per_step) >= single.trace.steps - 2 > 2
    assert max(per_step) == 1, per_step
    assert per_step.forward_syncs() == []
    with count_syncs(model) as per_step:
        batch = ssd_core.generate_batch(model, drafter, prompts=[1, 2], seeds=[2, 3], decoder=decoder, grid=(5, 5),
                                        decode_pixels=False, score=False)
    assert max(per_step) <= 2 and per_step.forward_syncs() == []
    assert torch.equal(batch[0].tokens, single.tokens)
    if decoder not in dynamic_tokens:
        dynamic, dynamic_heads = bundled
        dynamic_tokens[decoder] = ssd_core.generate(dynamic, dynamic_heads if drafter is not None else None, prompt=1,
                                                    decoder=decoder, seed=2, grid=(5, 5), decode_pixels=False,
                                                    score=False).tokens
    assert torch.equal(single.tokens, dynamic_tokens[decoder])


FAMILIES = {"janus": ("build_janus", (4, 4)), "emu3": ("build_emu3", (3, 4)), "lumina": ("build_lumina", (4, 4))}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_folder(request, tmp_path_factory):
    import tiny_families

    build, grid = FAMILIES[request.param]
    return getattr(tiny_families, build)(tmp_path_factory.mktemp(request.param) / "model"), grid


@pytest.mark.parametrize("compile", ["off", "static"])
def test_no_host_sync_inside_the_forward_of_any_family(family_folder, compile):
    """Every family's embedding and our session code around the base model's forward: no host sync, on the
    DynamicCache and the static cache, one image and a batch of two (rows of different lengths)."""
    folder, grid = family_folder
    model = ssd_core.load_model(folder, dtype="fp32", compile=compile)
    forget_exactness_probe(model)
    with count_syncs(model) as per_step:
        single = ssd_core.generate(model, None, prompt="a red cat", decoder="ssd-exact", seed=1, grid=grid,
                                   decode_pixels=False, score=False)
    # at least one step counted (a tiny random model may finish its grid in 2 steps: transformers 4.57's init)
    assert single.trace.steps >= 2 and len(per_step) >= max(single.trace.steps - 2, 1) and max(per_step) == 1, per_step
    assert per_step.forward_syncs() == []
    with count_syncs(model) as per_step:
        batch = ssd_core.generate_batch(model, None, prompts=["a red cat", "a dog"], seeds=[1, 2], decoder="ar",
                                        grid=grid, decode_pixels=False, score=False)
    assert max(per_step) <= 2 and per_step.forward_syncs() == []
    assert torch.equal(batch[0].tokens, single.tokens)  # ssd-exact == ar, one image or two


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
