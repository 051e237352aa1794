"""Self-distillation of the draft heads on grids the base model generates itself.

1. grids: the base model samples its own images (batched AR with CFG), or they are read from a file;
2. features: one teacher-forced forward per grid collects the pre-norm last-layer features of both
   CFG streams;
3. heads: Smooth-L1 on features (+ a small cross-entropy of the draft token through the frozen head);
4. report: per-head top-1 agreement with the base model on held-out grids; write the heads file.
Runs as one process on a CPU, or under `accelerate launch` on several GPUs (data parallel).
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .heads import DraftHeads
from .sampling import SamplerSettings, sample_logits
from .session import Layout, stack_prompts


@dataclass
class TrainConfig:
    samples: int = 256
    heldout: int = 16
    epochs: int = 4
    batch_grids: int = 8
    lr: float = 2e-3
    ce_weight: float = 0.1
    seed: int = 0
    gen_batch: int = 8
    intermediate: int | None = None

    def __post_init__(self):  # every value checked before any grid is sampled
        from .errors import SSDError

        for name, low in (("samples", 1), ("heldout", 0), ("epochs", 1), ("batch_grids", 1), ("gen_batch", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < low:
                raise SSDError(f"train-heads {name} must be a whole number >= {low}, got {value}")
        if self.samples + self.heldout < 2:
            raise SSDError("train-heads needs at least 2 grids (samples + heldout): one to train on, one held out")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise SSDError(f"train-heads lr must be a number > 0 (e.g. 2e-3), got {self.lr}")
        if not (math.isfinite(self.ce_weight) and self.ce_weight >= 0):
            raise SSDError(f"train-heads ce_weight must be a number >= 0, got {self.ce_weight}")


def sample_prompts(model, n: int, rng: random.Random) -> list:
    if model.class_names is not None or hasattr(model, "class_id"):
        num = int(model.spec["num_classes"]) if hasattr(model, "spec") else len(model.class_names)
        return [rng.randrange(num) for _ in range(n)]
    return [rng.choice(getattr(model, "training_prompts", ["a photo"])) for _ in range(n)]


@torch.no_grad()
def generate_grids(model, prompts: list, settings: SamplerSettings, layout: Layout, batch: int = 8,
                   log=print) -> torch.Tensor:
    """Batched AR sampling with CFG: [N, L] codes per slot (-1 at forced slots)."""
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
                     batch: int = 8):
    """Teacher-forced pre-norm features of both streams: h [N*B_s, L+1, d] (index 0 = prompt end), ids."""
    feats, ids_all = [], []
    for b in range(0, len(prompts), batch):
        chunk, c = prompts[b:b + batch], codes[b:b + batch]
        prompt = stack_prompts([model.build_prompt(p, "", settings.guided, layout.grid) for p in chunk])
        ids = torch.where(layout.forced[None] >= 0, layout.forced[None].expand_as(c), model.code_to_id(c.clamp(min=0)))
        session = model.start(prompt)
        rows = ids.repeat(2, 1) if settings.guided else ids
        h = session.forward(rows)  # [B, L, d]
        h = torch.cat([session.last_features[:, None], h], dim=1)  # index j+1 = features at slot j
        feats.append(h.float().cpu())
        ids_all.append(rows)
    return torch.cat(feats), torch.cat(ids_all)


def pair_indices(layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Horizontal pairs: every slot s (input h[s-1], e[s] -> h[s]); vertical: image cells with a cell below."""
    H, W = layout.grid
    horizontal = torch.arange(layout.num_slots)
    if H > 1:
        cells = layout.slot_of_cell.view(H, W)
        vertical = torch.stack([cells[:-1].flatten(), cells[1:].flatten()], 1)  # (slot, slot below)
    else:
        vertical = torch.zeros(0, 2, dtype=torch.long)
    return horizontal, vertical


