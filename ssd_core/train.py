"""Self-distillation of the draft heads, trained for acceptance.

1. grids: the base model samples its own images (batched AR with CFG), and/or grids are read from files
   (e.g. the model's tokenised training data: `python -m reference_recipe.grids`);
2. features: one teacher-forced forward per grid collects the pre-norm last-layer features of both CFG
   streams, once; they can be stored (`features=`) and reused across runs;
3. heads (the base model frozen, heads-only backward): Smooth-L1 on features, plus a KL of the model's
   processed guided distribution p (cfg, temperature, top-k/top-p) against the draft's guided
   distribution q (cfg, temperature) through the frozen image head; Hh unrolled on its own outputs
   along every row (`unroll`: chain depth, 1 = teacher-forced pairs only);
4. report: expected acceptance sum_v min(p, q) per head, by Hh chain depth and by column
   (ssd_core.acceptance), with top-1 agreement beside it, on held-out grids; written into the heads file.
Runs as one process on a CPU, or under `accelerate launch` on several GPUs (data parallel).
"""
from __future__ import annotations

import json
import math
import numbers
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.nn import functional as F

from .acceptance import guided_logp, heads_acceptance, horizontal_chain, vertical_drafts
from .errors import SSDError
from .heads import VERTICAL_INPUTS, DraftHeads
from .outputs import check_output, write_or_keep
from .sampling import SamplerSettings, guide, sample_logits, settings_from
from .session import Layout, stack_prompts


MAX_GRIDS = 1_000_000  # grids sampled, held out or in one batch: their features are held in memory
MAX_COUNT = 10_000_000  # epochs, steps, chain depth, checkpoint interval
MAX_WIDTH = 65_536  # an MLP width (the shipped Hv: 1,024): 3 x width x hidden_size weights, and Adam's state


def _whole(name: str, value, low, high) -> int:
    """A TrainConfig count as an int, or one SSDError line naming its limits."""
    whole = isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or (low is not None and value < low) or (high is not None and value > high):
        limits = "" if low is None else f" from {low} to {high}" if high is not None else f" >= {low}"
        why = {MAX_GRIDS: " (the grids and their features are held in memory)",
               MAX_WIDTH: " (an MLP width: 3 x width x hidden size weights, with their optimiser state; the shipped "
                          "heads' Hv is 1024)"}.get(high, "")
        raise SSDError(f"train-heads {name} must be a whole number{limits}{why}, got {str(value)[:40]}")
    return int(value)


