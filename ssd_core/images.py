"""Pixels out: PNG writing and side-by-side sheets (the status grid as an image: trace.status_image)."""
from __future__ import annotations

import numpy as np
import torch


def to_uint8(image) -> np.ndarray:
    arr = image.detach().float().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image, dtype=np.float32)
    return (arr.clip(0, 1) * 255 + 0.5).astype(np.uint8)


def save_image(image, path) -> None:
    from PIL import Image

    Image.fromarray(to_uint8(image)).save(path)


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


def image_extensions() -> set[str]:
    """The file extensions PIL can write an image to ('.png', '.jpg', ...)."""
    from PIL import Image

    Image.init()
    return {ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.SAVE}
