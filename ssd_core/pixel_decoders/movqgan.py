"""The MoVQGAN pixel decoder of Lumina-mGPT 2.0 (ai-forever/MoVQGAN movqgan_270M.ckpt, as Alpha-VLLM/Lumina-mGPT-2.0
ships its code in lumina_mgpt/movqgan).

code ids -> quantizer embedding zq [B, 4, H, W] -> post_quant_conv -> MOVQDecoder (conv_in; mid: res / attn / res;
up levels of res blocks, + attn where taming's resolution rule puts it, nearest-x2 upsample + conv; norm_out,
swish, conv_out) -> pixels in [-1, 1], 8 px a code for the 270M model (ch 256, ch_mult [1, 2, 2, 4], 2 res blocks,
attention at resolution 32 of 256, 16,384 codes of 4 dims). Every norm is MoVQ's SpatialNorm: GroupNorm(32) of
the features, scaled and shifted by 1x1 convs of zq resized (nearest) to the features' size.

Tensor names are the release's (`quantize.embedding.weight`, `post_quant_conv.*`, `decoder.*`), so
`python -m ssd_core convert-movqgan movqgan_270M.ckpt <folder>/movqgan.safetensors` copies the tensors; weights
load from safetensors only, the config as JSON in the file's metadata (key `ssd_movqgan_config`).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import reason
from .decoder_file import DecoderFile, Quantize, write_state

METADATA_KEY = "ssd_movqgan_config"
FILE_NAME = "movqgan.safetensors"
KEPT_PREFIXES = ("quantize.embedding.", "post_quant_conv.", "decoder.")
CONVERT_FIX = ("download movqgan_270M.ckpt from ai-forever/MoVQGAN (as Lumina-mGPT 2.0's README says) and convert "
               "it with `python -m ssd_core convert-movqgan movqgan_270M.ckpt {folder}/movqgan.safetensors`")


@dataclass
class MoVQConfig:
    n_embed: int = 16384
    embed_dim: int = 4  # zq channels
    z_channels: int = 4
    ch: int = 256
    out_ch: int = 3
    ch_mult: list = field(default_factory=lambda: [1, 2, 2, 4])
    num_res_blocks: int = 2
    resolution: int = 256  # taming's rule: level i works at resolution // 2**i, attention where that is listed
    attn_resolutions: list = field(default_factory=lambda: [32])
    add_conv: bool = False  # SpatialNorm's extra 3x3 conv of zq (off in the released models)

    @property
    def factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def level_has_attn(self, level: int) -> bool:
        return self.resolution // 2 ** level in self.attn_resolutions

    def validate(self) -> "MoVQConfig":
        bad = [self.ch * m for m in self.ch_mult if (self.ch * m) % 32]
        if bad or self.n_embed < 1 or self.embed_dim < 1 or not self.ch_mult:
            raise ValueError(f"MoVQGAN config {asdict(self)} is not a MoVQGAN decoder (channels must be multiples "
                             "of 32 for GroupNorm(32))")
        return self


class SpatialNorm(nn.Module):
    """GroupNorm(32, eps 1e-6) of f, times conv_y(zq) plus conv_b(zq), zq resized (nearest) to f."""

    def __init__(self, channels: int, zq_ch: int, add_conv: bool):
        super().__init__()
        self.norm_layer = nn.GroupNorm(32, channels, eps=1e-6, affine=True)
        self.conv = nn.Conv2d(zq_ch, zq_ch, 3, padding=1) if add_conv else None
        self.conv_y = nn.Conv2d(zq_ch, channels, 1)
        self.conv_b = nn.Conv2d(zq_ch, channels, 1)

    def forward(self, f: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        if self.conv is not None:
            zq = self.conv(zq)
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, zq_ch: int, add_conv: bool):
        super().__init__()
        self.norm1, self.conv1 = SpatialNorm(cin, zq_ch, add_conv), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = SpatialNorm(cout, zq_ch, add_conv), nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x, zq)))
        h = self.conv2(F.silu(self.norm2(h, zq)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head attention over the H*W positions (scale c**-0.5), residual."""

    def __init__(self, channels: int, zq_ch: int, add_conv: bool):
        super().__init__()
        self.norm = SpatialNorm(channels, zq_ch, add_conv)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        h = self.norm(x, zq)
        b, c, hh, ww = x.shape
        q, k, v = (m(h).reshape(b, 1, c, hh * ww).transpose(-1, -2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # [b, 1, hw, c]
        return x + self.proj_out(out.transpose(-1, -2).reshape(b, c, hh, ww))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Decoder(nn.Module):
    """MOVQDecoder (lumina_mgpt/movqgan/modules/vqvae/movq_modules.py) without the timestep parts it never uses."""

    def __init__(self, cfg: MoVQConfig):
        super().__init__()
        zq, ac, levels = cfg.embed_dim, cfg.add_conv, len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in, zq, ac)
        self.mid.attn_1 = AttnBlock(block_in, zq, ac)
        self.mid.block_2 = ResnetBlock(block_in, block_in, zq, ac)
        up = []
        for level in reversed(range(levels)):  # built lowest resolution first, stored by level
            stage = nn.Module()
            block_out = cfg.ch * cfg.ch_mult[level]
            stage.block = nn.ModuleList()
            stage.attn = nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                stage.block.append(ResnetBlock(block_in, block_out, zq, ac))
                block_in = block_out
                if cfg.level_has_attn(level):
                    stage.attn.append(AttnBlock(block_in, zq, ac))
            if level != 0:
                stage.upsample = Upsample(block_in)
            up.insert(0, stage)
        self.up = nn.ModuleList(up)
        self.norm_out = SpatialNorm(block_in, zq, ac)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, zq), zq), zq)
        for level in reversed(range(len(self.up))):
            stage = self.up[level]
            for i, block in enumerate(stage.block):
                h = block(h, zq)
                if len(stage.attn):
                    h = stage.attn[i](h, zq)
            if level != 0:
                h = stage.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h, zq)))


