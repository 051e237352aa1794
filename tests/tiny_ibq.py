"""A tiny IBQ pixel decoder (ssd_core/pixel_decoders/ibq.py) with random weights, for tiny Emu3.5 folders.

The released tokenizer's shape at a fraction of its width: 5 levels (16 px a code, as Emu3.5's), attention at the
lowest level (resolution 64 // 16 = 4, as the release's 256 // 16 = 16) and in the middle.
"""
import torch

TINY_IBQ = dict(n_embed=64, embed_dim=32, z_channels=32, ch=32, out_ch=3, ch_mult=[1, 1, 2, 2, 4],
                num_res_blocks=1, resolution=64, attn_resolutions=[4], resamp_with_conv=True)


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved off its init (GroupNorm's ones / zeros matter then); conv_out shrunk so the pixels
    stay mostly inside [-1, 1] and few are clamped."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
        module.decoder.conv_out.weight.mul_(0.05)
        module.decoder.conv_out.bias.mul_(0.05)
    return module


def tiny_ibq_decoder(seed: int = 1, n_embed: int | None = None):
    """The pack's IBQDecoder at the tiny config (n_embed codes, default 64), random weights, fp32, eval.
    Save it into a folder with `.save(folder / "ibq.safetensors")`."""
    from ssd_core.pixel_decoders.ibq import IBQConfig, IBQDecoder

    cfg = dict(TINY_IBQ, ch_mult=list(TINY_IBQ["ch_mult"]), attn_resolutions=list(TINY_IBQ["attn_resolutions"]))
    if n_embed is not None:
        cfg["n_embed"] = int(n_embed)
    torch.manual_seed(seed)
    return randomize(IBQDecoder(IBQConfig(**cfg)), seed).eval()
