"""Retrain the bundled reference model from scratch on CPU, with fixed seeds.

    python -m reference_recipe --out DIR [--quick]

Stages: data (render the emoji) -> VQ autoencoder -> tokenize (+ augmented copies) -> AR v1 (22
classes) -> data set v2 (11 classes), its tokens and the yardstick classifier -> AR v2 (v1 continued
with a row-end token after every row) -> draft heads. Other modes:
    python -m reference_recipe --sample MODEL_DIR [--png out.png]       # sample sheet
    python -m reference_recipe --score MODEL_DIR [--images N --seeds 0,1]  # class accuracy, FD, stripes
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from ssd_core.sampling import SamplerSettings, sample_logits
from . import data as D
from ssd_core.pixel_decoders.reference_vq import VQModel, load_vq, save_vq

GRID = 24
SEED = 0
# the AR schedule of the shipped model (see run_recipe)
AR_STEPS = 2189      # nominal cosine length of phase 1
AR_STOP = 700        # phase 1 ends here
AR_COOL_STEPS = 978  # phase 2 (cool-down) length
AR_COOL_LR = 8e-4

AR_CONFIG = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
                 intermediate_size=688, max_position_embeddings=1024, rope_theta=10000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _seed(s: int) -> None:
    torch.manual_seed(s)
    np.random.seed(s)


# ------------------------------------------------------------------------------------------------
# VQ
# ------------------------------------------------------------------------------------------------
def train_vq(ds: dict, out_path: str, steps: int = 1100, batch: int = 32, lr: float = 2e-3,
             config: dict | None = None, seed: int = SEED, stop_after: int | None = None,
             init: str | None = None, bf16: bool = True) -> VQModel:
    """Adam, warmup + cosine over `steps`; stop_after ends early (the schedule is unchanged).
    With `init` (a VQ file): fine-tune its decoder only (codes unchanged) with lr decaying
    linearly from `lr` to 0 over `steps` (the cool-down phase)."""
    _seed(seed)
    rng = np.random.default_rng(seed)
    train_imgs = ds["images"][~ds["heldout"]]
    if init:  # decoder-only cool-down: encoder and codebook frozen, so the codes do not change
        model = load_vq(init)
        model.freeze_codebook = True
        model.encoder.requires_grad_(False)
        params = list(model.decoder.parameters())
    else:
        model = VQModel(config or {"channels": [32, 128]})
        params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.99))
    warm = max(1, steps // 20)
    t0 = time.time()
    model.train()
    end = min(steps, stop_after or steps)
    for step in range(end):
        if init:
            cur = lr * (1 - step / steps)
        else:
            cur = lr * min(1.0, (step + 1) / warm) * (0.5 * (1 + math.cos(math.pi * step / steps)) * 0.95 + 0.05)
        for g in opt.param_groups:
            g["lr"] = cur
        idx = rng.integers(0, len(train_imgs), batch)
        x = D.to_tensor(D.augment(train_imgs[idx], rng))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            rec, commit, codes = model(x)
        rec = rec.float()
        target = x * 2 - 1
        loss = F.mse_loss(rec, target) + 0.5 * (rec - target).abs().mean() + 0.25 * commit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == end - 1:
            used = int(torch.unique(codes).numel())
            el = time.time() - t0
            eta = el / (step + 1) * (end - step - 1)
            log(f"vq step {step}/{steps} loss {loss.item():.4f} commit {commit.item():.4f} "
                f"codes-in-batch {used} lr {cur:.2e} eta {eta / 60:.1f} min")
        if (step + 1) % 200 == 0 or step == end - 1:
            save_vq(model, out_path, dtype=torch.float32)
    model.eval()
    return model


@torch.no_grad()
def eval_vq(model: VQModel, images: np.ndarray, batch: int = 64) -> dict:
    """Reconstruction MSE (pixels in [0,1]) and PSNR on the given uint8 images."""
    mses = []
    codes_all = []
    for i in range(0, len(images), batch):
        x = D.to_tensor(images[i:i + batch]).to(next(model.parameters()).dtype)
        codes = model.encode(x)
        rec = model.decode(codes).float()
        mses.append(((rec - x.float()) ** 2).mean(dim=(1, 2, 3)))
        codes_all.append(codes)
    mse = torch.cat(mses)
    codes = torch.cat(codes_all)
    return {"mse": float(mse.mean()), "psnr": float((10 * torch.log10(1 / mse)).mean()),
            "codes_used": int(torch.unique(codes).numel()), "codebook_size": model.config["codebook_size"]}


# ------------------------------------------------------------------------------------------------
# Yardstick (the image-quality classifier that ships beside the model: ssd_core/yardstick.py)
# ------------------------------------------------------------------------------------------------
YARDSTICK_STEPS = 500


@torch.no_grad()
def vq_roundtrip(vq: VQModel, images: np.ndarray, batch: int = 128) -> np.ndarray:
    """uint8 images -> their VQ reconstructions (what a perfect AR model would draw), uint8."""
    out = []
    for i in range(0, len(images), batch):
        rec = vq.decode(vq.encode(D.to_tensor(images[i:i + batch])))
        out.append((rec.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8))
    return np.concatenate(out)


def train_yardstick(ds: dict, vq: VQModel, out_path: str, data_version: int, steps: int = YARDSTICK_STEPS,
                    batch: int = 32, lr: float = 2e-3, seed: int = SEED, ref_copies: int = 8,
                    recs: np.ndarray | None = None) -> dict:
    """The classifier on the training glyphs only (as rendered and through the VQ, augmented and
    mirrored). Figures: accuracy on the held-out glyphs (as rendered and through the VQ) and the FD
    of the training glyphs to the held-out ones (held-out glyphs + `ref_copies` augmented copies)."""
    from ssd_core.yardstick import Classifier, Yardstick, save_yardstick
    _seed(seed)
    rng = np.random.default_rng(seed + 7)
    t0 = time.time()
    tr, ho = ~ds["heldout"], ds["heldout"]
    imgs, labels = ds["images"][tr], torch.from_numpy(ds["labels"][tr]).long()
    recs = vq_roundtrip(vq, imgs) if recs is None else recs  # the training glyphs through the VQ
    log(f"yardstick: {len(imgs)} training glyphs through the VQ in {time.time() - t0:.0f} s")
    C = len(ds["class_names"])
    net = Classifier(C)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.05)
    net.train()
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        idx = rng.integers(0, len(imgs), batch)
        src = np.where(rng.random(batch)[:, None, None, None] < 0.5, imgs[idx], recs[idx])
        x = D.to_tensor(D.augment(src, rng, max_shift=6, scale_range=(0.75, 1.0)))
        flip = torch.from_numpy(rng.random(batch) < 0.5)
        x[flip] = x[flip].flip(-1)
        loss = F.cross_entropy(net(x), labels[idx], label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"yardstick step {step}/{steps} loss {loss.item():.4f} {(time.time() - t0) / (step + 1):.2f} s/step")
    net.eval()
    half = copy.deepcopy(net).half().float()  # measure what ships (fp16 weights)
    stick = Yardstick(half, {"class_names": ds["class_names"], "version": "0"}, torch.zeros(2, 1), torch.zeros(2, 1))
    ho_imgs, ho_labels = ds["images"][ho], torch.from_numpy(ds["labels"][ho]).long()
    ref = np.concatenate([ho_imgs] + [D.augment(ho_imgs, rng) for _ in range(ref_copies)])
    _, ref_feats = stick.logits_and_features(ref)
    _, train_feats = stick.logits_and_features(imgs)
    real_acc = float((stick.classify(ho_imgs) == ho_labels).float().mean())
    vq_acc = float((stick.classify(vq_roundtrip(vq, ho_imgs)) == ho_labels).float().mean())
    stick = Yardstick(half, {"class_names": ds["class_names"], "version": "0"}, ref_feats, train_feats)
    meta = {"version": f"{data_version}.1", "data_version": data_version, "class_names": ds["class_names"],
            "real_acc": round(real_acc, 4), "real_acc_vq": round(vq_acc, 4), "real_fd": stick.real_fd(),
            "heldout_glyphs": int(ho.sum()), "train_glyphs": int(tr.sum()), "steps": steps,
            "train_seconds": round(time.time() - t0, 1)}
    save_yardstick(net, out_path, meta, ref_feats, train_feats)
    log(f"yardstick: held-out accuracy {real_acc:.3f} as rendered, {vq_acc:.3f} through the VQ "
        f"({int(ho.sum())} glyphs, {C} classes); real_fd {meta['real_fd']:.3f}; "
        f"{meta['train_seconds'] / 60:.1f} min -> {out_path}")
    return meta


# ------------------------------------------------------------------------------------------------
# Tokens
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def tokenize(vq: VQModel, ds: dict, copies: int, seed: int = SEED, batch: int = 128) -> dict:
    """Train grids: every training glyph as rendered plus `copies` augmented copies; held-out grids:
    the held-out glyphs as rendered. Tokens int16 [N, 24, 24], labels int64 [N]."""
    rng = np.random.default_rng(seed + 1)
    tr = ~ds["heldout"]
    timgs, tlabels = ds["images"][tr], ds["labels"][tr]

    def enc(imgs):
        out = []
        for i in range(0, len(imgs), batch):
            out.append(vq.encode(D.to_tensor(imgs[i:i + batch])).to(torch.int16))
        return torch.cat(out)

    toks, labs = [enc(timgs)], [torch.from_numpy(tlabels)]
    for c in range(copies):
        toks.append(enc(D.augment(timgs, rng)))
        labs.append(torch.from_numpy(tlabels))
        log(f"tokenize: copy {c + 1}/{copies}")
    return {"train_tokens": torch.cat(toks), "train_labels": torch.cat(labs).long(),
            "heldout_tokens": enc(ds["images"][ds["heldout"]]),
            "heldout_labels": torch.from_numpy(ds["labels"][ds["heldout"]]).long()}


# ------------------------------------------------------------------------------------------------
# AR model (llama-grid family)
# ------------------------------------------------------------------------------------------------
def layout(num_classes: int, image_vocab: int = 512, row_end: bool = False) -> dict:
    """Token ids: image codes, class tokens, the null class, then (v2) the row-end token."""
    extra = 2 if row_end else 1
    return {"image_vocab_size": image_vocab, "class_token_start": image_vocab,
            "null_class_token": image_vocab + num_classes,
            "row_end_token": image_vocab + num_classes + 1 if row_end else None,
            "vocab_size": int(math.ceil((image_vocab + num_classes + extra) / 8) * 8)}


def build_ar(num_classes: int, image_vocab: int = 512, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM
    lay = layout(num_classes, image_vocab)
    cfg = dict(AR_CONFIG)
    cfg.update(overrides)
    config = LlamaConfig(vocab_size=lay["vocab_size"], bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, **cfg)
    return LlamaForCausalLM(config)


def sequences(tokens: torch.Tensor, labels: torch.Tensor, lay: dict) -> torch.Tensor:
    """[class token] + raster image tokens (v2: a row-end token after each row) -> long [B, 577 or 601]."""
    B, H, W = tokens.shape
    cls = (lay["class_token_start"] + labels).view(B, 1)
    grid = tokens.long()
    if lay.get("row_end_token") is not None:
        grid = torch.cat([grid, torch.full((B, H, 1), lay["row_end_token"], dtype=torch.long)], dim=2)
    return torch.cat([cls, grid.reshape(B, -1)], dim=1)


def ar_loss(model, seq: torch.Tensor, reduction: str = "mean", image_vocab: int = 512) -> torch.Tensor:
    """Next-token CE on the 576 image positions (prediction at the class token included; the forced
    row-end tokens are no targets)."""
    logits = model(input_ids=seq[:, :-1]).logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1), reduction="none")
    ce = ce.view(seq.shape[0], -1)[:, seq[0, 1:] < image_vocab]
    return ce.mean() if reduction == "mean" else ce


@torch.no_grad()
def eval_ar(model, tokens, labels, lay, batch: int = 16) -> float:
    """Held-out NLL, nats per image token, class-conditional."""
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(tokens), batch):
        ce = ar_loss(model, sequences(tokens[i:i + batch], labels[i:i + batch], lay), reduction="none")
        tot += float(ce.sum())
        n += ce.numel()
    return tot / n


def save_ar(model, out_dir: str, lay: dict, class_names: list[str], extra: dict | None = None) -> None:
    """fp16 safetensors + ssd_model.json (the llama-grid contract)."""
    os.makedirs(out_dir, exist_ok=True)
    half = copy.deepcopy(model).to(torch.float16)  # never round the training weights
    half.save_pretrained(out_dir, safe_serialization=True)
    meta = {"family": "llama-grid", "grid": [GRID, GRID], "image_token_start": 0,
            "image_vocab_size": lay["image_vocab_size"], "row_end_token": lay.get("row_end_token"),
            "num_classes": len(class_names), "class_token_start": lay["class_token_start"],
            "null_class_token": lay["null_class_token"], "vq_decoder": "vq.safetensors",
            "class_names": list(class_names), "data_version": 2 if lay.get("row_end_token") is not None else 1,
            "default_cfg": 3.0, "default_temperature": 1.0,
            "default_top_k": 0}
    path = os.path.join(out_dir, "ssd_model.json")
    if os.path.exists(path):  # keep tuned sampling defaults
        old = json.load(open(path))
        for k in ("default_cfg", "default_temperature", "default_top_k"):
            meta[k] = old.get(k, meta[k])
    meta.update(extra or {})
    with open(path, "w") as f:
        json.dump(meta, f, indent=1)


def train_ar(tok: dict, num_classes: int, out_dir: str, steps: int, batch: int = 16, lr: float = 1.5e-3,
             warmup: int = 100, eval_every: int = 100, cfg_drop: float = 0.1, seed: int = SEED,
             class_names: list[str] | None = None, model_overrides: dict | None = None,
             deadline: float | None = None, bf16: bool = True, budget_s: float | None = None,
             stop_after: int | None = None, init: str | None = None, row_end: bool = False,
             widen_from: str | None = None, class_map: list[list[int]] | None = None,
             peak_steps: int = 0) -> dict:
    """Trains with AdamW + cosine; evaluates held-out NLL every `eval_every` steps and keeps the
    best checkpoint (fp16) in out_dir/best. `deadline` (unix time) stops early, best kept.
    `budget_s`: after 20 steps, re-size `steps` so that training fits the budget (the cosine then
    runs over the new step count; the count used is recorded). bf16 autocast (AMX on this CPU).
    `stop_after`: end after that many steps (the schedule is unchanged).
    `init` (a saved model folder): the cool-down phase: start from it, lr from `lr` linearly to 0
    over `steps` after a 20-step warmup (fresh AdamW moments).
    `widen_from` (a v1 model folder) with `class_map` (v2 class -> v1 classes) and `row_end`: the v2
    fine-tune: start from the v1 weights in the v2 vocabulary (see widen), lr warmup, `peak_steps` at
    `lr`, then linearly to 0 at `steps`."""
    _seed(seed)
    g = torch.Generator().manual_seed(seed)
    lay = layout(num_classes, row_end=row_end)
    if widen_from:
        model = widen(widen_from, lay, class_map)
    elif init:
        from transformers import LlamaForCausalLM
        model = LlamaForCausalLM.from_pretrained(init, dtype=torch.float32)
        warmup = 20
    else:
        model = build_ar(num_classes, **(model_overrides or {}))
    nparam = sum(p.numel() for p in model.parameters())
    log(f"AR model: {nparam / 1e6:.2f} M parameters, vocab {lay['vocab_size']}, steps {steps}, batch {batch}")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    X, Y = tok["train_tokens"], tok["train_labels"]
    HX, HY = tok["heldout_tokens"], tok["heldout_labels"]
    best = {"nll": float("inf"), "step": -1}
    history = []
    t0 = time.time()
    perm = torch.randperm(len(X), generator=g)
    pos = 0
    for step in range(10 ** 9):  # ends at `last` (steps may be re-sized)
        model.train()
        if init:
            cur = lr * min(1.0, (step + 1) / warmup) * (1 - step / steps)
        elif widen_from:
            cur = lr * min(1.0, (step + 1) / warmup) * min(1.0, max(0.0, (steps - step) / max(1, steps - peak_steps)))
        else:
            cur = lr * min(1.0, (step + 1) / warmup) * (0.5 * (1 + math.cos(math.pi * min(1.0, step / steps))) * 0.9 + 0.1)
        for grp in opt.param_groups:
            grp["lr"] = cur
        if pos + batch > len(perm):
            perm, pos = torch.randperm(len(X), generator=g), 0
        idx = perm[pos:pos + batch]
        pos += batch
        labels = Y[idx].clone()
        drop = torch.rand(batch, generator=g) < cfg_drop
        labels[drop] = num_classes  # null class: class_token_start + num_classes
        if row_end and step == 0:
            log(f"v2 sequences: {sequences(X[idx[:1]], labels[:1], lay).shape[1]} tokens (row-end {lay['row_end_token']})")
        seq = sequences(X[idx], labels, lay)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = ar_loss(model, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if budget_s and (step == 19 or (step > 19 and step % 50 == 19)):  # a shared CPU's speed drifts
            rate = (time.time() - t0) / (step + 1)
            steps = max(step + 21, int(step + 1 + (budget_s - (time.time() - t0)) / rate * 0.95))
            peak_steps = min(peak_steps, steps // 3)
            log(f"ar: {rate:.2f} s/step -> {steps} steps fit the budget of {budget_s / 60:.0f} min")
        last = (step == steps - 1 or (deadline is not None and time.time() > deadline)
                or (stop_after is not None and step == stop_after - 1))
        if step % 10 == 0 or last:
            el = time.time() - t0
            log(f"ar step {step}/{steps} loss {loss.item():.4f} lr {cur:.2e} {el / (step + 1):.2f} s/step "
                f"eta {el / (step + 1) * (steps - step - 1) / 60:.1f} min")
        if (step + 1) % eval_every == 0 or last:
            nll = eval_ar(model, HX, HY, lay)
            history.append((step + 1, nll, time.time() - t0))
            log(f"ar eval step {step + 1}: held-out NLL {nll:.4f} nats/token (best {best['nll']:.4f})")
            save_ar(model, os.path.join(out_dir, "last"), lay, class_names or [])
            if nll < best["nll"]:
                best = {"nll": nll, "step": step + 1}
                save_ar(model, os.path.join(out_dir, "best"), lay, class_names or [])
            with open(os.path.join(out_dir, "history.json"), "w") as f:
                json.dump({"history": history, "best": best, "params": nparam,
                           "train_seconds": time.time() - t0}, f)
        if last:
            break
    best["train_seconds"] = time.time() - t0
    best["params"] = nparam
    best["steps_done"] = step + 1
    best["batch"] = batch
    return best


def widen(v1_dir: str, lay: dict, class_map: list[list[int]]):
    """The v1 model in the v2 vocabulary: every weight copied; image-code rows as they were; v2 class
    token c = the mean of the v1 class tokens it merges (class_map[c]); null class as in v1; the new
    row-end token starts at the mean image-code embedding."""
    from transformers import LlamaForCausalLM
    old = LlamaForCausalLM.from_pretrained(v1_dir, dtype=torch.float32)
    meta = json.load(open(os.path.join(v1_dir, "ssd_model.json")))
    new = build_ar(len(class_map), lay["image_vocab_size"], **{k: getattr(old.config, k, v) for k, v in AR_CONFIG.items()})
    V, c0 = lay["image_vocab_size"], meta["class_token_start"]
    sd = {k: v for k, v in old.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    new.load_state_dict(sd, strict=False)
    with torch.no_grad():
        e_old, e_new = old.model.embed_tokens.weight, new.model.embed_tokens.weight
        e_new.normal_(0, 0.02)
        e_new[:V] = e_old[:V]
        for c, members in enumerate(class_map):
            e_new[lay["class_token_start"] + c] = e_old[[c0 + m for m in members]].mean(0)
        e_new[lay["null_class_token"]] = e_old[meta["null_class_token"]]
        if lay.get("row_end_token") is not None:
            e_new[lay["row_end_token"]] = e_old[:V].mean(0)
        new.lm_head.weight.zero_()
        new.lm_head.weight[:V] = old.lm_head.weight[:V]
    return new


# v2: the v1 model continued on data set v2 (11 classes) with a row-end token after every row
AR2_STEPS = 819      # what the shipped v2 went through (budget-sized on the day); lr held for a third, then -> 0
AR2_LR = 5e-4
AR2_BATCH = 4
AR2_COPIES = 8       # augmented copies per training glyph (v1: 16); the fine-tune sees each about once


def v2_class_map() -> list[list[int]]:
    """v2 class -> the v1 classes whose tokens start it (clock faces were v1 'tool & object')."""
    v1 = D.class_names()
    members = {c: [v1.index(a) for a, b in D.V2_FROM_V1.items() if b == c] for c in D.V2_CLASSES}
    members["clock"] = [v1.index("tool & object")]
    return [members[c] for c in D.V2_CLASSES]


def train_ar_v2(tok: dict, v1_dir: str, out_dir: str, steps: int = AR2_STEPS, budget_s: float | None = None,
                deadline: float | None = None, eval_every: int = 100, bf16: bool = False) -> dict:
    """fp32 by default: bf16 autocast pays only with AMX / avx512_bf16; without them (the AMD CPU of
    the v2 run) it is emulated and several times slower than fp32."""
    return train_ar(tok, len(D.V2_CLASSES), out_dir, steps=steps, batch=AR2_BATCH, lr=AR2_LR, warmup=50,
                    eval_every=eval_every, class_names=D.V2_CLASSES, deadline=deadline, budget_s=budget_s, bf16=bf16,
                    row_end=True, widen_from=v1_dir, class_map=v2_class_map(), peak_steps=steps // 3,
                    seed=SEED + 2)


# ------------------------------------------------------------------------------------------------
# Sampling (plain AR with CFG as a batch of 2; a check, not the engine)
# ------------------------------------------------------------------------------------------------
def load_model_dir(model_dir: str, dtype=torch.float32):
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    meta = json.load(open(os.path.join(model_dir, "ssd_model.json")))
    return model, meta


@torch.no_grad()
def sample_grids(model, meta: dict, classes: list[int], cfg: float = 3.0, temperature: float = 1.0,
                 top_k: int = 0, seed: int = 0) -> torch.Tensor:
    """-> codes [B, H, W]."""
    import inspect
    from transformers import DynamicCache
    H, W = meta["grid"]
    V = meta["image_vocab_size"]
    B = len(classes)
    cond = torch.tensor([meta["class_token_start"] + c for c in classes])
    uncond = torch.full((B,), meta["null_class_token"])
    ids = torch.cat([cond, uncond]).view(2 * B, 1)
    cache = DynamicCache()
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    g = torch.Generator().manual_seed(seed)
    settings = SamplerSettings(seed, cfg, temperature, top_k)
    out = []
    for t in range(H * W):
        logits = model(input_ids=ids, use_cache=True, **{kw: cache}).logits[:, -1, :V].float()
        nxt = sample_logits(logits.view(2, B, V), settings, g)  # rows: B conditional, then B unconditional
        out.append(nxt)
        ids = torch.cat([nxt, nxt]).view(2 * B, 1)
        if meta.get("row_end_token") is not None and t % W == W - 1:  # feed the forced row-end token
            ids = torch.cat([ids, torch.full_like(ids, meta["row_end_token"])], dim=1)
    return torch.stack(out, dim=1).view(B, H, W)


def sample_sheet(model_dir: str, png: str, per_class: int = 2, cfg: float | None = None,
                 top_k: int | None = None, temperature: float | None = None, classes=None, seed: int = 0):
    from PIL import Image
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    cfg = meta["default_cfg"] if cfg is None else cfg
    top_k = meta["default_top_k"] if top_k is None else top_k
    temperature = meta["default_temperature"] if temperature is None else temperature
    classes = list(range(meta["num_classes"])) if classes is None else classes
    cls = [c for c in classes for _ in range(per_class)]
    t0 = time.time()
    grids = sample_grids(model, meta, cls, cfg=cfg, temperature=temperature, top_k=top_k, seed=seed)
    log(f"sampled {len(cls)} grids in {time.time() - t0:.1f}s (cfg {cfg}, top_k {top_k}, T {temperature})")
    imgs = (vq.decode(grids).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    D.contact_sheet(imgs, cols=per_class * 4).save(png)
    log(f"wrote {png}: rows of 4 classes x {per_class}: {[meta['class_names'][c] for c in classes]}")
    return grids


def edge_ink(images: np.ndarray, px: int = 2, threshold: int = 235) -> dict:
    """The stripe / wrap-around measure: share of images with ink in the outer `px` pixel columns
    (left/right) and rows (top/bottom), and share with an object drawn across the row seam (8+ pixel
    rows inked in both the 3 leftmost and the 3 rightmost columns). Real glyphs: 0, 0 and 0."""
    ink = images.astype(np.int16).min(axis=3) < threshold
    lr = ink[:, :, :px].any(axis=(1, 2)) | ink[:, :, -px:].any(axis=(1, 2))
    tb = ink[:, :px, :].any(axis=(1, 2)) | ink[:, -px:, :].any(axis=(1, 2))
    seam = (ink[:, :, :3].any(axis=2) & ink[:, :, -3:].any(axis=2)).sum(axis=1) >= 8  # drawn across the row seam
    return {"left_right": round(float(lr.mean()), 4), "top_bottom": round(float(tb.mean()), 4),
            "seam": round(float(seam.mean()), 4)}


def score_model(model_dir: str, images: int = 64, seeds=(0, 1), yardstick: str | None = None,
                png: str | None = None, batch: int = 32, **sampling) -> dict:
    """AR samples of the model at its default settings (classes in turn), per seed set: the
    yardstick's class accuracy and FD, and the edge-ink measure."""
    from ssd_core.yardstick import load_yardstick
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    stick = load_yardstick(yardstick or os.path.join(model_dir, "yardstick.safetensors"))
    kw = {"cfg": meta["default_cfg"], "top_k": meta["default_top_k"], "temperature": meta["default_temperature"]}
    kw.update({k: v for k, v in sampling.items() if v is not None})
    classes = [i % meta["num_classes"] for i in range(images)]
    out = {"settings": kw, "images_per_set": images, "sets": []}
    for seed in seeds:
        t0 = time.time()
        imgs = []
        for i in range(0, images, batch):
            g = sample_grids(model, meta, classes[i:i + batch], seed=seed * 1000 + i, **kw)
            imgs.append((vq.decode(g).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8))
        imgs = np.concatenate(imgs)
        row = {"seed": seed, **stick.score(imgs, classes), **edge_ink(imgs), "seconds": round(time.time() - t0)}
        out["sets"].append(row)
        log(f"score {model_dir} seed set {seed}: {row}")
        if png:
            D.contact_sheet(imgs, cols=meta["num_classes"]).save(png.replace(".png", f"_seed{seed}.png"))
            np.save(png.replace(".png", f"_seed{seed}.npy"), imgs)
    for k in ("class_acc", "fd", "left_right", "top_bottom", "seam"):
        vals = [r[k] for r in out["sets"]]
        out[k] = {"mean": round(float(np.mean(vals)), 4), "spread": round(float(max(vals) - min(vals)), 4)}
    out["yardstick"] = stick.summary(images)
    log(f"score {model_dir}: {json.dumps({k: out[k] for k in ('class_acc', 'fd', 'left_right', 'top_bottom', 'seam', 'yardstick')})}")
    return out


