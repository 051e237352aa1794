"""The optimisation loop of heads training: losses, the one-cycle schedule, data-parallel steps, checkpoints,
resume, and the held-out report written into the heads file.

The base model is frozen; only the heads learn: Smooth-L1 on features, plus a KL of the model's processed
guided distribution p (cfg, temperature, top-k/top-p) against the draft's guided distribution q (cfg,
temperature) through the frozen image head, and optionally the drafts' expected rejection 1 - sum min(p, q);
Hh unrolled on its own outputs along every row (`unroll`: chain depth, 1 = teacher-forced pairs only). The
report: expected acceptance sum_v min(p, q) per head, by Hh chain depth and by column (ssd_core.acceptance),
with top-1 agreement beside it, on held-out grids.

A run is a pure function of its settings and data: the heads start from the seed (or --init), epoch e visits
the grids in an order drawn from (seed, e), the learning rate and Adam's beta1 follow the step number, and a
stale-input batch draws its changed tokens from (seed, step). So the state saved every `checkpoint_every`
steps and at SIGTERM / SIGINT (heads, Adam's moments, the step) is all a resumed run needs to end with the
same heads as a run never stopped (the state's file: state.py).
"""
from __future__ import annotations

import json
import math
import signal
import threading
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from ..acceptance import guided_logp, heads_acceptance, horizontal_chain, vertical_drafts
from ..errors import SSDError
from ..heads import DraftHeads
from ..outputs import check_output, write_or_keep
from ..sampling import SamplerSettings, guide, seeded_generator, settings_from
from ..session import Layout
from . import data, dist
from . import features as feature_sources
from .config import TrainConfig
from .prompts import prompt_order, prompt_source
from .shards import Shards, default_folder
from .state import check_state, load_state, save_state, state_path, state_tensors

DIV_FACTOR, FINAL_DIV, PCT_START, BETA1_HIGH, BETA1_LOW = 25.0, 1e4, 0.1, 0.95, 0.85  # torch's OneCycleLR defaults


def train_heads(model, out_path, cfg: TrainConfig, settings: SamplerSettings | None = None, grids=None,
                grid_prompts=None, log=print, features=None, heldout_grids=None, prompts=None, shards=None,
                resume: bool = False, group: dist.Group | None = None) -> tuple[DraftHeads, dict]:
    """Train both heads for `model` and write them to `out_path`; returns the heads and the report.

    grids / grid_prompts: training grids (codes [N, L], a prompt or class each) besides the self-distilled
    ones (cfg.samples; 0: these only); prompts: the texts to self-distil from (default: the shipped list);
    shards: the folder of the self-distilled grids (default: beside out_path); heldout_grids: (prompts, codes)
    to score on, else the last cfg.heldout grids; features: a file to store / reuse the training features in
    (else streamed a batch at a time); resume: continue the run whose state is saved beside out_path."""
    plan = _prepare(model, out_path, cfg, settings, grids, grid_prompts, features, prompts, shards, resume, group,
                    heldout_grids)
    group, settings, layout = plan["group"], plan["settings"], plan["layout"]
    t0 = time.time()
    prompts_all, codes, made = _grids(model, cfg, plan, grids, grid_prompts, heldout_grids, log)
    t_gen = time.time() - t0
    if heldout_grids is None:  # _prepare made sure the grids hold cfg.heldout of them and at least one more
        n_held = cfg.heldout
        held_prompts, held_codes = prompts_all[-n_held:], codes[-n_held:]
        prompts_all, codes = prompts_all[:-n_held], codes[:-n_held]
    else:
        held_prompts, held_codes = heldout_grids
        n_held = len(held_prompts)
    for p in model.model.parameters():  # heads-only backward: the base model is frozen
        p.requires_grad_(False)
    order = torch.randperm(len(prompts_all), generator=torch.Generator().manual_seed(cfg.seed % 2**63))
    prompts_all, codes = [prompts_all[i] for i in order.tolist()], codes[order]  # a prefix is a sample
    if features is not None:
        stop_at = None if not cfg.until else time.time() + 0.6 * (cfg.until - time.time())  # features: 60% at most
        source, n = feature_sources.features_file(features, model, prompts_all, codes, settings, layout,
                                                  cfg.gen_batch, stop_at, log)
        prompts_all, codes = prompts_all[:n], codes[:n]
    else:
        source = feature_sources.Streamed(model, prompts_all, codes, settings, layout)
    held = None
    if group.is_main:  # the held-out grids' features (--heldout of them) stay in memory for the scores
        h_held, ids_held = data.collect_features(model, held_prompts, held_codes.long(), settings, layout,
                                                 cfg.gen_batch)
        stale_held = data.stale_features(model, held_prompts, h_held, ids_held, settings, layout,
                                         cfg.stale_share or 0.2, cfg.gen_batch, cfg.seed + 1)[0]
        held = (h_held, ids_held, stale_held)
    torch.manual_seed(cfg.seed % 2**63)  # the same heads in every process
    heads = start_heads(model, cfg).to(model.device, model.dtype)
    identity = {"config": cfg.run_identity(), "settings": data.settings_record(settings),
                "model": data.model_identity(model),
                "data": {"grids": len(prompts_all), "codes": data.codes_digest(codes), "heldout": n_held}}
    step, t1, kept = _optimise(model, heads, cfg, settings, layout, source, prompts_all, group, held, identity,
                               out_path, resume, log)
    heads = heads.eval()
    report = {"samples": len(prompts_all), "heldout": n_held, "epochs": cfg.epochs, "steps": step,
              "batch_grids": cfg.batch_grids, "unroll": cfg.unroll, "kl_weight": cfg.kl_weight, "lr": cfg.lr,
              "ce_weight": cfg.ce_weight, "stale_share": cfg.stale_share, "vertical_left": cfg.vertical_left,
              "vertical_shift": cfg.vertical_shift, "init": Path(cfg.init).name if cfg.init else "random",
              "tv_weight": cfg.tv_weight, "trained": cfg.train, "processes": group.world,
              "base_model": identity["model"]["name"], "base_dtype": identity["model"]["dtype"],
              "base_quantization": identity["model"]["quantization"], **made,
              "generate_s": round(t_gen, 1), "train_s": round(time.time() - t1, 1)}
    if not group.is_main:
        return heads, report
    report.update(agreement(model, heads, held[0], held[1], layout))
    report.update(_scores(model, heads, held, layout, settings, cfg, step, kept))
    log(acceptance_lines(report))
    heads.extra.update({k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in report.items()})
    write_or_keep(out_path, heads.save, "--out")  # a failed write keeps the heads in the temp folder
    state_path(out_path).unlink(missing_ok=True)  # the run is done: nothing left to resume
    return heads, report