@dataclass
class TrainConfig:
    samples: int = 256
    heldout: int = 16
    epochs: int = 4
    batch_grids: int = 8
    lr: float = 2e-3
    ce_weight: float = 0.1  # argmax cross-entropy of one-step drafts (0 = off)
    kl_weight: float = 1.0  # KL(p processed || q guided) of the drafts (0 = off)
    tv_weight: float = 0.0  # 1 - sum_v min(p, q guided) of the drafts: their expected rejection (0 = off)
    unroll: int = 0  # Hh chain depth trained on its own outputs (0 = W-1, 1 = teacher-forced pairs only)
    seed: int = 0
    gen_batch: int = 8
    intermediate: int | None = None
    vertical_intermediate: int | None = None  # Hv's MLP width (None: Hh's, or init's); wider than init's: widened
    max_steps: int | None = None  # stop after this many optimiser steps (None: every epoch)
    stale_share: float = 0.0  # Hv trained on features with this share of tokens changed (0 = true features)
    until: float | None = None  # stop at this time (time.time()): features of the grids done in 60% of the time
    #                             left, then the one-cycle lr schedule runs on the time left
    checkpoint_every: int = 0  # every this many steps: held-out expected acceptance logged, heads saved (0 = off)
    vertical_left: int = 0  # 1: Hv also reads the token drafted on the left of the cell it drafts (and the cell
    #                         above-right of it); 2: also the token two to the left and the cell above-left
    vertical_shift: int = 0  # Hv reads the row above this many columns right (1: the cell above the drafted cell)
    init: str | None = None  # a heads file for this model to start from (warm start) instead of random weights
    train: str = "both"  # which heads learn: both, vertical (Hh kept as it starts) or horizontal

    def __post_init__(self):  # every value checked before any grid is sampled (or any memory taken)
        for name, low, high in (("samples", 0, MAX_GRIDS), ("heldout", 0, MAX_GRIDS), ("epochs", 1, MAX_COUNT),
                                ("batch_grids", 1, MAX_GRIDS), ("gen_batch", 1, MAX_GRIDS),
                                ("checkpoint_every", 0, MAX_COUNT), ("unroll", 0, MAX_COUNT),
                                ("intermediate", 1, MAX_WIDTH), ("vertical_intermediate", 1, MAX_WIDTH),
                                ("max_steps", 0, MAX_COUNT), ("seed", None, None)):
            value = getattr(self, name)
            if value is None and name in ("intermediate", "vertical_intermediate", "max_steps"):  # optional
                continue
            setattr(self, name, _whole(name, value, low, high))
        if self.max_steps == 0 and self.init is None:
            raise SSDError("train-heads max_steps 0 trains nothing and would write random heads: give at least 1, or "
                           "an init heads file to score as it is")
        for name in ("lr", "ce_weight", "kl_weight", "tv_weight", "stale_share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SSDError(f"train-heads {name} must be a number, got {str(value)[:40]!r}")
        if self.samples + self.heldout < 2:
            raise SSDError("train-heads needs at least 2 grids (samples + heldout): one to train on, one held out")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise SSDError(f"train-heads lr must be a number > 0 (e.g. 2e-3), got {self.lr}")
        for name in ("ce_weight", "kl_weight", "tv_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise SSDError(f"train-heads {name} must be a number >= 0, got {getattr(self, name)}")
        if self.vertical_shift not in (0, 1) or isinstance(self.vertical_shift, bool):
            raise SSDError(f"train-heads vertical_shift must be 0 (the paper's Hv input) or 1 (the cell above the "
                           f"drafted cell), got {self.vertical_shift}")
        if self.vertical_left not in VERTICAL_INPUTS:  # the levels heads.py knows (True / False: 1 / 0)
            raise SSDError(f"train-heads vertical_left must be 0 (Hv reads the row above), 1 (also the token on the "
                           f"left, the cell above-right) or 2 (also the token two to the left, the cell above-left), "
                           f"got {self.vertical_left}")
        self.vertical_left = int(self.vertical_left)
        if self.train not in ("both", "vertical", "horizontal"):
            raise SSDError(f"train-heads train must be both, vertical or horizontal, got {self.train!r}")
        if self.train != "both" and self.init is None:
            raise SSDError(f"train-heads train={self.train} keeps the other head as it starts: give init, a heads file "
                           "to start from, or train both")
        if self.init is not None and not Path(self.init).is_file():
            raise SSDError(f"train-heads init {self.init} is not a file: give a heads .safetensors file made for this "
                           "model to start from, or leave it out to start from random weights")
        if not (math.isfinite(self.stale_share) and 0 <= self.stale_share < 1):
            raise SSDError(f"train-heads stale_share must be a number in [0, 1), e.g. 0.2, got {self.stale_share}")


def sample_prompts(model, n: int, rng: random.Random) -> list:
    if model.class_names is not None or hasattr(model, "class_id"):
        num = int(model.spec["num_classes"]) if hasattr(model, "spec") else len(model.class_names)
        return [rng.randrange(num) for _ in range(n)]
    return [rng.choice(getattr(model, "training_prompts", ["a photo"])) for _ in range(n)]


@torch.no_grad()
def generate_grids(model, prompts: list, settings: SamplerSettings, layout: Layout, batch: int = 8,
                   log=print) -> torch.Tensor:
    """Batched AR sampling with CFG: [N, L] codes per slot (-1 at forced slots). One token per forward reads
    the whole KV cache, so the loop is memory-bound: it runs on the static cache (written in place) unless the
    model already has one: half the time of the dynamic cache on the bundled model, the same grids
    (`python -m ssd_core.dev.grids_bench`; figures in docs/heads-and-acceptance.md)."""
    from . import static_cache

    before = getattr(model, "static", None)
    if before is None:
        try:
            static_cache.enable(model, "static")
        except SSDError:  # a family whose final norm the static path cannot bypass: the dynamic cache
            pass
    try:
        return _sample_grids(model, prompts, settings, layout, batch, log)
    finally:
        model.static = before  # the model's own cache mode again (and the sampling caches freed)


def _sample_grids(model, prompts, settings, layout, batch, log) -> torch.Tensor:
    out = []
    gen = torch.Generator().manual_seed(settings.seed)
    t0 = time.time()
    for b in range(0, len(prompts), batch):
        chunk = prompts[b:b + batch]
        k = len(chunk)
        prompt = stack_prompts([model.build_prompt(p, "", settings.guided, layout.grid) for p in chunk])
        session = model.start(prompt)
        logits = model.image_logits(session.last_features)  # [B, V]
        codes = torch.full((k, layout.num_slots), -1, dtype=torch.long)
        for s in range(layout.num_slots):
            forced = int(layout.forced[s])
            if forced >= 0:
                ids = torch.full((k,), forced, dtype=torch.long)
            else:
                codes[:, s] = sample_logits(logits.view(-1, k, logits.shape[-1]), settings, gen)  # streams [S, k, V]
                ids = model.code_to_id(codes[:, s].to(model.device)).cpu()
            if s + 1 < layout.num_slots:
                rows = ids.repeat(2) if settings.guided else ids
                logits = model.image_logits(session.forward(rows[:, None]))[:, 0]
        out.append(codes)
        log(f"  generated {min(b + batch, len(prompts))}/{len(prompts)} grids ({time.time() - t0:.0f} s)")
    return torch.cat(out)


@torch.no_grad()
def collect_features(model, prompts: list, codes: torch.Tensor, settings: SamplerSettings, layout: Layout,
                     batch: int = 8, dtype: torch.dtype = torch.float32, stop_at: float | None = None,
                     log=None):
    """Teacher-forced pre-norm features: h [N, S, L+1, d] (S streams; index 0 = prompt end, j+1 = slot j),
    sequence ids [N, L]; stop_at (time.time()): only the first grids done by then (N fewer)."""
    feats, ids_all = [], []
    t0 = time.time()
    for b in range(0, len(prompts), batch):
        if stop_at is not None and b and time.time() >= stop_at:  # one batch at least
            break
        if log is not None and b and b % (64 * batch) == 0:
            log(f"  features of {b}/{len(prompts)} grids ({time.time() - t0:.0f} s)")
        chunk, c = prompts[b:b + batch], codes[b:b + batch]
        k = len(chunk)
        prompt = stack_prompts([model.build_prompt(p, "", settings.guided, layout.grid) for p in chunk])
        ids = torch.where(layout.forced[None] >= 0, layout.forced[None].expand_as(c), model.code_to_id(c.clamp(min=0)))
        session = model.start(prompt)
        rows = ids.repeat(2, 1) if settings.guided else ids
        h = session.forward(rows)  # [S*k, L, d], all conditional rows first
        h = torch.cat([session.last_features[:, None], h], dim=1)
        feats.append(h.view(-1, k, *h.shape[1:]).transpose(0, 1).to("cpu", dtype))  # [k, S, L+1, d]
        ids_all.append(ids)
    return torch.cat(feats), torch.cat(ids_all)


@torch.no_grad()
def stale_features(model, prompts: list, h: torch.Tensor, ids: torch.Tensor, settings: SamplerSettings,
                   layout: Layout, share: float, batch: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features as Hv meets them: a row's features come from the forward before its last verify round, so
    the cells changed in that round (`share` of them) were fed another token. Here each image cell is, with
    probability `share`, fed another sample of the model's processed p (the true token excluded) -> h [N, S,
    L+1, d] of those sequences (to be read with the true tokens' embeddings), changed [N, H*W] bool."""
    gen = torch.Generator().manual_seed(seed)
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W).flatten()
    offset = int(model.code_to_id(torch.zeros(1, dtype=torch.long, device=model.device))[0])  # id of code 0
    out, changed = [], []
    for b in range(0, len(prompts), batch):
        hb = h[b:b + batch].to(model.device, model.dtype)
        seq = ids[b:b + batch].clone()  # [k, L] true sequence ids
        codes = seq[:, cells] - offset  # [k, H*W] true image codes
        p = guided_logp(model, hb[:, :, cells], settings).exp().float().cpu()  # [k, H*W, V]: p of each cell
        p.scatter_(-1, codes[..., None], 0.0)  # another token than the true one
        change = (torch.rand(codes.shape, generator=gen) < share) & (p.sum(-1) > 0)
        new = codes.clone()
        new[change] = torch.multinomial(p[change], 1, generator=gen)[:, 0]
        seq[:, cells] = new + offset
        session = model.start(stack_prompts([model.build_prompt(q, "", settings.guided, layout.grid)
                                             for q in prompts[b:b + batch]]))
        f = session.forward((seq.repeat(2, 1) if settings.guided else seq).to(model.device))  # [S*k, L, d]
        f = torch.cat([session.last_features[:, None], f], dim=1)
        out.append(f.view(-1, seq.shape[0], *f.shape[1:]).transpose(0, 1).to("cpu", h.dtype))
        changed.append(change)
    return torch.cat(out), torch.cat(changed)


def head_losses(model, heads: DraftHeads, h: torch.Tensor, ids: torch.Tensor, layout: Layout, cfg: TrainConfig,
                settings: SamplerSettings, h_stale: torch.Tensor | None = None) -> dict:
    """Losses of both heads on a batch of grids h [b, S, L+1, d] (teacher-forced), ids [b, L]; h_stale:
    the features Hv reads (see stale_features), else h."""
    h = h.to(model.device, model.dtype)
    e = model.embed(ids.to(model.device))  # [b, L, d]
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    S = h.shape[1]
    losses, drafts = {}, {}
    targets = h[:, :, cells[:, 1:]]  # [b, S, H, W-1, d] true features drafting cells x >= 1
    if cfg.train != "vertical":
        # Hh, teacher-forced: every slot s from (h[s-1], e[s]) (forced slots included)
        pred_tf = heads.horizontal(h[:, :, :-1], e[:, None].expand(-1, S, -1, -1))  # [b, S, L, d] -> h[:, :, 1:]
        losses["horizontal"] = F.smooth_l1_loss(pred_tf.float(), h[:, :, 1:].float())
        drafts["h"] = pred_tf[:, :, cells[:, :-1]]  # one-step Hh drafts of cells x >= 1
        if cfg.unroll != 1:
            chain = horizontal_chain(heads, h, e, layout, cfg.unroll or None)  # [b, S, H, D, d]
            D = chain.shape[3]
            losses["horizontal_chain"] = F.smooth_l1_loss(chain.float(), targets[:, :, :, :D].float())
            drafts["h"] = chain
    if H > 1 and cfg.train != "horizontal":
        h_in = h if h_stale is None else h_stale.to(model.device, model.dtype)
        pred_v = vertical_drafts(heads, h_in, e, layout, all_columns=True)  # [b, S, H-1, W, d]
        losses["vertical"] = F.smooth_l1_loss(pred_v.float(), h[:, :, cells[1:] + 1].float())
        drafts["v"] = pred_v[:, :, :, :-1]
    for name, q_feats in drafts.items():
        true = targets[:, :, 1:] if name == "v" else targets[:, :, :, :q_feats.shape[3]]
        if (cfg.kl_weight > 0 or cfg.tv_weight > 0) and S == (2 if settings.guided else 1):
            with torch.no_grad():
                logp = guided_logp(model, true, settings)  # processed p [b, ..., V]
            t = settings.temperature if settings.temperature > 0 else 1.0
            logq = (guide(model.image_logits(q_feats).transpose(0, 1), settings.cfg) / t).log_softmax(-1)
            p = logp.exp()
            if cfg.kl_weight > 0:
                losses["kl_" + name] = cfg.kl_weight * (p * (logp.clamp(min=-1e30) - logq)).sum(-1).mean()
            if cfg.tv_weight > 0:  # what acceptance is: the draft is rejected with probability 1 - sum min(p, q)
                losses["tv_" + name] = cfg.tv_weight * (1 - torch.minimum(p, logq.exp()).sum(-1)).mean()
        if cfg.ce_weight > 0:
            target = model.image_logits(true).argmax(-1)
            losses["ce_" + name] = cfg.ce_weight * F.cross_entropy(model.image_logits(q_feats).flatten(0, -2),
                                                                   target.flatten())
    return losses


@torch.no_grad()
def agreement(model, heads: DraftHeads, h: torch.Tensor, ids: torch.Tensor, layout: Layout) -> dict:
    """Per-stream top-1 agreement of one-step drafts with the base model's own top-1 (held-out grids)."""
    dev, dtype = model.device, model.dtype
    h = h.to(dev, dtype)
    e = model.embed(ids.to(dev))[:, None].expand(-1, h.shape[1], -1, -1)
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W)
    target = model.image_logits(h[:, :, cells[:, 1:]]).argmax(-1)
    a_h = model.image_logits(heads.horizontal(h[:, :, cells[:, :-1]], e[:, :, cells[:, :-1]])).argmax(-1) == target
    out = {"horizontal_top1": round(a_h.float().mean().item(), 4)}
    if H > 1:
        pv = vertical_drafts(heads, h, e[:, 0], layout)
        out["vertical_top1"] = round((model.image_logits(pv).argmax(-1) == target[:, :, 1:]).float().mean().item(), 4)
    return out


def features_for(model, prompts, codes, settings, layout, batch, path=None, log=print, stop_at=None):
    """Teacher-forced features, read from `path` when it holds them for these grids, else computed (and
    stored there, fp16); stop_at: the first grids done by then only (h, ids of N' <= N grids)."""
    from safetensors.torch import load_file, save_file

    check_features_file(path, "features", ("h", "ids", "codes"))
    if path is not None and Path(path).is_file():
        data = load_file(str(path))
        if data["codes"].shape == codes.shape and torch.equal(data["codes"], codes):
            log(f"features of {codes.shape[0]} grids read from {path}")
            return data["h"], data["ids"]
    t0 = time.time()
    h, ids = collect_features(model, prompts, codes, settings, layout, batch, torch.float16 if path else torch.float32,
                              stop_at, log)
    log(f"features of {h.shape[0]} of {codes.shape[0]} grids: {time.time() - t0:.0f} s")
    if path is not None:
        tensors = {"h": h.contiguous(), "ids": ids.contiguous(), "codes": codes[:h.shape[0]].contiguous()}
        try:  # the features are a cache: a failed write is said and the training goes on
            write_or_keep(path, lambda p: save_file(tensors, str(p)), "--features")
        except SSDError as err:
            log(f"warning: {err}")
    return h, ids


def stored(path, codes: torch.Tensor, compute, log=print) -> torch.Tensor:
    """A tensor computed for these grids, read from `path` when it holds it for them, else computed (and
    stored there, fp16)."""
    from safetensors.torch import load_file, save_file

    check_features_file(path or None, "stale features", ("h", "codes"))
    if path and Path(path).is_file():
        data = load_file(str(path))
        if data["codes"].shape == codes.shape and torch.equal(data["codes"], codes):
            log(f"{data['h'].shape[0]} grids' features read from {path}")
            return data["h"]
    t0 = time.time()
    h = compute()
    log(f"{h.shape[0]} grids' features: {time.time() - t0:.0f} s")
    if path:
        tensors = {"h": h.to(torch.float16).contiguous(), "codes": codes.contiguous()}
        try:
            write_or_keep(path, lambda p: save_file(tensors, str(p)), "--features (stale)")
        except SSDError as err:
            log(f"warning: {err}")
    return h


def train_heads(model, out_path, cfg: TrainConfig, settings: SamplerSettings | None = None, grids=None,
                grid_prompts=None, log=print, features=None, heldout_grids=None) -> tuple[DraftHeads, dict]:
    """Train both heads for `model` and write them to `out_path`; returns the heads and the report.

    grids/grid_prompts: training grids instead of sampling them; heldout_grids: (prompts, codes) to score
    on, else the last cfg.heldout grids; features: a file to store / reuse the training features in."""
    from accelerate import Accelerator

    if grids is None and cfg.samples < 1:
        raise SSDError("train-heads samples must be a whole number >= 1 when no grids are given (or pass grids)")
    check_output(out_path, "train-heads out", {".safetensors"})  # before any grid is sampled: the run is never lost
    check_features_file(features, "features")
    if features is not None and cfg.stale_share > 0:
        check_features_file(Path(features).with_suffix(f".stale{cfg.stale_share}.safetensors"), "stale features",
                            ("h", "codes"))
    if grids is not None and grid_prompts is not None and len(grid_prompts) != len(grids):
        raise SSDError(f"train-heads got {len(grids)} grids and {len(grid_prompts)} prompts: give one prompt (class) "
                       "per grid")
    accel = Accelerator(cpu=model.device.type == "cpu")
    torch.manual_seed(cfg.seed + accel.process_index)
    rng = random.Random(cfg.seed * 1000 + accel.process_index)
    d = getattr(model, "defaults", {})
    settings = settings or settings_from(d, cfg.seed)
    layout = model.layout(None)
    t0 = time.time()
    prompts, codes = (list(grid_prompts), grids) if grids is not None else ([], torch.zeros(0, layout.num_slots).long())
    if grids is None or cfg.samples > 0:  # self-distilled grids (held out from the end of these)
        total = cfg.samples + (cfg.heldout if heldout_grids is None else 0)
        share = math.ceil(total / accel.num_processes)
        sampled = sample_prompts(model, share, rng)
        log(f"generating {share} grids with the base model (process {accel.process_index})")
        prompts += sampled
        own = replace(settings, seed=settings.seed + accel.process_index)
        codes = torch.cat([codes, generate_grids(model, sampled, own, layout, cfg.gen_batch, log)])
    t_gen = time.time() - t0
    if heldout_grids is None:
        n_held = max(1, min(cfg.heldout, len(prompts) - 1))
        held_prompts, held_codes = prompts[-n_held:], codes[-n_held:]
        prompts, codes = prompts[:-n_held], codes[:-n_held]
    else:
        held_prompts, held_codes = heldout_grids
        n_held = len(held_prompts)
    for p in model.model.parameters():  # heads-only backward: the base model is frozen
        p.requires_grad_(False)
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(cfg.seed))  # a prefix is a sample
    prompts, codes = [prompts[i] for i in order.tolist()], codes[order]
    stop_at = None if not cfg.until else time.time() + 0.6 * (cfg.until - time.time())  # features: 60% at most
    h_train, ids_train = features_for(model, prompts, codes, settings, layout, cfg.gen_batch, features, log, stop_at)
    prompts, codes = prompts[:h_train.shape[0]], codes[:h_train.shape[0]]
    h_held, ids_held = collect_features(model, held_prompts, held_codes, settings, layout, cfg.gen_batch)
    stale_train = None
    if cfg.stale_share > 0:
        stale_train = stored(features and Path(features).with_suffix(f".stale{cfg.stale_share}.safetensors"), codes,
                             lambda: stale_features(model, prompts, h_train, ids_train, settings, layout,
                                                    cfg.stale_share, cfg.gen_batch, cfg.seed)[0], log)
    stale_held = stale_features(model, held_prompts, h_held, ids_held, settings, layout, cfg.stale_share or 0.2,
                                cfg.gen_batch, cfg.seed + 1)[0]
    heads = start_heads(model, cfg).to(model.device, model.dtype)
    learning = [p for name, p in heads.named_parameters()
                if cfg.train == "both" or name.startswith(cfg.train + ".")]  # the other head stays as it starts
    opt = torch.optim.AdamW(learning, lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = max(1, math.ceil(h_train.shape[0] / cfg.batch_grids))
    total_steps = steps_per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, steps_per_epoch * cfg.epochs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg.lr, total_steps=max(1, total_steps), pct_start=0.1)
    heads, opt = accel.prepare(heads, opt)
    t1 = time.time()
    step = 0
    for epoch in range(cfg.epochs):
        order = torch.randperm(h_train.shape[0])
        sums: dict[str, float] = {}
        n = 0
        for b in range(steps_per_epoch):
            if step >= total_steps or (cfg.until and time.time() >= cfg.until):
                break
            if cfg.until:  # one cycle over the time left: warm-up 10%, then cosine down
                frac = (time.time() - t1) / max(1.0, cfg.until - t1)
                for group in opt.param_groups:
                    group["lr"] = cfg.lr * (max(frac, 0.004) / 0.1 if frac < 0.1 else
                                            0.02 + 0.49 * (1 + math.cos(math.pi * (frac - 0.1) / 0.9)))
            idx = order[b * cfg.batch_grids:(b + 1) * cfg.batch_grids]
            losses = head_losses(model, accel.unwrap_model(heads), h_train[idx], ids_train[idx], layout, cfg, settings,
                                 None if stale_train is None else stale_train[idx])
            loss = sum(losses.values())
            opt.zero_grad()
            accel.backward(loss)
            opt.step()
            if not cfg.until:
                sched.step()
            step += 1
            n += 1
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v.item()
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                checkpoint(model, accel, heads, out_path, step, step * cfg.batch_grids, h_held, ids_held, stale_held,
                           layout, settings, time.time() - t1, log)
        log(f"epoch {epoch + 1}/{cfg.epochs} ({step} steps, {time.time() - t1:.0f} s): "
            + ", ".join(f"{k} {v / max(n, 1):.4f}" for k, v in sums.items()))
        if step >= total_steps or (cfg.until and time.time() >= cfg.until):
            break
    heads = accel.unwrap_model(heads).eval()
    report = {"samples": int(h_train.shape[0]), "heldout": n_held, "epochs": cfg.epochs, "steps": step,
              "batch_grids": cfg.batch_grids, "unroll": cfg.unroll, "kl_weight": cfg.kl_weight, "lr": cfg.lr,
              "ce_weight": cfg.ce_weight, "stale_share": cfg.stale_share, "vertical_left": cfg.vertical_left,
              "vertical_shift": cfg.vertical_shift, "init": Path(cfg.init).name if cfg.init else "random",
              "tv_weight": cfg.tv_weight,
              "trained": cfg.train,
              "generate_s": round(t_gen, 1), "train_s": round(time.time() - t1, 1)}
    report.update(agreement(model, heads, h_held, ids_held, layout))
    scores = heads_acceptance(model, heads, h_held, ids_held, layout, settings, h_stale=stale_held)
    report.update(scores)
    log(acceptance_lines(report))
    if accel.is_main_process:
        heads.extra.update({k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in report.items()})
        write_or_keep(out_path, heads.save, "--out")  # a failed write keeps the heads in the temp folder
    return heads, report


