"""Emu3.5's IBQ pixel decoder (ssd_core/pixel_decoders/ibq.py) against the release's own code, and its converter.

The release's decoding path (baaivision/Emu3.5 src/vision_tokenizer: ibq.py IBQ.decode_code,
modules/vqvae/quantize.py IndexPropagationQuantize.get_codebook_entry, modules/diffusionmodules/model.py Decoder,
and the Encoder, whose tensors a released model.ckpt holds too; __init__.py build_vision_tokenizer's loading;
src/utils/generation_utils.py decode_image) is re-created from that code in tests/released_ibq.py, trimmed to what
decoding runs, and compared with the pack pixel for pixel on the same tiny random weights.
"""
import math

import pytest
import torch
import torch.nn as nn
import yaml

from ssd_core import cli
from ssd_core.errors import SSDError
from ssd_core.pixel_decoders import ibq
from ssd_core.pixel_decoders.ibq import IBQConfig, IBQDecoder
from released_ibq import IBQ, build_vision_tokenizer, decode_image_array
from tiny_ibq import TINY_IBQ, randomize, tiny_ibq_decoder


# ---- tiny configs in the release's config.yaml layout -----------------------------------------------------------
def release_yaml(cfg: dict, **extra) -> dict:
    """IBQ(**cfg)'s keys as BAAI/Emu3.5-VisionTokenizer's config.yaml holds them (plus the encoder's)."""
    dd = dict(double_z=False, z_channels=cfg["z_channels"], resolution=cfg["resolution"], in_channels=3,
              out_ch=cfg["out_ch"], ch=cfg["ch"], ch_mult=list(cfg["ch_mult"]), num_res_blocks=cfg["num_res_blocks"],
              attn_resolutions=list(cfg["attn_resolutions"]), dropout=0.0)
    if not cfg.get("resamp_with_conv", True):
        dd["resamp_with_conv"] = False
    return dict(ddconfig=dd, n_embed=cfg["n_embed"], embed_dim=cfg["embed_dim"], **extra)


# a second shape: 3 levels (f = 4), z_channels != embed_dim, attention at a middle level of a resolution the
# levels do not divide (90 // 4 = 22, 44, 88: the release's counting, not 90 // 2), upsamplers without their conv
ODD = dict(n_embed=40, embed_dim=16, z_channels=32, ch=32, out_ch=3, ch_mult=[2, 1, 1], num_res_blocks=2,
           resolution=90, attn_resolutions=[44], resamp_with_conv=False)


def tiny_ibq(seed: int = 1, cfg: dict = TINY_IBQ) -> IBQ:
    """The release's IBQ (encoder too) at a tiny config, random weights as tiny_ibq.randomize moves them."""
    torch.manual_seed(seed)
    return randomize(IBQ(**release_yaml(cfg)), seed).eval()


def decoder_state(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(ibq.KEPT_PREFIXES)}


def assert_same_pixels(ours: IBQDecoder, ref: IBQ, cfg: dict, grids):
    gen = torch.Generator().manual_seed(7)
    for shape in grids:
        codes = torch.randint(0, cfg["n_embed"], shape, generator=gen)
        b, h, w = shape
        with torch.no_grad():
            theirs = ref.decode_code(codes, shape=(b, h, w, cfg["embed_dim"]))
        mine = ours(codes)
        f = 2 ** (len(cfg["ch_mult"]) - 1)
        assert tuple(mine.shape) == (b, 3, f * h, f * w) == tuple(theirs.shape) and mine.dtype == torch.float32
        assert theirs.std() > 0.05
        # one fused attention here, two bmm there: float rounding, which moves with the CPU's kernels (1.53e-5 on
        # 17 of 4,608 values on one machine, under 1e-5 on another), far below the pixels' spread (std > 0.05)
        scale = float(theirs.abs().max())
        torch.testing.assert_close(mine, theirs, rtol=0, atol=3e-5 * max(scale, 1.0))


