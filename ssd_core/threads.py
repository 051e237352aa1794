"""How many intra-op CPU threads a generation uses: the one rule, applied by api.generate (so by the sampler
node, the CLI and bench alike), and the caller's (ComfyUI's) count restored afterwards.

A small model's step is a few tiny matmuls: torch's threads then cost more in hand-offs than they save, and
on a busy machine they wait for each other (docs/speed.md, "Threads": the bundled model's `ar` wall at 1 vs 2
threads, idle and with another busy process). A model below SMALL_MODEL_PARAMETERS on the CPU runs on one
thread; larger models, GPU runs and an explicit OMP_NUM_THREADS are left as they are.
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch

SMALL_MODEL_PARAMETERS = 50_000_000


def sampling_threads(model) -> int | None:
    """The intra-op thread count for sampling with `model`, or None to leave the caller's."""
    if model.device.type != "cpu" or os.environ.get("OMP_NUM_THREADS"):
        return None
    parameters = sum(p.numel() for p in model.model.parameters())
    return 1 if parameters < SMALL_MODEL_PARAMETERS else None


_lock = threading.Lock()
_users = {"count": 0, "before": None}  # generations inside for_sampling now, and the count before the first


@contextlib.contextmanager
def for_sampling(model):
    """Run the block with the rule's thread count; the previous count is back afterwards (errors included).

    The count is the process's: generations running in several threads at once share it, and the caller's
    count comes back when the last of them ends."""
    wanted = sampling_threads(model)
    if wanted is None:
        yield
        return
    with _lock:
        if _users["count"] == 0:
            _users["before"] = torch.get_num_threads()
        _users["count"] += 1
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
    try:
        yield
    finally:
        with _lock:
            _users["count"] -= 1
            if _users["count"] == 0 and torch.get_num_threads() != _users["before"]:
                torch.set_num_threads(_users["before"])