def start_heads(model, cfg: TrainConfig) -> DraftHeads:
    """Fresh heads for `model` (cfg.vertical_shift, cfg.vertical_left, cfg.vertical_intermediate), with random
    weights or those of the heads file cfg.init. An Hv warm-starts one that reads more (vertical_left) as itself:
    the new inputs' weights start at 0; a wider Hv starts as the init's too: its new units' output weights start at 0."""
    extra = {"vertical_shift": cfg.vertical_shift, "vertical_left": cfg.vertical_left}
    if cfg.init is None:
        if cfg.vertical_intermediate is not None:
            extra["vertical_intermediate_size"] = cfg.vertical_intermediate
        return DraftHeads.for_model(model, cfg.intermediate, **extra)
    from .heads import load_heads_file

    start = load_heads_file(cfg.init)
    start.check_model(model)
    if cfg.intermediate is not None and cfg.intermediate != start.intermediate:
        raise SSDError(f"train-heads init {Path(cfg.init).name} has intermediate size {start.intermediate}, not "
                       f"{cfg.intermediate}: leave the size out to keep the file's, or start from random weights")
    if start.vertical_left > cfg.vertical_left:
        raise SSDError(f"train-heads init {Path(cfg.init).name} has an Hv that reads the token on its left "
                       f"(vertical_left {start.vertical_left}): train with --vertical-left {start.vertical_left} (or "
                       "more), or start from other heads")
    width = cfg.vertical_intermediate or start.vertical_intermediate
    if width < start.vertical_intermediate:
        raise SSDError(f"train-heads init {Path(cfg.init).name} has an Hv of width {start.vertical_intermediate}, wider "
                       f"than the {width} asked: leave vertical_intermediate out, ask >= {start.vertical_intermediate}, "
                       "or start from random weights")
    if width != start.intermediate:
        extra["vertical_intermediate_size"] = width
    heads = DraftHeads.for_model(model, start.intermediate, **extra)
    weights, fresh = start.state_dict(), heads.state_dict()
    fuse = weights["vertical.fuse.weight"]  # [d, 2d], [d, 5d] or [d, 8d]: inputs appended at the end
    weights["vertical.fuse.weight"] = torch.cat([fuse, fuse.new_zeros(fuse.shape[0], heads.vertical.fuse.in_features
                                                                      - fuse.shape[1])], dim=1)
    for name in ("vertical.gate.weight", "vertical.up.weight"):  # new units: fresh input weights [width, d]
        weights[name] = torch.cat([weights[name], fresh[name][weights[name].shape[0]:]])
    down = weights["vertical.down.weight"]  # [d, width]: the new units add nothing yet
    weights["vertical.down.weight"] = torch.cat([down, down.new_zeros(down.shape[0], width - down.shape[1])], dim=1)
    heads.load_state_dict(weights)
    return heads


