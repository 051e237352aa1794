"""What watches a generation from outside its decode path: the engine and the runs call an Observer at the points
a measurement needs (every base-model forward, every step, every call of the draft heads' networks); nothing
patches a class or hooks a module. The engine's timings are one observer (engine.Timing), opcount's counter
another; `observing(observer)` adds one to this thread's generations (a context variable: another thread's
generations do not see it)."""
from __future__ import annotations

import contextlib
import contextvars

FORWARDS = ("prefill", "step", "finalize", "score")  # the kinds of base-model forward a generation runs


class Observer:
    """The engine's calls, no-ops here. A forward's `kind` is one of FORWARDS: the prompt's prefill, a step's
    forward of the window, the finalize forward (the last tokens' keys) and the scoring (its teacher-forced
    forward and the log-probs of the finished image). Heads: one call of a draft head's network (Run.call_heads).
    The step's begin and end bracket one step of the batch: its forward (when a window is fed) and every
    policy's update."""

    def forward_begin(self, kind: str) -> None:
        pass

    def forward_end(self, kind: str) -> None:
        pass

    def step_begin(self) -> None:
        pass

    def step_end(self) -> None:
        pass

    def heads_begin(self) -> None:
        pass

    def heads_end(self) -> None:
        pass

    def graph_begin(self, compiled: bool) -> None:
        """The base model's own layers start inside a forward (static_cache: compiled, a graph launch; or eager)."""

    def graph_end(self, compiled: bool) -> None:
        pass


class Observers(Observer):
    """Several observers as one: begins in their order, ends in the reverse order (a counter that switches a
    dispatch mode off and on again nests inside another); with-blocks that call the end also when the body raises."""

    def __init__(self, observers=()):
        self.observers = tuple(observers)

    def forward_begin(self, kind: str) -> None:
        for o in self.observers:
            o.forward_begin(kind)

    def forward_end(self, kind: str) -> None:
        for o in reversed(self.observers):
            o.forward_end(kind)

    def step_begin(self) -> None:
        for o in self.observers:
            o.step_begin()

    def step_end(self) -> None:
        for o in reversed(self.observers):
            o.step_end()

    def heads_begin(self) -> None:
        for o in self.observers:
            o.heads_begin()

    def heads_end(self) -> None:
        for o in reversed(self.observers):
            o.heads_end()

    def graph_begin(self, compiled: bool) -> None:
        for o in self.observers:
            o.graph_begin(compiled)

    def graph_end(self, compiled: bool) -> None:
        for o in reversed(self.observers):
            o.graph_end(compiled)

    def forward(self, kind: str):
        return _span(self.forward_begin, self.forward_end, kind)

    def graph(self, compiled: bool):
        return _span(self.graph_begin, self.graph_end, compiled)

    def step(self):
        return _span(self.step_begin, self.step_end)

    def heads(self):
        return _span(self.heads_begin, self.heads_end)


@contextlib.contextmanager
def _span(begin, end, *args):
    """with-block that calls begin(*args), then end(*args) also when the body raises."""
    begin(*args)
    try:
        yield
    finally:
        end(*args)


NONE = Observers()  # a run outside the engine (tests, tools) is watched by nobody
_ambient: contextvars.ContextVar[tuple] = contextvars.ContextVar("ssd_observers", default=())


def ambient() -> tuple:
    """The observers `observing` blocks of this thread (context) have opened, outermost first."""
    return _ambient.get()


@contextlib.contextmanager
def observing(observer: Observer):
    """with observing(o): generate(...) -> every generation started inside the block, in this thread, calls o."""
    token = _ambient.set(_ambient.get() + (observer,))
    try:
        yield observer
    finally:
        _ambient.reset(token)
