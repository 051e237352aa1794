"""Recipe stages 2-3: the VQ autoencoder (train, evaluate, round-trip) and the tokenised data set."""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from ssd_core.pixel_decoders.reference_vq import VQModel, load_vq, save_vq
from . import data as D
from .common import SEED, log, _seed


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


@torch.no_grad()
def vq_roundtrip(vq: VQModel, images: np.ndarray, batch: int = 128) -> np.ndarray:
    """uint8 images -> their VQ reconstructions (what a perfect AR model would draw), uint8."""
    out = []
    for i in range(0, len(images), batch):
        rec = vq.decode(vq.encode(D.to_tensor(images[i:i + batch])))
        out.append((rec.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8))
    return np.concatenate(out)


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