@torch.no_grad()
def checkpoint(model, accel, heads, out_path, step, seen, h_held, ids_held, stale_held, layout, settings, elapsed,
               log=print) -> None:
    """Mid-run: the held-out expected acceptance (also on stale Hv inputs) and the heads so far, saved beside
    out_path as *.step{N}.safetensors."""
    one = accel.unwrap_model(heads).eval()
    a = heads_acceptance(model, one, h_held, ids_held, layout, settings, h_stale=stale_held)
    line = (f"checkpoint step {step} ({seen} grids seen, {elapsed:.0f} s): expected {a['expected_acceptance']} "
            f"(stale {a['expected_acceptance_stale']}), Hh row0 {a['horizontal_row0_expected']}, "
            f"Hv {a['vertical_expected']} (stale {a['vertical_stale_expected']})")
    log(line)
    if accel.is_main_process:
        try:  # a failed checkpoint is said (and kept beside); the training goes on
            write_or_keep(Path(out_path).with_suffix(f".step{step}.safetensors"), one.save, "checkpoint")
        except SSDError as err:
            log(f"warning: {err}")
    one.train()


def acceptance_lines(report: dict) -> str:
    """The held-out acceptance figures as a few printable lines."""
    keys = [k for k in report if k.endswith(("_top1", "expected")) or "_depth_" in k or k.endswith("_guided")
            or k.endswith("_chain")]
    lines = ["held-out (" + str(report.get("heldout")) + " grids): " + ", ".join(f"{k} {report[k]}" for k in keys)]
    for k in ("horizontal_expected_by_depth", "vertical_expected_by_column"):
        if k in report:
            lines.append(f"{k}: " + " ".join(f"{v:.2f}" for v in report[k]))
    return "\n".join(lines)


