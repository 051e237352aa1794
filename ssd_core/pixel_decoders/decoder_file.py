"""What the converted pixel decoders share (movqgan.py, ibq.py): a decoder-only safetensors file holding the release's
tensor names, its config as JSON in the file's metadata, checked from its header before any tensor is read."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch
import torch.nn as nn


class Quantize(nn.Module):
    """The release's codebook, under its tensor name (quantize.embedding.weight)."""

    def __init__(self, n_embed: int, embed_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)  # [codes, embed_dim]


def embed_codes(quantize: Quantize, n_embed: int, codes: torch.Tensor) -> torch.Tensor:
    """Code ids [B, H, W] (checked: three dims, each id in [0, n_embed)) -> their codebook vectors [B, embed_dim, H, W]."""
    if codes.dim() != 3:
        raise ValueError(f"codes must be (B, H, W), got shape {tuple(codes.shape)}")
    codes = codes.to(quantize.embedding.weight.device).long()
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= n_embed):
        raise ValueError(f"code ids must lie in [0, {n_embed}), got [{int(codes.min())}, {int(codes.max())}]")
    return quantize.embedding(codes).permute(0, 3, 1, 2).contiguous()


class DecoderFile(nn.Module):
    """A pixel decoder module (codes [B, H, W] -> pixels in [-1, 1]) with its file format; a subclass names it
    and holds `config` (with n_embed) and `quantize` (a Quantize)."""

    what = ""  # how messages name it: "MoVQGAN", "IBQ"
    config_class: type  # its config dataclass (with validate())
    metadata_key = ""  # the metadata entry holding the config as JSON
    file_format = ""  # the metadata's "format"
    convert_fix = ""  # the fix a message gives, with {folder}

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Code ids [B, H, W] (checked) -> their codebook vectors [B, embed_dim, H, W]."""
        return embed_codes(self.quantize, self.config.n_embed, codes)

    @torch.no_grad()
    def decode_to_image(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, H, W] codes -> [B, H_px, W_px, 3] in [0, 1] (the releases' (x + 1) * 127.5, clamped, over 255)."""
        return ((self.forward(codes).float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).contiguous()

    def save(self, path) -> None:
        write_state(type(self), self.state_dict(), self.config, path)

    @classmethod
    def wrong_shapes(cls, cfg, shapes: dict) -> list[str]:
        """'name: shape in the file, shape wanted' for every tensor missing, extra or of another shape, sorted."""
        with torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in cls(cfg).state_dict().items()}
        return [f"{k}: {shapes.get(k)} in the file, {want.get(k)} wanted"
                for k in sorted(set(want) | set(shapes)) if want.get(k) != shapes.get(k)]

    @classmethod
    def check_file(cls, path):
        """The file's config and tensor shapes against it, from the header alone (no tensor data read)."""
        from safetensors import safe_open

        from ..errors import SSDError, reason

        path = os.fspath(path)
        fix = cls.convert_fix.format(folder=os.path.dirname(os.path.abspath(path)))
        if not path.endswith(".safetensors") or not os.path.isfile(path):
            raise SSDError(f"{cls.what} decoder {path}: not a .safetensors file; {fix}")
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            cfg = cls.config_class(**json.loads(meta[cls.metadata_key])).validate()
        except Exception as err:  # noqa: BLE001 -- a damaged header, missing metadata, a config of other fields
            raise SSDError(f"{path} is not a converted {cls.what} decoder ({reason(err)}); {fix}") from None
        wrong = cls.wrong_shapes(cfg, shapes)
        if wrong:
            raise SSDError(f"{path}: its tensors do not fit its config (first: {wrong[0]}); {fix}")
        return cfg

    @classmethod
    def load(cls, path, device="cpu", dtype: torch.dtype = torch.float32):
        from safetensors.torch import load_file

        module = cls(cls.check_file(path))
        module.load_state_dict(load_file(os.fspath(path)), strict=True)
        return module.to(device=device, dtype=dtype).eval()


def write_state(cls: type[DecoderFile], state: dict, cfg, path) -> None:
    """`state` (the decoder's tensors) and `cfg` as `cls`'s file."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, os.fspath(path),
              metadata={cls.metadata_key: json.dumps(asdict(cfg), sort_keys=True), "format": cls.file_format})