def _prepare(model, out_path, cfg, settings, grids, grid_prompts, features, prompts, shards, resume, group,
             heldout_grids=None) -> dict:
    """Every input checked (and the shards folder, the features file's room, the state to resume) before any
    grid is sampled: a long run is never lost to a bad path."""
    if grids is None and cfg.samples < 1:
        raise SSDError("train-heads samples must be a whole number >= 1 when no grids are given (or pass grids)")
    check_output(out_path, "train-heads out", {".safetensors"})
    data.check_features_file(features, "features")
    if grids is not None and grid_prompts is not None and len(grid_prompts) != len(grids):
        raise SSDError(f"train-heads got {len(grids)} grids and {len(grid_prompts)} prompts: give one prompt (class) "
                       "per grid")
    group = group or dist.from_environment(model.device.type)
    if features is not None and group.world > 1:
        raise SSDError("--features (a file of every grid's features, for small models) takes one process: with "
                       f"{group.world} processes leave it out (each streams its share's features)")
    settings = settings or settings_from(getattr(model, "defaults", {}), cfg.seed)
    layout = model.layout(None)
    plan = {"group": group, "settings": settings, "layout": layout, "shards": None}
    if grids is None or cfg.samples > 0:
        texts, name = prompt_source(model, prompts)
        plan["shards"] = Shards(shards or default_folder(out_path), model, settings, texts, name, cfg.shard_grids)
        plan["shards"].check_folder()
        plan["texts"], plan["prompts_from"] = texts, name
    elif prompts is not None:
        raise SSDError("--prompts is for self-distilled grids: with --samples 0 only the --grids files are used")
    n_train = _check_heldout(cfg, grids, heldout_grids)
    if resume:  # refused now, not after the grids and features, when the saved run is another
        if not state_path(out_path).is_file():
            raise SSDError(f"--resume: no saved run state {state_path(out_path)} (a run saves it every "
                           "--checkpoint-every steps and when stopped by SIGTERM or Ctrl-C): run without --resume")
        check_state(state_path(out_path), {"config": cfg.run_identity(), "settings": data.settings_record(settings),
                                           "model": data.model_identity(model)}, run_steps(n_train, cfg))
        with torch.random.fork_rng(devices=[]):  # heads of this run's shapes, to check the saved ones against
            template = start_heads(model, cfg)
        state_tensors(state_path(out_path), template, _optimiser(template, cfg))
    if features is not None:
        n = (0 if grids is None else len(grids)) + cfg.samples
        feature_sources.check_room(features, n, 2 if settings.guided else 1, layout.num_slots, model.hidden_size)
    return plan


