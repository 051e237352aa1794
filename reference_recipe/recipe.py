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
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

from ssd_core.pixel_decoders.reference_vq import save_vq
from . import data as D
from .common import SEED, log
from .ar import (AR2_COPIES, AR2_STEPS, AR_COOL_LR, AR_COOL_STEPS, AR_STEPS, AR_STOP, eval_ar,
                 layout, train_ar, train_ar_v2)
from .score import decode_uint8, load_model_dir, sample_sheet, score_model, write_heldout_file
from .vq import eval_vq, load_vq, tokenize, train_vq
from .yardstick_train import YARDSTICK_STEPS, train_yardstick


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
        recs = decode_uint8(vq, tok2["train_tokens"][:n_train])
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
    ap.add_argument("--min-p", type=float, help="min-p on the conditional stream (default: the model's)")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "2")))
    if a.score:
        res = score_model(a.score, images=a.images, seeds=[int(x) for x in a.seeds.split(",")],
                          yardstick=a.yardstick, png=a.png if a.png != "samples.png" else None,
                          cfg=a.cfg, top_k=a.top_k, temperature=a.temperature,
                          min_p=a.min_p)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    elif a.sample:
        classes = [int(c) for c in a.classes.split(",")] if a.classes else None
        sample_sheet(a.sample, a.png, per_class=a.per_class, cfg=a.cfg, top_k=a.top_k, min_p=a.min_p,
                     temperature=a.temperature, classes=classes, seed=a.seed)
    elif a.out:
        run_recipe(a.out, quick=a.quick, vq_steps=a.vq_steps, copies=a.copies, ar_steps=a.ar_steps,
                   ar_batch=a.ar_batch, minutes=a.minutes)
    else:
        ap.error("give --out DIR or --sample MODEL_DIR")


if __name__ == "__main__":
    main()
