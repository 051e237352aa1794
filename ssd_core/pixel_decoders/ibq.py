"""The IBQ pixel decoder of Emu3.5 (baaivision/Emu3.5 src/vision_tokenizer, weights BAAI/Emu3.5-VisionTokenizer).

code ids -> quantizer embedding (IndexPropagationQuantize.get_codebook_entry: a plain lookup, [B, embed_dim, h, w])
-> post_quant_conv -> Decoder (taming's: conv_in; mid: res / attn / res; up levels of res blocks, + attn where
taming's resolution rule puts it, nearest-x2 upsample + conv; GroupNorm(32), swish, conv_out) -> pixels in
[-1, 1], 16 px a code. The released tokenizer (its config.yaml): 131,072 codes of 256 dims, z_channels 256,
ch 256, ch_mult [1, 1, 2, 2, 4], 4 res blocks, attention at resolution 16 of 256 (the lowest level) and in the
middle. This is IBQ.decode_code(code_b, shape=(B, h, w, 256)) of src/vision_tokenizer/ibq.py, as
src/utils/generation_utils.py decode_image calls it.

Tensor names are the release's (`quantize.embedding.weight`, `post_quant_conv.*`, `decoder.*`), so
`python -m ssd_core convert-ibq model.ckpt config.yaml <folder>/ibq.safetensors` copies the tensors; weights load
from safetensors only, the config as JSON in the file's metadata (key `ssd_ibq_config`).
"""
from __future__ import annotations

import os
import pickle
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import reason
from .decoder_file import DecoderFile, Quantize, write_state

METADATA_KEY = "ssd_ibq_config"
FILE_NAME = "ibq.safetensors"
REPO = "BAAI/Emu3.5-VisionTokenizer"
KEPT_PREFIXES = ("quantize.embedding.", "post_quant_conv.", "decoder.")
CONVERT_FIX = ("download model.ckpt and config.yaml from BAAI/Emu3.5-VisionTokenizer and convert them with "
               "`python -m ssd_core convert-ibq model.ckpt config.yaml {folder}/ibq.safetensors`")
# config.yaml's ddconfig keys the decoder reads (the others, in_channels / double_z / dropout, are the encoder's
# or training's)
DD_FIELDS = ("z_channels", "ch", "out_ch", "ch_mult", "num_res_blocks", "resolution", "attn_resolutions",
             "resamp_with_conv")


@dataclass
class IBQConfig:
    """Defaults: BAAI/Emu3.5-VisionTokenizer's config.yaml (ddconfig, n_embed, embed_dim)."""
    n_embed: int = 131072
    embed_dim: int = 256  # the codebook vectors' width (decode_image's shape=(1, h, w, 256))
    z_channels: int = 256
    ch: int = 256
    out_ch: int = 3
    ch_mult: list = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 4
    resolution: int = 256  # taming's rule: the lowest level works at resolution // 2**(levels-1), doubling upwards
    attn_resolutions: list = field(default_factory=lambda: [16])
    resamp_with_conv: bool = True  # the upsamplers' 3x3 conv

    @property
    def factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def level_resolution(self, level: int) -> int:
        """As the release's Decoder counts: curr_res = resolution // 2**(levels-1) at the lowest level, x2 a level."""
        levels = len(self.ch_mult)
        return (self.resolution // 2 ** (levels - 1)) * 2 ** (levels - 1 - level)

    def level_has_attn(self, level: int) -> bool:
        return self.level_resolution(level) in self.attn_resolutions

    def validate(self) -> "IBQConfig":
        def whole(v, low):
            return isinstance(v, int) and not isinstance(v, bool) and v >= low

        ok = (all(whole(getattr(self, k), 1) for k in ("n_embed", "embed_dim", "z_channels", "ch", "out_ch",
                                                         "resolution"))
              and whole(self.num_res_blocks, 0) and isinstance(self.resamp_with_conv, bool)
              and isinstance(self.ch_mult, list) and self.ch_mult and all(whole(m, 1) for m in self.ch_mult)
              and isinstance(self.attn_resolutions, list) and all(whole(r, 0) for r in self.attn_resolutions))
        if not ok or any((self.ch * m) % 32 for m in self.ch_mult):
            raise ValueError(f"IBQ config {asdict(self)} is not an IBQ decoder (whole positive sizes; channels "
                             "must be multiples of 32 for GroupNorm(32))")
        return self


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)  # model.py Normalize


