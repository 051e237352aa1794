"""The decoder registry: every decoder is a policy of the one loop in engine.py.

A decoder is one file here (its Policy subclass) plus one line in DECODER_SPECS. The CLI, bench, the
ComfyUI nodes and the engine read names, parameters, limits and defaults from this table; a generation's
parameter values travel as one DecoderParams (made from PARAMS, checked once).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass, replace
from enum import IntEnum

from ..errors import SSDError, shown
from ..limits import whole_number
from .ar import ARPolicy
from .exact import ExactPolicy
from .flashar import FlashARPolicy
from .gsd import GSDPolicy
from .scd import Accept, SCDPolicy
from .sjd import SJDPolicy
from .sjd_pac import SJDPACPolicy
from .ssd import FirstRow, Repair, SSDPolicy
from .zipar import ZipARPolicy


@dataclass(frozen=True)
class Param:
    """A whole-number decoder parameter: its limits (high None = no upper limit) and its default; a coded one
    (Param.coded) also the names of its values."""

    low: int
    high: int | None
    default: int | None
    help: str
    names: type[IntEnum] | None = None  # a coded parameter's values by name (users give the numbers)

    @classmethod
    def coded(cls, names: type[IntEnum], default: IntEnum, help: str) -> Param:
        """A parameter whose values are the members of `names` (their numbers, from the lowest to the highest)."""
        return cls(int(min(names)), int(max(names)), int(default), help, names)

    def meanings(self) -> str:
        """A coded parameter's values as words, e.g. '0 = off, 1 = redraw' ('' for the others)."""
        return ", ".join(f"{int(v)} = {v.name.lower().replace('_', ' ')}" for v in self.names or ())

    def check(self, name: str, value) -> int | None:
        """value as an int within the limits, or one SSDError line naming it as `name` (and a coded
        parameter's meanings); None stays None (the decoder's default)."""
        why = f" ({self.meanings()})" if self.names else ""
        return None if value is None else whole_number(name, value, self.low, self.high, why)


NO_HEADS = ":noheads"  # bench decoder suffix: run it without the loaded heads ("ssd-exact:noheads" beside "ssd-exact")
ROWS_AT = "@"  # bench decoder suffix: that many draft rows ("ssd-exact@3", "ssd-exact@3:noheads")

DRAFT_ROWS = Param(0, 8, 0, "rows drafted and verified together (ssd, ssd-exact); 0 = the decoder's default "
                            "(ssd 1; ssd-exact: rows and heads picked for the model and device, calibrate.py)")
VERIFY_ROUNDS = Param(0, 8, 2, "correction rounds per row before it is committed (ssd)")
WINDOW = Param(1, None, None, "the Jacobi window of sjd, scd, sjd-pac, gsd and zipar (default: 16 for sjd and gsd, "
                              "32 for scd, 64 for sjd-pac (the tree's tokens with it), a third of a row for zipar)")
STABLE_FIRST_ROW = Param.coded(FirstRow, FirstRow.EXACT, "ssd: decode the first row by ssd-exact's rule, the row ar "
                               "draws (2); verify the first block until a round changes nothing (1, the paper); "
                               "or like the others (0)")
ADAPTIVE_PERCENT = Param(0, 100, 0, "ssd: end a block's verification once a round corrects at most this percent "
                         "of its cells (0 = off; verify_rounds stays the cap)")
REPAIR = Param.coded(Repair, Repair.REDRAW, "ssd: a committed token outside the top-k / min-p set of its final "
                     "context is redrawn from it when the next forward feeds it (1: no extra steps; 0 = the "
                     "paper's rule)")


ACCEPT = Param.coded(Accept, Accept.RATIO, "scd: keep a draft while u < min(1, p/q), its authors' default (1: the AR "
                     "distribution); or while it equals the verifier's Gumbel pick (0: ar's very tokens)")


PARAMS = {"draft_rows": DRAFT_ROWS, "verify_rounds": VERIFY_ROUNDS, "window": WINDOW,
          "stable_first_row": STABLE_FIRST_ROW, "adaptive_percent": ADAPTIVE_PERCENT,
          "repair": REPAIR, "accept": ACCEPT}  # every decoder parameter


