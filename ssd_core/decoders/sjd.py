"""`sjd` (peer): speculative Jacobi decoding, as tyshiwo1/Accelerating-T2I-AR-with-SJD releases it.

A window of `window` tokens; new ones start as the token above (or uniform random in the first row).
Tokens are accepted in prefix order with min(1, p/q), q the distribution each was drawn from; the first
rejected one is resampled from norm(max(0, p - q)) and is final; the rest are redrawn from the new p.
"""
import torch

from ..run import Policy, Run
from ..sampling import acceptance, residual


class SJDPolicy(Policy):
    name = "sjd"

    def __init__(self, window: int = 16):
        self.window = window
        self.params = {"window": window}

    def update(self, run: Run, logits, features) -> None:
        start, end = run.start, run.end
        slots = run.open_in(start, end)
        if slots.numel():
            p = run.logp(logits[:, slots - start], slots).exp()  # [n, V] on the model's device
            q = run.q_at(slots)
            tok = run.codes[slots].to(p.device)
            ok = (run.uniform(slots.numel()).to(p.device) < acceptance(p, q, tok)).cpu()
            lead = int(ok.long().cumprod(0).sum())
            run.finalize(slots[:lead])
            if lead < slots.numel():
                first = slots[lead:lead + 1]
                run.set_tokens(first, run.sample(residual(p[lead:lead + 1], q[lead:lead + 1]).clamp(min=1e-30).log()))
                run.finalize(first)
                rest, p_rest = slots[lead + 1:], p[lead + 1:]
                if rest.numel():  # Jacobi: redraw the rest from their new p
                    run.set_tokens(rest, run.sample(p_rest.clamp(min=1e-30).log()))
                    run.put_q(rest, p_rest)
        if not run.open_in(start, run.end).numel() and run.end < run.L and run.end - start < logits.shape[1]:
            one = torch.tensor([run.end])  # the token after an all-final window: an exact sample
            run.set_tokens(one, run.sample(run.logp(logits[:, run.end - start:run.end - start + 1], one)), draft=False)
            run.finalize(one)
            run.set_end(run.end + 1)
        self._extend(run)

    def _extend(self, run: Run) -> None:
        stride, V = run.layout.row_stride, run.V
        while run.end < run.L and run.open_in(run.start, run.end).numel() < self.window:
            s = run.end
            above = s - stride
            if above >= 0 and run.codes[above] >= 0:  # vertical repeat of the row above
                code = run.codes[above:above + 1].clone()
                q = torch.nn.functional.one_hot(code, V).float()
            else:
                code = torch.randint(V, (1,), generator=run.rng)
                q = torch.full((1, V), 1.0 / V)
            one = torch.tensor([s])
            run.set_tokens(one, code)
            run.put_q(one, q)
            run.set_end(run.end + 1)
