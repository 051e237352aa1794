"""Per-step overhead, counted: the torch ops a step launches outside the base model's forward.

On a GPU every eager op is a kernel launch (5-10 us each), so a decoder whose bookkeeping runs hundreds of
ops a step loses its step savings in wall time even though the CPU figures look fine. `count_ops` counts,
with a TorchDispatchMode, every op dispatched outside the sessions' forward (the base model's own work),
the float64 ops among them (Apple's mps has no float64), and the steps; bench prints the mean as ops/step.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# views and metadata ops launch no kernel on a GPU
FREE = {"aten.view", "aten._unsafe_view", "aten.alias", "aten.detach", "aten.t", "aten.expand", "aten.slice",
        "aten.select", "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.transpose", "aten.as_strided",
        "aten.lift_fresh", "aten._to_copy.default-noop", "aten.split", "aten.unbind", "aten.diagonal"}


class OpCounter(TorchDispatchMode):
    """Counts dispatched ops while `active` (the sessions' forwards switch it off)."""

    def __init__(self):
        super().__init__()
        self.active = True
        self.ops: Counter = Counter()  # op name -> launches outside the forwards
        self.float64: Counter = Counter()  # op name -> launches with a float64 input or output
        self.steps = 0
        self.in_heads = 0  # inside a draft head's network: counted in head_ops too
        self.head_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.active:
            name = str(func.overloadpacket)
            if name not in FREE:
                self.ops[name] += 1
                self.head_ops += self.in_heads > 0
            tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            if any(t.dtype == torch.float64 for t in tensors):
                self.float64[name] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def head_total(self) -> int:
        return self.head_ops

    def per_step(self) -> float:
        return self.total / max(self.steps, 1)


@contextlib.contextmanager
def count_ops(heads=None):
    """with count_ops(heads) as c: generate(...) -> c.per_step(), c.ops, c.float64, c.head_total (ops outside the
    base model's forwards, those inside the heads' networks also counted apart; prefill and scoring run through
    the same forwards and are not counted, nor what runs in `uncounted()`: ssd-exact's one-time calibration)."""
    from .session import Session
    from .static_cache import StaticSession

    counter = OpCounter()
    originals = [(cls, name, getattr(cls, name)) for cls in (Session, StaticSession) for name in ("__init__", "forward")]

    def wrap(fn, step: bool):
        def not_counted(*args, **kwargs):
            counter.steps += step
            with _disable_current_modes():  # the forward runs without the counter (at full speed, uncounted)
                return fn(*args, **kwargs)
        return not_counted

    def enter(*_):
        counter.in_heads += 1

    def leave(*_):
        counter.in_heads -= 1

    hooks = [] if heads is None else [h for m in (heads.horizontal, heads.vertical)
                                      for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    for cls, name, fn in originals:  # the prefill (a session's start) and every step's forward
        setattr(cls, name, wrap(fn, name == "forward"))
    _counters.append(counter)
    try:
        with counter:
            yield counter
    finally:
        _counters.remove(counter)
        for h in hooks:
            h.remove()
        for owner, name, fn in originals:
            setattr(owner, name, fn)


_counters: list = []  # the counters of the count_ops blocks now open


@contextlib.contextmanager
def uncounted():
    """Ops inside are no step's overhead (ssd-exact's one-time calibration: its own session, timed ops, a heads
    call): the open count_ops blocks do not count them."""
    was = [c.active for c in _counters]
    for c in _counters:
        c.active = False
    try:
        yield
    finally:
        for c, active in zip(_counters, was):
            c.active = active
