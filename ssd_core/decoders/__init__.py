"""Decoders are policies of the one loop in engine.py."""
from ..errors import SSDError
from .ar import ARPolicy
from .exact import ExactPolicy
from .sjd import SJDPolicy
from .ssd import SSDPolicy
from .zipar import ZipARPolicy

DECODERS = ("ar", "ssd", "ssd-exact", "sjd", "zipar")
MAX_DRAFT_ROWS = 8
MAX_VERIFY_ROUNDS = 8


def make_policy(name: str, draft_rows: int = 1, verify_rounds: int = 2, window: int | None = None):
    if name not in DECODERS:
        raise SSDError(f"unknown decoder {name!r}; choose one of {', '.join(DECODERS)}")
    if int(draft_rows) != draft_rows or not 1 <= draft_rows <= MAX_DRAFT_ROWS:
        raise SSDError(f"draft_rows must be a whole number from 1 to {MAX_DRAFT_ROWS}, got {draft_rows}")
    if int(verify_rounds) != verify_rounds or not 0 <= verify_rounds <= MAX_VERIFY_ROUNDS:
        raise SSDError(f"verify_rounds must be a whole number from 0 to {MAX_VERIFY_ROUNDS}, got {verify_rounds}")
    if window is not None and (int(window) != window or window < 1):
        raise SSDError(f"window must be a whole number >= 1, got {window}")
    if name == "ar":
        return ARPolicy()
    if name == "ssd":
        return SSDPolicy(int(draft_rows), int(verify_rounds))
    if name == "ssd-exact":
        return ExactPolicy(int(draft_rows))
    if name == "sjd":
        return SJDPolicy(window or 16)
    return ZipARPolicy(window)
