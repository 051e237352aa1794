"""The decoder registry: every decoder is a policy of the one loop in engine.py.

A decoder is one file here (its Policy subclass) plus one line in DECODER_SPECS. The CLI, bench, the
ComfyUI nodes and the engine read names, parameters, limits and defaults from this table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SSDError
from .ar import ARPolicy
from .exact import ExactPolicy
from .sjd import SJDPolicy
from .ssd import SSDPolicy
from .zipar import ZipARPolicy


@dataclass(frozen=True)
class Param:
    """A whole-number decoder parameter: its limits (high None = no upper limit) and its default."""

    low: int
    high: int | None
    default: int | None
    help: str

    def check(self, name: str, value) -> None:
        if value is None:  # None: the decoder's default
            return
        if int(value) != value or value < self.low or (self.high is not None and value > self.high):
            limit = f"from {self.low} to {self.high}" if self.high is not None else f">= {self.low}"
            raise SSDError(f"{name} must be a whole number {limit}, got {value}")


NO_HEADS = ":noheads"  # bench decoder suffix: run it without the loaded heads ("ssd-exact:noheads" beside "ssd-exact")

DRAFT_ROWS = Param(0, 8, 0, "rows drafted and verified together (ssd, ssd-exact); 0 = the decoder's default "
                            "(ssd 1, ssd-exact 3)")
VERIFY_ROUNDS = Param(0, 8, 2, "correction rounds per row before it is committed (ssd)")
WINDOW = Param(1, None, None, "sjd / zipar window (default: 16 for sjd, a third of a row for zipar)")
STABLE_FIRST_ROW = Param(0, 2, 2, "ssd: decode the first row by ssd-exact's rule, the row ar draws (2); verify the first "
                         "block until a round changes nothing (1, the paper); or like the others (0)")
ADAPTIVE_PERCENT = Param(0, 100, 0, "ssd: end a block's verification once a round corrects at most this percent "
                         "of its cells (0 = off; verify_rounds stays the cap)")
REPAIR = Param(0, 1, 1, "ssd: a committed token outside the top-k / min-p set of its final context is redrawn "
               "from it when the next forward feeds it (1: no extra steps; 0 = the paper's rule)")
PARAMS = {"draft_rows": DRAFT_ROWS, "verify_rounds": VERIFY_ROUNDS, "window": WINDOW,
          "stable_first_row": STABLE_FIRST_ROW, "adaptive_percent": ADAPTIVE_PERCENT,
          "repair": REPAIR}  # every decoder parameter


@dataclass(frozen=True)
class DecoderSpec:
    policy: type  # a Policy subclass, built with the parameters below as keyword arguments
    params: tuple[str, ...] = ()  # the names in PARAMS it takes
    defaults: dict = field(default_factory=dict)  # its own defaults where they differ from PARAMS'

    @property
    def needs_heads(self) -> bool:
        return self.policy.needs_heads

    @property
    def uses_heads(self) -> bool:
        return self.policy.uses_heads


DECODER_SPECS = {
    "ar": DecoderSpec(ARPolicy),
    "ssd": DecoderSpec(SSDPolicy, ("draft_rows", "verify_rounds", "stable_first_row", "adaptive_percent", "repair"),
                       {"draft_rows": 1}),
    # 3 rows: about the fewest steps with and without heads on the bundled model (docs/decoders.md, "Exact
    # speed-up without heads"); fewer rows cost less per step on a CPU (docs/speed.md, "GPUs and Macs")
    "ssd-exact": DecoderSpec(ExactPolicy, ("draft_rows",), {"draft_rows": 3}),
    "sjd": DecoderSpec(SJDPolicy, ("window",), {"window": 16}),
    "zipar": DecoderSpec(ZipARPolicy, ("window",)),
}
DECODERS = tuple(DECODER_SPECS)
HEADLESS = tuple(name for name, spec in DECODER_SPECS.items() if not spec.needs_heads)  # decoders without heads


def spec(name: str) -> DecoderSpec:
    if name not in DECODER_SPECS:
        raise SSDError(f"unknown decoder {name!r}; choose one of {', '.join(DECODERS)}")
    return DECODER_SPECS[name]


def needs_heads(name: str) -> bool:
    return spec(name).needs_heads


def uses_heads(name: str) -> bool:
    """The decoder drafts with heads when they are given (ssd, ssd-exact)."""
    return spec(name).uses_heads


def without_heads() -> str:
    """The decoders that run without heads, as words: 'ar, sjd or zipar'."""
    return ", ".join(HEADLESS[:-1]) + f" or {HEADLESS[-1]}" if len(HEADLESS) > 1 else HEADLESS[0]


def make_policy(name: str, draft_rows: int | None = None, verify_rounds: int | None = None,
                window: int | None = None, stable_first_row: int | None = None, adaptive_percent: int | None = None,
                repair: int | None = None):
    """The policy of decoder `name`; every parameter is checked against its limits, used or not; None takes
    the decoder's own default, else the parameter's."""
    given = {"draft_rows": draft_rows, "verify_rounds": verify_rounds, "window": window,
             "stable_first_row": stable_first_row, "adaptive_percent": adaptive_percent, "repair": repair}
    chosen = spec(name)
    for key, value in given.items():
        if value is not None:
            PARAMS[key].check(key, value)
    given["draft_rows"] = draft_rows or None  # 0: the decoder's own default
    kwargs = {key: int(given[key]) if given[key] is not None else chosen.defaults.get(key, PARAMS[key].default)
              for key in chosen.params}
    return chosen.policy(**kwargs)
