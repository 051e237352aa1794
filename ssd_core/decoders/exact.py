"""`ssd-exact`: Gumbel-coupled drafts and prefix acceptance; the verifier's outputs become the next drafts.

Every token is x_t = argmax(log p_t + g(seed, t)), so the result is the image `ar` makes for the
seed wherever the window's rounding cannot flip a decision (fp32: 1,407 of 1,410 sweep pairs equal; the trace
names the first near-tie, exactness.py; in bf16 / fp16 the rounding is larger and the images part sooner). A window
token is final while every token before it was final or matched the verifier's output; the rest take the
verifier's outputs (Jacobi iteration); heads, when given, extend the window (a new row below the first in
JACOBI_SWEEPS sweeps over the whole row, drafting._jacobi_row) and, after a correction, re-draft from the
corrected token (`reanchor_row`): FIRST_ROW_REDRAFT cells in the first row (where only Hh drafts), the
next cell in the rows below (where the verifier's outputs, which see the row above, beat Hh past one step).
Without heads the new rows start as copies of the row above, and the first row from the verifier's latest
output. The choices and their measured steps and ops per step: docs/speed.md, "GPUs and Macs"."""

from .. import calibrate, exactness
from ..errors import SSDError
from ..run import Policy, Run
from ..run_state import Tokens, finalize_tokens, write_tokens
from ..static_cache import region
from .drafting import Drafter, coupled, drafter_for, rows_end


FIRST_ROW_REDRAFT = 4  # cells re-drafted by Hh after a correction in the first row (the rest keep the verifier's)
JACOBI_SWEEPS = 1  # a new row's drafts: sweeps over the whole row at once (drafting._jacobi_row; 0: cell by cell)


class ExactPolicy(Policy):
    name = "ssd-exact"
    needs_heads = False
    uses_heads = True  # heads draft when given; without, rows start as copies of the row above

    def __init__(self, draft_rows: int, choice: calibrate.Choice | None = None):
        """draft_rows: a number (decoders.make_policy); choice: rows and heads picked for the model and device
        (api.py, before the policy is made, for draft_rows 0), whose tuner moves the rows as the image goes."""
        if not draft_rows and choice is None:
            raise SSDError("ssd-exact's draft_rows 0 means rows picked for the model and device, which "
                           "ssd_core.generate does (calibrate.pick); give the engine a number of rows, or a choice")
        self.draft_rows = draft_rows  # as given (0: picked)
        self.rows, self.use_heads, self.tuner = draft_rows, True, None
        if choice is not None:  # only steps and time change, never the image
            self.rows, self.use_heads, self.tuner = choice.rows, choice.heads, choice.tuner
        self.params = {"draft_rows": draft_rows, **(choice.params() if choice is not None else {})}

    def begin(self, run: Run) -> None:
        self.stretch = (0, 0)  # (final cells, steps) when the tuner last looked
        # the heads' drafts (Gumbel-coupled, a new row in JACOBI_SWEEPS sweeps, FIRST_ROW_REDRAFT cells re-drafted
        # after a correction in the first row), or without heads copies of the row above
        self.drafter = drafter_for(run, self.use_heads, pick=coupled, sweeps=JACOBI_SWEEPS, redraft=FIRST_ROW_REDRAFT)
        if run.prompt is not None:  # the trace then names the decisions the window's rounding could flip
            run.track_exactness(exactness.error_bound(run.model, run.prompt, run.tokens.ids))

    def update(self, run: Run, logits, features) -> None:
        latest = verify(run, logits, self.drafter)
        if run.window.done:
            return
        cells, steps = run.window.final_cells - self.stretch[0], run.counts.steps - self.stretch[1]
        if self.tuner is not None and cells >= run.layout.grid[1]:  # a row's worth made: its acceptance counts
            self.rows = self.tuner.rows_after(self.rows, cells, steps)
            self.stretch = (run.window.final_cells, run.counts.steps)
            self.params["draft_rows_picked"] = self.rows  # the trace says the rows it ended with
        self.drafter.draft(run, rows_end(run, run.window.final_end, self.rows), latest)


def verify(run: Run, logits, drafter: Drafter, stop: int | None = None):
    """Prefix acceptance of the window against the verifier's Gumbel-coupled outputs (which become the drafts
    of the slots not yet final); returns the verifier's log p [V] at the window's last open slot (or None).
    After a correction the drafter may re-draft the window's cells after it (`Drafter.corrected`).
    stop: no slot from `stop` on is decided (the window does not grow past it)."""
    win = run.window
    C, end = win.cached, win.end
    a, b = win.open_span(C, end + 1 if stop is None else min(end + 1, stop))  # the window and the slot past it
    if b == a:
        return None
    slots = run.index.image_ids[a:b]
    last = run.index.image_slots[b - 1]
    raw = region(run.model, _columns)(logits, slots, C)  # [B, n, V]
    logp = run.logp(raw, slots)
    latest = logp[-1]
    verdict = run.draws.gumbel_sample(logp, a, b)  # verifier outputs
    lead = region(run.model, _accept)(run.tokens, slots, verdict, last >= end, run.counts.steps)
    n_final = min(run.sync(lead)[0] + 1, b - a)
    run.note_near_ties(raw, logp, a, n_final)  # scores only the n_final final decisions
    last_final = run.index.image_slots[a + n_final - 1]
    if n_final < b - a:  # a correction: the drafter may re-draft after it from the corrected token
        drafter.corrected(run, last_final)
    win.advance(last_final + 1)
    if last >= end and end < run.index.L:
        win.set_end(end + 1)
    return latest


def _accept(tokens: Tokens, slots, verdict, past_end: bool, step: int):
    """Prefix acceptance of the drafts at slots [n] against the verifier's outputs verdict [n] (past_end: the last
    slot was not fed, nothing to match): the leading matches plus the first mismatch (its context was all final)
    become final, the verifier's outputs the drafts of the rest (Jacobi). -> 0-d: the leading matches."""
    match = tokens.codes[slots] == verdict
    if past_end:
        match[-1] = False
    lead = match.long().cumprod(0).sum()
    final = tokens.index.slot_ids[:slots.shape[0]] <= lead
    write_tokens(tokens, slots, verdict, ~final)
    finalize_tokens(tokens, slots, final, step)
    return lead


def _columns(logits, slots, first: int):
    """The step's logits [B, k + 1, V] (predicting slots first, first + 1, ...) at slots [n] -> [B, n, V]."""
    return logits[:, slots - first]