def bench_variant(name: str) -> tuple[str, bool, int | None]:
    """A bench decoder name -> (decoder, without heads, draft rows or None): 'ssd-exact@3:noheads' ->
    ('ssd-exact', True, 3). One SSDError line for rows that are not a whole number in DRAFT_ROWS' limits."""
    base, _, rows = name.removesuffix(NO_HEADS).partition(ROWS_AT)
    # '3' -> 3; '' -> None; anything else (other scripts' digits such as '３' too) is refused by name
    given = rows if len(rows) <= 12 else rows[:12] + "..."  # as the message shows it
    given = int(rows) if rows.isascii() and rows.isdigit() and len(rows) <= 6 else given or None
    return base, name.endswith(NO_HEADS), DRAFT_ROWS.check(f"the draft rows of {shown(name)}", given)


class _DecoderParams:
    """What DecoderParams does besides holding its fields (one per PARAMS entry, None = the decoder's default)."""

    def __post_init__(self):  # every value checked once, when the object is made: an int within its limits
        for name, param in PARAMS.items():
            object.__setattr__(self, name, param.check(name, getattr(self, name)))

    @classmethod
    def of(cls, params: DecoderParams | None = None, /, **values) -> DecoderParams:
        """params (a DecoderParams or a dict of its values; None: all defaults) with the values given (None: not
        given, params' value stays); a name outside PARAMS is refused (TypeError, as for an unknown keyword)."""
        unknown = [name for name in values if name not in PARAMS]
        if unknown:
            raise TypeError(f"unknown decoder parameter {unknown[0]!r}; the decoder parameters are {', '.join(PARAMS)}")
        if isinstance(params, Mapping):
            params = cls.of(None, **params)
        elif params is not None and not isinstance(params, cls):
            raise SSDError(f"params must be a DecoderParams (or a dict of decoder parameters), got "
                           f"{type(params).__name__}")
        given = {name: value for name, value in values.items() if value is not None}
        return replace(params, **given) if params is not None else cls(**given)

    @classmethod
    def read(cls, source, shown=lambda name: name) -> DecoderParams:
        """The PARAMS-named attributes of `source` (e.g. the command line's arguments), each checked with its
        error naming it as shown(name) (e.g. '--draft-rows')."""
        return cls(**{name: param.check(shown(name), getattr(source, name, None)) for name, param in PARAMS.items()})

    def given(self) -> dict:
        """The values set (not None), by name."""
        return {name: getattr(self, name) for name in PARAMS if getattr(self, name) is not None}

    def for_decoder(self, decoder: str) -> dict:
        """The keyword arguments of decoder's policy: the parameters it takes (its DecoderSpec), each as given,
        else the decoder's own default, else the parameter's (draft_rows 0: the decoder's default)."""
        chosen = spec(decoder)
        given = {**self.given(), "draft_rows": self.draft_rows or None}
        return {name: given[name] if given.get(name) is not None else chosen.defaults.get(name, PARAMS[name].default)
                for name in chosen.params}


DecoderParams = make_dataclass(
    "DecoderParams", [(name, "int | None", field(default=None)) for name in PARAMS], bases=(_DecoderParams,),
    frozen=True)
DecoderParams.__module__ = __name__  # (make_dataclass's `module` argument: Python 3.12 and newer)
DecoderParams.__doc__ = """Every decoder parameter (a field per PARAMS entry: its limits, default and help there), None
= the decoder's default; frozen, checked when made. DecoderParams(draft_rows=2), DecoderParams.of(p, window=8),
p.for_decoder('ssd'). The one object that api, the CLI, the nodes, bench and make_policy pass along."""


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
    # 0: rows (and whether the heads pay) picked by a short measured calibration of the model on its device
    # (calibrate.py; docs/speed.md, "Defaults that fit the device"): the image never changes, only steps and time
    "ssd-exact": DecoderSpec(ExactPolicy, ("draft_rows",), {"draft_rows": 0}),
    "sjd": DecoderSpec(SJDPolicy, ("window",), {"window": 16}),
    "zipar": DecoderSpec(ZipARPolicy, ("window",)),
    # peers of 2025-26 as their authors release them (docs/decoders.md, "Peers"): their windows from their repos
    "scd": DecoderSpec(SCDPolicy, ("window", "accept"), {"window": 32}),
    "sjd-pac": DecoderSpec(SJDPACPolicy, ("window",), {"window": 64}),
    "gsd": DecoderSpec(GSDPolicy, ("window",), {"window": 16}),
    # FlashAR checkpoints only (families/flashar.py); its own loop (flashar_decode.py)
    "flashar": DecoderSpec(FlashARPolicy),
}
DECODERS = tuple(DECODER_SPECS)
# the decoders of the engine's one loop, which run on every model (flashar runs on its own checkpoint only)
ENGINE_DECODERS = tuple(name for name, s in DECODER_SPECS.items() if not getattr(s.policy, "own_loop", False))
HEADLESS = tuple(name for name in ENGINE_DECODERS if not DECODER_SPECS[name].needs_heads)  # decoders without heads


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


