"""When may ssd-exact's picture differ from ar's? Near-ties that the window's rounding can flip.

ssd-exact decides a token from the logits of a forward over a window of many slots; `ar` from a forward over
one. The model's kernels round differently for the two widths (a one-row matmul is a GEMV, a window a GEMM with
another reduction order; attention over a window another kernel again): on the bundled model in fp32 on a
CPU the raw logits of the two paths differ by up to about 1e-5 (docs/decoders.md, "How exact is ssd-exact").
Both paths then take the same argmax of the same scores with the same noise, so a decision can differ only
where two candidates are closer than that difference: a near-tie.

`error_bound` measures the difference once per model, device, dtype and number of streams (a probe of PROBE_SLOTS
slots fed one at a time and in windows), times SAFETY. From a raw-logit error e the decision quantities move by
at most (sampling.py's formulas):
  guided logit u + s (c - u) = (1 - s) u + s c:   e_g = (|1 - s| + s) e     (s = cfg; one stream: e_g = e)
  x = guided / T:                                   e_x = e_g / T            (T = 0: greedy, e_x = e_g)
  the difference of two codes' x (a common shift, log_softmax's normaliser, cancels): 2 e_x
  min-p's test c_v - max c >= log(min_p):           2 e
so a final decision is a near-tie when the best perturbed score x + g beats the second by less than 2 e_x, or a
code whose top-k / top-p / min-p membership could flip (within 2 e_x, or 2 e for min-p, of the cut) could win or
is the winner. A run without near-ties makes ar's picture (by induction over the slots: until the first
near-tie both paths decide the same tokens from the same context); with one, the trace names the first.
"""
from __future__ import annotations

import math

import torch

from .sampling import GREEDY_BELOW, SamplerSettings, guide
from .session import Session

PROBE_SLOTS = 48  # slots fed by the probe, one at a time and in windows
PROBE_WIDTHS = (8, PROBE_SLOTS)  # window widths the probe compares with one at a time
SAFETY = 4.0  # the bound: this times the largest difference the probe measured


def probe(model, prompt, forced: torch.Tensor) -> torch.Tensor:
    """0-d tensor on the model's device: the largest |raw logit| difference between feeding the first PROBE_SLOTS
    slots one at a time (ar) and in windows of PROBE_WIDTHS (ssd-exact), over every stream and code. forced [L]:
    the layout's ids on the device (-1 at image slots, which get fixed pseudo-random codes). No host copy."""
    n = min(PROBE_SLOTS, forced.numel() - 1)
    if n < 2:
        return torch.zeros((), device=forced.device)
    spread = torch.arange(n, device=forced.device) * 7919 % model.image_vocab_size  # varied codes, no generator
    ids = torch.where(forced[:n] >= 0, forced[:n], model.code_to_id(spread))

    def logits(width: int) -> torch.Tensor:
        session = Session(model, prompt)  # eager, its own cache (a static cache is the running image's)
        out = [model.image_logits(session.forward(ids[i:i + width])) for i in range(0, n, width)]
        return torch.cat(out, dim=1).float()  # [B, n, V]

    with torch.no_grad():
        one = logits(1)
        return torch.stack([(logits(w) - one).abs().amax() for w in PROBE_WIDTHS if w > 1]).amax()


def error_bound(model, prompt, forced: torch.Tensor) -> torch.Tensor:
    """SAFETY x probe() (a 0-d device tensor), measured once per (device, dtype, streams), kept on the model."""
    cache = model.__dict__.setdefault("_exact_error", {})
    key = (str(model.device), str(model.dtype), int(prompt.ids.shape[0]))
    if key not in cache:
        cache[key] = SAFETY * probe(model, prompt, forced)
    return cache[key]


def near_ties(raw: torch.Tensor, guided: torch.Tensor, logp: torch.Tensor, noise: torch.Tensor | None,
              s: SamplerSettings, error: torch.Tensor) -> torch.Tensor:
    """[n] bool: the decisions argmax(logp + noise) that a raw-logit error of `error` could flip.

    raw [B, n, V]: the per-stream logits (B = 2: conditional, unconditional); guided [n, V]: sampling.guide's
    output; logp [n, V]: log p after temperature and truncation (-inf outside the kept set); noise [n, V] Gumbel
    noise (None: greedy). About 35 ops a verification with the bundled model's sampler (tests/test_step_overhead.py)."""
    e_g = (abs(1 - s.cfg) + s.cfg) * error if raw.shape[0] > 1 else error
    greedy = s.temperature < GREEDY_BELOW or noise is None
    e_x = e_g if greedy else e_g / s.temperature
    # the scores the argmax compares (-inf: not kept); greedy decides on the guided logits themselves (after min-p)
    score = guided if greedy else logp + noise
    top2, winner = score.topk(2, dim=-1) if score.shape[-1] > 1 else (score.expand(-1, 2), score.new_zeros(
        score.shape[0], 1, dtype=torch.long))
    tie = top2[:, 0] - top2[:, 1] < 2 * e_x  # the best two perturbed scores closer than the error can move them
    truncating = s.min_p > 0 or (not greedy and ((s.top_k and s.top_k < logp.shape[-1]) or s.top_p < 1))
    if not truncating:
        return tie
    # a code whose membership of the kept set could flip (near a cut) and that could then win, or is the winner
    cond = raw[0]
    if s.min_p > 0:  # the scores of the codes min-p cut, too (guide() set them to -inf)
        guided = guide(raw, s.cfg)
    x = guided if greedy or s.temperature == 1 else guided / s.temperature
    perturbed = x if greedy else x + noise  # every code's score, cut or not, in x's frame (log p's shift aside)
    contender = perturbed >= perturbed.gather(-1, winner[:, :1]) - 2 * e_x
    near = None
    before_top_p = x  # the scores top-p sees: after min-p and top-k (sampling.log_probs' order)
    if s.min_p > 0:
        floor = cond.amax(-1, keepdim=True) + math.log(s.min_p)
        near = (cond - floor).abs() < 2 * error
        before_top_p = x.masked_fill(cond < floor, -math.inf)
    if not greedy and s.top_k and s.top_k < x.shape[-1]:
        kth = before_top_p.topk(int(s.top_k), dim=-1).values[:, -1:]
        at_k = (before_top_p - kth).abs() < 2 * e_x
        near = at_k if near is None else near | at_k
        before_top_p = before_top_p.masked_fill(before_top_p < kth, -math.inf)
    if not greedy and s.top_p < 1:
        # a code whose probability mass ahead of it is within the error of top_p: its cut could flip (the
        # masses move by at most 2 e_x in total, first order)
        sorted_p, order = torch.softmax(before_top_p, -1).sort(-1, descending=True)
        edge = ((sorted_p.cumsum(-1) - sorted_p) - s.top_p).abs() < 2 * e_x + 1e-6
        at_p = torch.zeros_like(edge).scatter(-1, order, edge)
        near = at_p if near is None else near | at_p
    return tie | (near & contender).any(-1)
