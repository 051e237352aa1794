"""The Chameleon / Lumina-mGPT VQGAN pixel decoder.

transformers ships only the encoder half of Chameleon's VQ model (``ChameleonVQVAE``), so the pixels of a
Lumina-mGPT image come from here: the taming-transformers VQGAN decoder as Meta released it with Chameleon
(8192 codes, embed_dim 256, z_channels 256, ch 128, ch_mult [1, 1, 2, 2, 4], 2 res blocks, f = 16).

code ids -> quantizer embedding lookup -> post_quant_conv -> decoder
(conv_in, mid: res/attn/res, up levels of res blocks (+ attn where configured) with nearest-x2 upsample + conv,
GroupNorm(32) + swish, conv_out) -> pixels in [-1, 1].

Parameter names are those of the released checkpoint (``quantize.embedding.weight``, ``post_quant_conv.*``,
``decoder.*``), so ``ssd_core.pixel_decoders.convert_vqgan`` is a straight copy of the tensors. Weights load from
safetensors only, with the config stored as JSON in the file's metadata (key ``ssd_vqgan_config``).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .decoder_file import Quantize, embed_codes

METADATA_KEY = "ssd_vqgan_config"
FORMAT = "ssd-vqgan-decoder"
FORMAT_VERSION = "1"
KEPT_PREFIXES = ("quantize.", "post_quant_conv.", "decoder.")


@dataclass
class VQGANConfig:
    n_embed: int = 8192
    embed_dim: int = 256
    z_channels: int = 256
    ch: int = 128
    out_ch: int = 3
    ch_mult: List[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 2
    # taming semantics: level i of the decoder works at resolution // 2**i; it gets attention blocks when that
    # resolution is in attn_resolutions.
    resolution: int = 256
    attn_resolutions: List[int] = field(default_factory=lambda: [16])
    mid_attn: bool = True

    @property
    def num_levels(self) -> int:
        return len(self.ch_mult)

    @property
    def factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def level_has_attn(self, level: int) -> bool:
        return (self.resolution // 2 ** level) in set(self.attn_resolutions)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "VQGANConfig":
        data = json.loads(text)
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"VQGAN config has unknown fields {sorted(unknown)}")
        return cls(**data)

    def validate(self) -> None:
        for level, mult in enumerate(self.ch_mult):
            if (self.ch * mult) % 32:
                raise ValueError(f"VQGAN config: ch * ch_mult[{level}] = {self.ch * mult} is not a multiple of 32 "
                                 "(GroupNorm with 32 groups)")


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.norm2 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, hh, ww = h.shape
        q = self.q(h).reshape(b, c, hh * ww).transpose(1, 2)  # b, hw, c
        k = self.k(h).reshape(b, c, hh * ww)  # b, c, hw
        v = self.v(h).reshape(b, c, hh * ww)  # b, c, hw
        w = torch.softmax(torch.bmm(q, k) * (c ** -0.5), dim=2)  # b, hw(query), hw(key)
        out = torch.bmm(v, w.transpose(1, 2)).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Decoder(nn.Module):
    def __init__(self, cfg: VQGANConfig):
        super().__init__()
        self.num_levels = cfg.num_levels
        self.num_res_blocks = cfg.num_res_blocks
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, 1, 1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in)
        if cfg.mid_attn:
            self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(block_in, block_in)
        ups: List[nn.Module] = []
        for level in reversed(range(cfg.num_levels)):
            up = nn.Module()
            block_out = cfg.ch * cfg.ch_mult[level]
            blocks, attns = [], []
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResnetBlock(block_in, block_out))
                block_in = block_out
                if cfg.level_has_attn(level):
                    attns.append(AttnBlock(block_in))
            up.block = nn.ModuleList(blocks)
            up.attn = nn.ModuleList(attns)
            if level != 0:
                up.upsample = Upsample(block_in)
            ups.insert(0, up)
        self.up = nn.ModuleList(ups)
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_1(h)
        if hasattr(self.mid, "attn_1"):
            h = self.mid.attn_1(h)
        h = self.mid.block_2(h)
        for level in reversed(range(self.num_levels)):
            up = self.up[level]
            for i in range(self.num_res_blocks + 1):
                h = up.block[i](h)
                if len(up.attn) > 0:
                    h = up.attn[i](h)
            if level != 0:
                h = up.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VQGANDecoder(nn.Module):
    """Code ids (B, H, W) -> pixels (B, 3, 16H, 16W) in [-1, 1]."""

    def __init__(self, cfg: Optional[VQGANConfig] = None):
        super().__init__()
        self.config = cfg = cfg or VQGANConfig()
        cfg.validate()
        self.quantize = Quantize(cfg.n_embed, cfg.embed_dim)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = Decoder(cfg)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return embed_codes(self.quantize, self.config.n_embed, codes)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.embed_codes(codes)
        return self.decoder(self.post_quant_conv(z))

    @torch.no_grad()
    def decode_to_image(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, H, W) codes -> (B, 16H, 16W, 3) float in [0, 1] (ComfyUI's IMAGE layout)."""
        x = self.forward(codes).float()
        return ((x.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).contiguous()

    # ---- files ---------------------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        save_decoder_state(self.state_dict(), self.config, path)

    @classmethod
    def load(cls, path: str, device="cpu", dtype: torch.dtype = torch.float32) -> "VQGANDecoder":
        state, cfg = load_decoder_state(path)
        with torch.device("meta"):  # the shapes its config asks for, checked before any memory is allocated
            want = {k: tuple(v.shape) for k, v in cls(cfg).state_dict().items()}
        wrong = [k for k in want if k in state and tuple(state[k].shape) != want[k]]
        if wrong:
            raise ValueError(f"{path}: VQGAN weights do not match the config in its metadata (first: {wrong[0]} "
                             f"is {list(state[wrong[0]].shape)}, the config needs {list(want[wrong[0]])})")
        module = cls(cfg)
        missing, unexpected = module.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path}: VQGAN weights do not match the config in its metadata "
                             f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
        return module.to(device=device, dtype=dtype).eval()