def make_policy(name: str, params: DecoderParams | None = None, /, choice=None, **values):
    """The policy of decoder `name` with `params` (DecoderParams; None: the defaults) and any parameter values
    given by name (checked against their limits, used or not); choice: ssd-exact's rows and heads picked for the
    device (calibrate.pick; api.py makes it for draft_rows 0). policy.params: the values it runs with."""
    kwargs = DecoderParams.of(params, **values).for_decoder(name)
    if choice is not None and name != "ssd-exact":
        raise SSDError(f"a picked choice of draft rows is ssd-exact's, not {name!r}'s")
    policy = spec(name).policy(**kwargs, **({"choice": choice} if choice is not None else {}))
    policy.params = {**kwargs, **getattr(policy, "params", {})}
    return policy


def check_model_defaults(table, where: str) -> dict:
    """A model's own decoder defaults (ssd_model.json's decoder_defaults: {"ssd": {"verify_rounds": 3}}) checked:
    -> {decoder: {parameter: value}}; one SSDError line naming `where` for an unknown decoder or parameter, a
    parameter the decoder does not take, or a value outside its limits."""
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise SSDError(f"{where}: decoder_defaults must be an object of decoder names, e.g. "
                       f'{{"ssd": {{"verify_rounds": 3}}}}, got {shown(table)}')
    out = {}
    for decoder, values in table.items():
        if decoder not in ENGINE_DECODERS:
            raise SSDError(f"{where}: decoder_defaults names {shown(decoder)}, not a decoder; the decoders are "
                           f"{', '.join(ENGINE_DECODERS)}")
        if not isinstance(values, Mapping):
            raise SSDError(f"{where}: decoder_defaults[{decoder!r}] must be an object of parameter values, got "
                           f"{shown(values)}")
        takes = spec(decoder).params
        for name in values:
            if name not in takes:
                raise SSDError(f"{where}: decoder_defaults[{decoder!r}] sets {shown(name)}, which {decoder} does not "
                               f"take; it takes {', '.join(takes) or 'no parameters'}")
        out[decoder] = {name: PARAMS[name].check(f"{where}: decoder_defaults[{decoder!r}][{name!r}]", value)
                        for name, value in values.items()}
    return out


def with_model_defaults(params: DecoderParams, model, decoder: str) -> DecoderParams:
    """params with the model's own defaults for `decoder` (its decoder_defaults) wherever params leave a value
    unset: what the caller gives, else the model's, else the decoder's (DECODER_SPECS)."""
    own = getattr(model, "decoder_defaults", {}).get(decoder, {})
    return DecoderParams.of(None, **{**own, **params.given()}) if own else params


def own_loop(name: str) -> bool:
    """The decoder runs a loop of its own on its own kind of checkpoint (flashar), not the engine's."""
    return bool(getattr(spec(name).policy, "own_loop", False))


def keeps_ar_tokens(name: str, params: Mapping) -> bool:
    """Whether the decoder, run with these parameters (a trace's settings), makes ar's very tokens for the seed
    (in fp32, up to the near-ties its trace names): ar, ssd-exact, scd with accept 0."""
    return name in ("ar", "ssd-exact") or (name == "scd" and params.get("accept") == Accept.MATCH)


def picks_rows(name: str, params: DecoderParams) -> bool:
    """Whether this decoder's rows are picked for the model and device (ssd-exact with draft_rows 0 or unset)."""
    return name == "ssd-exact" and not params.draft_rows