# ------------------------------------------------------------------------------------------------
# Held-out file for the tests
# ------------------------------------------------------------------------------------------------
def write_heldout_file(model_dir: str, tok: dict, ds: dict, path: str, n_grids: int = 64, n_images: int = 16):
    """A small fixed held-out set: token grids + classes (NLL test) and a few rendered glyphs (VQ
    test), with the figures measured on them with the shipped files in the metadata."""
    from safetensors.torch import save_file
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    lay = layout(meta["num_classes"], meta["image_vocab_size"], row_end=meta.get("row_end_token") is not None)
    toks = tok["heldout_tokens"][:n_grids].to(torch.int32)
    labs = tok["heldout_labels"][:n_grids].to(torch.int64)
    nll = eval_ar(model, toks, labs, lay)
    imgs = ds["images"][ds["heldout"]][:n_images]
    ev = eval_vq(vq, imgs)
    save_file({"tokens": toks.contiguous(), "labels": labs.contiguous(),
               "images": torch.from_numpy(np.ascontiguousarray(imgs)),
               "image_labels": torch.from_numpy(ds["labels"][ds["heldout"]][:n_images]).long()}, path,
              metadata={"nll": f"{nll:.5f}", "vq_mse": f"{ev['mse']:.6f}", "vq_psnr": f"{ev['psnr']:.3f}",
                        "note": "held-out glyphs of reference_recipe.data (split seed 1234)"})
    log(f"wrote {path}: {len(toks)} grids NLL {nll:.4f}; {len(imgs)} images VQ MSE {ev['mse']:.5f}")
    return nll, ev


