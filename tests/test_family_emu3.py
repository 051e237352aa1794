"""Emu3-Gen adapter on a tiny random-init Emu3ForConditionalGeneration (see tiny_families.py)."""
import json

import pytest
import torch

import ssd_core
from ssd_core.families.emu3 import DEFAULT_NEGATIVE, Emu3Model
from official_prompts import OFFICIAL_NEGATIVE, OFFICIAL_POSITIVE, official_ids  # BAAI's rules, re-created
from tiny_families import build_emu3, check_cfg_matches_unbatched, check_every_decoder, sequence_ids

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

PROMPT = "a red cat"
GRID = (3, 4)


BUILD = build_emu3  # the `folder` and `model` fixtures of conftest.py build this family


def test_loads_as_emu3(model):
    assert isinstance(model, Emu3Model) and model.family == "emu3"
    assert model.image_vocab_size == 16
    vm = model.model.vocabulary_mapping
    # image logits: lm_head rows of the visual tokens, in code order
    x = torch.randn(2, model.hidden_size)
    full = model.model.lm_head(x)
    assert torch.equal(model.head_logits(x), full[:, [vm.img2bpe[c] for c in range(16)]])
    codes = torch.tensor([0, 7, 15])
    assert [vm.bpe2img[i] for i in model.code_to_id(codes).tolist()] == [0, 7, 15]


def test_row_end_and_tail_tokens(model):
    layout = model.layout(GRID)
    H, W = GRID
    vocab = model.model.config.vocabulary_map
    assert layout.row_stride == W + 1 and layout.num_slots == (W + 1) * H + 3
    forced = layout.forced.tolist()
    for y in range(H):
        assert forced[y * (W + 1) + W] == vocab["<|extra_200|>"]
        assert all(v == -1 for v in forced[y * (W + 1):y * (W + 1) + W])
    assert forced[-3:] == [vocab["<|extra_201|>"], vocab["<|image end|>"], model.tokenizer.eos_token_id]
    # a whole generated sequence: transformers' own decode_image_tokens reads it (rows of W + eol, 3 tail tokens)
    res = ssd_core.generate(model, None, prompt=PROMPT, negative_prompt="", decoder="ar", seed=1, grid=GRID,
                            score=False)
    seq = sequence_ids(model, layout, res.tokens)
    assert seq[layout.slot_of_cell].tolist() == model.code_to_id(res.tokens.flatten()).tolist()
    pix = model.model.decode_image_tokens(image_tokens=seq[None], height=H, width=W)[0]
    torch.testing.assert_close(res.image, ((pix.clamp(-1, 1) + 1) / 2).permute(1, 2, 0))


@pytest.mark.parametrize("text", [PROMPT, "a shiba inu\n", "  spaces around  "])
def test_prompt_ids_are_the_official_scripts(model, text):
    tok = model.tokenizer
    p = model.build_prompt(text, "", True, GRID)  # the node's empty negative prompt: BAAI's NEGATIVE_PROMPT
    assert p.ids[0][p.mask[0]].tolist() == official_ids(tok, text + OFFICIAL_POSITIVE, GRID)
    assert p.ids[1][p.mask[1]].tolist() == official_ids(tok, OFFICIAL_NEGATIVE, GRID)
    assert DEFAULT_NEGATIVE == OFFICIAL_NEGATIVE
    # the switch off: the user's words alone, as given (Emu3's processor does not strip)
    off = model.build_prompt(text, "", True, GRID, official_suffix=False)
    assert off.ids[0][off.mask[0]].tolist() == official_ids(tok, text, GRID)


def test_prompt_and_negative_in_one_batch(model):
    p = model.build_prompt(PROMPT, "blurry", True, GRID)
    tok = model.tokenizer
    assert p.ids.shape[0] == 2
    cond = p.ids[0][p.mask[0]].tolist()
    neg = p.ids[1][p.mask[1]].tolist()
    assert tok.decode(cond) == f"<|extra_203|>{PROMPT}{OFFICIAL_POSITIVE}<|image start|>3*4<|image token|>"
    assert tok.decode(neg) == "<|extra_203|>blurry<|image start|>3*4<|image token|>"
    # left padding: the shorter row is padded at the front
    assert bool(p.mask[0, -1]) and bool(p.mask[1, -1]) and not bool(p.mask[1, 0])
    default = model.build_prompt(PROMPT, None, True, GRID)
    assert tok.decode(default.ids[1][default.mask[1]].tolist()).startswith("<|extra_203|>" + DEFAULT_NEGATIVE)


