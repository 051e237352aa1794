"""Pixels out: PNG writing, the token-status grid as an image, side-by-side sheets."""
from __future__ import annotations

import numpy as np
import torch

# status -> RGB: the one palette of the pack (nodes/trace.py uses it; web/ssd_grid_core.js matches, tested)
STATUS_COLORS = {"pending": (43, 43, 43), "ar": (138, 143, 152), "accepted": (63, 185, 80),
                 "corrected": (240, 136, 62), "forced": (88, 166, 255)}


def to_uint8(image) -> np.ndarray:
    arr = image.detach().float().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image, dtype=np.float32)
    return (arr.clip(0, 1) * 255 + 0.5).astype(np.uint8)


def save_image(image, path) -> None:
    from PIL import Image

    Image.fromarray(to_uint8(image)).save(path)


def status_image(trace: dict, cell: int = 8) -> np.ndarray:
    """The status grid of a trace as float RGB [H*cell, W*cell, 3] in [0, 1], one colour per status."""
    status = trace["status"]
    H, W = len(status), len(status[0])
    img = np.zeros((H * cell, W * cell, 3), dtype=np.float32)
    for y, row in enumerate(status):
        for x, s in enumerate(row):
            img[y * cell:(y + 1) * cell, x * cell:(x + 1) * cell] = np.array(STATUS_COLORS[s]) / 255.0
    if cell >= 4:  # thin grid lines
        img[::cell, :] *= 0.85
        img[:, ::cell] *= 0.85
    return img


def sheet(images: list, pad: int = 4) -> np.ndarray:
    """Images [h, w, 3] side by side on white, scaled to the tallest one's height."""
    arrs = [np.asarray(i.cpu() if isinstance(i, torch.Tensor) else i, dtype=np.float32) for i in images]
    height = max(a.shape[0] for a in arrs)
    arrs = [np.kron(a, np.ones((height // a.shape[0], height // a.shape[0], 1))) if a.shape[0] < height else a
            for a in arrs]
    width = sum(a.shape[1] for a in arrs) + pad * (len(arrs) + 1)
    out = np.ones((max(a.shape[0] for a in arrs) + 2 * pad, width, 3), dtype=np.float32)
    x = pad
    for a in arrs:
        out[pad:pad + a.shape[0], x:x + a.shape[1]] = a
        x += a.shape[1] + pad
    return out