def save_decoder_state(state: Dict[str, torch.Tensor], cfg: VQGANConfig, path: str) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    save_file(tensors, path, metadata={METADATA_KEY: cfg.to_json(), "format": FORMAT,
                                       "format_version": FORMAT_VERSION})


def load_decoder_state(path: str):
    from safetensors import safe_open

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"VQGAN decoder weights not found at {path!r}: convert Meta's released vqgan.ckpt "
                                "with `python -m ssd_core.pixel_decoders.convert_vqgan vqgan.ckpt vqgan.safetensors`")
    if not path.endswith(".safetensors"):
        raise ValueError(f"{path!r}: the VQGAN decoder loads from .safetensors only "
                         "(convert a .ckpt with `python -m ssd_core.pixel_decoders.convert_vqgan`)")
    state = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        if METADATA_KEY not in meta:
            raise ValueError(f"{path!r} has no '{METADATA_KEY}' metadata: write it with "
                             "ssd_core.pixel_decoders.convert_vqgan")
        cfg = VQGANConfig.from_json(meta[METADATA_KEY])
        for k in f.keys():
            state[k] = f.get_tensor(k)
    return state, cfg


def infer_config(state: Dict[str, torch.Tensor], resolution: int = 256) -> VQGANConfig:
    """Read the decoder's shape off a taming-style state dict (decoder / quantize / post_quant_conv keys).

    ``resolution`` only names where attention sits (taming's convention); the layout found in the keys is kept
    whatever it is.
    """
    try:
        emb = state["quantize.embedding.weight"]
        pqc = state["post_quant_conv.weight"]
        conv_out = state["decoder.conv_out.weight"]
    except KeyError as e:
        raise ValueError(f"not a VQGAN state dict: key {e.args[0]!r} is missing") from None
    n_embed, embed_dim = int(emb.shape[0]), int(emb.shape[1])
    z_channels = int(pqc.shape[0])
    out_ch = int(conv_out.shape[0])
    levels = sorted({int(k.split(".")[2]) for k in state if k.startswith("decoder.up.")})
    if levels != list(range(len(levels))) or not levels:
        raise ValueError(f"VQGAN state dict: decoder up levels {levels} are not 0..n-1")
    n_blocks = len({int(k.split(".")[4]) for k in state if k.startswith("decoder.up.0.block.")})
    outs = [int(state[f"decoder.up.{lv}.block.0.conv1.weight"].shape[0]) for lv in levels]
    ch = outs[0]
    if any(o % ch for o in outs):
        raise ValueError(f"VQGAN state dict: level widths {outs} are not multiples of the first ({ch})")
    ch_mult = [o // ch for o in outs]
    attn_res = [resolution // 2 ** lv for lv in levels if f"decoder.up.{lv}.attn.0.q.weight" in state]
    mid_attn = "decoder.mid.attn_1.q.weight" in state
    return VQGANConfig(n_embed=n_embed, embed_dim=embed_dim, z_channels=z_channels, ch=ch, out_ch=out_ch,
                       ch_mult=ch_mult, num_res_blocks=n_blocks - 1, resolution=resolution,
                       attn_resolutions=attn_res, mid_attn=mid_attn)


def find_vqgan(model_dir: Optional[str], explicit: Optional[str] = None) -> Optional[str]:
    """Where a Lumina-mGPT model's VQGAN lives: an explicit path, else ``vqgan.safetensors`` in the model folder
    (or its ``vqgan/`` subfolder). None when there is none."""
    if explicit:
        return explicit
    if model_dir:
        for cand in ("vqgan.safetensors", os.path.join("vqgan", "vqgan.safetensors")):
            p = os.path.join(model_dir, cand)
            if os.path.isfile(p):
                return p
    return None
