"""The one whole-number check: an API value, a decoder parameter, a command-line flag, a training count."""
from __future__ import annotations

import math
import numbers

from .errors import SSDError


def whole_number(name: str, value, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """An int (or a float / numpy number without a fraction) within [low, high] (None: no limit) as an int;
    anything else one SSDError line naming `name`, the limits and what was given (`why`: a reason for the
    limits, shown after them). 1.5, '3', True, NaN and infinity are refused, never rounded or read."""
    limits = "" if low is None and high is None else \
        f" from {low} to {high}" if low is not None and high is not None else \
        f" >= {low}" if low is not None else f" <= {high}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SSDError(f"{name} must be a whole number{limits}{why}, got {str(value)[:40]!r} ({type(value).__name__})")
    whole = isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())
    if not whole or (low is not None and value < low) or (high is not None and value > high):
        raise SSDError(f"{name} must be a whole number{limits}{why}, got {str(value)[:40]}")
    return int(value)
