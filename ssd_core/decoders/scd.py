"""`scd` (peer): Speculative Coupled Decoding (So, Kook, Jang, Park, ICML 2026, arXiv 2510.24211; ex-MC-SJD), as
junhyukso/SCD releases it for Lumina-mGPT (lumina1/).

SJD (speculative Jacobi decoding, sjd.py) with the draws coupled: the verifier's draw at a slot is the Gumbel-max
pick argmax(log p + g) with noise g that belongs to the slot, and the slot's next draft is that pick, so a re-drawn
token stays the same wherever p moved too little to move the argmax. In the repo the noise is a table of uniforms,
one row per window position, shifted by the accepted count after each iteration so that a position keeps its row
(lumina1/scheduler/jacobi_iteration_lumina_mgpt_GS.py: `random_table`, `_sample_from_probs_with_global_rand`); the
pack's noise g(seed, slot) (sampling.gumbel) is that table, made per slot by a counter-based hash.

Acceptance, the `accept` parameter (both rules are in that file):
- 1 ratio, the authors' default (test_SCD_GS.py: prefix_token_sampler_scheme 'speculative_jacobi';
  SpeculativeSampler.__call__): a window token x, drawn from q, is kept while u < min(1, p(x) / q(x)) with a fresh
  uniform u; the first one rejected is drawn from norm(max(0, p - q)) (fresh) and is final; the later ones become the
  verifier's Gumbel picks. That is the AR distribution, but not ar's tokens: a kept x may differ from the pick
  argmax(log p + g) that ar makes at the slot.
- 0 match (scheme 'jacobi', find_first_misaligned_token_inds): a token is final while the draft equals the
  verifier's pick; the first mismatch takes the pick. With noise keyed by the slot this is Jacobi iteration on ar's
  own deterministic map: ar's very tokens for the seed, by ssd-exact's rule (exact.verify, its near-tie record too).
  It accepts less per check (P(pick = draft) <= sum min(p, q)), and every final token is ar's.

Window 32 open slots (max_num_new_tokens = 32 in test_SCD_GS.py and test_SCD_MC.py; the class default is 16); a new
slot starts as a uniform random code with q one-hot on it (multi_token_init_scheme 'random' there: the scores of
get_multi_token_for_preparation's random tokens are one-hot). The maximal-coupling variant (SCDMC file) keeps
checking past the first rejection and redraws by maximal coupling; with the pack's per-slot Gumbel noise the
Gumbel-coupled variant (GS) is the natural one, and the one ported.
"""
from enum import IntEnum

from .. import exactness
from ..run import Policy, Run
from ..sampling import acceptance
from .drafting import WindowDrafter
from .exact import verify
from .sjd import jacobi_verify


class Accept(IntEnum):
    MATCH = 0  # the verifier's Gumbel pick equals the draft: ar's very tokens
    RATIO = 1  # min(1, p/q) with a fresh uniform, the first rejected one from the residual (the authors' default)


class SCDPolicy(Policy):
    name = "scd"

    def __init__(self, window: int, accept: int):  # decoders.make_policy passes every parameter
        self.window, self.accept = window, Accept(accept)

    def begin(self, run: Run) -> None:
        self.drafter = WindowDrafter(self.window, above=False, random_q="onehot")
        if self.accept is Accept.MATCH and run.prompt is not None:  # ar's tokens: name the near-ties, as ssd-exact
            run.track_exactness(exactness.error_bound(run.model, run.prompt, run.tokens.ids))

    def update(self, run: Run, logits, features) -> None:
        if self.accept is Accept.MATCH:
            verify(run, logits, self.drafter)  # the verifier's picks become the drafts (Jacobi)
        else:
            self._ratio(run, logits)
        if not run.window.done:
            self.drafter.draft(run, run.index.L)

    def _ratio(self, run: Run, logits) -> None:
        jacobi_verify(run, logits, lambda logp, p, q, tok: acceptance(p, q, tok),
                      # the rest: the verifier's picks with each slot's own noise (draws of p)
                      lambda logp, p, a, b: run.draws.gumbel_sample(logp, a, b),
                      # the token after a window kept whole: the verifier's pick
                      lambda logp, s: run.draws.gumbel_sample(logp, run.index.images_before[s],
                                                        run.index.images_before[s] + 1))