def test_suffix_switch_through_generate_and_cli(model, folder, tmp_path):
    # the tiny model's tokens hardly depend on the prompt: its scores (log-probs of the tokens) do
    on = ssd_core.generate(model, None, prompt=PROMPT, decoder="ar", seed=2, grid=GRID, decode_pixels=False)
    off = ssd_core.generate(model, None, prompt=PROMPT, decoder="ar", seed=2, grid=GRID, decode_pixels=False,
                            official_suffix=False)
    same = ssd_core.generate(model, None, prompt=PROMPT + OFFICIAL_POSITIVE, decoder="ar", seed=2, grid=GRID,
                             decode_pixels=False, official_suffix=False)
    assert torch.equal(on.tokens, same.tokens) and on.trace.nll == same.trace.nll and on.trace.nll != off.trace.nll
    with pytest.raises(ssd_core.SSDError, match="true or false"):
        ssd_core.generate(model, None, prompt=PROMPT, decoder="ar", grid=GRID, official_suffix="no")
    # the CLI: on by default, --no-official-suffix turns it off (the same tokens as the API's)
    from ssd_core import cli

    for flags, want in (([], on), (["--no-official-suffix"], off)):
        trace = tmp_path / f"t{len(flags)}.json"
        assert cli.main(["generate", "--model", str(folder), "--heads", "none", "--decoder", "ar", "--grid", "3x4",
                         "--seed", "2", "--prompt", PROMPT, "--trace", str(trace), *flags]) == 0
        written = json.loads(trace.read_text())
        assert written["tokens"] == want.tokens.tolist() and written["nll"] == pytest.approx(want.trace.nll, abs=1e-9)


def test_resolution_selectable(model):
    assert model.layout((2, 5)).grid == (2, 5)
    assert model.build_prompt(PROMPT, "", True, (2, 5)).ids.shape[0] == 2
    assert len(model.grid_options()) > 1
    with pytest.raises(ssd_core.SSDError, match="positions"):
        model.layout((100, 100))


@pytest.mark.parametrize("negative", ["", "blurry, low quality"])
def test_cfg_batched_equals_unbatched(model, negative):
    check_cfg_matches_unbatched(model, PROMPT, GRID, negative=negative, cfg=3.0)


def test_every_decoder_full_image(model, tmp_path):
    heads = ssd_core.DraftHeads.for_model(model)
    heads.save(tmp_path / "h.safetensors")
    heads = ssd_core.load_heads(tmp_path / "h.safetensors", model)
    check_every_decoder(model, heads, PROMPT, GRID, pixel_factor=2, negative="blurry")


def test_same_sequence_as_transformers_unbatched_guidance(folder):
    """Greedy decoding with our one-batch CFG writes the very sequence (visual tokens, row ends, tail) that
    transformers' generate writes with its unbatched guidance processor and the negative prompt as
    negative_prompt_ids, the layout forced through prefix_allowed_tokens_fn."""
    from tiny_families import sequence_ids

    m = ssd_core.load_model(folder, dtype="fp32")
    with torch.no_grad():  # sharper than the random init, so the tokens vary
        m.model.lm_head.weight.mul_(20)
    layout = m.layout(GRID)
    p = m.build_prompt(PROMPT, "blurry", True, GRID)
    cond, neg = p.ids[0][p.mask[0]][None], p.ids[1][p.mask[1]][None]
    P, image_ids = cond.shape[1], m.image_ids.tolist()

    def allowed(_batch, input_ids):
        s = input_ids.shape[0] - P
        if s >= layout.num_slots:
            return [m.eos_id]
        return [int(layout.forced[s])] if layout.forced[s] >= 0 else image_ids

    theirs = m.model.generate(cond, attention_mask=torch.ones_like(cond), max_new_tokens=layout.num_slots,
                              do_sample=False, guidance_scale=3.0, negative_prompt_ids=neg,
                              negative_prompt_attention_mask=torch.ones_like(neg), prefix_allowed_tokens_fn=allowed)
    ours = ssd_core.generate(m, None, prompt=PROMPT, negative_prompt="blurry", decoder="ar", cfg=3.0, temperature=0,
                             grid=GRID, score=False, decode_pixels=False)
    assert sequence_ids(m, layout, ours.tokens).tolist() == theirs[0, P:].tolist()


def test_random_init_of_released_shapes():
    from tiny_families import check_random_init

    m = check_random_init(Emu3Model, "emu3", GRID, {"Emu3-Gen": (8.3, 8.9)})
    vocab = m.model.config.vocabulary_map
    p = m.build_prompt([5, 6], [], True, GRID)
    prefix = [vocab["<|image start|>"], vocab["3"], vocab["*"], vocab["4"], vocab["<|image token|>"]]
    assert p.ids[0].tolist() == [m.bos_id, 5, 6] + prefix
    assert p.ids[1][p.mask[1]].tolist() == [m.bos_id] + prefix == \
        m.build_prompt([5, 6], "", True, GRID).ids[1][-6:].tolist()  # an empty negative needs no tokenizer


def test_suffix_switch_off_is_refused_where_there_is_no_suffix():
    ref = ssd_core.load_model("reference")
    with pytest.raises(ssd_core.SSDError, match="only emu3 models do"):
        ssd_core.generate(ref, None, prompt=1, decoder="ar", official_suffix=False, decode_pixels=False)
    assert ssd_core.generate(ref, None, prompt=1, decoder="ar", grid=(2, 2), official_suffix=True,
                             decode_pixels=False, score=False).tokens.shape == (2, 2)
