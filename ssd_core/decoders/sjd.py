"""`sjd` (peer): speculative Jacobi decoding, as tyshiwo1/Accelerating-T2I-AR-with-SJD releases it.

A window of `window` tokens; new ones start as the token above (or uniform random in the first row).
Tokens are accepted in prefix order with min(1, p/q), q the distribution each was drawn from; the first
rejected one is resampled from norm(max(0, p - q)) and is final; the rest are redrawn from the new p.
"""
import torch

from ..run import Policy, Run
from ..sampling import acceptance, residual
from .drafting import WindowDrafter


class SJDPolicy(Policy):
    name = "sjd"

    def __init__(self, window: int):  # decoders.make_policy passes every parameter (DECODER_SPECS' defaults)
        self.window = window

    def begin(self, run: Run) -> None:
        self.drafter = WindowDrafter(self.window)  # the window's guesses: the token above, else uniform random

    def update(self, run: Run, logits, features) -> None:
        jacobi_verify(run, logits, lambda logp, p, q, tok: acceptance(p, q, tok),
                      lambda logp, p, a, b: run.draws.sample_probs(p),  # Jacobi: the rest from their new p
                      lambda logp, s: run.draws.sample(logp))  # an exact sample (a fixed last token: next step)
        self.drafter.draft(run, run.index.L)


def jacobi_verify(run: Run, logits, accept, redraw, pick_next) -> None:
    """SJD's check of the open window, shared by sjd, scd and gsd: drafts are kept in prefix order while a uniform
    falls below accept(logp, p, q, tokens) [n]; the first one rejected is drawn from norm(max(0, p - q)) and is final;
    the rest become the next drafts, redraw(logp, p, a, b) [n]; after a window kept whole, the token after it is
    pick_next(logp [1, V], slot) (from a window with a rejected draft it waits for the next forward)."""
    win = run.window
    C, end = win.cached, win.end
    a, b = win.open_span(C, end)
    whole = b == a  # every open slot kept as fed: the window's last output is then the next token's p
    if b > a:
        slots = run.index.image_ids[a:b]
        logp = run.logp(logits[:, slots - C], slots)
        p = logp.exp()  # [n, V] on the model's device
        q = run.draws.q_at(a, b)
        tok = run.tokens.codes[slots]
        ok = run.draws.uniform(b - a) < accept(logp, p, q, tok)
        lead = ok.long().cumprod(0).sum()  # accepted in prefix order
        order = run.index.slot_ids[:b - a]
        fix = run.draws.sample_probs(residual(p, q))  # the first rejected one: from the residual
        rest = redraw(logp, p, a, b)
        codes = torch.where(order < lead, tok, torch.where(order == lead, fix, rest))
        run.tokens.write(slots, codes, draft=order > lead)
        run.tokens.finalize(slots, order <= lead)
        run.draws.put_q(a, p)  # the redrawn ones are draws of p (the final ones are not read again)
        kept = run.sync(lead)[0]
        whole = kept == b - a
        win.advance(run.index.image_slots[a + min(kept + 1, b - a) - 1] + 1)
    if whole and win.final_end >= win.end and win.end < run.index.L and win.end - C < logits.shape[1]:
        s = win.end  # the token after a window kept whole
        one = run.index.slots(s, s + 1)
        run.tokens.write(one, pick_next(run.logp(logits[:, s - C:s - C + 1], one), s), draft=False)
        run.tokens.finalize(one)
        win.advance(s + 1)
        win.set_end(s + 1)
