"""`gsd` (peer): Grouped Speculative Decoding (So, Shin, Kook, Park, ICCV 2025, arXiv 2508.07747), as junhyukso/GSD
releases it for Lumina-mGPT. Lossy.

SJD (sjd.py) whose test accepts a window token x when the group of plausible tokens around it is likely enough,
rather than x itself: keep x while u < min(1, p(G) / q(G)), G = group(x) (scheduler/jacobi_iteration_lumina_mgpt.py,
SpeculativeSampler.__call__). The group, the file's default rule (`group`):
- the tokens next to x in the order of the verifier's processed logits (guided, top-k): the 14 ranks
  [rank(x) - 7, rank(x) + 7) of the ascending sort (`logit_sort[cur_idx-7:cur_idx+7]`): x, 7 less likely tokens and 6
  more likely ones (fewer at the ends of the vocabulary: the pack clips the ranks, where the file's slice would wrap);
- kept where the verifier's probabilities are close, |p(y) - p(x)| < 0.15 (`p_thr`);
- and the model's input embeddings are close, squared L2 distance < 0.5 (`d_thr`, on embed_tokens rows; the file
  skips this filter for ids past its table of 10,000, which holds Lumina-mGPT's image tokens; the pack applies it to
  every family's image codes, at Lumina-mGPT's threshold).
The first token rejected is drawn from norm(max(0, p - q)) and is final; the later ones are redrawn from their new
p, as SJD. Window 16 open slots (max_num_new_tokens in test_GSD.py, and the 16 prefix_matching_next_tokens sets);
a new slot starts as a uniform random code with q one-hot on it (multi_token_init_scheme 'random').
"""
import torch

from ..run import Policy, Run
from .drafting import WindowDrafter
from .sjd import jacobi_verify

BELOW, ABOVE = 7, 7  # the group: ranks [rank - 7, rank + 7) of the ascending logit order (logit_sort_idx)
P_THR = 0.15  # |p(y) - p(x)| < p_thr (is_in_p_thr)
D_THR = 0.5  # squared L2 distance of the input embeddings < d_thr (is_in_d_thr, head_img_sims)


def group(logp: torch.Tensor, tokens: torch.Tensor, embed) -> tuple[torch.Tensor, torch.Tensor]:
    """GSD's group of each token: logp [n, V] the verifier's processed log p, tokens [n], embed(codes [n, k]) ->
    [n, k, d] the model's input embeddings. -> (members [n, 14] codes, in_group [n, 14] bool); x is always in."""
    V = logp.shape[-1]
    order = logp.argsort(dim=-1, stable=True)  # ascending, as logits.sort(dim=-1).indices (ranks of equal logits: stable)
    rank = order.argsort(dim=-1).gather(1, tokens[:, None])  # [n, 1] the rank of x
    at = rank + torch.arange(-BELOW, ABOVE, device=logp.device)[None]  # [n, 14]
    members = order.gather(1, at.clamp(0, V - 1))
    p = logp.exp()
    near_p = (p.gather(1, members) - p.gather(1, tokens[:, None])).abs() < P_THR
    e = embed(torch.cat([tokens[:, None], members], dim=1)).float()  # [n, 15, d]
    near_e = ((e[:, 1:] - e[:, :1]) ** 2).sum(-1) < D_THR
    return members, (at >= 0) & (at < V) & near_p & near_e


def group_acceptance(logp: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, embed) -> torch.Tensor:
    """min(1, p(G) / q(G)) [n] for tokens [n] drawn from q [n, V], G = group(tokens) under the verifier's logp [n, V]."""
    members, inside = group(logp, tokens, embed)
    pg = (logp.exp().gather(1, members) * inside).sum(1)
    qg = (q.gather(1, members) * inside).sum(1)
    return (pg / qg.clamp(min=1e-30)).clamp(max=1.0)


class GSDPolicy(Policy):
    name = "gsd"

    def __init__(self, window: int):  # decoders.make_policy passes every parameter (DECODER_SPECS' defaults)
        self.window = window

    def begin(self, run: Run) -> None:
        self.drafter = WindowDrafter(self.window, above=False, random_q="onehot")

    def embed(self, run: Run, codes: torch.Tensor) -> torch.Tensor:
        return run.model.embed(run.index.id_of_code[codes].flatten()[None])[0].view(*codes.shape, -1)

    def update(self, run: Run, logits, features) -> None:
        jacobi_verify(run, logits,
                      lambda logp, p, q, tok: group_acceptance(logp, q, tok, lambda codes: self.embed(run, codes)),
                      lambda logp, p, a, b: run.draws.sample_probs(p),  # Jacobi: the rest from their new p
                      lambda logp, s: run.draws.sample(logp))  # an exact sample
        self.drafter.draft(run, run.index.L)