def check_features_file(path, flag: str = "--features", keys=("h", "ids", "codes")) -> None:
    """A features file to store or reuse: a new .safetensors file in a folder that takes files, or one that
    train-heads wrote (its tensors `keys`). Any other file (grids, heads, a pickle) is refused, never read as
    features nor overwritten."""
    if path is None:
        return
    check_output(path, flag, {".safetensors"})
    path = Path(path)
    if not path.exists():
        return
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:  # the header only, however large the file
            have = sorted(f.keys())
    except Exception as err:
        reason = " ".join(str(err).split())[:80]
        raise SSDError(f"{flag} {path} is not a safetensors file ({reason}): give a new file name (the features are "
                       "stored there) or a features file train-heads wrote") from None
    if not set(keys) <= set(have):
        shown = ", ".join(have[:5]) + (" ..." if len(have) > 5 else "")
        raise SSDError(f"{flag} {path} holds [{shown}], not the features train-heads stores ({', '.join(keys)}): is it a "
                       "grids or heads file? Give a new file name: the features are stored there")


def read_grids(path, model) -> tuple[list, torch.Tensor]:
    """Training grids from safetensors files (comma-separated paths): `tokens` [N, H, W] image codes and
    `classes` [N] -> (prompts, per-slot codes [N, L] with -1 at forced slots). Every file is checked whole
    (codes within the model's image vocabulary, one class per grid, classes of the model) before any is used."""
    from safetensors.torch import load_file

    prompts, out = [], []
    vocab = int(model.image_vocab_size)
    classes_known = len(model.class_names) if getattr(model, "class_names", None) else None
    for one in str(path).split(","):
        try:
            data = load_file(one)
        except Exception as err:
            raise SSDError(f"cannot read training grids from {one} ({err}): give a safetensors file with "
                           "'tokens' [N, H, W] and 'classes' [N]") from None
        if "tokens" not in data or "classes" not in data:
            raise SSDError(f"{one} needs the tensors 'tokens' [N, H, W] and 'classes' [N]; it has {sorted(data)}")
        tokens, classes = data["tokens"], data["classes"]
        for name, t, dims in (("tokens", tokens, 3), ("classes", classes, 1)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise SSDError(f"{one}: '{name}' must hold whole numbers (an integer tensor), it is {t.dtype}; "
                               "write it as int64")
            if t.dim() != dims:
                raise SSDError(f"{one}: '{name}' must be {'[N, H, W]' if dims == 3 else '[N]'}, it has shape "
                               f"{list(t.shape)}")
        if tokens.shape[0] == 0:
            raise SSDError(f"{one} holds no grids (tokens {list(tokens.shape)}): give a file with at least one grid")
        if classes.shape[0] != tokens.shape[0]:
            raise SSDError(f"{one} has {tokens.shape[0]} grids but {classes.shape[0]} classes: 'classes' needs one "
                           "class per grid, in the order of 'tokens'")
        tokens, classes = tokens.long(), classes.long()
        bad = ((tokens < 0) | (tokens >= vocab)).nonzero()
        if len(bad):
            n, y, x = bad[0].tolist()
            raise SSDError(f"{one}: token {int(tokens[n, y, x])} (grid {n}, row {y}, column {x}) is not an image code "
                           f"of this model (0..{vocab - 1}); {len(bad)} such token(s): were the grids made for "
                           "another model?")
        if classes_known is not None:
            wrong = ((classes < 0) | (classes >= classes_known)).nonzero()
            if len(wrong):
                i = int(wrong[0])
                raise SSDError(f"{one}: class {int(classes[i])} (grid {i}) is not a class of this model "
                               f"(0..{classes_known - 1})")
        layout = model.layout(tuple(tokens.shape[1:]))
        if layout.grid != model.default_grid:
            raise SSDError(f"the grids in {one} are {layout.grid[0]}x{layout.grid[1]}; heads train on the model's "
                           f"{model.default_grid[0]}x{model.default_grid[1]} grid")
        codes = torch.full((tokens.shape[0], layout.num_slots), -1, dtype=torch.long)
        codes[:, layout.slot_of_cell] = tokens.flatten(1)
        prompts += [int(c) for c in classes]
        out.append(codes)
    return prompts, torch.cat(out)