# ---- (a) the decoder against the release's --------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [TINY_IBQ, ODD], ids=["f16", "odd"])
def test_ibq_equals_the_release_decoder_on_the_same_weights(tmp_path, cfg):
    ref = tiny_ibq(3, cfg)
    conf = IBQConfig(**{k: (list(v) if isinstance(v, list) else v) for k, v in cfg.items()})
    ibq.save_state(decoder_state(ref), conf, tmp_path / "ibq.safetensors")  # a real file, as a folder holds it
    ours = IBQDecoder.load(tmp_path / "ibq.safetensors")
    assert ours.config == conf and not ours.training
    assert sorted(ours.state_dict()) == sorted(decoder_state(ref))  # the release's names
    # where attention sits: the release's counting
    ref_attn = [len(ref.decoder.up[lv].attn) > 0 for lv in range(len(cfg["ch_mult"]))]
    assert ref_attn == [len(ours.decoder.up[lv].attn) > 0 for lv in range(len(cfg["ch_mult"]))] and any(ref_attn)
    assert_same_pixels(ours, ref, cfg, [(1, 2, 3), (2, 3, 2), (1, 4, 4)])


def test_decode_to_image_is_the_release_decode_image(tmp_path):
    ref = tiny_ibq(4)
    ours = IBQDecoder(IBQConfig(**TINY_IBQ))
    ours.load_state_dict(decoder_state(ref), strict=True)
    codes = torch.randint(0, TINY_IBQ["n_embed"], (3, 5), generator=torch.Generator().manual_seed(1))
    want = torch.from_numpy(decode_image_array(codes, ref, TINY_IBQ["embed_dim"])).float()
    img = ours.eval().decode_to_image(codes[None])
    assert tuple(img.shape) == (1, 48, 80, 3) and float(img.min()) >= 0 and float(img.max()) <= 1
    # the release truncates to uint8 (astype), the pack keeps the float: at most one level apart
    assert float((img[0] * 255 - want).abs().max()) <= 1 + 1e-3
    assert float(((img[0] * 255).floor() != want).float().mean()) < 0.01


def test_tiny_ibq_decoder_is_the_tiny_release_shape(tmp_path):
    dec = tiny_ibq_decoder(1)
    assert dec.config.factor == 16 and dec.config.n_embed == TINY_IBQ["n_embed"]
    assert [len(dec.decoder.up[lv].attn) > 0 for lv in range(5)] == [False] * 4 + [True]
    dec.save(tmp_path / "ibq.safetensors")
    back = IBQDecoder.load(tmp_path / "ibq.safetensors")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in dec.state_dict().items())
    codes = torch.randint(0, 64, (1, 2, 2))
    assert torch.equal(back(codes), dec(codes))
    assert tiny_ibq_decoder(2, n_embed=500).config.n_embed == 500
    ref = IBQ(**release_yaml(TINY_IBQ))  # the release builds the same tensors from the same config
    assert {k: v.shape for k, v in decoder_state(ref).items()} == {k: v.shape for k, v in dec.state_dict().items()}


def test_default_config_is_the_released_tokenizer():
    """BAAI/Emu3.5-VisionTokenizer config.yaml: ddconfig {double_z False, z_channels 256, resolution 256,
    in_channels 3, out_ch 3, ch 256, ch_mult [1, 1, 2, 2, 4], num_res_blocks 4, attn_resolutions [16],
    dropout 0.0}, n_embed 131072, embed_dim 256."""
    cfg = IBQConfig()
    assert (cfg.n_embed, cfg.embed_dim, cfg.factor) == (131072, 256, 16)
    assert [cfg.level_has_attn(lv) for lv in range(5)] == [False] * 4 + [True]
    with torch.device("meta"):
        ours = IBQDecoder(cfg)
        ref = IBQ(**release_yaml(IBQConfig().__dict__))
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items() if k.startswith(ibq.KEPT_PREFIXES)}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == want
    params = sum(math.prod(s) for s in want.values())
    assert 150e6 < params < 400e6  # the decoder half of a tokenizer of ~455M parameters (tech report)


def test_codes_are_checked():
    dec = tiny_ibq_decoder(1)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        dec(torch.tensor([[[0, 64]]]))
    with pytest.raises(ValueError, match="must be"):
        dec(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="multiples of 32"):
        IBQConfig(ch=48).validate()


