"""Teacher-forcing grids for `train-heads --grids`: the model's own training glyphs, tokenised by its VQ.

    python -m reference_recipe.grids --model ssd_core/reference/model --out .work/data_grids.safetensors --copies 3

Writes `tokens` [N, 24, 24] and `classes` [N]: every training glyph as rendered plus `copies` augmented
copies (the recipe's own augmentation), never the held-out glyphs, labelled with the model's own classes
(its ssd_model.json `data_version`: 1 or 2). Needs fonts-noto-color-emoji.
"""
from __future__ import annotations

import argparse
import json
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
    ap.add_argument("--heldout-out", default=None, help="also write the held-out glyphs' grids here (to score on)")
    a = ap.parse_args(argv)
    from safetensors.torch import save_file

    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "1")))
    with open(os.path.join(a.model, "ssd_model.json")) as f:
        data_version = int(json.load(f).get("data_version", 1))
    ds = (D.build_dataset_v2 if data_version == 2 else D.build_dataset)(a.cache, verbose=False)
    vq = load_vq(os.path.join(a.model, "vq.safetensors"))
    tok = tokenize(vq, ds, copies=a.copies, seed=a.seed)
    tokens, classes = tok["train_tokens"].long(), tok["train_labels"].long()
    save_file({"tokens": tokens.to(torch.int16).contiguous(), "classes": classes.contiguous()}, a.out)
    print(f"wrote {len(tokens)} grids of {tokens.shape[1]}x{tokens.shape[2]} to {a.out}")
    if a.heldout_out:
        held = tok["heldout_tokens"].to(torch.int16).contiguous()
        save_file({"tokens": held, "classes": tok["heldout_labels"].long().contiguous()}, a.heldout_out)
        print(f"wrote {len(held)} held-out grids to {a.heldout_out}")


if __name__ == "__main__":
    main()
