"""Teacher-forcing grids for `train-heads --grids`: the model's own training glyphs, tokenised by its VQ.

    python -m reference_recipe.grids --model ssd_core/reference/model --out .work/data_grids.safetensors --copies 3

Writes `tokens` [N, 24, 24] and `classes` [N]: every training glyph as rendered plus `copies` augmented
copies (the recipe's own augmentation), never the held-out glyphs. Needs fonts-noto-color-emoji.
"""
from __future__ import annotations

import argparse
import os

import torch

from ssd_core.pixel_decoders.reference_vq import load_vq

from . import data as D
from .common import SEED
from .vq import tokenize


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m reference_recipe.grids", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ssd_core/reference/model", help="model folder with vq.safetensors")
    ap.add_argument("--out", required=True)
    ap.add_argument("--copies", type=int, default=3, help="augmented copies per training glyph")
    ap.add_argument("--cache", default=".work/emoji.npz", help="rendered glyphs (.npz, no pickle)")
    ap.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args(argv)
    from safetensors.torch import save_file

    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "1")))
    ds = D.build_dataset(a.cache, verbose=False)
    vq = load_vq(os.path.join(a.model, "vq.safetensors"))
    tok = tokenize(vq, ds, copies=a.copies, seed=a.seed)
    tokens, classes = tok["train_tokens"].long(), tok["train_labels"].long()
    save_file({"tokens": tokens.to(torch.int16).contiguous(), "classes": classes.contiguous()}, a.out)
    print(f"wrote {len(tokens)} grids of {tokens.shape[1]}x{tokens.shape[2]} to {a.out}")


if __name__ == "__main__":
    main()
