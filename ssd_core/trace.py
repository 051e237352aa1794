"""What a run reports and how it is shown: how each cell became final, per-run figures, the status palette
and status image, JSON-safe numbers (the CLI, bench and the nodes all use these)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

STATUSES = ("pending", "ar", "accepted", "corrected", "forced")  # the order is the status code
PENDING, AR, ACCEPTED, CORRECTED, FORCED = range(5)
# status -> RGB: the one palette of the pack (web/ssd_grid_core.js matches it, a test checks)
STATUS_COLORS = {"pending": (43, 43, 43), "ar": (138, 143, 152), "accepted": (63, 185, 80),
                 "corrected": (240, 136, 62), "forced": (88, 166, 255)}
BACKGROUND = (20, 20, 20)  # a cell without a value (an unknown status, a step of -1)


def finite_or_none(x) -> float | None:
    """JSON has no Infinity / NaN (a browser refuses the whole message): an infinite NLL (a token outside
    top-k / top-p) or a NaN is written as null."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def json_safe(value):
    """`value` with every float that is not finite (inf, NaN) as None, through dicts, lists and tuples: strict
    JSON (json.dumps(..., allow_nan=False) takes it; a browser's JSON.parse refuses Infinity and NaN)."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # float, numpy's floats
        return finite_or_none(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, tuple):
        return tuple(json_safe(v) for v in value)
    return value


GRIDS = ("tokens", "status", "step", "round")  # to_dict's per-cell grids: ints and names only, never walked


@dataclass
class Progress:
    """Handed to on_step after every base-model step."""

    step: int
    grid: tuple[int, int]
    tokens: torch.Tensor  # [H, W] long, -1 where not final yet
    status_codes: torch.Tensor  # [H, W] int8 codes into STATUSES
    final_cells: int
    image: int = 0  # the image's index in its batch

    @property
    def status(self) -> list[list[str]]:
        return [[STATUSES[v] for v in row] for row in self.status_codes.tolist()]


def progress(run, image: int = 0) -> Progress:
    """The Progress of an engine Run (run.py) after a step; `image`: its index in the batch (copies the
    grid to the host: a second device-to-host copy in every step that reports progress)."""
    H, W = run.layout.grid
    state = run.tokens
    cells = run.layout.slot_of_cell.to(state.codes.device)
    tokens = torch.where(state.final[cells], state.codes[cells], -1).view(H, W).cpu()
    status = state.status[cells].view(H, W).cpu()
    return Progress(run.counts.steps, (H, W), tokens, status, run.window.final_cells, image)


def from_run(run, decoder: str, params: dict, timings: dict, finalize_forwards: int, peak_memory_mb: float) -> "Trace":
    """The Trace of a finished engine Run (run.py): per-cell tokens, statuses, steps, rounds, and its settings."""
    H, W = run.layout.grid
    cells = run.layout.slot_of_cell
    s = run.settings
    from .acceptance import check_rows, summarize_checks

    state = run.tokens
    codes, status, step_of, round_of = (t.cpu() for t in (state.codes, state.status, state.step_of, state.round_of))
    return Trace(decoder, (H, W), codes[cells].view(H, W), status[cells].view(H, W),
                 step_of[cells].view(H, W), round_of[cells].view(H, W), run.counts.steps,
                 settings={"seed": s.seed, "cfg": s.cfg, "temperature": s.temperature, "top_k": s.top_k,
                           "top_p": s.top_p, "min_p": s.min_p, **params},
                 timings=timings, head_calls=run.counts.head_calls, finalize_forwards=finalize_forwards,
                 peak_memory_mb=peak_memory_mb, acceptance=summarize_checks(check_rows(run)), exact=exact_summary(run))


def exact_summary(run) -> dict | None:
    """ssd-exact's promise for this run (exactness.py): the rounding bound, how many final decisions were near-ties
    it could flip, and the first such cell [row, column] (None: the picture is ar's); None for other decoders."""
    if run.exact_error is None:
        return None
    cells = run.tokens.near_tie[run.layout.slot_of_cell].cpu()
    W = run.layout.grid[1]
    first = int(cells.nonzero()[0]) if bool(cells.any()) else None
    return {"error_bound": float(f"{float(run.exact_error):.3g}"), "near_ties": int(cells.sum()),
            "first_near_tie": None if first is None else [first // W, first % W]}


@dataclass
class Trace:
    decoder: str
    grid: tuple[int, int]
    tokens: torch.Tensor  # [H, W]
    status: torch.Tensor  # [H, W] int8
    step: torch.Tensor  # [H, W] int32: the step that finalized the cell (0 = from the prefill)
    round: torch.Tensor  # [H, W] int32
    steps: int
    settings: dict
    timings: dict = field(default_factory=dict)
    head_calls: int = 0
    finalize_forwards: int = 0
    peak_memory_mb: float = 0.0
    nll: float | None = None
    nll_full: float | None = None
    out_of_support: float | None = None
    acceptance: dict = field(default_factory=dict)  # ssd: accepted share and expected acceptance by round
    exact: dict | None = None  # ssd-exact: exact_summary (may the picture differ from ar's, and from which cell)

    def acceptance_round0(self) -> tuple[float | None, float | None]:
        """(measured accepted share, expected acceptance) of the round-0 checks; None without drafts."""
        r0 = self.acceptance.get("by_round", {}).get("0")
        return (r0["accepted"], r0["expected"]) if r0 else (None, None)

    @property
    def counts(self) -> dict[str, int]:
        return {name: int((self.status == i).sum()) for i, name in enumerate(STATUSES) if name != "pending"}

    def acceptance_by_row(self) -> list[float | None]:
        out = []
        for row in self.status:
            drafted = int(((row == ACCEPTED) | (row == CORRECTED)).sum())
            out.append(round(int((row == ACCEPTED).sum()) / drafted, 4) if drafted else None)
        return out

    def acceptance_by_round(self) -> dict[int, int]:
        rounds = self.round[(self.status == ACCEPTED) | (self.status == CORRECTED)]
        return {int(r): int((rounds == r).sum()) for r in rounds.unique()}

    def to_dict(self) -> dict:
        """The trace as strict JSON values (json_safe: an infinite nll_full is null)."""
        H, W = self.grid
        cells = H * W
        out = {
            "decoder": self.decoder, "grid": [H, W], "tokens": self.tokens.tolist(),
            "status": [[STATUSES[v] for v in row] for row in self.status.tolist()],
            "step": self.step.tolist(), "round": self.round.tolist(),
            "steps": self.steps, "tokens_per_step": round(cells / max(self.steps, 1), 3),
            "counts": self.counts, "head_calls": self.head_calls, "finalize_forwards": self.finalize_forwards,
            "acceptance_by_row": self.acceptance_by_row(),
            "acceptance_by_round": {str(k): v for k, v in self.acceptance_by_round().items()},
            "acceptance_by_verify_round": self.acceptance.get("by_round", {}),
            "acceptance_round0_by_column": self.acceptance.get("round0_by_column", []),
            "prefill_s": round(self.timings.get("prefill", 0.0), 4), "wall_s": round(self.timings.get("wall", 0.0), 4),
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "peak_memory_mb": round(self.peak_memory_mb, 1), "nll": self.nll,
            "nll_full": self.nll_full, "out_of_support": self.out_of_support,
            "seed": self.settings.get("seed"), "settings": self.settings, "exact": self.exact,
        }
        return {k: v if k in GRIDS else json_safe(v) for k, v in out.items()}


def _gradient(value, top) -> tuple[int, int, int]:
    """Dark blue (early) -> yellow (late)."""
    t = 0.0 if top <= 0 else max(0.0, min(1.0, value / top))
    a, b = (30, 40, 110), (250, 220, 60)
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def status_image(trace: dict, cell: int = 8, color_by: str = "status", gridlines: bool = True) -> torch.Tensor:
    """The grid of a trace dict as float RGB [H*cell, W*cell, 3] in [0, 1]: one colour per cell status, or a
    gradient by the step / verification round that made the cell final."""
    if color_by == "status":
        colors = [[STATUS_COLORS.get(s, BACKGROUND) for s in row] for row in trace["status"]]
    elif color_by in ("step", "round"):
        if color_by not in trace:
            raise ValueError(f"this trace has no per-cell '{color_by}': pick color_by = status.")
        vals = trace[color_by]
        top = max((v for row in vals for v in row), default=0)
        colors = [[_gradient(v, top) if v >= 0 else BACKGROUND for v in row] for row in vals]
    else:
        raise ValueError(f"unknown color_by '{color_by}': pick status, step or round.")
    grid = torch.tensor(colors, dtype=torch.float32) / 255.0  # [H, W, 3]
    img = grid.repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    if gridlines and cell >= 4:  # thin dark lines between cells
        img[::cell, :, :] *= 0.6
        img[:, ::cell, :] *= 0.6
    return img.contiguous()
