"""`ssd-exact`: Gumbel-coupled drafts and prefix acceptance; the verifier's outputs become the next drafts.

Every token is x_t = argmax(log p_t + g(seed, t)), so the result is the very image `ar` makes for the
seed. A window token is final while every token before it was final or matched the verifier's output;
the rest take the verifier's outputs (Jacobi iteration); heads, when given, only extend the window. Without
heads the new rows start as copies of the row above, and the first row from the verifier's latest output.
"""

from ..run import Policy, Run
from .drafting import draft, draft_without_heads, rows_end


class ExactPolicy(Policy):
    name = "ssd-exact"
    needs_heads = False
    uses_heads = True  # heads draft when given; without, rows start as copies of the row above

    def __init__(self, draft_rows: int = 1):
        self.draft_rows = draft_rows
        self.params = {"draft_rows": draft_rows}

    def update(self, run: Run, logits, features) -> None:
        start, end = run.start, run.end
        slots = run.open_in(start, end + 1)  # open slots of the window and the one just past it
        latest = None  # [V] the verifier's log p at the window's last open slot
        if slots.numel():
            logp = run.logp(logits[:, slots - start], slots)
            latest = logp[-1]
            verdict = run.gumbel_sample(logp, slots)  # verifier outputs
            inside = slots < end
            fed = run.codes[slots]
            # final: the leading matches plus the first mismatch (its context was all final)
            match = (fed == verdict) & inside
            lead = int(match.long().cumprod(0).sum())
            n_final = min(lead + 1, slots.numel())
            run.set_tokens(slots[:n_final], verdict[:n_final], draft=False)  # head drafts keep their record
            run.set_tokens(slots[n_final:], verdict[n_final:])  # Jacobi: the verifier's outputs are the new drafts
            run.finalize(slots[:n_final])
            if slots[-1] >= end and end < run.L:
                run.set_end(end + 1)
        first = run.first_open()
        if first >= run.L:
            return
        target = rows_end(run, first, self.draft_rows)
        if run.heads is not None:
            draft(run, target, run.gumbel_sample)
        else:
            draft_without_heads(run, target, latest)
