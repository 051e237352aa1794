"""Convert Meta's released Chameleon VQGAN checkpoint (``vqgan.ckpt``, used by Lumina-mGPT) to the safetensors
file ``ssd_core.pixel_decoders.chameleon_vqgan`` loads.

    python -m ssd_core.pixel_decoders.convert_vqgan path/to/vqgan.ckpt path/to/model_folder/vqgan.safetensors

The checkpoint is read with ``torch.load(..., weights_only=True)`` (no pickled code runs). Only the decoder,
quantizer and post_quant_conv tensors are kept (the encoder is not needed to draw pixels); they are copied
unchanged under their original names, and the decoder's shape, read off the tensors, goes into the file's
metadata.
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
from typing import Dict, Optional

import torch

from ..errors import reason
from .chameleon_vqgan import KEPT_PREFIXES, VQGANConfig, VQGANDecoder, infer_config, save_decoder_state


class ConversionError(ValueError):
    pass


def read_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConversionError(f"VQGAN checkpoint not found: {path!r} (Chameleon's tokenizer/vqgan.ckpt, "
                              "as Lumina-mGPT's README links it)")
    if os.path.isdir(path):
        raise ConversionError(f"{path!r} is a folder: give the vqgan.ckpt file itself")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConversionError(
            f"{path!r} holds pickled Python objects besides tensors, which loading with weights_only=True refuses "
            f"({reason(e)}). If you trust the file, save its "
            "tensors alone where you trust it, e.g. torch.save(torch.load(path, weights_only=False)['state_dict'], "
            "'vqgan_tensors.pt'), and convert that file") from e
    except Exception as e:  # noqa: BLE001 -- any unreadable file gets the same clear message
        raise ConversionError(f"could not read {path!r} as a PyTorch checkpoint with weights_only=True: "
                              f"{type(e).__name__}: {e}") from e
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ConversionError(f"{path!r} does not hold a state dict (got {type(obj).__name__})")
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConversionError(f"{path!r} holds no tensors")
    return tensors


def extract_decoder_state(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    kept = {k: v for k, v in state.items() if k.startswith(KEPT_PREFIXES)}
    if "quantize.embedding.weight" not in kept or not any(k.startswith("decoder.") for k in kept):
        raise ConversionError("the checkpoint has no VQGAN decoder: expected keys 'quantize.embedding.weight', "
                              "'post_quant_conv.*' and 'decoder.*' (is this Chameleon's vqgan.ckpt?)")
    return kept


def convert(ckpt_path: str, out_path: str, resolution: int = 256, dtype: Optional[torch.dtype] = None
            ) -> VQGANConfig:
    """Read ``ckpt_path``, write ``out_path`` (.safetensors); returns the config found. The result is checked by
    building the decoder and loading the tensors strictly before anything is written."""
    if not os.fspath(out_path).endswith(".safetensors"):
        raise ConversionError(f"output {out_path!r} must end in .safetensors")
    state = extract_decoder_state(read_checkpoint(ckpt_path))
    try:
        cfg = infer_config(state, resolution=resolution)
        VQGANDecoder(cfg).load_state_dict(state, strict=True)
    except (ValueError, RuntimeError) as e:
        raise ConversionError(f"{ckpt_path!r}: the decoder tensors do not form a taming VQGAN decoder: {e}") from e
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    save_decoder_state(state, cfg, out_path)
    return cfg


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m ssd_core.pixel_decoders.convert_vqgan",
                                               description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt", help="Meta's released vqgan.ckpt")
    parser.add_argument("out", help="output .safetensors (put it in the Lumina-mGPT model folder as "
                                    "vqgan.safetensors)")
    parser.add_argument("--resolution", type=int, default=256,
                        help="taming's nominal resolution, only used to name where attention sits")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="store in this dtype (default: as is)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


def run(args) -> int:
    try:
        cfg = convert(args.ckpt, args.out, resolution=args.resolution,
                      dtype=_DTYPES[args.dtype] if args.dtype else None)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {cfg.n_embed} codes, embed_dim {cfg.embed_dim}, ch {cfg.ch}, ch_mult {cfg.ch_mult}, "
          f"f={cfg.factor}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
