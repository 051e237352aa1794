"""Retrain the bundled reference model from scratch on CPU, with fixed seeds.

    python -m reference_recipe --out DIR [--quick]

Stages: data (render the emoji) -> VQ autoencoder -> tokenize every image (+ augmented copies)
-> class-conditional Llama over 24x24 token grids -> (heads: see the marked stage at the end).
Other mode:
    python -m reference_recipe --sample MODEL_DIR [--png out.png]   # sample sheet
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
def layout(num_classes: int, image_vocab: int = 512) -> dict:
    return {"image_vocab_size": image_vocab, "class_token_start": image_vocab,
            "null_class_token": image_vocab + num_classes,
            "vocab_size": int(math.ceil((image_vocab + num_classes + 1) / 8) * 8)}


def build_ar(num_classes: int, image_vocab: int = 512, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM
    lay = layout(num_classes, image_vocab)
    cfg = dict(AR_CONFIG)
    cfg.update(overrides)
    config = LlamaConfig(vocab_size=lay["vocab_size"], bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, **cfg)
    return LlamaForCausalLM(config)


def sequences(tokens: torch.Tensor, labels: torch.Tensor, lay: dict) -> torch.Tensor:
    """[class token] + 576 raster image tokens -> long [B, 577]."""
    B = tokens.shape[0]
    cls = (lay["class_token_start"] + labels).view(B, 1)
    return torch.cat([cls, tokens.view(B, -1).long()], dim=1)


def ar_loss(model, seq: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token CE on the 576 image positions (prediction at the class token included)."""
    logits = model(input_ids=seq[:, :-1]).logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1), reduction="none")
    ce = ce.view(seq.shape[0], -1)
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
            "image_vocab_size": lay["image_vocab_size"], "row_end_token": None,
            "num_classes": len(class_names), "class_token_start": lay["class_token_start"],
            "null_class_token": lay["null_class_token"], "vq_decoder": "vq.safetensors",
            "class_names": list(class_names), "default_cfg": 3.0, "default_temperature": 1.0,
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
             stop_after: int | None = None, init: str | None = None) -> dict:
    """Trains with AdamW + cosine; evaluates held-out NLL every `eval_every` steps and keeps the
    best checkpoint (fp16) in out_dir/best. `deadline` (unix time) stops early, best kept.
    `budget_s`: after 20 steps, re-size `steps` so that training fits the budget (the cosine then
    runs over the new step count; the count used is recorded). bf16 autocast (AMX on this CPU).
    `stop_after`: end after that many steps (the schedule is unchanged).
    `init` (a saved model folder): the cool-down phase: start from it, lr from `lr` linearly to 0
    over `steps` after a 20-step warmup (fresh AdamW moments)."""
    _seed(seed)
    g = torch.Generator().manual_seed(seed)
    lay = layout(num_classes)
    if init:
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
        seq = sequences(X[idx], labels, lay)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = ar_loss(model, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if budget_s and step == 19:
            rate = (time.time() - t0) / 20
            steps = max(40, int(20 + (budget_s - (time.time() - t0)) / rate * 0.93))
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


# ------------------------------------------------------------------------------------------------
# Held-out file for the tests
# ------------------------------------------------------------------------------------------------
def write_heldout_file(model_dir: str, tok: dict, ds: dict, path: str, n_grids: int = 32, n_images: int = 4):
    """A small fixed held-out set: token grids + classes (NLL test) and a few rendered glyphs (VQ
    test), with the figures measured on them with the shipped files in the metadata."""
    from safetensors.torch import save_file
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    lay = layout(meta["num_classes"], meta["image_vocab_size"])
    toks = tok["heldout_tokens"][:n_grids].to(torch.int32)
    labs = tok["heldout_labels"][:n_grids].to(torch.int64)
    nll = eval_ar(model, toks, labs, lay)
    imgs = ds["images"][ds["heldout"]][:n_images]
    ev = eval_vq(vq, imgs)
    save_file({"tokens": toks.contiguous(), "labels": labs.contiguous(),
               "images": torch.from_numpy(np.ascontiguousarray(imgs))}, path,
              metadata={"nll": f"{nll:.5f}", "vq_mse": f"{ev['mse']:.6f}", "vq_psnr": f"{ev['psnr']:.3f}",
                        "note": "held-out glyphs of reference_recipe.data (split seed 1234)"})
    log(f"wrote {path}: {len(toks)} grids NLL {nll:.4f}; {len(imgs)} images VQ MSE {ev['mse']:.5f}")
    return nll, ev


# ------------------------------------------------------------------------------------------------
# The recipe
# ------------------------------------------------------------------------------------------------
def run_recipe(out: str, quick: bool = False, vq_steps: int | None = None, copies: int | None = None,
               ar_steps: int | None = None, ar_batch: int = 16, minutes: float | None = None) -> dict:
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "2")))
    t_all = time.time()
    os.makedirs(out, exist_ok=True)
    figures = {}
    # 1. data
    log("stage 1/5: data")
    ds = D.build_dataset(os.path.join(out, "emoji.npz"))
    if quick:  # a small subset, same code paths
        keep = np.zeros(len(ds["labels"]), bool)
        keep[::8] = True
        keep |= ds["heldout"]
        ds = {k: (v[keep] if isinstance(v, np.ndarray) and len(v) == len(keep) else
                  ([x for x, m in zip(v, keep) if m] if isinstance(v, list) and len(v) == len(keep) else v))
              for k, v in ds.items()}
    figures["glyphs"] = int(len(ds["labels"]))
    figures["heldout_glyphs"] = int(ds["heldout"].sum())
    C = len(ds["class_names"])
    # 2. VQ
    vq_path = os.path.join(out, "vq_train.safetensors")
    log("stage 2/5: VQ autoencoder")
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
    log("stage 3/5: tokenize")
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
    # 4. AR
    log("stage 4/5: AR model")
    ar_dir = os.path.join(out, "ar")
    deadline = time.time() + minutes * 60 if minutes else None
    over = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4,
            "num_key_value_heads": 4} if quick else None
    # phase 1: cosine nominally over AR_STEPS, stopped after AR_STOP steps (its fp16 'last' checkpoint);
    # phase 2: cool-down from that checkpoint, lr AR_COOL_LR -> 0 linearly over AR_COOL_STEPS steps.
    # These are the step counts the shipped model went through (sized to a CPU time budget).
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
    figures["ar"] = best
    ar_dir = ar_dir + "2"
    model_dir = os.path.join(out, "model")
    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    shutil.copytree(os.path.join(ar_dir, "best"), model_dir)
    save_vq(vq, os.path.join(model_dir, "vq.safetensors"), dtype=torch.float16)
    model, meta = load_model_dir(model_dir)
    lay = layout(C)
    figures["ar_heldout_nll_fp16"] = eval_ar(model, tok["heldout_tokens"], tok["heldout_labels"], lay)
    log(f"AR held-out NLL (shipped fp16 weights): {figures['ar_heldout_nll_fp16']:.4f} nats per image token "
        f"(best step {best['step']}, {best['train_seconds'] / 60:.1f} min)")
    write_heldout_file(model_dir, tok, ds, os.path.join(out, "heldout_tokens.safetensors"))
    # 5. heads  ------------------------------------------------------------------------------
    # the engine's self-distillation trainer, with the settings of the shipped heads (about 15 min here)
    log("stage 5/5: draft heads")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
    cmd = [sys.executable, "-m", "ssd_core", "train-heads", "--model", model_dir,
           "--out", os.path.join(model_dir, "heads.safetensors"), "--seed", "0",
           "--samples", "16" if quick else "384", "--heldout", "4" if quick else "32",
           "--epochs", "1" if quick else "10", "--gen-batch", "32", "--batch", "16"]
    log("  " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=here)
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
    ap.add_argument("--png", default="samples.png")
    ap.add_argument("--per-class", type=int, default=2)
    ap.add_argument("--classes", help="comma-separated class indices")
    ap.add_argument("--cfg", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "2")))
    if a.sample:
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
