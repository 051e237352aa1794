"""`ar`: one token a step, Gumbel-max keyed by (seed, slot) so that `ssd-exact` can reproduce it."""
from ..run import Policy, Run


class ARPolicy(Policy):
    name = "ar"

    def update(self, run: Run, logits, features) -> None:
        slot = run.window.final_end
        if slot >= run.index.L:
            return
        one = run.index.slots(slot, slot + 1)
        i = slot - run.window.cached  # the logits predicting `slot` (its context is all final)
        r = run.index.images_before[slot]
        run.tokens.write(one, run.draws.gumbel_sample(run.logp(logits[:, i:i + 1], one), r, r + 1), draft=False)
        run.tokens.finalize(one)
        run.window.advance(slot + 1)
        run.window.set_end(slot + 1)