def _check_heldout(cfg, grids, heldout_grids) -> int:
    """The held-out grids as asked, or one SSDError line (never fewer held out than asked, never none trained
    on); returns how many grids the heads train on (fewer with --features and --until)."""
    given = 0 if grids is None else len(grids)
    if heldout_grids is not None:
        if len(heldout_grids[0]) < 1:
            raise SSDError("train-heads heldout_grids holds no grids: give at least one to score the heads on")
        return given + cfg.samples
    if cfg.heldout < 1:
        raise SSDError("train-heads heldout 0: the heads are scored on held-out grids: give --heldout 1 or more "
                       "(e.g. 16), or --heldout-grids FILE")
    if cfg.samples == 0 and cfg.heldout >= given:
        raise SSDError(f"train-heads heldout {cfg.heldout}: the --grids files hold {given} grid(s), and the held-out "
                       f"grids come from them with at least one left to train on: give --heldout {max(1, given - 1)} "
                       "or less, more grids, --samples N (self-distilled grids, held out from those), or "
                       "--heldout-grids FILE")
    return given + cfg.samples if cfg.samples else given - cfg.heldout  # self-distilled: held out from those


def run_steps(n: int, cfg) -> int:
    """Optimiser steps of a run on n grids: every epoch's batches, at most cfg.max_steps."""
    per_epoch = max(1, math.ceil(n / cfg.batch_grids))
    return per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)


def _grids(model, cfg, plan, grids, grid_prompts, heldout_grids, log) -> tuple[list, torch.Tensor, dict]:
    """The run's grids: those given, then the self-distilled ones (made into shards by every process, its
    share each, then read by all)."""
    group, layout = plan["group"], plan["layout"]
    prompts_all = list(grid_prompts) if grids is not None else []
    codes = grids.to(torch.int32) if grids is not None else torch.zeros(0, layout.num_slots, dtype=torch.int32)
    made = {}
    if plan["shards"] is not None:
        total = cfg.samples + (cfg.heldout if heldout_grids is None else 0)
        order = prompt_order(len(plan["texts"]), total, cfg.seed)
        made = plan["shards"].make(total, order, layout, cfg.gen_batch, group.rank, group.world, log)
        group.barrier()  # every shard written before any process reads them
        more, index, _ = plan["shards"].read(total, layout)
        prompts_all += [plan["texts"][i] for i in index]
        codes = torch.cat([codes, more])
        made = {"self_distilled": total, "grids_made_here": made["grids_made"], "prompts": plan["prompts_from"]}
    return prompts_all, codes, made


