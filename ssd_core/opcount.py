"""Per-step overhead, counted: the torch ops a step launches outside the base model's forward.

On a GPU every eager op is a kernel launch (5-10 us each), so a decoder whose bookkeeping runs hundreds of
ops a step loses its step savings in wall time even though the CPU figures look fine. `count_ops` counts,
with a TorchDispatchMode, every op a generation's steps dispatch outside the base model's forwards, the float64
ops among them (Apple's mps has no float64), those in the draft heads' networks, and the steps; bench prints the
mean as ops/step. It is one of the generation's observers (observer.py): the engine tells it where a step and a
forward begin and end, the runs where a heads' call does; nothing is patched.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .observer import Observer, observing

# views and metadata ops launch no kernel on a GPU
FREE = {"aten.view", "aten._unsafe_view", "aten.alias", "aten.detach", "aten.t", "aten.expand", "aten.slice",
        "aten.select", "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.transpose", "aten.as_strided",
        "aten.lift_fresh", "aten._to_copy.default-noop", "aten.split", "aten.unbind", "aten.diagonal"}


class OpCounter(TorchDispatchMode, Observer):
    """Counts dispatched ops while `active`: entered alone (`with OpCounter() as c:`) every op of its block; as a
    generation's observer (count_ops) only those of its steps outside the base model's forwards, which run
    without the counter (at full speed). A generation's work outside its steps (the prefill, each policy's
    begin, ssd-exact's one-time calibration and exactness probe, the finalize forward, the traces, the scoring)
    is no step's overhead and is not counted."""

    def __init__(self, active: bool = True, graphs: bool = False):
        super().__init__()
        self.active = active
        self.graphs = graphs  # the compiled view: a forward's own eager work counts too, its graph call as 1 op
        self.graph_calls = 0  # compiled graph launches counted (the compiled view)
        self.ops: Counter = Counter()  # op name -> launches while active
        self.float64: Counter = Counter()  # op name -> launches with a float64 input or output
        self.steps = 0  # the steps' base-model forwards
        self.in_step = False
        self.in_heads = 0  # inside a draft head's network: counted in head_ops too
        self.head_ops = 0
        self._forward_off: list = []  # the open forwards' contexts that took the dispatch modes off

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

    # ---- the generation's observer ---------------------------------------------------------------
    def step_begin(self) -> None:
        self.in_step = self.active = True

    def step_end(self) -> None:
        self.in_step = self.active = False

    def forward_begin(self, kind: str) -> None:
        if self.graphs and kind == "step":  # the compiled view: only the model's own layers (graph_begin) are off
            return
        self._off()

    def forward_end(self, kind: str) -> None:
        self.steps += kind == "step"
        if self.graphs and kind == "step":
            return
        self._on()

    def graph_begin(self, compiled: bool) -> None:
        """A compiled graph (or the model's eager layers) runs without the dispatch mode, in either view (dynamo
        does not trace under one); counted as one launch where the step's ops are being counted."""
        if not self.in_step:
            return
        if compiled and self.active:  # what runs on the device as one launch (a CUDA graph's replay)
            self.ops["graph launch"] += 1
            self.graph_calls += 1
        self._off()

    def graph_end(self, compiled: bool) -> None:
        if self.in_step:
            self._on()

    def _off(self) -> None:
        off = _disable_current_modes()  # the base model runs without any dispatch mode
        off.__enter__()
        self._forward_off.append((off, self.active))
        self.active = False

    def _on(self) -> None:
        off, self.active = self._forward_off.pop()
        off.__exit__(None, None, None)

    def heads_begin(self) -> None:
        self.in_heads += 1

    def heads_end(self) -> None:
        self.in_heads -= 1

    # ---- figures ---------------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def head_total(self) -> int:
        return self.head_ops

    def per_step(self) -> float:
        return self.total / max(self.steps, 1)


@contextlib.contextmanager
def count_ops(graphs: bool = False):
    """with count_ops() as c: generate(...) -> c.per_step(), c.ops, c.float64, c.head_total, c.steps: the ops of
    the steps of every generation this thread runs inside the block, outside the base model's forwards (those
    inside the heads' networks also counted apart).

    graphs: the compiled view (a model loaded with compile 'static' or 'compiled'): every op a step runs eagerly,
    the forward's own preparation (embedding, masks) included, only the model's layers left out; each call of a
    compiled graph counts as one op ("graph launch"), what a CUDA graph replay costs."""
    counter = OpCounter(active=False, graphs=graphs)
    with observing(counter), counter:
        yield counter
