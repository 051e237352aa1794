"""Lumina-mGPT adapter on a tiny random-init ChameleonForConditionalGeneration (see tiny_families.py)."""
import pytest
import torch

import ssd_core
from ssd_core.families.lumina import LuminaModel, crop_size_grids
from ssd_core.pixel_decoders.chameleon_vqgan import VQGANDecoder
from tiny_families import build_lumina, check_cfg_matches_unbatched, check_every_decoder, sequence_ids

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

PROMPT = "a red cat"
GRID = (4, 4)


BUILD = build_lumina  # the `folder` and `model` fixtures of conftest.py build this family


def test_loads_as_lumina(model):
    assert isinstance(model, LuminaModel) and model.family == "lumina"
    assert model.image_vocab_size == 16
    vm = model.model.model.vocabulary_mapping
    x = torch.randn(2, model.hidden_size)
    # image logits from lm_head over the features, in code order (bpe2img)
    assert torch.equal(model.head_logits(x), model.model.lm_head(x)[:, [vm.img2bpe[c] for c in range(16)]])
    assert [vm.bpe2img[i] for i in model.code_to_id(torch.tensor([0, 9, 15])).tolist()] == [0, 9, 15]


def test_chameleon_forward_masks_image_logits_so_we_do_not_use_it(model):
    """The reason for the adapter's own head: transformers' forward sets image-token logits to the minimum."""
    p = model.build_prompt(PROMPT, "", False, GRID)
    with torch.no_grad():
        out = model.model(input_ids=p.ids)
    img = model.image_ids
    assert bool((out.logits[0, -1, img] == torch.finfo(out.logits.dtype).min).all())
    session = model.start(p)
    ours = model.image_logits(session.last_features)[0]
    assert torch.isfinite(ours).all() and ours.std() > 0


def test_prompt_size_tokens_and_unconditional_stream(model):
    p = model.build_prompt(PROMPT, "", True, GRID)
    vocab, tok = model.vocab, model.tokenizer
    cond = p.ids[0][p.mask[0]].tolist()
    uncond = p.ids[1][p.mask[1]].tolist()
    prefix = [vocab["<racm3:break>"], vocab["<reserved08802>"], vocab["<reserved08802>"]]  # 4 cells = 64 px = 2
    assert cond[-3:] == prefix and uncond == prefix
    assert cond[0] == vocab["<s>"] and cond[-4] == vocab["<reserved08706>"]
    assert tok.decode(cond[1:-4]) == f"Generate an image of 64x64 according to the following prompt:\n{PROMPT}"
    assert not bool(p.mask[1, 0]) and bool(p.mask[0].all())
    wide = model.build_prompt(PROMPT, "", True, (2, 6)).ids[1, -2:].tolist()
    assert wide == [vocab["<reserved08801>"], vocab["<reserved08803>"]]  # height first, then width
    with pytest.raises(ssd_core.SSDError, match="even"):
        model.layout((3, 4))


def test_row_end_and_image_end_tokens(model):
    layout = model.layout(GRID)
    H, W = GRID
    row_end, end = model.vocab["<reserved08799>"], model.vocab["<eoss>"]
    assert layout.row_stride == W + 1 and layout.num_slots == (W + 1) * H + 1
    forced = layout.forced.tolist()
    assert [forced[y * (W + 1) + W] for y in range(H)] == [row_end] * H
    assert forced[-1] == end and forced.count(-1) == H * W
    res = ssd_core.generate(model, None, prompt=PROMPT, decoder="ar", seed=2, grid=GRID, score=False)
    seq = sequence_ids(model, layout, res.tokens).tolist()
    # Lumina-mGPT's own reading: drop the row ends, map BPE ids to codes, rows of W
    vm = model.model.model.vocabulary_mapping
    body = [t for t in seq[:-1] if t != row_end]
    assert torch.equal(torch.tensor([vm.bpe2img[t] for t in body]).view(H, W), res.tokens)


def test_vqgan_pixels_and_missing_vqgan(model, folder, tmp_path):
    codes = torch.randint(0, 16, GRID)
    img = model.decode(codes)
    ref = VQGANDecoder.load(str(folder / "vqgan.safetensors")).decode_to_image(codes[None])[0]
    assert torch.equal(img, ref) and img.shape == (8, 8, 3)
    bare = build_lumina(tmp_path / "bare", with_vqgan=False)
    m = ssd_core.load_model(bare, dtype="fp32")
    with pytest.warns(UserWarning, match="convert-vqgan"):
        assert m.decode(codes) is None
    m2 = LuminaModel.load(bare, "fp32", "cpu", vqgan=str(folder / "vqgan.safetensors"))
    assert torch.equal(m2.decode(codes), img)
    with pytest.raises(ssd_core.SSDError, match="convert-vqgan"):
        LuminaModel.load(bare, "fp32", "cpu", vqgan=str(tmp_path / "nope.safetensors"))


def test_resolution_list():
    grids = crop_size_grids(24)  # Lumina-mGPT 768: 24 x 24 patches of 32 px
    assert (48, 48) in grids and all(h % 2 == 0 and w % 2 == 0 for h, w in grids)
    assert all(h * w <= 48 * 48 for h, w in grids) and all(max(h, w) / min(h, w) <= 4 for h, w in grids)


def test_cfg_batched_equals_unbatched(model):
    check_cfg_matches_unbatched(model, PROMPT, GRID, negative="", cfg=3.0)


def test_every_decoder_full_image(model, tmp_path):
    heads = ssd_core.DraftHeads.for_model(model)
    heads.save(tmp_path / "h.safetensors")
    heads = ssd_core.load_heads(tmp_path / "h.safetensors", model)
    check_every_decoder(model, heads, PROMPT, GRID, pixel_factor=2, negative="")


def test_random_init_of_released_shapes():
    from tiny_families import check_random_init

    m = check_random_init(LuminaModel, "lumina", GRID, {"Lumina-mGPT-7B": (6.8, 7.2)})
    # Chameleon's real ids: image start 8197 and the size tokens 8804 + size / 32 (at a 16-code vocabulary the
    # image tokens end earlier, so only the reserved ids can be checked)
    assert m.row_end_id == 8803 and m.turn_end_id == 8710 and m.size_ids((48, 48)) == [8828, 8828]
    from tools.random_models import lumina_vocabulary

    full = lumina_vocabulary(65536, 8192)
    assert full["<racm3:break>"] == 8197 and full["<eoss>"] == 8196 and full["IMGIMGBAZ"] == 14
