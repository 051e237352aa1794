"""Checks of a trained model: plain AR samples (CFG as a batch of 2; a check, not the engine), the sample
sheet, the yardstick score with the seam (stripe) measure, and the held-out file the tests read."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from ssd_core.sampling import SamplerSettings, sample_logits
from ssd_core.pixel_decoders.reference_vq import load_vq
from . import data as D
from .common import log
from .ar import eval_ar, layout
from .vq import eval_vq


def load_model_dir(model_dir: str, dtype=torch.float32):
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    meta = json.load(open(os.path.join(model_dir, "ssd_model.json")))
    return model, meta


@torch.no_grad()
def sample_grids(model, meta: dict, classes: list[int], cfg: float = 3.0, temperature: float = 1.0,
                 top_k: int = 0, seed: int = 0, min_p: float = 0.0) -> torch.Tensor:
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
    settings = SamplerSettings(seed, cfg, temperature, top_k, min_p=min_p)
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
                 top_k: int | None = None, temperature: float | None = None, classes=None, seed: int = 0,
                 min_p: float | None = None):
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    cfg = meta["default_cfg"] if cfg is None else cfg
    top_k = meta["default_top_k"] if top_k is None else top_k
    temperature = meta["default_temperature"] if temperature is None else temperature
    min_p = meta.get("default_min_p", 0.0) if min_p is None else min_p
    classes = list(range(meta["num_classes"])) if classes is None else classes
    cls = [c for c in classes for _ in range(per_class)]
    t0 = time.time()
    grids = sample_grids(model, meta, cls, cfg=cfg, temperature=temperature, top_k=top_k, seed=seed, min_p=min_p)
    log(f"sampled {len(cls)} grids in {time.time() - t0:.1f}s (cfg {cfg}, top_k {top_k}, T {temperature}, "
        f"min_p {min_p})")
    imgs = decode_uint8(vq, grids)
    D.contact_sheet(imgs, cols=per_class * 4).save(png)
    log(f"wrote {png}: rows of 4 classes x {per_class}: {[meta['class_names'][c] for c in classes]}")
    return grids


def decode_uint8(vq, grids: torch.Tensor) -> np.ndarray:
    """Token grids [N, H, W] -> uint8 RGB images [N, H_px, W_px, 3] through the VQ decoder."""
    return (vq.decode(grids).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)


def inked(images: np.ndarray, threshold: int = 235) -> np.ndarray:
    """[N, H, W] bool: pixels with ink (a channel below `threshold`)."""
    return images.astype(np.int16).min(axis=3) < threshold


def seam_crossing(ink: np.ndarray) -> np.ndarray:
    """[N] bool: an object drawn across the row seam (8+ pixel rows inked in both the 3 leftmost and the 3
    rightmost columns)."""
    return (ink[:, :, :3].any(axis=2) & ink[:, :, -3:].any(axis=2)).sum(axis=1) >= 8


def edge_ink(images: np.ndarray, px: int = 2, threshold: int = 235) -> dict:
    """The stripe / wrap-around measure: share of images with ink in the outer `px` pixel columns
    (left/right) and rows (top/bottom), and share with an object drawn across the row seam
    (`seam_crossing`). Real glyphs: 0, 0 and 0."""
    ink = inked(images, threshold)
    lr = ink[:, :, :px].any(axis=(1, 2)) | ink[:, :, -px:].any(axis=(1, 2))
    tb = ink[:, :px, :].any(axis=(1, 2)) | ink[:, -px:, :].any(axis=(1, 2))
    return {"left_right": round(float(lr.mean()), 4), "top_bottom": round(float(tb.mean()), 4),
            "seam": round(float(seam_crossing(ink).mean()), 4)}


def score_model(model_dir: str, images: int = 64, seeds=(0, 1), yardstick: str | None = None,
                png: str | None = None, batch: int = 32, **sampling) -> dict:
    """AR samples of the model at its default settings (classes in turn), per seed set: the
    yardstick's class accuracy and FD, and the edge-ink measure."""
    from ssd_core.yardstick import load_yardstick
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    stick = load_yardstick(yardstick or os.path.join(model_dir, "yardstick.safetensors"))
    kw = {"cfg": meta["default_cfg"], "top_k": meta["default_top_k"], "temperature": meta["default_temperature"],
          "min_p": meta.get("default_min_p", 0.0)}
    kw.update({k: v for k, v in sampling.items() if v is not None})
    classes = [i % meta["num_classes"] for i in range(images)]
    out = {"settings": kw, "images_per_set": images, "sets": []}
    for seed in seeds:
        t0 = time.time()
        imgs = []
        for i in range(0, images, batch):
            g = sample_grids(model, meta, classes[i:i + batch], seed=seed * 1000 + i, **kw)
            imgs.append(decode_uint8(vq, g))
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