def head_losses(model, heads: DraftHeads, h: torch.Tensor, ids: torch.Tensor, layout: Layout, ce_weight: float,
                image_mask: torch.Tensor):
    """Smooth-L1 (+ CE through the frozen head) for both heads on a batch of sequences h [b, L+1, d]."""
    dev, dtype = model.device, model.dtype
    h = h.to(dev, dtype)
    e = model.embed(ids.to(dev))  # [b, L, d]
    hz, vt = pair_indices(layout)
    losses = {}
    pred_h = heads.horizontal(h[:, hz], e[:, hz])  # predicts h at slot s (index s+1)
    target_h = h[:, hz + 1]
    losses["horizontal"] = F.smooth_l1_loss(pred_h.float(), target_h.float())
    if vt.numel():
        pred_v = heads.vertical(h[:, vt[:, 0] + 1], e[:, vt[:, 0]])
        losses["vertical"] = F.smooth_l1_loss(pred_v.float(), h[:, vt[:, 1] + 1].float())
    if ce_weight > 0:  # the token each predicted feature drafts: slot s+1 for h[s]
        nxt = hz[:-1][image_mask[1:]]
        logits = model.image_logits(pred_h[:, nxt])
        target = model.image_logits(h[:, nxt + 1]).argmax(-1)
        losses["ce_h"] = ce_weight * F.cross_entropy(logits.flatten(0, 1), target.flatten())
        if vt.numel():
            below = vt[:, 1]
            ok = (below + 1 < layout.num_slots) & image_mask[(below + 1).clamp(max=layout.num_slots - 1)]
            lv = model.image_logits(pred_v[:, ok])
            tv = model.image_logits(h[:, below[ok] + 1]).argmax(-1)
            losses["ce_v"] = ce_weight * F.cross_entropy(lv.flatten(0, 1), tv.flatten())
    return losses


@torch.no_grad()
def agreement(model, heads: DraftHeads, h: torch.Tensor, ids: torch.Tensor, layout: Layout) -> dict:
    """Top-1 agreement of each head's draft token with the base model's own top-1 (held-out grids)."""
    dev, dtype = model.device, model.dtype
    h = h.to(dev, dtype)
    e = model.embed(ids.to(dev))
    image = layout.forced < 0
    hz, vt = pair_indices(layout)
    nxt = hz[:-1][image[1:]]
    a_h = (model.image_logits(heads.horizontal(h[:, nxt], e[:, nxt])).argmax(-1)
           == model.image_logits(h[:, nxt + 1]).argmax(-1)).float().mean().item()
    out = {"horizontal_top1": round(a_h, 4)}
    if vt.numel():
        below = vt[:, 1]
        ok = (below + 1 < layout.num_slots) & image[(below + 1).clamp(max=layout.num_slots - 1)]
        pv = heads.vertical(h[:, vt[ok, 0] + 1], e[:, vt[ok, 0]])
        a_v = (model.image_logits(pv).argmax(-1) == model.image_logits(h[:, below[ok] + 1]).argmax(-1)).float().mean()
        out["vertical_top1"] = round(a_v.item(), 4)
    return out


