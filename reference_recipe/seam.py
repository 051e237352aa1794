"""The seam / stripe proof: how plausible was each code of the `ar` samples to the prompted (conditional)
model alone? Samples as `--score` draws them (one seed set), each code replayed through the model.

  python -m reference_recipe.seam [--model ssd_core/reference/model] [--images 48] [--seed 0] [--cfg 4]
                                  [--min-p 0] [--floor 0.01]
"""
from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import torch

from ssd_core.pixel_decoders.reference_vq import load_vq
from .ar import sequences
from .score import decode_uint8, edge_ink, inked, load_model_dir, sample_grids, seam_crossing


@torch.no_grad()
def implausible_codes(model_dir: str, images: int = 48, seed: int = 0, cfg: float = 4.0, min_p: float = 0.0,
                      floor: float = 0.01, batch: int = 32) -> dict:
    """Share of the written codes whose conditional probability is below floor x the conditional top code's,
    per image, for the images that cross the row seam and the others."""
    model, meta = load_model_dir(model_dir)
    vq = load_vq(os.path.join(model_dir, meta["vq_decoder"]))
    classes = [i % meta["num_classes"] for i in range(images)]
    grids = torch.cat([sample_grids(model, meta, classes[i:i + batch], cfg=cfg, top_k=meta["default_top_k"],
                                    temperature=meta["default_temperature"], seed=seed * 1000 + i, min_p=min_p)
                       for i in range(0, images, batch)])
    imgs = decode_uint8(vq, grids)
    seam = seam_crossing(inked(imgs))
    V = meta["image_vocab_size"]
    seq = sequences(grids, torch.tensor(classes), meta)
    low = []
    for i in range(0, images, 8):  # the conditional stream, teacher-forced
        logits = model(input_ids=seq[i:i + 8, :-1]).logits.float()[..., :V]
        logits = logits[:, (seq[0, 1:] < V).nonzero().flatten()]  # [b, cells, V]
        picked = logits.gather(-1, grids[i:i + 8].view(len(logits), -1, 1)).squeeze(-1)
        low.append(picked < logits.amax(-1) + math.log(floor))
    low = torch.cat(low).view(images, *grids.shape[1:])  # [N, H, W] written below the floor
    per_image = low.sum((1, 2))
    first_rows = [int(low[i].any(1).nonzero()[0]) if bool(low[i].any()) else None for i in range(images)]
    return {"images": images, "cfg": cfg, "min_p": min_p, "floor": floor, **edge_ink(imgs),
            "share_below_floor": round(float(low.float().mean()), 4),
            "per_image_mean": round(float(per_image.float().mean()), 2),
            "seam_images": np.where(seam)[0].tolist(),
            "seam_images_codes_below": per_image[torch.from_numpy(seam)].tolist(),
            "seam_images_first_row_below": [first_rows[i] for i in np.where(seam)[0]],
            "other_images_mean_below": round(float(per_image[torch.from_numpy(~seam)].float().mean()), 2),
            "images_with_a_code_below_in_row_0": int(low[:, 0].any(1).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ssd_core/reference/model")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cfg", type=float, default=4.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--floor", type=float, default=0.01)
    a = ap.parse_args(argv)
    print(json.dumps(implausible_codes(a.model, a.images, a.seed, a.cfg, a.min_p, a.floor)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
