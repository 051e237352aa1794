"""The one decoding loop. Every decoder is a policy: what to draft, what to accept, when to commit.

State: a committed prefix (in the KV cache, computed from final tokens only) and a window of slots
[cached, end) whose tokens are drafts or final-but-uncached. Each step: one forward of the base model
over the window; the policy reads the guided log-probs of every window slot (and of the slot just past
it), finalizes / corrects tokens and extends the window; the cache is cropped back to the longest
prefix whose keys were computed from final tokens (per image in a batch).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from . import trace as T
from .decoders import without_heads
from .errors import Cancelled, SSDError
from .families.base import GridModel
from .observer import Observer, Observers, ambient
from .run import Branches, Policy, Run
from .sampling import SamplerSettings, guide, log_probs
from .session import KVSession, Layout, Prompt, stack_prompts
from .static_cache import region


def _now(device) -> float:
    """A host clock reading after the device's queued work (outside the step loop: prefill, scoring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Clock:
    """The step loop's phase times without a device sync per step: on CUDA, events recorded on the stream and
    read once, when a trace is built; elsewhere the host clock (the CPU runs each op before returning)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list] = {}  # phase -> [(start mark, end mark)]

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, phase: str, start, end) -> None:
        self.spans.setdefault(phase, []).append((start, end))

    def seconds(self, phase: str) -> float:
        """Total seconds of a phase (on CUDA: waits for its last event)."""
        spans = self.spans.get(phase, [])
        if not self.cuda:
            return sum(b - a for a, b in spans)
        if spans:
            spans[-1][1].synchronize()
        return sum(a.elapsed_time(b) for a, b in spans) / 1000


@dataclass
class Generation:
    """What a generation hears from and tells its caller, besides its images: on_step(Progress) after every step
    that fed a window, should_cancel() before every step (True: Cancelled), score (each trace's fidelity figures:
    one more forward an image), observers (observer.Observer: what measures it; those of this thread's
    `observer.observing` blocks are added)."""

    on_step: Callable | None = None
    should_cancel: Callable[[], bool] | None = None
    score: bool = True
    observers: tuple = ()


class Timing(Observer):
    """The engine's timings (the trace's `timings`) as an observer: the prefill, finalize and scoring by the host
    clock after a device sync (outside the step loop); a step's `forward` from its start to its forward's end (its
    window's ids and the base model) and its `policy` from there to its end (the logits, every policy's update;
    the whole step when it fed nothing) by the Clock, without a sync a step; the draft heads' networks by the
    host clock (their share is taken out of the policies')."""

    def __init__(self, device: torch.device):
        self.device, self.clock = device, Clock(device)
        self.latest: dict[str, float] = {}  # forward kind -> seconds of its latest forward (not "step")
        self.draft = 0.0  # seconds in the heads' networks
        self.began: float | None = None  # host clock at the prefill's start (the wall's start)
        self.started = 0.0  # host clock at the running forward's start (not a step's)
        self.step_mark = self.updating = None  # the Clock's marks: the step's start, its policies' start

    def forward_begin(self, kind: str) -> None:
        if kind == "step":
            return
        self.started = _now(self.device)
        if self.began is None:
            self.began = self.started

    def forward_end(self, kind: str) -> None:
        if kind == "step":
            self.updating = self.clock.mark()
            self.clock.add("forward", self.step_mark, self.updating)
        else:
            self.latest[kind] = _now(self.device) - self.started

    def step_begin(self) -> None:
        self.step_mark = self.updating = self.clock.mark()

    def step_end(self) -> None:
        self.clock.add("policy", self.updating, self.clock.mark())

    def heads_begin(self) -> None:
        self.heads_start = time.perf_counter()

    def heads_end(self) -> None:
        self.draft += time.perf_counter() - self.heads_start

    def timings(self) -> dict:
        """The figures so far (seconds): prefill, the steps' forward, policy and draft, finalize (when it ran) and
        the wall from the prefill's start (read now, after a device sync)."""
        out = {"prefill": self.latest.get("prefill", 0.0), "forward": self.clock.seconds("forward"),
               "policy": self.clock.seconds("policy") - self.draft, "draft": self.draft}
        if "finalize" in self.latest:
            out["finalize"] = self.latest["finalize"]
        out["wall"] = _now(self.device) - self.began
        return out


def decode(model: GridModel, heads, prompt: Prompt, layout: Layout, settings: SamplerSettings, policy: Policy,
           **generation) -> tuple[Run, T.Trace]:
    """Run one generation to the end; returns the final state and its trace. generation: Generation's fields
    (on_step, should_cancel, score, observers)."""
    return decode_batch(model, heads, [prompt], layout, [settings], [policy], Generation(**generation))[0]


def decode_batch(model: GridModel, heads, prompts: list[Prompt], layout: Layout, settings: list[SamplerSettings],
                 policies: list[Policy], generation: Generation | None = None) -> list[tuple[Run, T.Trace]]:
    """N generations with one base-model forward per step for all N x CFG streams -> [(Run, Trace)] in order.

    One prompt, sampler settings and policy an image; the policies are of one decoder (the batch's steps are
    one schedule). Each image keeps its own cache length (the session's per-row `held`): every step it feeds its
    window [cached, end), exactly what its single run feeds, at its own positions; shorter feeds are padded on
    the right, and the padding is invisible to every other query. Then each image's rows are cropped to the
    prefix it keeps, so no padding or rejected key is ever attended to. Per-image state stays in its Run; a
    finished image leaves the batch.
    """
    decoder = _one_decoder(prompts, settings, policies)
    if decoder.needs_heads and heads is None:
        raise SSDError(f"decoder {decoder.name!r} drafts with SSD heads: load heads for this model "
                       f"(or 'reference' for the bundled model), or choose decoder {without_heads()}")
    static = getattr(model, "static", None)  # a static cache is one per model: its generations take turns
    with torch.no_grad(), (static.lock if static is not None else contextlib.nullcontext()):
        return _decode(model, heads, prompts, layout, settings, policies, generation or Generation())


def _one_decoder(prompts: list, settings: list, policies: list[Policy]) -> Policy:
    """A batch's first policy, once it is checked that every image has a prompt, settings and a policy, and that
    the policies are of one decoder."""
    if not len(prompts) == len(settings) == len(policies) > 0:
        raise SSDError(f"a batch needs one prompt, sampler settings and policy an image, got {len(prompts)} "
                       f"prompts, {len(settings)} settings and {len(policies)} policies")
    kinds = {(type(p), p.name) for p in policies}
    if len(kinds) > 1:
        raise SSDError(f"a batch runs one decoder, got policies of {', '.join(sorted(name for _, name in kinds))}")
    return policies[0]


class _Rows:
    """Which stream rows of the session each image of a batch holds (image i: i, i + N, ...): on the device (to
    index features and logits) and as host numbers (to set held lengths); renumbered when images leave."""

    def __init__(self, session: KVSession, images: int):
        self.session = session
        dev = session.m.device
        self.dev = [torch.arange(i, session.batch, images, device=dev) for i in range(images)]
        self.host = [list(range(i, session.batch, images)) for i in range(images)]
        self.at = [slice(i, session.batch, images) for i in range(images)]  # the same rows, as views (no op a step)

    def hold(self, held: list[int], image: int, slots: int) -> None:
        """Set image's rows in `held` (a copy of session.held_host, for session.crop) to `slots`."""
        for r in self.host[image]:
            held[r] = slots

    def keep(self, images: list[int]) -> None:
        """Only these images' streams stay in the session (finished images leave its batch), renumbered in order."""
        self.session.select(torch.cat([self.dev[i] for i in images]), [r for i in images for r in self.host[i]])
        offset = 0
        for i in images:
            k = len(self.host[i])
            self.dev[i] = torch.arange(offset, offset + k, device=self.dev[i].device)
            self.host[i] = list(range(offset, offset + k))
            self.at[i] = slice(offset, offset + k)
            offset += k


def _decode(model, heads, prompts, layout, settings, policies, generation: Generation):
    dev = model.device
    N = len(prompts)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    timing = Timing(dev)
    watch = Observers((*ambient(), *generation.observers, timing))  # timing innermost: it times no observer's work
    with watch.forward("prefill"):
        rows = _Rows(model.start(stack_prompts(prompts) if N > 1 else prompts[0], N), N)
    session = rows.session
    runs = [Run(model, heads, layout, s, session.last_features[r], session, prompt, watch)
            for s, r, prompt in zip(settings, rows.dev, prompts)]
    for run, policy in zip(runs, policies):
        policy.begin(run)
    pad_id = int(model.code_to_id(torch.zeros(1, dtype=torch.long, device=dev))[0])  # fed at padding slots
    active = list(range(N))
    traces: list[T.Trace | None] = [None] * N
    while active:
        if generation.should_cancel is not None and generation.should_cancel():
            raise Cancelled(f"generation cancelled after {max(runs[i].counts.steps for i in active)} steps")
        with watch.step():
            fed = _step(model, rows, [runs[i] for i in active], [policies[i] for i in active], active, pad_id, watch)
        if fed and generation.on_step is not None:
            for i in active:
                generation.on_step(T.progress(runs[i], i))
        done = [i for i in active if runs[i].window.done]
        if not done:
            continue
        active = [i for i in active if i not in done]
        finalize = 0 if active else _last_keys(rows, [runs[i] for i in done], done, layout, pad_id, watch)
        timings = timing.timings()
        for i in done:
            runs[i].finish(session.held_host[rows.host[i][0]])
            traces[i] = T.from_run(runs[i], policies[i].name, policies[i].params, dict(timings), finalize,
                                   _peak_memory_mb(dev))
        if active:
            rows.keep(active)
    if generation.score:
        _score(model, prompts, layout, runs, traces, watch, timing)
    return list(zip(runs, traces))


def _step(model, rows: _Rows, runs: list[Run], policies: list[Policy], images: list[int], pad_id: int,
          watch: Observers) -> int:
    """One step of these images (runs, policies): one base-model forward of every window [cached, end), then each
    policy's update; the cache is cropped to each image's cached_next(). -> the longest window fed (0: none)."""
    session = rows.session
    # each window's ids [k] (a copy) and 0-d: every slot of it has a token (checked at the step's sync)
    fed, filled = zip(*(region(model, _window_ids)(run.tokens.ids[run.window.cached:run.window.end]) for run in runs))
    # a policy's draft tree: tokens fed after its window that are no slot (Branches), only with a window
    branches = [policy.branches(run) if f.numel() else None for run, policy, f in zip(runs, policies, fed)]
    feeds = [f if b is None else torch.cat([f, b.ids]) for f, b in zip(fed, branches)]
    n = max(f.numel() for f in feeds)
    for run, policy, f, ok in zip(runs, policies, fed, filled):
        run.expect(ok, lambda run=run, f=f, name=policy.name: _no_token(name, run, f))
    feats, all_logits, visibles = _forward(model, session, runs, policies, [rows.dev[i] for i in images], feeds, n,
                                           pad_id, watch, branches) if n else (None, None, [None] * len(runs))
    held = list(session.held_host)  # [B] each row's kept prefix after this step (rows of other images: as before)
    for run, policy, f, visible, b, i in zip(runs, policies, fed, visibles, branches, images):
        r, k = rows.at[i], f.numel()
        out = (feats[r, :k], all_logits[r, :k]) if k else (None, None)  # its window's features and logits
        run.outputs.branch_logits = None if b is None else all_logits[r, k:k + len(b.slots)]  # [B, m, V] branches'
        logits = run.begin_step(f, visible if k else None, *out)
        policy.update(run, logits, out[0])
        rows.hold(held, i, run.end_step(logits))  # its new cache length: the step's one host copy
    session.crop(held)
    return n


def _last_keys(rows: _Rows, runs: list[Run], images: list[int], layout: Layout, pad_id: int, watch: Observers) -> int:
    """The last images' tokens past their kept prefix get their keys (one forward), so that the cache holds every
    sequence whole. -> 1 when that forward ran (the trace's finalize), else 0."""
    session = rows.session
    first = min(run.window.cached for run in runs)
    if first >= layout.num_slots:
        return 0
    held = list(session.held_host)
    last = [run.tokens.ids[run.window.cached:] for run in runs]
    ids, visible, _ = _batch_ids(session, [rows.dev[i] for i in images], last, [None] * len(runs),
                                 layout.num_slots - first, pad_id)
    with watch.forward("finalize"):
        session.forward(ids, visible)
    for i in images:
        rows.hold(held, i, layout.num_slots)
    session.crop(held)
    return 1


def _score(model, prompts: list[Prompt], layout: Layout, runs: list[Run], traces: list[T.Trace], watch: Observers,
           timing: Timing) -> None:
    """Each trace's fidelity figures (sequence_nll) and the time they took."""
    for run, prompt, tr in zip(runs, prompts, traces):
        codes = run.tokens.codes.cpu()
        with watch.forward("score"):
            fidelity = sequence_nll(model, prompt, layout, run.tokens.ids, codes, run.settings)
        tr.nll, tr.nll_full, tr.out_of_support = fidelity["nll"], fidelity["nll_full"], fidelity["out_of_support"]
        tr.timings["score"] = timing.latest["score"]


def _forward(model, session: KVSession, runs: list[Run], policies: list[Policy], rows: list[torch.Tensor],
             fed: list[torch.Tensor], n: int, pad_id: int, watch: Observers, branches: list):
    """One base-model forward of every image's fed slots (and its branches after them), right-padded to n.

    -> features [R, n, d], logits [R, n, V], and each image's visible window slots (None: all)."""
    visibles = [p.visible(r) for p, r in zip(policies, runs)]
    masks, positions = zip(*(_tree(run, f.numel() - len(b.slots), b, v) if b is not None else (v, None)
                             for run, f, v, b in zip(runs, fed, visibles, branches)))
    ids, visible, position = _batch_ids(session, rows, fed, list(masks), n, pad_id, list(positions))
    with watch.forward("step"):
        features, logits = session.forward(ids, visible, position, logits=True)
    return features, model.image_logits(features) if logits is None else logits, visibles


def _tree(run: Run, k: int, b: Branches, visible: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The window mask [k + m, k + m] and positions [k + m] of a window of k slots followed by the branches b: the
    window causal (and `visible`), each branch sees the window slots below its `sees` slot, its parent chain and
    itself, at its slot's position; no window slot sees a branch (its keys are cropped after the step)."""
    m, C = len(b.slots), run.window.cached
    mask = torch.zeros(k + m, k + m, dtype=torch.bool)
    mask[:k, :k] = torch.ones(k, k, dtype=torch.bool).tril()
    if visible is not None:
        mask[:k, :k] &= visible.cpu()[None, :] | torch.eye(k, dtype=torch.bool)
    for i in range(m):
        mask[k + i, :max(0, min(k, b.sees[i] - C))] = True
        j = i
        while j >= 0:  # itself and its parent chain
            mask[k + i, k + j] = True
            j = b.parent[j]
    dev = b.ids.device
    positions = torch.tensor(list(range(k)) + [s - C for s in b.slots], dtype=torch.long)
    return mask.to(dev), positions.to(dev)


def _window_ids(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A window's ids [k] -> (a copy of them, 0-d: every slot has a token)."""
    return ids.clone(), (ids >= 0).all()


def _no_token(decoder: str, run: Run, fed: torch.Tensor):
    raise RuntimeError(f"{decoder}: window slot without a token at {run.window.cached + int((fed < 0).nonzero()[0])}")


def _batch_ids(session: KVSession, rows: list[torch.Tensor], fed: list[torch.Tensor], visibles: list, n: int,
               pad_id: int, positions: list | None = None) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                      torch.Tensor | None]:
    """Each image's fed ids on its rows, right-padded to n -> ids ([n] when one image fills the batch, else
    [B, n]), the visible slots (None: all; padding and rows of no image are invisible) and the positions (None:
    slot order). An image's visible may be its whole window mask [k, k] (_tree, with its positions [k]): then
    the batch's is [B, n, n]."""
    positions = positions or [None] * len(fed)
    if any(v is not None and v.dim() == 2 for v in visibles):
        return _batch_trees(session, rows, fed, visibles, n, pad_id, positions)
    if len(rows) == 1 and rows[0].numel() == session.batch and fed[0].numel() == n:
        return fed[0], visibles[0], None
    dev = fed[0].device
    ids = torch.full((session.batch, n), pad_id, dtype=torch.long, device=dev)
    visible = torch.zeros(session.batch, n, dtype=torch.bool, device=dev)
    for r, f, v in zip(rows, fed, visibles):
        ids[r, :f.numel()] = f
        visible[r, :f.numel()] = True if v is None else v
    whole = sum(r.numel() for r in rows) == session.batch and all(v is None for v in visibles) and \
        all(f.numel() == n for f in fed)  # known on the host: no copy
    return ids, (None if whole else visible), None


def _batch_trees(session: KVSession, rows: list[torch.Tensor], fed: list[torch.Tensor], visibles: list, n: int,
                 pad_id: int, positions: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """_batch_ids where some image feeds a tree: ids [B, n], window masks [B, n, n], positions [B, n]."""
    dev = fed[0].device
    ids = torch.full((session.batch, n), pad_id, dtype=torch.long, device=dev)
    masks = torch.eye(n, dtype=torch.bool, device=dev).repeat(session.batch, 1, 1)  # padding sees itself only
    steps = torch.arange(n, device=dev).repeat(session.batch, 1)
    for r, f, v, p in zip(rows, fed, visibles, positions):
        k = f.numel()
        ids[r, :k] = f
        if v is None or v.dim() == 1:  # causal, and each slot sees the visible ones
            v = torch.ones(k, k, dtype=torch.bool, device=dev).tril() & \
                ((torch.ones(k, dtype=torch.bool, device=dev) if v is None else v.to(dev))[None, :] |
                 torch.eye(k, dtype=torch.bool, device=dev))
        masks[r, :k, :k] = v
        if p is not None:
            steps[r, :k] = p
    return ids, masks, steps


def _peak_memory_mb(dev: torch.device) -> float:
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20
    import resource  # the process's peak resident memory (Linux reports KiB)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sequence_logits(model: GridModel, prompt: Prompt, ids: torch.Tensor) -> tuple[KVSession, torch.Tensor]:
    """Teacher-forced raw logits [B, L, V] predicting every slot of a finished sequence, in one forward."""
    session = model.start(prompt)
    first = model.image_logits(session.last_features)[:, None]
    feats = session.forward(ids[:-1].clone()) if ids.numel() > 1 else None
    rest = model.image_logits(feats) if feats is not None else first[:, :0]
    return session, torch.cat([first, rest], dim=1)


def sequence_nll(model: GridModel, prompt: Prompt, layout: Layout, ids: torch.Tensor, codes: torch.Tensor,
                 settings: SamplerSettings) -> dict:
    """Fidelity of a finished image under the base model (guided logits, one teacher-forced forward).

    nll: mean per-token NLL with the run's sampler settings (temperature, top-k, top-p, min-p); infinite when a
      token lies outside the top-k / top-p / min-p set of its final context (a lossy decoder can write such tokens);
    nll_full: the same with temperature and CFG but no truncation, finite for every decoder;
    out_of_support: the share of tokens the run's sampler settings could not have produced.
    Greedy runs (temperature 0) are scored at temperature 1 so that the figures stay finite.
    """
    _, logits = sequence_logits(model, prompt, ids)
    t = settings.temperature if settings.temperature > 0 else 1.0
    scoring = replace(settings, temperature=t)
    full = replace(settings, temperature=t, top_k=0, top_p=1.0, min_p=0.0)
    image = layout.forced < 0
    target = codes[image].to(logits.device)[:, None]
    picked = log_probs(guide(logits, settings.cfg, settings.min_p)[image], scoring).gather(-1, target).squeeze(-1)
    picked_full = log_probs(guide(logits, settings.cfg)[image], full).gather(-1, target).squeeze(-1)
    return {"nll": float(-picked.mean()), "nll_full": float(-picked_full.mean()),
            "out_of_support": float(torch.isinf(picked).float().mean())}
