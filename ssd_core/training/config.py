"""TrainConfig: every train-heads setting, checked before any grid is sampled or any memory taken."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SSDError
from ..heads import VERTICAL_INPUTS
from ..limits import whole_number
from ..model_files import check_path

MAX_GRIDS = 1_000_000  # grids sampled or held out (their tokens are held in memory; features are streamed)
MAX_COUNT = 10_000_000  # epochs, steps, chain depth, checkpoint interval
MAX_LR = 1.0  # the one-cycle schedule's peak learning rate at most (the heads train at 1e-3 to 4e-3; AdamW moves a
#               weight by about lr a step, so past 1 a step outgrows the weights, and 1e308 overflows to inf)
MAX_WIDTH = 65_536  # an MLP width (the shipped Hv: 1,024): 3 x width x hidden_size weights, and Adam's state
SHARD_GRIDS = 256  # self-distilled grids per shard file (the unit a rerun skips)


def _whole(name: str, value, low, high) -> int:
    """A TrainConfig count as an int, or one SSDError line naming its limits (limits.whole_number)."""
    why = {MAX_GRIDS: " (the grids' tokens are held in memory)",
           MAX_WIDTH: " (an MLP width: 3 x width x hidden size weights, with their optimiser state; the shipped "
                      "heads' Hv is 1024)"}.get(high, "")
    return whole_number(f"train-heads {name}", value, low, high, why)


@dataclass
class TrainConfig:
    samples: int = 256
    heldout: int = 16
    epochs: int = 4
    batch_grids: int = 8
    lr: float = 2e-3
    ce_weight: float = 0.1  # argmax cross-entropy of one-step drafts (0 = off)
    kl_weight: float = 1.0  # KL(p processed || q guided) of the drafts (0 = off)
    tv_weight: float = 0.0  # 1 - sum_v min(p, q guided) of the drafts: their expected rejection (0 = off)
    unroll: int = 0  # Hh chain depth trained on its own outputs (0 = W-1, 1 = teacher-forced pairs only)
    seed: int = 0
    gen_batch: int = 8
    intermediate: int | None = None
    vertical_intermediate: int | None = None  # Hv's MLP width (None: Hh's, or init's); wider than init's: widened
    max_steps: int | None = None  # stop after this many optimiser steps (None: every epoch)
    stale_share: float = 0.0  # Hv trained on features with this share of tokens changed (0 = true features)
    until: float | None = None  # stop at this time (time.time()); the one-cycle lr schedule runs on the time left
    #                             (with a features file: its features of the grids done in 60% of the time left)
    checkpoint_every: int = 0  # every this many steps: held-out expected acceptance logged, heads and the run's
    #                            state (optimiser, schedule, data position) saved (0 = off)
    vertical_left: int = 0  # 1: Hv also reads the token drafted on the left of the cell it drafts (and the cell
    #                         above-right of it); 2: also the token two to the left and the cell above-left
    vertical_shift: int = 0  # Hv reads the row above this many columns right (1: the cell above the drafted cell)
    init: str | None = None  # a heads file for this model to start from (warm start) instead of random weights
    train: str = "both"  # which heads learn: both, vertical (Hh kept as it starts) or horizontal
    shard_grids: int = SHARD_GRIDS  # self-distilled grids per shard file

    def __post_init__(self):  # every value checked before any grid is sampled (or any memory taken)
        for name, low, high in (("samples", 0, MAX_GRIDS), ("heldout", 0, MAX_GRIDS), ("epochs", 1, MAX_COUNT),
                                ("batch_grids", 1, MAX_GRIDS), ("gen_batch", 1, MAX_GRIDS),
                                ("checkpoint_every", 0, MAX_COUNT), ("unroll", 0, MAX_COUNT),
                                ("intermediate", 1, MAX_WIDTH), ("vertical_intermediate", 1, MAX_WIDTH),
                                ("max_steps", 0, MAX_COUNT), ("seed", None, None),
                                ("shard_grids", 1, MAX_GRIDS)):
            value = getattr(self, name)
            if value is None and name in ("intermediate", "vertical_intermediate", "max_steps"):  # optional
                continue
            setattr(self, name, _whole(name, value, low, high))
        if self.max_steps == 0 and self.init is None:
            raise SSDError("train-heads max_steps 0 trains nothing and would write random heads: give at least 1, or "
                           "an init heads file to score as it is")
        for name in ("lr", "ce_weight", "kl_weight", "tv_weight", "stale_share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SSDError(f"train-heads {name} must be a number, got {str(value)[:40]!r}")
        if self.samples + self.heldout < 2:
            raise SSDError("train-heads needs at least 2 grids (samples + heldout): one to train on, one held out")
        if not (math.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
            raise SSDError(f"train-heads lr must be a number > 0 and <= {MAX_LR:g} (the one-cycle schedule's peak; the "
                           f"heads train at 1e-3 to 4e-3, e.g. 2e-3), got {self.lr}")
        for name in ("ce_weight", "kl_weight", "tv_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise SSDError(f"train-heads {name} must be a number >= 0, got {getattr(self, name)}")
        if self.vertical_shift not in (0, 1) or isinstance(self.vertical_shift, bool):
            raise SSDError(f"train-heads vertical_shift must be 0 (the paper's Hv input) or 1 (the cell above the "
                           f"drafted cell), got {self.vertical_shift}")
        if self.vertical_left not in VERTICAL_INPUTS:  # the levels heads.py knows (True / False: 1 / 0)
            raise SSDError(f"train-heads vertical_left must be 0 (Hv reads the row above), 1 (also the token on the "
                           f"left, the cell above-right) or 2 (also the token two to the left, the cell above-left), "
                           f"got {self.vertical_left}")
        self.vertical_left = int(self.vertical_left)
        if self.train not in ("both", "vertical", "horizontal"):
            raise SSDError(f"train-heads train must be both, vertical or horizontal, got {self.train!r}")
        if self.train != "both" and self.init is None:
            raise SSDError(f"train-heads train={self.train} keeps the other head as it starts: give init, a heads file "
                           "to start from, or train both")
        check_path(self.init, "train-heads init")
        if self.init is not None and not Path(self.init).is_file():
            raise SSDError(f"train-heads init {self.init} is not a file: give a heads .safetensors file made for this "
                           "model to start from, or leave it out to start from random weights")
        if not (math.isfinite(self.stale_share) and 0 <= self.stale_share < 1):
            raise SSDError(f"train-heads stale_share must be a number in [0, 1), e.g. 0.2, got {self.stale_share}")

    def run_identity(self) -> dict:
        """The settings a resumed run must share with the run it continues (not: when to stop by the clock,
        how often to checkpoint)."""
        out = asdict(self)
        for name in ("until", "checkpoint_every"):
            out.pop(name)
        out["init"] = Path(self.init).name if self.init else None
        return out
