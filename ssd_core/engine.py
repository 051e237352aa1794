"""The one decoding loop. Every decoder is a policy: what to draft, what to accept, when to commit.

State: a committed prefix (in the KV cache, computed from final tokens only) and a window of slots
[cached, end) whose tokens are drafts or final-but-uncached. Each step: one forward of the base model
over the window; the policy reads the guided log-probs of every window slot (and of the slot just past
it), finalizes / corrects tokens and extends the window; the cache is cropped back to the longest
prefix whose keys were computed from final tokens.
"""
from __future__ import annotations

import time

import torch

from . import trace as T
from .decoders import without_heads
from .errors import Cancelled, SSDError
from .families.base import GridModel
from .run import Policy, Run
from .sampling import SamplerSettings, guide, log_probs
from .session import Layout, Prompt, Session


def _now(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def decode(model: GridModel, heads, prompt: Prompt, layout: Layout, settings: SamplerSettings, policy: Policy,
           decoder_name: str, on_step=None, should_cancel=None, score: bool = True) -> tuple[Run, T.Trace]:
    """Run one generation to the end; returns the final state and its trace."""
    if policy.needs_heads and heads is None:
        raise SSDError(f"decoder {decoder_name!r} drafts with SSD heads: load heads for this model "
                       f"(or 'reference' for the bundled model), or choose decoder {without_heads()}")
    dev = model.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    timings = {"prefill": 0.0, "forward": 0.0, "policy": 0.0}
    t0 = _now(dev)
    session = model.start(prompt)
    run = Run(model, heads, layout, settings, session)
    timings["prefill"] = _now(dev) - t0
    policy.begin(run)
    while not bool(run.final.all()):
        if should_cancel is not None and should_cancel():
            raise Cancelled(f"generation cancelled after {run.steps} steps")
        start = run.start = run.cached
        fed = run.ids[start:run.end].clone()
        run.verified[start:run.end] += 1
        t1 = _now(dev)
        features = None
        if fed.numel():
            if bool((fed < 0).any()):
                raise RuntimeError(f"{decoder_name}: window slot without a token at {start + int((fed < 0).nonzero()[0])}")
            features = session.forward(fed, policy.visible(run))
            run.features[:, start:run.end] = features
            logits = torch.cat([run.next_logits[:, None], model.image_logits(features)], dim=1)
            run.steps += 1
        else:
            logits = run.next_logits[:, None]
        t2 = _now(dev)
        policy.update(run, logits, features)
        timings["forward"] += t2 - t1
        timings["policy"] += _now(dev) - t2
        # keep the keys of the longest prefix of window slots that are final and unchanged since fed
        ok = run.final[start:start + fed.numel()] & (run.ids[start:start + fed.numel()] == fed)
        keep = start + (int(ok.long().cumprod(0).sum()) if ok.numel() else 0)
        session.crop(keep)
        if keep > start:
            run.next_logits = logits[:, keep - start]
        if on_step is not None and features is not None:
            on_step(T.progress(run))
    # the last tokens' keys: one more forward so the cache holds the whole committed sequence
    if run.cached < run.L:
        t1 = _now(dev)
        session.forward(run.ids[run.cached:].clone())
        timings["finalize"] = _now(dev) - t1
        finalize_forwards = 1
    else:
        finalize_forwards = 0
    timings["wall"] = _now(dev) - t0
    tr = T.from_run(run, decoder_name, getattr(policy, "params", {}), timings, finalize_forwards, _peak_memory_mb(dev))
    if score:
        t1 = _now(dev)
        fidelity = sequence_nll(model, prompt, layout, run.ids, run.codes, settings)
        tr.nll, tr.nll_full, tr.out_of_support = fidelity["nll"], fidelity["nll_full"], fidelity["out_of_support"]
        timings["score"] = _now(dev) - t1
    return run, tr


def _peak_memory_mb(dev: torch.device) -> float:
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20
    import resource  # the process's peak resident memory (Linux reports KiB)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sequence_logits(model: GridModel, prompt: Prompt, ids: torch.Tensor) -> tuple[Session, torch.Tensor]:
    """Teacher-forced raw logits [B, L, V] predicting every slot of a finished sequence, in one forward."""
    session = model.start(prompt)
    first = model.image_logits(session.last_features)[:, None]
    feats = session.forward(ids[:-1].clone()) if ids.numel() > 1 else None
    rest = model.image_logits(feats) if feats is not None else first[:, :0]
    return session, torch.cat([first, rest], dim=1)


def sequence_nll(model: GridModel, prompt: Prompt, layout: Layout, ids: torch.Tensor, codes: torch.Tensor,
                 settings: SamplerSettings) -> dict:
    """Fidelity of a finished image under the base model (guided logits, one teacher-forced forward).

    nll: mean per-token NLL with the run's sampler settings (temperature, top-k, top-p); infinite when a
      token lies outside the top-k / top-p set of its final context (a lossy decoder can write such tokens);
    nll_full: the same with temperature and CFG but no truncation, finite for every decoder;
    out_of_support: the share of tokens the run's sampler settings could not have produced.
    Greedy runs (temperature 0) are scored at temperature 1 so that the figures stay finite.
    """
    _, logits = sequence_logits(model, prompt, ids)
    t = settings.temperature if settings.temperature > 0 else 1.0
    scoring = SamplerSettings(settings.seed, settings.cfg, t, settings.top_k, settings.top_p)
    full = SamplerSettings(settings.seed, settings.cfg, t, 0, 1.0)
    image = layout.forced < 0
    guided = guide(logits, settings.cfg)[image]
    target = codes[image].to(guided.device)[:, None]
    picked = log_probs(guided, scoring).gather(-1, target).squeeze(-1)
    picked_full = log_probs(guided, full).gather(-1, target).squeeze(-1)
    return {"nll": float(-picked.mean()), "nll_full": float(-picked_full.mean()),
            "out_of_support": float(torch.isinf(picked).float().mean())}