# ---- (b) the converter on the release's files --------------------------------------------------------------------
def write_release(folder, ref: IBQ, cfg: dict, wrapped: bool = True):
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3, "global_step": 1200} if wrapped else state, folder / "model.ckpt")
    (folder / "config.yaml").write_text(yaml.safe_dump(release_yaml(cfg, beta=0.25, use_entropy_loss=True,
                                                                    entropy_temperature=0.01), sort_keys=False))
    return state


@pytest.mark.parametrize("wrapped", [True, False], ids=["state_dict", "plain"])
def test_convert_ibq_reads_the_release_files(tmp_path, wrapped, capsys):
    vt = tmp_path / "Emu3.5-VisionTokenizer"
    state = write_release(vt, tiny_ibq(5), TINY_IBQ, wrapped)
    assert any(k.startswith("encoder.") for k in state) and "quant_conv.weight" in state
    out = tmp_path / "Emu3.5" / "ibq.safetensors"
    assert cli.main(["convert-ibq", str(vt / "model.ckpt"), str(vt / "config.yaml"), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "64 codes, embed_dim 32" in printed and "f=16" in printed
    assert ibq.find_ibq(out.parent) == str(out) and IBQDecoder.check_file(out) == IBQConfig(**TINY_IBQ)
    back = IBQDecoder.load(out)
    kept = {k for k in state if k.startswith(ibq.KEPT_PREFIXES)}
    assert set(back.state_dict()) == kept  # the encoder and quant_conv are left behind
    assert all(torch.equal(back.state_dict()[k], state[k]) for k in kept)
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        assert set(f.keys()) == kept
    ref = build_vision_tokenizer(vt)  # the release's own loading of the same two files
    assert_same_pixels(back, ref, TINY_IBQ, [(1, 3, 2)])


def test_convert_ibq_odd_config_and_safetensors_input(tmp_path):
    vt = tmp_path / "vt"
    state = write_release(vt, tiny_ibq(6, ODD), ODD)
    from safetensors.torch import save_file

    save_file(state, str(vt / "model.safetensors"))
    out = tmp_path / "ibq.safetensors"
    assert cli.main(["convert-ibq", str(vt / "model.safetensors"), str(vt / "config.yaml"), str(out)]) == 0
    back = IBQDecoder.load(out)
    assert back.config == IBQConfig(**ODD)
    assert_same_pixels(back, build_vision_tokenizer(vt), ODD, [(1, 3, 5)])


# ---- (c) refusals, one line each ----------------------------------------------------------------------------------
class Hyperparameters:  # what a Lightning checkpoint may pickle beside its tensors
    def __init__(self):
        self.lr = 1e-4


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_convert_ibq_refusals(tmp_path, capsys):
    vt = tmp_path / "vt"
    state = write_release(vt, tiny_ibq(7), TINY_IBQ)
    ckpt, conf, out = str(vt / "model.ckpt"), str(vt / "config.yaml"), str(tmp_path / "o" / "ibq.safetensors")
    assert cli.main(["convert-ibq", str(tmp_path / "nope.ckpt"), conf, out]) == 2
    assert "nope.ckpt" in _one_error_line(capsys)
    assert cli.main(["convert-ibq", ckpt, str(tmp_path / "nope.yaml"), out]) == 2
    assert "nope.yaml" in _one_error_line(capsys)
    assert cli.main(["convert-ibq", ckpt, conf, str(tmp_path / "ibq.pt")]) == 2
    assert ".safetensors" in _one_error_line(capsys)
    # a checkpoint that only weights_only=False would read: refused, nothing unpickled
    torch.save({"state_dict": state, "hyper_parameters": Hyperparameters()}, tmp_path / "lightning.ckpt")
    assert cli.main(["convert-ibq", str(tmp_path / "lightning.ckpt"), conf, out]) == 2
    line = _one_error_line(capsys)
    assert "weights_only=True" in line and "lightning.ckpt" in line
    # a config of another model than the checkpoint
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(release_yaml(dict(TINY_IBQ, num_res_blocks=2))))
    assert cli.main(["convert-ibq", ckpt, str(other), out]) == 2
    assert "does not fit" in _one_error_line(capsys)
    (tmp_path / "bad.yaml").write_text("n_embed: 64\n")
    assert cli.main(["convert-ibq", ckpt, str(tmp_path / "bad.yaml"), out]) == 2
    assert "ddconfig" in _one_error_line(capsys)
    torch.save({"encoder.conv_in.weight": torch.zeros(1)}, tmp_path / "enc.ckpt")
    assert cli.main(["convert-ibq", str(tmp_path / "enc.ckpt"), conf, out]) == 2
    assert "no IBQ decoder" in _one_error_line(capsys)
    assert not (tmp_path / "o").exists()  # nothing written by a refused conversion


def test_damaged_files_are_refused_naming_the_fix(tmp_path):
    dec = tiny_ibq_decoder(1)
    state = dec.state_dict()
    missing = tmp_path / "missing" / "ibq.safetensors"
    missing.parent.mkdir()
    ibq.save_state({k: v for k, v in state.items() if k != "decoder.up.4.attn.0.q.weight"}, dec.config, missing)
    for call in (IBQDecoder.check_file, IBQDecoder.load):
        with pytest.raises(SSDError, match=r"decoder\.up\.4\.attn\.0\.q\.weight: None in the file.*convert-ibq "
                           r"model\.ckpt config\.yaml .*missing/ibq\.safetensors"):
            call(missing)
    cut = tmp_path / "cut.safetensors"
    dec.save(cut)
    cut.write_bytes(cut.read_bytes()[:200])
    with pytest.raises(SSDError, match="is not a converted IBQ decoder .*BAAI/Emu3.5-VisionTokenizer"):
        IBQDecoder.check_file(cut)
    with pytest.raises(SSDError, match="not a .safetensors file"):
        IBQDecoder.check_file(tmp_path / "nope.safetensors")


def test_find_and_pickles(tmp_path):
    assert ibq.find_ibq(tmp_path) is None and ibq.find_ibq(None) is None and ibq.pickled_checkpoints(None) == []
    (tmp_path / "Emu3.5-VisionTokenizer").mkdir()
    (tmp_path / "Emu3.5-VisionTokenizer" / "model.ckpt").write_bytes(b"x")
    assert [p.name for p in ibq.pickled_checkpoints(tmp_path)] == ["model.ckpt"]
    (tmp_path / "ibq").mkdir()
    tiny_ibq_decoder(1).save(tmp_path / "ibq" / "ibq.safetensors")
    assert ibq.find_ibq(tmp_path) == str(tmp_path / "ibq" / "ibq.safetensors")
    assert ibq.CONVERT_FIX.format(folder="F") == (
        "download model.ckpt and config.yaml from BAAI/Emu3.5-VisionTokenizer and convert them with "
        "`python -m ssd_core convert-ibq model.ckpt config.yaml F/ibq.safetensors`")


@pytest.mark.parametrize("family", ["ibq", "movqgan"])
def test_codes_are_checked_before_decoding(family):
    """DecoderFile.embed_codes, shared by the IBQ and MoVQGAN decoders: a grid of ids in range, nothing else."""
    if family == "ibq":
        dec = tiny_ibq_decoder(1)
    else:
        from released_lumina2 import MOVQ
        from ssd_core.pixel_decoders.movqgan import MoVQConfig, MoVQDecoder
        dec = MoVQDecoder(MoVQConfig(**MOVQ))
    n = dec.config.n_embed
    zq = dec.embed_codes(torch.tensor([[[0, n - 1]]]))
    assert tuple(zq.shape) == (1, dec.config.embed_dim, 1, 2)
    assert torch.equal(zq[0, :, 0, 1], dec.quantize.embedding.weight[n - 1])
    with pytest.raises(ValueError, match=r"codes must be \(B, H, W\), got shape \(2, 2\)"):
        dec(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"code ids must lie in \[0, {n}\), got \[0, {n}\]"):
        dec(torch.tensor([[[0, n]]]))
    with pytest.raises(ValueError, match=r"got \[-1, 0\]"):
        dec(torch.tensor([[[-1, 0]]]))
