"""Recipe stages 4 and 6: the AR model (llama-grid family): sequences, loss, training with a held-out
NLL and best-checkpoint keeping, and the v1 -> v2 schedules of the shipped model."""
from __future__ import annotations

import copy
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from . import data as D
from .common import GRID, SEED, log, _seed

# the AR schedule of the shipped model (see run_recipe)
AR_STEPS = 2189      # nominal cosine length of phase 1
AR_STOP = 700        # phase 1 ends here
AR_COOL_STEPS = 978  # phase 2 (cool-down) length
AR_COOL_LR = 8e-4

AR_CONFIG = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
                 intermediate_size=688, max_position_embeddings=1024, rope_theta=10000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0)


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


def ar_loss(model, seq: torch.Tensor, reduction: str = "mean", image_vocab: int = 512,
            inputs: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token CE on the 576 image positions (prediction at the class token included; the forced
    row-end tokens are no targets). inputs: what the model reads instead of seq[:, :-1] (the targets stay seq's)."""
    logits = model(input_ids=seq[:, :-1] if inputs is None else inputs).logits.float()
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


@torch.no_grad()
def class_likelihood(model, tokens, labels, lay, num_classes: int, batch: int = 8) -> dict:
    """How much the class token tells the model, teacher-forced on real grids: each grid's NLL (nats per image token)
    under every class and under the null class; `accuracy` is the share of grids whose true class gives the lowest
    NLL (chance: 1 / num_classes), `nll_true` / `nll_null` the mean NLL under the true and the null class."""
    model.eval()
    nll = torch.zeros(len(tokens), num_classes + 1)
    for c in range(num_classes + 1):  # the last column: the null class (its token follows the class tokens)
        for i in range(0, len(tokens), batch):
            grids = tokens[i:i + batch].long()
            ce = ar_loss(model, sequences(grids, torch.full((len(grids),), c), lay), reduction="none")
            nll[i:i + batch, c] = ce.mean(1)
    labels = torch.as_tensor(labels).long()
    return {"accuracy": float((nll[:, :num_classes].argmin(1) == labels).float().mean()),
            "nll_true": float(nll[torch.arange(len(tokens)), labels].mean()), "nll_null": float(nll[:, -1].mean()),
            "grids": len(tokens)}


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
            "default_top_k": 0, "default_min_p": 0.0}
    path = os.path.join(out_dir, "ssd_model.json")
    if os.path.exists(path):  # keep tuned sampling defaults
        old = json.load(open(path))
        for k in ("default_cfg", "default_temperature", "default_top_k", "default_min_p"):
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