def _optimise(model, heads, cfg, settings, layout, source, prompts_all, group, held, identity, out_path, resume,
              log) -> tuple[int, float, Path | None]:
    """The steps: each process takes its share of every batch; returns (steps done, their start time, the last
    checkpoint's heads file or None). A loss that turns NaN or infinite stops the run there (SSDError)."""
    opt = _optimiser(heads, cfg)
    learning = opt.param_groups[0]["params"]
    n = len(source)
    per_epoch = max(1, math.ceil(n / cfg.batch_grids))
    total = run_steps(n, cfg)
    step = 0
    if resume:
        step = load_state(state_path(out_path), heads, opt, identity, total)
        log(f"resumed at step {step} of {total} from {state_path(out_path)}")
    stop = Stop()
    t1 = time.time()
    sums: dict[str, float] = {}
    count, orders, kept = 0, {}, None
    try:
        while step < total:
            epoch, b = divmod(step, per_epoch)
            frac = (time.time() - t1) / max(1.0, cfg.until - t1) if cfg.until else 0.0
            asked, frac = group.agree([1.0 if stop.asked else 0.0, frac])
            if cfg.until and (frac >= 1.0 or time.time() >= cfg.until):
                break
            if asked:
                if group.is_main:
                    save_state(state_path(out_path), heads, opt, step, identity, log)
                log(f"stopped by {stop.asked or 'another process'} after step {step} of {total}: the run's state is in "
                    f"{state_path(out_path)}; rerun with --resume to continue")
                raise KeyboardInterrupt
            lr, beta1 = (clock_lr(frac, cfg.lr), BETA1_HIGH) if cfg.until else one_cycle(step, total, cfg.lr)
            for g in opt.param_groups:
                g["lr"], g["betas"] = lr, (beta1, g["betas"][1])
            if epoch not in orders:
                orders = {epoch: epoch_order(n, cfg.seed, epoch)}
            idx = orders[epoch][b * cfg.batch_grids:(b + 1) * cfg.batch_grids].tolist()
            mine = idx[group.rank::group.world]
            opt.zero_grad()
            losses, values, h = {}, {}, None
            if mine:
                h, ids = source.batch(mine)
                stale = None
                if cfg.stale_share > 0:
                    stale = data.stale_features(model, [prompts_all[i] for i in mine], h, ids, settings, layout,
                                                cfg.stale_share, len(mine), cfg.seed * 1_000_003 + step)[0]
                losses = head_losses(model, heads, h, ids, layout, cfg, settings, stale)
                values = {k: v.item() for k, v in losses.items()}
            bad = next(((k, v) for k, v in values.items() if not math.isfinite(v)), None)
            if group.agree([0.0 if bad is None else 1.0])[0]:  # every process stops at the same step
                raise SSDError(_diverged(step + 1, total, bad, lr, cfg, kept, h))
            if losses:
                sum(losses.values()).backward()
                for k, v in values.items():
                    sums[k] = sums.get(k, 0.0) + v
            group.average_gradients(learning, len(mine) / len(idx))
            opt.step()
            step += 1
            count += 1
            if b == per_epoch - 1 or step == total:
                log(f"epoch {epoch + 1}/{cfg.epochs} ({step} steps, {time.time() - t1:.0f} s): "
                    + ", ".join(f"{k} {v / max(count, 1):.4f}" for k, v in sums.items()))
                sums, count = {}, 0
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and group.is_main:
                kept = checkpoint(model, heads, out_path, step, step * cfg.batch_grids, held, layout, settings,
                                  time.time() - t1, cfg, kept, log) or kept
                save_state(state_path(out_path), heads, opt, step, identity, log)
    finally:
        stop.restore()
    return step, t1, kept


def _optimiser(heads, cfg) -> torch.optim.AdamW:
    """AdamW over the heads that learn (cfg.train; the other head stays as it starts)."""
    learning = [p for name, p in heads.named_parameters() if cfg.train == "both" or name.startswith(cfg.train + ".")]
    return torch.optim.AdamW(learning, lr=cfg.lr, weight_decay=0.0)


def _diverged(step: int, total: int, bad, lr: float, cfg, kept, h) -> str:
    """The one line of a run stopped by a NaN / infinite loss at `step`: where, why and what to do."""
    if h is not None and bad is not None and not bool(torch.isfinite(h).all()):
        return (f"the base model's features of the grids of step {step} are NaN or infinite, so the heads cannot "
                "learn from them: load the model with --dtype fp32 (fp16 overflows on some models); if that does "
                "not help, its weights are damaged: re-download them")
    what = f"the {bad[0]} loss is {bad[1]}" if bad is not None else "another process's loss is NaN or infinite"
    return (f"training diverged at step {step} of {total}: {what} (learning rate {lr:.3g} there, --lr {cfg.lr:g}); "
            f"stopped: train again with a lower --lr, e.g. {cfg.lr / 10:g}" + _kept_line(kept))


def _kept_line(kept) -> str:
    if kept is None:
        return "; no heads were written (--checkpoint-every N keeps the heads every N steps)"
    return f"; the last checkpoint's heads are kept in {kept}"


def _scores(model, heads, held, layout, settings, cfg, step: int, kept) -> dict:
    """heads_acceptance on the held-out grids; NaN or infinite drafts there (the model's own logits of those
    grids are finite: they were scored when the run started) mean the training diverged: one SSDError line."""
    h_held, ids_held, stale_held = held
    try:
        return heads_acceptance(model, heads, h_held, ids_held, layout, settings, h_stale=stale_held)
    except SSDError as err:  # sampling.check_finite's line (it blames the model: it cannot tell the drafts' source)
        if "NaN or infinite" not in str(err):
            raise
        raise SSDError(f"training diverged by step {step}: the heads give NaN or infinite drafts on the held-out "
                       f"grids; stopped: train again with a lower --lr than {cfg.lr:g}, e.g. {cfg.lr / 10:g}"
                       + _kept_line(kept)) from None


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


