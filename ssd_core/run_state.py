"""The parts of one generation's state that run.Run holds (docs/engine.md, "The state of a run"):

Counts   what the run counts (host numbers): steps, head calls, host copies, the verification records
Tokens   the token state per slot (device tensors): ids, codes, which are final and how each got its value

Policies and drafters change them only through their methods (Tokens.write, finalize, fill_holes)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import trace as T
from .slots import SlotIndex


@dataclass
class Counts:
    """What a run counts (host numbers): the trace's figures, and what the policies pace themselves by."""

    steps: int = 0  # steps that fed a window (Run.begin_step); a slot finalized now records this number
    head_calls: int = 0  # calls of a draft head's network (Run.call_heads)
    syncs: int = 0  # device-to-host copies made by Run.sync
    checks: list = field(default_factory=list)  # per verification: (round, ranks a, b, [n] rejected, [n] mass)

    def add_check(self, check: tuple) -> None:
        """One verification for the trace (acceptance.record_checks)."""
        self.checks.append(check)


class Tokens:
    """The token state per slot (device tensors [L], on the model's device). Policies and drafters write it only
    through write, finalize and fill_holes; the engine counts the forwards (Run.begin_step) and Run.note_near_ties
    marks the near-ties."""

    def __init__(self, index: SlotIndex, counts: Counts):
        self.index, self.counts = index, counts  # counts: the step number that finalize records
        L, dev = index.L, index.slot_ids.device
        self.ids = index.forced_ids.clone()  # [L] sequence ids; -1 = empty
        self.codes = torch.full((L,), -1, dtype=torch.long, device=dev)  # [L] image code per slot; -1 = none
        self.final = self.ids >= 0  # [L] bool: final slots (forced slots are final from the start)
        self.drafted = torch.full((L,), -1, dtype=torch.long, device=dev)  # [L] first draft code of a slot
        self.step_of = torch.zeros(L, dtype=torch.int32, device=dev)  # [L] the step that made a slot final
        self.verified = torch.zeros(L, dtype=torch.int32, device=dev)  # [L] forwards each slot has been fed in
        self.value_seen = torch.zeros(L, dtype=torch.int32, device=dev)  # [L] `verified` when a slot took its value
        self.near_tie = torch.zeros(L, dtype=torch.bool, device=dev)  # [L] final decisions that rounding could flip

    @property
    def status(self) -> torch.Tensor:
        """[L] int8 status codes (trace.STATUSES), from the first drafts and the final tokens."""
        made = torch.where(self.drafted < 0, T.AR, torch.where(self.drafted == self.codes, T.ACCEPTED, T.CORRECTED))
        return torch.where(self.index.forced_mask, T.FORCED, torch.where(self.final, made, T.PENDING)).to(torch.int8)

    @property
    def round_of(self) -> torch.Tensor:
        """[L] int32: the verification round (0 = the first check) in which a final slot took its value."""
        return torch.where(self.final, (self.value_seen - 1).clamp(min=0), 0).to(torch.int32)

    def write(self, slots: torch.Tensor, codes: torch.Tensor, draft=True) -> None:
        """Write codes [n] at slots [n]; draft (True, False or a [n] mask): record them as first drafts."""
        changed = self.codes[slots] != codes  # the round in which a slot took its current value
        self.value_seen[slots] = torch.where(changed, self.verified[slots], self.value_seen[slots])
        self.codes[slots] = codes
        self.ids[slots] = self.index.id_of_code[codes]
        if draft is not False:
            drafted = self.drafted[slots]
            first = drafted < 0 if draft is True else (drafted < 0) & draft
            self.drafted[slots] = torch.where(first, codes, drafted)

    def finalize(self, slots: torch.Tensor, mask=None) -> None:
        """Mark image slots final with their current token (only where `mask`, a [n] or 0-d bool tensor)."""
        if mask is None:
            self.final[slots] = True
            self.step_of[slots] = self.counts.steps
            return
        self.final[slots] |= mask
        self.step_of[slots] = torch.where(mask, self.counts.steps, self.step_of[slots])

    def fill_holes(self, lo: int, hi: int) -> None:
        """The open slots in [lo, hi) get a placeholder id (code 0's): fed where no other slot may see them (zipar)."""
        window = slice(lo, hi)
        self.ids[window] = self.ids[window].where(self.final[window], self.index.id_of_code[0])
