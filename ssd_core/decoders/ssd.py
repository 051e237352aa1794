"""`ssd` (the paper): drafts from the heads, per-position acceptance min(1, p/q), residual correction.

A block of `draft_rows` rows is verified `verify_rounds` + 1 times; every rejected token is resampled from
norm(max(0, p - q)) and stays in the window; then the block is final. The commit of a block is fused
with the first verification of the next one (both ride in one forward).
Schedule (the paper's): the first block is verified until a round changes nothing (`stable_first_row`,
capped at one round per cell of a row); `adaptive_percent` > 0 ends the other blocks' verification once a
round corrects at most that share of their cells (verify_rounds + 1 rounds stay the cap).
"""
import torch

from ..acceptance import record_checks
from ..run import Policy, Run
from ..sampling import acceptance, residual
from .drafting import draft, rows_end


class SSDPolicy(Policy):
    name = "ssd"
    needs_heads = True
    uses_heads = True

    def __init__(self, draft_rows: int = 1, verify_rounds: int = 2, stable_first_row: int = 1,
                 adaptive_percent: int = 0):
        self.draft_rows, self.verify_rounds = draft_rows, verify_rounds
        self.stable_first_row, self.adaptive_percent = stable_first_row, adaptive_percent
        self.params = {"draft_rows": draft_rows, "verify_rounds": verify_rounds,
                       "stable_first_row": stable_first_row, "adaptive_percent": adaptive_percent}

    def block_done(self, run: Run, slots: torch.Tensor, corrected: int) -> bool:
        """Whether the block of open `slots` is final after this round (`corrected` of them resampled)."""
        rounds = int(run.verified[slots].min())  # verification rounds done (the block's slots alike)
        if self.stable_first_row and int(slots[0]) < run.layout.row_stride:
            return corrected == 0 or rounds > run.layout.grid[1]
        if self.adaptive_percent and corrected * 100 <= self.adaptive_percent * slots.numel():
            return True
        return rounds > self.verify_rounds

    def update(self, run: Run, logits, features) -> None:
        start = run.start
        slots = run.open_in(start, run.end)
        if slots.numel():
            p = run.logp(logits[:, slots - start], slots).exp()  # [n, V] verifier, on the model's device
            q = run.q_at(slots)  # [n, V] what each token was drawn from
            tok = run.codes[slots].to(p.device)
            rejected = (run.uniform(slots.numel()).to(p.device) >= acceptance(p, q, tok)).cpu()
            record_checks(run, slots, p, q, ~rejected)
            if rejected.any():
                fixes = run.sample(residual(p[rejected], q[rejected]).clamp(min=1e-30).log())
                run.set_tokens(slots[rejected], fixes, draft=False)
            run.put_q(slots, p)  # each token is now a sample of this round's p
            if self.block_done(run, slots, int(rejected.sum())):
                run.finalize(slots)
        if not run.open_in(start, run.end).numel() and run.end < run.L:
            draft(run, rows_end(run, run.end, self.draft_rows), self._pick(run))

    @staticmethod
    def _pick(run: Run):
        def pick(logp, slots):
            codes = run.sample(logp)
            run.put_q(slots, logp.exp())
            return codes
        return pick