# ------------------------------------------------------------------------------------------------
# The recipe
# ------------------------------------------------------------------------------------------------
def _subset(ds: dict) -> dict:
    """--quick: every 8th glyph plus the held-out ones (same code paths, minutes instead of hours)."""
    keep = np.zeros(len(ds["labels"]), bool)
    keep[::8] = True
    keep |= ds["heldout"]
    return {k: (v[keep] if isinstance(v, np.ndarray) and len(v) == len(keep) else
                ([x for x, m in zip(v, keep) if m] if isinstance(v, list) and len(v) == len(keep) else v))
            for k, v in ds.items()}


def run_recipe(out: str, quick: bool = False, vq_steps: int | None = None, copies: int | None = None,
               ar_steps: int | None = None, ar_batch: int = 16, minutes: float | None = None) -> dict:
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "2")))
    t_all = time.time()
    os.makedirs(out, exist_ok=True)
    figures = {}
    # 1. data
    log("stage 1/7: data")
    ds = D.build_dataset(os.path.join(out, "emoji.npz"))
    if quick:
        ds = _subset(ds)
    figures["glyphs"] = int(len(ds["labels"]))
    figures["heldout_glyphs"] = int(ds["heldout"].sum())
    C = len(ds["class_names"])
    # 2. VQ
    vq_path = os.path.join(out, "vq_train.safetensors")
    log("stage 2/7: VQ autoencoder")
    if os.path.exists(vq_path):
        log(f"  reusing {vq_path}")
        vq = load_vq(vq_path)
    else:
        vq = train_vq(ds, vq_path, steps=vq_steps or (20 if quick else 1100))
    ev = eval_vq(vq, ds["images"][ds["heldout"]])
    figures["vq"] = ev
    log(f"VQ held-out: MSE {ev['mse']:.5f} PSNR {ev['psnr']:.2f} dB, codes used {ev['codes_used']}/{ev['codebook_size']}")
    # 3. tokens
    tok_path = os.path.join(out, "tokens.safetensors")
    log("stage 3/7: tokenize")
    if os.path.exists(tok_path):
        tok = load_file(tok_path)
    else:
        tok = tokenize(vq, ds, copies=copies if copies is not None else (1 if quick else 16))
        save_file({k: v.contiguous() for k, v in tok.items()}, tok_path)
    tok["train_tokens"] = tok["train_tokens"].long()
    tok["heldout_tokens"] = tok["heldout_tokens"].long()
    usage = torch.bincount(tok["train_tokens"].view(-1), minlength=512)
    figures["codebook_usage_train_tokens"] = int((usage > 0).sum())
    log(f"  {len(tok['train_tokens'])} training grids, {len(tok['heldout_tokens'])} held-out grids, "
        f"codes used in training tokens {figures['codebook_usage_train_tokens']}/512")
    # 4. AR v1
    log("stage 4/7: AR model v1 (data set v1, 22 classes, no row-end tokens)")
    ar_dir = os.path.join(out, "ar")
    deadline = time.time() + minutes * 60 if minutes else None
    over = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4,
            "num_key_value_heads": 4} if quick else None
    # phase 1: cosine nominally over AR_STEPS, stopped after AR_STOP steps (its fp16 'last' checkpoint);
    # phase 2: cool-down from that checkpoint, lr AR_COOL_LR -> 0 linearly over AR_COOL_STEPS steps.
    # These are the step counts the v1 model went through (sized to a CPU time budget).
    n_all = ar_steps or (40 if quick else AR_STEPS)
    n_stop = max(10, n_all * AR_STOP // AR_STEPS)
    n_cool = max(10, n_all * AR_COOL_STEPS // AR_STEPS)
    p1 = train_ar(tok, C, ar_dir, steps=n_all, stop_after=n_stop, batch=ar_batch,
                  eval_every=10 if quick else 100, class_names=ds["class_names"], model_overrides=over,
                  deadline=deadline)
    best = train_ar(tok, C, ar_dir + "2", steps=n_cool, lr=AR_COOL_LR, batch=ar_batch,
                    eval_every=10 if quick else 50, class_names=ds["class_names"],
                    init=os.path.join(ar_dir, "last"), seed=SEED + 1, deadline=deadline)
    best["train_seconds"] += p1["train_seconds"]
    best["phase1"] = p1
    figures["ar_v1"] = best
    v1_dir = os.path.join(ar_dir + "2", "best")
    shutil.copy(vq_path, os.path.join(v1_dir, "vq.safetensors"))
    # 5. data set v2 (11 classes, same glyphs and split), its tokens, the yardstick
    log("stage 5/7: data set v2, tokens, yardstick")
    t5 = time.time()
    ds2 = D.build_dataset_v2(os.path.join(out, "emoji.npz"))
    if quick:
        ds2 = _subset(ds2)
    tok2_path = os.path.join(out, "tokens_v2.safetensors")
    if os.path.exists(tok2_path):
        tok2 = load_file(tok2_path)
    else:
        tok2 = tokenize(vq, ds2, copies=copies if copies is not None else (1 if quick else AR2_COPIES))
        save_file({k: v.contiguous() for k, v in tok2.items()}, tok2_path)
    tok2 = {k: (v.long() if "tokens" in k else v) for k, v in tok2.items()}
    n_train = int((~ds2["heldout"]).sum())  # the first n_train grids: the training glyphs as rendered
    with torch.no_grad():
        recs = (vq.decode(tok2["train_tokens"][:n_train]).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    figures["yardstick"] = train_yardstick(ds2, vq, os.path.join(out, "yardstick.safetensors"), data_version=2,
                                           steps=20 if quick else YARDSTICK_STEPS, recs=recs)
    figures["stage5_minutes"] = (time.time() - t5) / 60
    # 6. AR v2: the v1 model continued on data set v2 with row-end tokens
    log("stage 6/7: AR model v2 (data set v2, row-end tokens), from v1")
    best2 = train_ar_v2(tok2, v1_dir, os.path.join(out, "ar_v2"), steps=20 if quick else AR2_STEPS,
                        deadline=deadline, eval_every=10 if quick else 100)
    figures["ar_v2"] = best2
    model_dir = os.path.join(out, "model")
    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    shutil.copytree(os.path.join(out, "ar_v2", "best"), model_dir)
    save_vq(vq, os.path.join(model_dir, "vq.safetensors"), dtype=torch.float16)
    shutil.copy(os.path.join(out, "yardstick.safetensors"), os.path.join(model_dir, "yardstick.safetensors"))
    model, meta = load_model_dir(model_dir)
    lay = layout(len(D.V2_CLASSES), row_end=True)
    figures["ar_heldout_nll_fp16"] = eval_ar(model, tok2["heldout_tokens"], tok2["heldout_labels"], lay)
    log(f"AR v2 held-out NLL (shipped fp16 weights): {figures['ar_heldout_nll_fp16']:.4f} nats per image token "
        f"(best step {best2['step']}, {best2['train_seconds'] / 60:.1f} min)")
    write_heldout_file(model_dir, tok2, ds2, os.path.join(out, "heldout_tokens.safetensors"))
    # 7. heads  ------------------------------------------------------------------------------
    # the engine's self-distillation trainer on stored grids: 384 v2 training grids (teacher-forced, no sampling)
    log("stage 7/7: draft heads")
    t7 = time.time()
    g = torch.Generator().manual_seed(SEED)
    pick = torch.randperm(len(tok2["train_tokens"]), generator=g)[:16 if quick else 384]
    grids_path = os.path.join(out, "heads_grids.safetensors")
    save_file({"tokens": tok2["train_tokens"][pick].contiguous(), "classes": tok2["train_labels"][pick].contiguous()},
              grids_path)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
    cmd = [sys.executable, "-m", "ssd_core", "train-heads", "--model", model_dir,
           "--out", os.path.join(model_dir, "heads.safetensors"), "--seed", "0", "--grids", grids_path,
           "--heldout", "4" if quick else "32", "--epochs", "1" if quick else "10", "--batch", "16"]
    log("  " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=here)
    figures["heads_minutes"] = (time.time() - t7) / 60
    figures["total_minutes"] = (time.time() - t_all) / 60
    with open(os.path.join(out, "figures.json"), "w") as f:
        json.dump(figures, f, indent=1)
    log(f"done in {figures['total_minutes']:.1f} min: {json.dumps(figures)}")
    return figures


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m reference_recipe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (retrain everything)")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run of every stage (minutes)")
    ap.add_argument("--vq-steps", type=int)
    ap.add_argument("--copies", type=int, help="augmented copies per glyph to tokenize")
    ap.add_argument("--ar-steps", type=int)
    ap.add_argument("--ar-batch", type=int, default=16)
    ap.add_argument("--minutes", type=float, help="stop AR training after this many minutes (best kept)")
    ap.add_argument("--sample", metavar="MODEL_DIR", help="draw a class-conditional sample sheet")
    ap.add_argument("--score", metavar="MODEL_DIR", help="yardstick figures of AR samples (class accuracy, FD)")
    ap.add_argument("--images", type=int, default=64, help="--score: images per seed set")
    ap.add_argument("--seeds", default="0,1", help="--score: seed sets")
    ap.add_argument("--yardstick", help="--score: yardstick file (default: MODEL_DIR/yardstick.safetensors)")
    ap.add_argument("--json", help="--score: write the figures here")
    ap.add_argument("--png", default="samples.png")
    ap.add_argument("--per-class", type=int, default=2)
    ap.add_argument("--classes", help="comma-separated class indices")
    ap.add_argument("--cfg", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "2")))
    if a.score:
        res = score_model(a.score, images=a.images, seeds=[int(x) for x in a.seeds.split(",")],
                          yardstick=a.yardstick, png=a.png if a.png != "samples.png" else None,
                          cfg=a.cfg, top_k=a.top_k, temperature=a.temperature)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    elif a.sample:
        classes = [int(c) for c in a.classes.split(",")] if a.classes else None
        sample_sheet(a.sample, a.png, per_class=a.per_class, cfg=a.cfg, top_k=a.top_k,
                     temperature=a.temperature, classes=classes, seed=a.seed)
    elif a.out:
        run_recipe(a.out, quick=a.quick, vq_steps=a.vq_steps, copies=a.copies, ar_steps=a.ar_steps,
                   ar_batch=a.ar_batch, minutes=a.minutes)
    else:
        ap.error("give --out DIR or --sample MODEL_DIR")


if __name__ == "__main__":
    main()
