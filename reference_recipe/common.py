"""What every stage of the recipe shares: the grid, the base seed, the log line."""
from __future__ import annotations

import time

import numpy as np
import torch

GRID = 24
SEED = 0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _seed(s: int) -> None:
    torch.manual_seed(s)
    np.random.seed(s)
