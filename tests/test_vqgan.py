"""The Chameleon / Lumina-mGPT VQGAN decoder: converter round trip, shapes, and values against an independent
functional computation of the same layers."""
import os

import pytest
import torch
import torch.nn.functional as F

from ssd_core.pixel_decoders import convert_vqgan
from ssd_core.pixel_decoders.chameleon_vqgan import VQGANConfig, VQGANDecoder, find_vqgan, infer_config

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

TINY = VQGANConfig(n_embed=16, embed_dim=8, z_channels=32, ch=32, ch_mult=[1, 2], num_res_blocks=1,
                   resolution=32, attn_resolutions=[16])  # level 1 works at 32 // 2 = 16: attention there


def random_state(cfg: VQGANConfig, seed: int = 0):
    """A randomly initialised decoder's tensors, with the non-trivial GroupNorm affines a real model has, plus the
    encoder / quant_conv / loss tensors the released checkpoint also holds (which the converter must drop)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    state = {k: v.clone() for k, v in VQGANDecoder(cfg).state_dict().items()}
    for k, v in state.items():
        if k.endswith("norm.weight") or ".norm" in k and k.endswith(".weight"):
            state[k] = 1 + 0.3 * torch.randn(v.shape, generator=g)
        elif k.endswith(".bias"):
            state[k] = 0.1 * torch.randn(v.shape, generator=g)
    state["encoder.conv_in.weight"] = torch.randn(cfg.ch, 3, 3, 3, generator=g)
    state["quant_conv.weight"] = torch.randn(cfg.embed_dim, cfg.z_channels, 1, 1, generator=g)
    state["loss.discriminator.main.0.weight"] = torch.randn(4, 3, 4, 4, generator=g)
    return state


# ---- an independent computation: plain functions over the weights dict, written from taming's description -----
def f_norm(x, W, p):
    return F.group_norm(x, 32, W[p + ".weight"], W[p + ".bias"], eps=1e-6)


def f_conv(x, W, p):
    w = W[p + ".weight"]
    return F.conv2d(x, w, W[p + ".bias"], padding=w.shape[-1] // 2)


def f_res(x, W, p):
    h = f_conv(F.silu(f_norm(x, W, p + ".norm1")), W, p + ".conv1")
    h = f_conv(F.silu(f_norm(h, W, p + ".norm2")), W, p + ".conv2")
    if p + ".nin_shortcut.weight" in W:
        x = f_conv(x, W, p + ".nin_shortcut")
    return x + h


def f_attn(x, W, p):
    h = f_norm(x, W, p + ".norm")
    B, C, H, Wd = h.shape
    q = f_conv(h, W, p + ".q").flatten(2)  # B C N
    k = f_conv(h, W, p + ".k").flatten(2)
    v = f_conv(h, W, p + ".v").flatten(2)
    att = torch.einsum("bci,bcj->bij", q, k) / C ** 0.5
    out = torch.einsum("bij,bcj->bci", att.softmax(-1), v).reshape(B, C, H, Wd)
    return x + f_conv(out, W, p + ".proj_out")


def f_decode(codes, W, cfg):
    z = W["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    h = f_conv(z, W, "post_quant_conv")
    h = f_conv(h, W, "decoder.conv_in")
    h = f_res(h, W, "decoder.mid.block_1")
    h = f_attn(h, W, "decoder.mid.attn_1")
    h = f_res(h, W, "decoder.mid.block_2")
    for lv in reversed(range(len(cfg.ch_mult))):
        for i in range(cfg.num_res_blocks + 1):
            h = f_res(h, W, f"decoder.up.{lv}.block.{i}")
            if f"decoder.up.{lv}.attn.{i}.q.weight" in W:
                h = f_attn(h, W, f"decoder.up.{lv}.attn.{i}")
        if lv:
            h = h.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
            h = f_conv(h, W, f"decoder.up.{lv}.upsample.conv")
    return f_conv(F.silu(f_norm(h, W, "decoder.norm_out")), W, "decoder.conv_out")


class NotATensor:  # a pickled object that weights_only loading refuses (as training callbacks would be)
    pass


@pytest.fixture()
def converted(tmp_path):
    state = random_state(TINY)
    ckpt = tmp_path / "vqgan.ckpt"
    torch.save({"state_dict": state, "global_step": 7}, ckpt)
    out = tmp_path / "model" / "vqgan.safetensors"
    cfg = convert_vqgan.convert(str(ckpt), str(out), resolution=TINY.resolution)
    return state, cfg, out


def test_layout_has_attention_where_configured():
    names = set(VQGANDecoder(TINY).state_dict())
    assert "decoder.mid.attn_1.q.weight" in names
    assert "decoder.up.1.attn.1.proj_out.weight" in names  # level 1 sits at resolution 16
    assert not any(k.startswith("decoder.up.0.attn") for k in names)
    assert "decoder.up.1.upsample.conv.weight" in names and "decoder.up.0.upsample.conv.weight" not in names
    assert "decoder.up.1.block.0.nin_shortcut.weight" not in names  # 64 -> 64
    assert "decoder.up.0.block.0.nin_shortcut.weight" in names  # 64 -> 32


def test_converter_round_trip(converted):
    state, cfg, out = converted
    assert cfg == TINY
    dec = VQGANDecoder.load(str(out))
    assert dec.config == TINY
    loaded = dec.state_dict()
    kept = {k: v for k, v in state.items() if k.startswith(("quantize.", "post_quant_conv.", "decoder."))}
    assert set(loaded) == set(kept)
    for k in kept:
        assert torch.equal(loaded[k], kept[k]), k
    # the module built straight from the original weights gives identical outputs
    ref = VQGANDecoder(TINY)
    ref.load_state_dict(kept)
    codes = torch.randint(0, 16, (2, 3, 4), generator=torch.Generator().manual_seed(1))
    assert torch.equal(dec(codes), ref.eval()(codes))


def test_output_shape_and_values(converted):
    state, cfg, out = converted
    dec = VQGANDecoder.load(str(out))
    codes = torch.randint(0, 16, (2, 3, 5), generator=torch.Generator().manual_seed(2))
    x = dec(codes)
    f = 2 ** (len(cfg.ch_mult) - 1)
    assert x.shape == (2, 3, 3 * f, 5 * f)
    expected = f_decode(codes, state, cfg)
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=1e-5)
    img = dec.decode_to_image(codes)
    assert img.shape == (2, 3 * f, 5 * f, 3) and img.min() >= 0 and img.max() <= 1


def test_plain_state_dict_checkpoint_and_cli(tmp_path, capsys):
    state = random_state(TINY, seed=3)
    ckpt = tmp_path / "plain.ckpt"
    torch.save(state, ckpt)
    out = tmp_path / "vqgan.safetensors"
    assert convert_vqgan.main([str(ckpt), str(out), "--resolution", "32", "--dtype", "fp16"]) == 0
    assert "16 codes" in capsys.readouterr().out
    dec = VQGANDecoder.load(str(out))
    assert torch.equal(dec.state_dict()["decoder.conv_in.weight"], state["decoder.conv_in.weight"].half().float())
    assert find_vqgan(str(tmp_path)) == str(out)
    assert find_vqgan(str(tmp_path / "nowhere")) is None


def test_infer_config_reads_released_layout():
    cfg = VQGANConfig(n_embed=16, embed_dim=8, z_channels=32, ch=32, ch_mult=[1, 1, 2], num_res_blocks=2,
                      resolution=64, attn_resolutions=[16])
    assert infer_config(VQGANDecoder(cfg).state_dict(), resolution=64) == cfg


def test_converter_errors(tmp_path, capsys):
    with pytest.raises(convert_vqgan.ConversionError, match="not found"):
        convert_vqgan.convert(str(tmp_path / "missing.ckpt"), str(tmp_path / "o.safetensors"))
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"this is not a checkpoint")
    with pytest.raises(convert_vqgan.ConversionError, match="could not read"):
        convert_vqgan.convert(str(junk), str(tmp_path / "o.safetensors"))
    other = tmp_path / "other.ckpt"
    torch.save({"model.layers.0.weight": torch.zeros(2)}, other)
    with pytest.raises(convert_vqgan.ConversionError, match="no VQGAN decoder"):
        convert_vqgan.convert(str(other), str(tmp_path / "o.safetensors"))
    pickled = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": random_state(TINY), "callbacks": NotATensor()}, pickled)
    with pytest.raises(convert_vqgan.ConversionError, match="besides tensors"):
        convert_vqgan.convert(str(pickled), str(tmp_path / "o.safetensors"))
    with pytest.raises(convert_vqgan.ConversionError, match="must end in .safetensors"):
        convert_vqgan.convert(str(other), str(tmp_path / "o.bin"))
    assert convert_vqgan.main([str(tmp_path / "missing.ckpt"), str(tmp_path / "o.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o.safetensors")


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="convert_vqgan"):
        VQGANDecoder.load(str(tmp_path / "vqgan.safetensors"))
    from safetensors.torch import save_file

    bare = tmp_path / "bare.safetensors"
    save_file({"x": torch.zeros(1)}, str(bare))
    with pytest.raises(ValueError, match="metadata"):
        VQGANDecoder.load(str(bare))
    with pytest.raises(ValueError, match="code ids"):
        VQGANDecoder(TINY)(torch.full((1, 1, 1), 16))
