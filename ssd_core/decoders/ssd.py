"""`ssd` (the paper): drafts from the heads, per-position acceptance min(1, p/q), residual correction.

A block of `draft_rows` rows is verified `verify_rounds` + 1 times; every rejected token is resampled from
norm(max(0, p - q)) and stays in the window; then the block is final. The commit of a block is fused
with the first verification of the next one (both ride in one forward).
Schedule (`stable_first_row`, FirstRow): EXACT (2, the default) decodes the first row by ssd-exact's rule
(Gumbel-coupled prefix acceptance: the row `ar` draws for the seed, its Hh chain re-drafted from every corrected
token, `reanchor_row`), then the blocks below as above; UNTIL_STABLE (1, the paper's) verifies the first block
until a round changes nothing (capped at one round per cell of a row); OFF (0) verifies it as the others.
`adaptive_percent` > 0 ends the other blocks' verification once a round corrects at most that share of their
cells (verify_rounds + 1 rounds stay the cap). `repair` (Repair) REDRAW (1, the default, beyond the paper): a
committed token that its final context rules out (outside top-k / min-p) is redrawn when the next forward feeds
it (`repair_committed`); OFF (0) keeps it.
"""
from enum import IntEnum

import torch

from ..acceptance import record_checks
from ..run import Policy, Run
from ..sampling import rejected, residual_and_mass
from ..static_cache import region
from .drafting import HeadsDrafter, coupled, rows_end, sampled
from .exact import verify as verify_exactly


class FirstRow(IntEnum):
    """stable_first_row: how ssd decodes the first row (users give the number)."""
    OFF = 0  # verified as the other blocks
    UNTIL_STABLE = 1  # the paper's: the first block verified until a round changes nothing
    EXACT = 2  # by ssd-exact's rule: the row ar draws for the seed


class Repair(IntEnum):
    """repair: what ssd does with a committed token that its final context rules out (users give the number)."""
    OFF = 0  # kept (the paper's rule)
    REDRAW = 1  # redrawn from that context when the next forward feeds it


class SSDPolicy(Policy):
    name = "ssd"
    needs_heads = True
    uses_heads = True

    def __init__(self, draft_rows: int, verify_rounds: int, stable_first_row: int, adaptive_percent: int, repair: int):
        """Every parameter from decoders.make_policy (DECODER_SPECS' and PARAMS' defaults)."""
        self.draft_rows, self.verify_rounds = draft_rows, verify_rounds
        self.stable_first_row, self.repair = FirstRow(stable_first_row), Repair(repair)
        self.adaptive_percent = adaptive_percent

    def block_done(self, run: Run, first_slot: int, n: int, resampled: torch.Tensor):
        """Whether the block of n open slots from `first_slot` is final after this round (`resampled` [n] bool:
        the slots resampled): a bool, or a 0-d bool tensor when it depends on this round's corrections."""
        rounds = self.rounds  # verification rounds done (the block's slots alike)
        if self.stable_first_row != FirstRow.OFF and first_slot < run.layout.row_stride:
            return (resampled.sum() == 0) | (rounds > run.layout.grid[1])
        if self.adaptive_percent:
            return (resampled.sum() * 100 <= self.adaptive_percent * n) | (rounds > self.verify_rounds)
        return rounds > self.verify_rounds

    def begin(self, run: Run) -> None:
        self.rounds = 0
        # the first row by the exact rule (FirstRow.EXACT): Gumbel-coupled Hh drafts, the rest of the row
        # re-drafted after each correction
        self.first_row = HeadsDrafter(coupled, redraft=None)
        self.blocks = HeadsDrafter(sampled)  # the lossy blocks: independent draws, q recorded

    def update(self, run: Run, logits, features) -> None:
        stride, syncs, win = run.layout.row_stride, run.counts.syncs, run.window
        if self.repair == Repair.REDRAW and win.cached < win.final_end:
            self.repair_committed(run, logits)
        if self.stable_first_row == FirstRow.EXACT and win.final_end < stride:  # the first row as ar draws it
            verify_exactly(run, logits, self.first_row, stop=stride)
            if win.final_end < stride:
                self.first_row.draft(run, stride)
                return  # else the first row is final: the first lossy block is drafted below
        a, b = win.open_span(win.cached, win.end)
        if b > a:
            self.rounds += 1
            slots = run.index.image_ids[a:b]
            logp = run.logp(_window(run, logits, a, b), slots)  # [n, V] verifier, on the model's device
            # p [n, V], the tokens [n], which are rejected [n], the residuals [n, V] and their masses [n, 1]
            p, tok, bad, fix, mass = region(run.model, _judge)(logp, run.draws.q_at(a, b), run.tokens.codes, slots,
                                                               run.draws.uniform(b - a))
            record_checks(run, self.rounds - 1, a, b, bad, mass)
            fixes = run.draws.sample_probs(fix)  # a residual draw for every slot
            run.tokens.write(slots, torch.where(bad, fixes, tok), draft=False)
            run.draws.put_q(a, p)  # each token is now a sample of this round's p
            done = self.block_done(run, run.index.image_slots[a], b - a, bad)
            if isinstance(done, torch.Tensor):
                run.tokens.finalize(slots, done)
                done = bool(run.sync(done)[0])
            elif done:
                run.tokens.finalize(slots)
            if done:
                win.advance(win.end)
        if win.final_end >= win.end and win.end < run.index.L:
            self.rounds = 0
            # no host copy made yet in this step: the drafter may make it (its rows' drafts found by sweeps)
            self.blocks.draft(run, rows_end(run, win.end, self.draft_rows), can_sync=run.counts.syncs == syncs)

    @staticmethod
    def repair_committed(run: Run, logits) -> None:
        """Committed (final) slots fed again in this forward, [cached, final_end): the tokens after the first
        correction of their block's last round, whose context changed after they were accepted. A token now
        outside the processed p of its final context (top-k / min-p) is redrawn from that p. The kept prefix
        then ends at it, so the next forward feeds it again and checks the tokens after it in their new
        context; the first token repaired is exact for its context and stays, so this ends. No extra steps:
        these slots ride in the forward that verifies the next block (the last block is not re-fed)."""
        win, before = run.window, run.index.images_before
        a, b = before[win.cached], before[min(win.final_end, win.end)]
        if b <= a:
            return
        slots = run.index.image_ids[a:b]
        p = run.logp(_window(run, logits, a, b), slots).exp()  # [n, V] each token's final-context p
        tok = run.tokens.codes[slots]
        outside = p.gather(1, tok[:, None]).squeeze(1) <= 0
        run.tokens.write(slots, torch.where(outside, run.draws.sample_probs(p), tok), draft=False)


def _window(run: Run, logits: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """[B, n, V] the logits of the image slots of ranks [a, b) out of the step's logits: a view when the slots are
    consecutive (a row: no gather op), else gathered."""
    lo = run.index.image_slots[a] - run.window.cached
    if run.index.image_slots[b - 1] - run.index.image_slots[a] == b - a - 1:
        return logits[:, lo:lo + b - a]
    return logits[:, run.index.image_ids[a:b] - run.window.cached]


def _judge(logp, q, codes, slots, u):
    """A lossy block's verification: the verifier's p = exp(logp) [n, V] against q [n, V], what each token codes[slots]
    was drawn from, with uniforms u [n] -> (p, the tokens, which are rejected, the residuals, their masses)."""
    p = logp.exp()
    tok = codes[slots]
    fix, mass = residual_and_mass(p, q)
    return p, tok, rejected(u, p, q, tok), fix, mass