def start_heads(model, cfg: TrainConfig) -> DraftHeads:
    """Fresh heads for `model` (cfg.vertical_shift, cfg.vertical_left, cfg.vertical_intermediate), with random
    weights or those of the heads file cfg.init. An Hv warm-starts one that reads more (vertical_left) as itself:
    the new inputs' weights start at 0; a wider Hv starts as the init's too: its new units' output weights start at 0."""
    extra = {"vertical_shift": cfg.vertical_shift, "vertical_left": cfg.vertical_left}
    if cfg.init is None:
        if cfg.vertical_intermediate is not None:
            extra["vertical_intermediate_size"] = cfg.vertical_intermediate
        return DraftHeads.for_model(model, cfg.intermediate, **extra)
    from ..heads import load_heads_file

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


def one_cycle(step: int, total: int, lr: float) -> tuple[float, float]:
    """(learning rate, Adam's beta1) of optimiser step `step` (0-based) of `total`: torch's OneCycleLR with
    its defaults (warm-up over the first 10% from lr/25 to lr, then cosine down to lr/25e4; beta1 from 0.95
    down to 0.85 and back), as a function of the step alone (nothing else to save or restore)."""
    def cos(start, end, pct):
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    low, floor = lr / DIV_FACTOR, lr / DIV_FACTOR / FINAL_DIV
    first_end, last_end = float(PCT_START * total) - 1, total - 1
    if step <= first_end:
        pct = step / first_end if first_end > 0 else 1.0
        return cos(low, lr, pct), cos(BETA1_HIGH, BETA1_LOW, pct)
    span = last_end - first_end
    pct = (step - first_end) / span if span > 0 else 1.0
    return cos(lr, floor, pct), cos(BETA1_LOW, BETA1_HIGH, pct)


def clock_lr(frac: float, lr: float) -> float:
    """The learning rate at share `frac` of the time to --until: warm-up 10%, then cosine down."""
    return lr * (max(frac, 0.004) / 0.1 if frac < 0.1 else 0.02 + 0.49 * (1 + math.cos(math.pi * (frac - 0.1) / 0.9)))


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=seeded_generator(seed * 1_000_003 + epoch))


class Stop:
    """SIGTERM / SIGINT while the heads train: the step in progress ends, the state is saved, the run stops
    (a second signal stops at once). Only in the main thread (signal handlers live there)."""

    def __init__(self):
        self.asked = None
        self.before = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.before[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.asked is not None:
            raise KeyboardInterrupt
        self.asked = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler)


@torch.no_grad()
def checkpoint(model, heads, out_path, step, seen, held, layout, settings, elapsed, cfg, kept=None,
               log=print) -> Path | None:
    """Mid-run: the held-out expected acceptance (also on stale Hv inputs) and the heads so far, saved beside
    out_path as *.step{N}.safetensors; returns that file (None when its write failed). Heads whose drafts are
    NaN or infinite are never saved: the run stops (SSDError, naming `kept`, the last checkpoint)."""
    heads.eval()
    a = _scores(model, heads, held, layout, settings, cfg, step, kept)
    log(f"checkpoint step {step} ({seen} grids seen, {elapsed:.0f} s): expected {a['expected_acceptance']} "
        f"(stale {a['expected_acceptance_stale']}), Hh row0 {a['horizontal_row0_expected']}, "
        f"Hv {a['vertical_expected']} (stale {a['vertical_stale_expected']})")
    path = None
    try:  # a failed checkpoint is said (and kept beside); the training goes on
        path = write_or_keep(Path(out_path).with_suffix(f".step{step}.safetensors"), heads.save, "checkpoint")
    except SSDError as err:
        log(f"warning: {err}")
    heads.train()
    return path


def acceptance_lines(report: dict) -> str:
    """The held-out acceptance figures as a few printable lines."""
    keys = [k for k in report if k.endswith(("_top1", "expected", "_guided", "_chain")) or "_depth_" in k]
    lines = ["held-out (" + str(report.get("heldout")) + " grids): " + ", ".join(f"{k} {report[k]}" for k in keys)]
    for k in ("horizontal_expected_by_depth", "vertical_expected_by_column"):
        if k in report:
            lines.append(f"{k}: " + " ".join(f"{v:.2f}" for v in report[k]))
    return "\n".join(lines)
