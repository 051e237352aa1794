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
from .errors import Cancelled, SSDError
from .families.base import GridModel, Layout, Prompt, Session
from .sampling import SamplerSettings, gumbel, gumbel_argmax, log_probs


class Run:
    """Everything one generation knows; policies read and write it through the helpers below."""

    def __init__(self, model: GridModel, heads, layout: Layout, settings: SamplerSettings, session: Session):
        self.model, self.heads, self.layout, self.settings, self.session = model, heads, layout, settings, session
        L = layout.num_slots
        self.L, self.V = L, model.image_vocab_size
        self.ids = layout.forced.clone()  # [L] sequence ids; -1 = empty
        self.codes = torch.full((L,), -1, dtype=torch.long)  # [L] image code per slot
        self.final = layout.forced >= 0  # forced slots are final from the start
        self.drafted = torch.full((L,), -1, dtype=torch.long)  # [L] first draft code of a slot
        self.status = torch.where(self.final, T.FORCED, T.PENDING).to(torch.int8)
        self.step_of = torch.zeros(L, dtype=torch.int32)
        self.round_of = torch.zeros(L, dtype=torch.int32)
        self.end = 0  # window = [session.cached, end)
        self.start = 0  # the window's first slot in the step being decided
        self.verified = torch.zeros(L, dtype=torch.int32)  # forwards each slot has been fed in
        self.value_round = torch.zeros(L, dtype=torch.int32)  # round in which each slot took its value
        self.steps = 0
        self.head_calls = 0
        self.rng = torch.Generator().manual_seed(int(settings.seed) & 0x7FFFFFFFFFFFFFFF)
        B, d = session.last_features.shape
        self.features = torch.zeros(B, L, d, dtype=model.dtype, device=model.device)  # latest feature per slot
        self.next_logits = model.image_logits(session.last_features)  # [B, V] raw logits for slot `cached`
        self.prompt_features = session.last_features  # [B, d] features predicting slot 0
        self.q: dict[int, torch.Tensor] = {}  # slot -> the distribution its current token was drawn from

    # ---- views -----------------------------------------------------------------------------
    @property
    def cached(self) -> int:
        return self.session.cached

    def first_open(self) -> int:
        """The first slot that is not final (L when done)."""
        open_ = (~self.final).nonzero()
        return int(open_[0]) if open_.numel() else self.L

    def is_image(self, slot: int) -> bool:
        return 0 <= slot < self.L and bool(self.layout.forced[slot] < 0)

    def logp(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """[B, n, V] raw per-stream logits -> [n, V] processed log p for those slots."""
        from .sampling import guide

        return log_probs(guide(logits, self.settings.cfg), self.settings, slots)

    # ---- token writes ------------------------------------------------------------------------
    def set_tokens(self, slots: torch.Tensor, codes: torch.Tensor, draft: bool = True) -> None:
        changed = self.codes[slots] != codes  # the round in which a slot took its current value
        self.value_round[slots[changed]] = (self.verified[slots[changed]] - 1).clamp(min=0)
        self.codes[slots] = codes
        self.ids[slots] = self.model.code_to_id(codes.to(self.ids.device)).cpu()
        if draft:
            first = self.drafted[slots] < 0
            self.drafted[slots[first]] = codes[first]

    def finalize(self, slots: torch.Tensor) -> None:
        """Mark image slots final with their current token; the status follows from the first draft.

        round = the verification round (0 = the first check) in which the slot took its final value."""
        if slots.numel() == 0:
            return
        drafted, codes = self.drafted[slots], self.codes[slots]
        st = torch.where(drafted < 0, T.AR, torch.where(drafted == codes, T.ACCEPTED, T.CORRECTED))
        self.status[slots] = st.to(torch.int8)
        self.final[slots] = True
        self.step_of[slots] = self.steps
        self.round_of[slots] = self.value_round[slots]
        for s in slots.tolist():
            self.q.pop(s, None)

    def extend_over_forced(self) -> None:
        """Forced slots right after the window join it: they are fed with the tokens before them."""
        while self.end < self.L and self.layout.forced[self.end] >= 0:
            self.end += 1

    def open_in(self, lo: int, hi: int) -> torch.Tensor:
        """Slots in [lo, hi) that are image cells and not final yet."""
        idx = torch.arange(lo, min(hi, self.L))
        return idx[~self.final[idx]]

    def sample(self, logp: torch.Tensor) -> torch.Tensor:
        """Independent samples from rows of log p (the seeded generator of this run)."""
        probs = logp.float().exp().cpu()
        return torch.multinomial(probs, 1, generator=self.rng).squeeze(-1)

    def gumbel_sample(self, logp: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Gumbel-max samples keyed by (seed, slot): the same slot always gets the same noise."""
        if self.settings.temperature == 0:
            return logp.argmax(-1).cpu()
        noise = gumbel(self.settings.seed, slots, self.V)
        return gumbel_argmax(logp.float().cpu(), noise)

    def uniform(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.rng)


class Policy:
    """A decoder: `update` finalizes / corrects after a forward and extends the window with drafts."""

    name = "policy"
    needs_heads = False

    def begin(self, run: Run) -> None:
        pass

    def visible(self, run: Run) -> torch.Tensor | None:
        """Which window slots other slots may attend to (None: all, plain causal)."""
        return None

    def update(self, run: Run, logits: torch.Tensor, features: torch.Tensor | None) -> None:
        """logits [B, n+1, V] raw per stream for slots cached..end; features [B, n, d] of the window."""
        raise NotImplementedError


def _now(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def decode(model: GridModel, heads, prompt: Prompt, layout: Layout, settings: SamplerSettings, policy: Policy,
           decoder_name: str, on_step=None, should_cancel=None, score: bool = True) -> tuple[Run, T.Trace]:
    """Run one generation to the end; returns the final state and its trace."""
    if policy.needs_heads and heads is None:
        raise SSDError(f"decoder {decoder_name!r} drafts with SSD heads: load heads for this model "
                       "(or 'reference' for the bundled model), or choose decoder 'ar', 'sjd' or 'zipar'")
    dev = model.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    timings = {"prefill": 0.0, "forward": 0.0, "policy": 0.0}
    t0 = _now(dev)
    session = model.start(prompt)
    run = Run(model, heads, layout, settings, session)
    timings["prefill"] = _now(dev) - t0
    policy.begin(run)
    H, W = layout.grid
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
            on_step(_progress(run))
    # the last tokens' keys: one more forward so the cache holds the whole committed sequence
    if run.cached < run.L:
        t1 = _now(dev)
        session.forward(run.ids[run.cached:].clone())
        timings["finalize"] = _now(dev) - t1
        finalize_forwards = 1
    else:
        finalize_forwards = 0
    timings["wall"] = _now(dev) - t0
    cells = layout.slot_of_cell
    tr = T.Trace(decoder_name, (H, W), run.codes[cells].view(H, W), run.status[cells].view(H, W),
                 run.step_of[cells].view(H, W), run.round_of[cells].view(H, W), run.steps,
                 settings={"seed": settings.seed, "cfg": settings.cfg, "temperature": settings.temperature,
                           "top_k": settings.top_k, "top_p": settings.top_p, **getattr(policy, "params", {})},
                 timings=timings, head_calls=run.head_calls, finalize_forwards=finalize_forwards)
    if dev.type == "cuda":
        tr.peak_memory_mb = torch.cuda.max_memory_allocated(dev) / 2**20
    else:  # the process's peak resident memory (Linux reports KiB)
        import resource

        tr.peak_memory_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if score:
        t1 = _now(dev)
        fidelity = sequence_nll(model, prompt, layout, run.ids, run.codes, settings)
        tr.nll, tr.nll_full, tr.out_of_support = fidelity["nll"], fidelity["nll_full"], fidelity["out_of_support"]
        timings["score"] = _now(dev) - t1
    return run, tr


def _progress(run: Run) -> T.Progress:
    H, W = run.layout.grid
    cells = run.layout.slot_of_cell
    final = run.final[cells]
    tokens = torch.where(final, run.codes[cells], -1).view(H, W)
    return T.Progress(run.steps, (H, W), tokens, run.status[cells].view(H, W), int(final.sum()))


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
    from .sampling import guide

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