def train_heads(model, out_path, cfg: TrainConfig, settings: SamplerSettings | None = None, grids=None,
                grid_prompts=None, log=print) -> tuple[DraftHeads, dict]:
    """Train both heads for `model` and write them to `out_path`; returns the heads and the report."""
    from accelerate import Accelerator

    accel = Accelerator(cpu=model.device.type == "cpu")
    torch.manual_seed(cfg.seed + accel.process_index)
    rng = random.Random(cfg.seed * 1000 + accel.process_index)
    d = getattr(model, "defaults", {})
    settings = settings or SamplerSettings(cfg.seed, d.get("cfg", 1.0), d.get("temperature", 1.0),
                                           d.get("top_k", 0), d.get("top_p", 1.0))
    layout = model.layout(None)
    total = cfg.samples + cfg.heldout
    t0 = time.time()
    if grids is None:
        share = math.ceil(total / accel.num_processes)
        prompts = sample_prompts(model, share, rng)
        log(f"generating {share} grids with the base model (process {accel.process_index})")
        codes = generate_grids(model, prompts, SamplerSettings(settings.seed + accel.process_index, settings.cfg,
                               settings.temperature, settings.top_k, settings.top_p), layout, cfg.gen_batch, log)
    else:
        prompts, codes = list(grid_prompts), grids
    t_gen = time.time() - t0
    n_held = max(1, min(cfg.heldout, len(prompts) - 1))
    h_train, ids_train = collect_features(model, prompts[:-n_held], codes[:-n_held], settings, layout, cfg.gen_batch)
    h_held, ids_held = collect_features(model, prompts[-n_held:], codes[-n_held:], settings, layout, cfg.gen_batch)
    per = 2 if settings.guided else 1  # feature rows per grid: the conditional and unconditional streams
    heads = DraftHeads.for_model(model, cfg.intermediate).to(model.device, model.dtype)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = max(1, math.ceil(h_train.shape[0] / cfg.batch_grids))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg.lr, total_steps=steps_per_epoch * cfg.epochs, pct_start=0.1)
    heads, opt = accel.prepare(heads, opt)
    image = layout.forced < 0
    t1 = time.time()
    for epoch in range(cfg.epochs):
        order = torch.randperm(h_train.shape[0])
        sums: dict[str, float] = {}
        for b in range(steps_per_epoch):
            idx = order[b * cfg.batch_grids:(b + 1) * cfg.batch_grids]
            losses = head_losses(model, accel.unwrap_model(heads), h_train[idx], ids_train[idx], layout,
                                 cfg.ce_weight, image)
            loss = sum(losses.values())
            opt.zero_grad()
            accel.backward(loss)
            opt.step()
            sched.step()
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v.item() / steps_per_epoch
        log(f"epoch {epoch + 1}/{cfg.epochs}: " + ", ".join(f"{k} {v:.4f}" for k, v in sums.items()))
    heads = accel.unwrap_model(heads).eval()
    report = {"samples": int(h_train.shape[0] // per), "heldout": n_held, "epochs": cfg.epochs,
              "generate_s": round(t_gen, 1), "train_s": round(time.time() - t1, 1)}
    report.update(agreement(model, heads, h_held, ids_held, layout))
    log("held-out agreement: " + ", ".join(f"{k} {v}" for k, v in report.items() if k.endswith("top1")))
    if accel.is_main_process:
        heads.extra.update({k: str(v) for k, v in report.items()})
        heads.save(out_path)
    return heads, report


def read_grids(path, model) -> tuple[list, torch.Tensor]:
    """Training grids from a safetensors file: `tokens` [N, H, W] image codes and `classes` [N]
    -> (prompts, per-slot codes [N, L] with -1 at forced slots) for `train_heads(grids=..., grid_prompts=...)`."""
    from safetensors.torch import load_file

    from .errors import SSDError

    try:
        data = load_file(str(path))
    except Exception as err:
        raise SSDError(f"cannot read training grids from {path} ({err}): give a safetensors file with "
                       "'tokens' [N, H, W] and 'classes' [N]") from None
    if "tokens" not in data or "classes" not in data:
        raise SSDError(f"{path} needs the tensors 'tokens' [N, H, W] and 'classes' [N]; it has {sorted(data)}")
    tokens, classes = data["tokens"].long(), data["classes"].long()
    layout = model.layout(tuple(tokens.shape[1:]))
    if layout.grid != model.default_grid:
        raise SSDError(f"the grids in {path} are {layout.grid[0]}x{layout.grid[1]}; heads train on the model's "
                       f"{model.default_grid[0]}x{model.default_grid[1]} grid")
    codes = torch.full((tokens.shape[0], layout.num_slots), -1, dtype=torch.long)
    codes[:, layout.slot_of_cell] = tokens.flatten(1)
    return [int(c) for c in classes], codes