class MoVQDecoder(DecoderFile):
    """Codes [B, H, W] -> pixels [B, 3, 8H, 8W] in [-1, 1] (270M: f = 8)."""

    what, config_class, metadata_key, file_format = "MoVQGAN", MoVQConfig, METADATA_KEY, "ssd-movqgan-decoder"
    convert_fix = CONVERT_FIX

    def __init__(self, cfg: MoVQConfig | None = None):
        super().__init__()
        self.config = cfg = (cfg or MoVQConfig()).validate()
        self.quantize = Quantize(cfg.n_embed, cfg.embed_dim)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = Decoder(cfg)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        zq = self.embed_codes(codes)  # [B, embed_dim, H, W]
        return self.decoder(self.post_quant_conv(zq), zq)



def save_state(state: dict, cfg: MoVQConfig, path) -> None:
    write_state(MoVQDecoder, state, cfg, path)


def infer_config(state: dict, resolution: int = 256) -> MoVQConfig:
    """The decoder's shape read off the release's tensor names (decoder.up.{level}.block.{i}, .attn.{i})."""
    try:
        n_embed, embed_dim = state["quantize.embedding.weight"].shape
        z_channels = state["post_quant_conv.weight"].shape[0]
        out_ch = state["decoder.conv_out.weight"].shape[0]
    except KeyError as e:
        raise ValueError(f"not a MoVQGAN state dict: {e.args[0]!r} is missing") from None
    levels = sorted({int(k.split(".")[2]) for k in state if k.startswith("decoder.up.")})
    if not levels or levels != list(range(len(levels))):
        raise ValueError(f"decoder up levels {levels} are not 0..n-1")
    widths = [int(state[f"decoder.up.{lv}.block.0.conv1.weight"].shape[0]) for lv in levels]
    blocks = len({k.split(".")[4] for k in state if k.startswith("decoder.up.0.block.")})
    attn = [resolution // 2 ** lv for lv in levels if f"decoder.up.{lv}.attn.0.q.weight" in state]
    return MoVQConfig(n_embed=int(n_embed), embed_dim=int(embed_dim), z_channels=int(z_channels), ch=widths[0],
                      out_ch=int(out_ch), ch_mult=[w // widths[0] for w in widths], num_res_blocks=blocks - 1,
                      resolution=resolution, attn_resolutions=attn,
                      add_conv="decoder.norm_out.conv.weight" in state)


def find_movqgan(folder) -> str | None:
    """movqgan.safetensors in a model folder (or its movqgan/ subfolder), else None."""
    if folder is None:
        return None
    for name in (FILE_NAME, os.path.join("movqgan", FILE_NAME)):
        if (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    return None


def pickled_checkpoints(folder) -> list[Path]:
    """The MoVQGAN pickles a user may have put in the folder instead (movqgan_270M.ckpt, as the release names it)."""
    found = [p for sub in ("", "movqgan", os.path.join("movqgan", "270M"))
             for p in sorted((Path(folder) / sub).glob("movqgan*.ckpt"))] if folder is not None else []
    return found


def convert(ckpt_path, out_path) -> MoVQConfig:
    """movqgan_270M.ckpt (read with torch.load(weights_only=True): no pickled code runs) -> out_path
    (.safetensors): the decoder's tensors under their own names, checked by a strict load before writing."""
    from .convert_vqgan import ConversionError, read_checkpoint

    if not os.fspath(out_path).endswith(".safetensors"):
        raise ConversionError(f"output {out_path!r} must end in .safetensors")
    if not os.path.isfile(ckpt_path):
        raise ConversionError(f"MoVQGAN checkpoint not found: {os.fspath(ckpt_path)!r} (ai-forever/MoVQGAN's "
                              "movqgan_270M.ckpt, as Lumina-mGPT 2.0's README downloads it)")
    state = {k: v for k, v in read_checkpoint(ckpt_path).items() if k.startswith(KEPT_PREFIXES)}
    try:
        cfg = infer_config(state)
        MoVQDecoder(cfg).load_state_dict(state, strict=True)
    except (ValueError, RuntimeError, IndexError) as e:
        raise ConversionError(f"{os.fspath(ckpt_path)!r} holds no MoVQGAN decoder ({reason(e, 300)}): is it "
                              "movqgan_270M.ckpt?") from None
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    save_state(state, cfg, out_path)
    return cfg
