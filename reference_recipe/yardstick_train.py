"""Recipe stage 5: the yardstick classifier (the image-quality measure that ships beside the model:
ssd_core/yardstick.py), trained on the training glyphs only."""
from __future__ import annotations

import copy
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from ssd_core.pixel_decoders.reference_vq import VQModel
from . import data as D
from .common import SEED, log, _seed
from .vq import vq_roundtrip

YARDSTICK_STEPS = 500


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