class ResnetBlock(nn.Module):
    """model.py ResnetBlock as the Decoder builds it: temb_channels 0 (no temb_proj), no conv_shortcut, dropout
    unused at inference."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head attention over the H*W positions (scale c**-0.5), residual."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, hh, ww = x.shape
        q, k, v = (m(h).reshape(b, 1, c, hh * ww).transpose(-1, -2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # [b, 1, hw, c]
        return x + self.proj_out(out.transpose(-1, -2).reshape(b, c, hh, ww))


class Upsample(nn.Module):
    def __init__(self, channels: int, with_conv: bool):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1) if with_conv else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return x if self.conv is None else self.conv(x)


class Decoder(nn.Module):
    """src/vision_tokenizer/modules/diffusionmodules/model.py Decoder (give_pre_end False, no temb)."""

    def __init__(self, cfg: IBQConfig):
        super().__init__()
        levels = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in)
        self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(block_in, block_in)
        up = []
        for level in reversed(range(levels)):  # built lowest resolution first, stored by level
            stage = nn.Module()
            block_out = cfg.ch * cfg.ch_mult[level]
            stage.block = nn.ModuleList()
            stage.attn = nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                stage.block.append(ResnetBlock(block_in, block_out))
                block_in = block_out
                if cfg.level_has_attn(level):
                    stage.attn.append(AttnBlock(block_in))
            if level != 0:
                stage.upsample = Upsample(block_in, cfg.resamp_with_conv)
            up.insert(0, stage)
        self.up = nn.ModuleList(up)
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for level in reversed(range(len(self.up))):
            stage = self.up[level]
            for i, block in enumerate(stage.block):
                h = block(h)
                if len(stage.attn):
                    h = stage.attn[i](h)
            if level != 0:
                h = stage.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class IBQDecoder(DecoderFile):
    """Codes [B, h, w] -> pixels [B, 3, 16h, 16w] in [-1, 1] (the released tokenizer: f = 16)."""

    what, config_class, metadata_key, file_format = "IBQ", IBQConfig, METADATA_KEY, "ssd-ibq-decoder"
    convert_fix = CONVERT_FIX

    def __init__(self, cfg: IBQConfig | None = None):
        super().__init__()
        self.config = cfg = (cfg or IBQConfig()).validate()
        self.quantize = Quantize(cfg.n_embed, cfg.embed_dim)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = Decoder(cfg)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        zq = self.embed_codes(codes)  # [B, embed_dim, H, W]
        return self.decoder(self.post_quant_conv(zq))



def save_state(state: dict, cfg: IBQConfig, path) -> None:
    write_state(IBQDecoder, state, cfg, path)


def find_ibq(folder) -> str | None:
    """ibq.safetensors in a model folder (or its ibq/ subfolder), else None."""
    if folder is None:
        return None
    for name in (FILE_NAME, os.path.join("ibq", FILE_NAME)):
        if (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    return None


def pickled_checkpoints(folder) -> list[Path]:
    """The release's pickle a user may have put in the folder instead: model.ckpt (as BAAI/Emu3.5-VisionTokenizer
    names it), in the folder or an Emu3.5-VisionTokenizer/, vision_tokenizer/ or ibq/ subfolder."""
    if folder is None:
        return []
    return [p for sub in ("", "Emu3.5-VisionTokenizer", "vision_tokenizer", "ibq")
            for p in [Path(folder) / sub / "model.ckpt"] if p.is_file()]


# ---- conversion ---------------------------------------------------------------------------------------------
def read_config(config_path) -> IBQConfig:
    """config.yaml as build_vision_tokenizer reads it (IBQ(**cfg): ddconfig, n_embed, embed_dim, ...), through
    yaml.safe_load (plain YAML: what OmegaConf.load reads from it)."""
    import yaml

    from .convert_vqgan import ConversionError

    path = os.fspath(config_path)
    if not os.path.isfile(path):
        raise ConversionError(f"IBQ config not found: {path!r} ({REPO}'s config.yaml)")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise ConversionError(f"could not read {path!r} as YAML ({reason(e)})") from None
    dd = raw.get("ddconfig") if isinstance(raw, dict) else None
    if not isinstance(dd, dict) or "n_embed" not in raw or "embed_dim" not in raw:
        raise ConversionError(f"{path!r} is not IBQ's config.yaml: it needs ddconfig, n_embed and embed_dim at the "
                              f"top (as {REPO}'s)")
    if dd.get("give_pre_end"):
        raise ConversionError(f"{path!r}: ddconfig.give_pre_end makes the decoder return features, not pixels")
    missing = [k for k in ("z_channels", "ch", "out_ch", "num_res_blocks", "resolution", "attn_resolutions")
               if k not in dd]
    if missing:
        raise ConversionError(f"{path!r}: ddconfig lacks {', '.join(missing)}")
    values = {k: dd[k] for k in DD_FIELDS if k in dd}
    for k in ("ch_mult", "attn_resolutions"):  # YAML lists (or tuples in a hand-written file)
        if k in values and isinstance(values[k], (list, tuple)):
            values[k] = list(values[k])
    try:
        return IBQConfig(n_embed=raw["n_embed"], embed_dim=raw["embed_dim"], **values).validate()
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{path!r}: {e}") from None


def read_state(ckpt_path) -> dict[str, torch.Tensor]:
    """model.ckpt with torch.load(weights_only=True) (no pickled code runs), unwrapped from {"state_dict": ...}
    as build_vision_tokenizer does; a .safetensors file of the same tensors is read as is."""
    from .convert_vqgan import ConversionError

    path = os.fspath(ckpt_path)
    if not os.path.isfile(path):
        raise ConversionError(f"IBQ checkpoint not found: {path!r} ({REPO}'s model.ckpt)")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except Exception as e:  # noqa: BLE001
            raise ConversionError(f"could not read {path!r} as safetensors: {type(e).__name__}: {e}") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = (str(e).strip().splitlines() or ["unpickling refused"])[0][:200]
        raise ConversionError(
            f"{path!r} holds pickled Python objects besides tensors, which torch.load(weights_only=True) refuses "
            f"({first}); the pack never unpickles code. If you trust the file, save its tensors alone, e.g. "
            "torch.save(torch.load(path, weights_only=False)['state_dict'], 'ibq_tensors.ckpt'), and convert "
            "that file") from None
    except Exception as e:  # noqa: BLE001 -- any unreadable file gets the same clear message
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConversionError(f"could not read {path!r} as a PyTorch checkpoint with weights_only=True: "
                              f"{type(e).__name__}: {first}") from None
    if isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ConversionError(f"{path!r} does not hold a state dict (got {type(obj).__name__})")
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConversionError(f"{path!r} holds no tensors")
    return tensors


def convert(ckpt_path, config_yaml_path, out_path) -> IBQConfig:
    """BAAI/Emu3.5-VisionTokenizer's model.ckpt + config.yaml -> out_path (.safetensors): the decoder's tensors
    (codebook, post_quant_conv, decoder) under their own names, their shapes checked against the config first."""
    from .convert_vqgan import ConversionError

    if not os.fspath(out_path).endswith(".safetensors"):
        raise ConversionError(f"output {os.fspath(out_path)!r} must end in .safetensors")
    cfg = read_config(config_yaml_path)
    state = {k: v for k, v in read_state(ckpt_path).items() if k.startswith(KEPT_PREFIXES)}
    if "quantize.embedding.weight" not in state or not any(k.startswith("decoder.") for k in state):
        raise ConversionError(f"{os.fspath(ckpt_path)!r} holds no IBQ decoder (no quantize.embedding.weight and "
                              f"decoder.* tensors): is it {REPO}'s model.ckpt?")
    wrong = IBQDecoder.wrong_shapes(cfg, {k: tuple(v.shape) for k, v in state.items()})
    if wrong:
        raise ConversionError(f"{os.fspath(ckpt_path)!r} does not fit {os.fspath(config_yaml_path)!r} "
                              f"({len(wrong)} tensors differ, first: {wrong[0]}): are they the same release's?")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    save_state(state, cfg, out_path)
    return cfg
