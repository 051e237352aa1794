"""A token grid as people write it: 'auto' (the model's), 'HxW' or 'N' (square). The one parser of the CLI's
--grid, used by the API, the demo and the nodes' grid list too."""
from __future__ import annotations

import re

from .errors import SSDError


def parse_grid(text) -> tuple[int, int] | None:
    """'auto' or '' -> None (the model's grid); 'HxW' or 'N' (square) -> (H, W) in tokens."""
    t = "" if text is None else str(text).strip().lower().replace(" ", "")
    if t in ("", "auto"):
        return None
    m = re.fullmatch(r"(\d+)(?:[x*,](\d+))?", t)
    if not m:
        raise SSDError(f"grid '{text}' is not understood: write auto, or rows x columns in tokens such as 16x16.")
    h = int(m.group(1))
    w = int(m.group(2)) if m.group(2) else h
    if h <= 0 or w <= 0:
        raise SSDError(f"grid '{text}' must be at least 1x1 tokens.")
    return (h, w)
