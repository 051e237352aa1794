"""Janus-Pro adapter on a tiny random-init JanusForConditionalGeneration (see tiny_families.py)."""
import pytest
import torch

import ssd_core
from ssd_core.families.janus import JanusModel
from official_prompts import official_janus_prompt  # deepseek-ai/Janus' rule, re-created
from tiny_families import build_janus, check_cfg_matches_unbatched, check_every_decoder

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

PROMPT = "a red cat"


BUILD = build_janus  # the `folder` and `model` fixtures of conftest.py build this family


def test_loads_as_janus(model):
    assert isinstance(model, JanusModel) and model.family == "janus"
    assert model.default_grid == (4, 4) and model.image_vocab_size == 16
    assert model.head_logits(torch.zeros(1, model.hidden_size)).shape == (1, 16)
    # image logits come from the generation head, not the text lm_head
    x = torch.randn(2, model.hidden_size)
    assert torch.equal(model.head_logits(x), model.model.model.generation_head(x))


def test_prompt_format_and_unconditional_stream(model):
    p = model.build_prompt(PROMPT, "", True, (4, 4))
    tok = model.tokenizer
    cond, uncond = p.ids.tolist()
    assert bool(p.mask.all())
    assert cond[0] == model.bos_id and cond[-1] == model.boi_id
    assert tok.decode(cond[1:]) == f"<|User|>: {PROMPT}\n\n<|Assistant|>:<begin_of_image>"
    assert uncond == [model.bos_id] + [model.pad_id] * (len(cond) - 2) + [model.boi_id]
    assert model.build_prompt(PROMPT, "", False, (4, 4)).ids.shape[0] == 1
    with pytest.raises(ssd_core.SSDError, match="negative"):
        model.build_prompt(PROMPT, "blurry", True, (4, 4))


@pytest.mark.parametrize("text", [PROMPT, "a red cat\n", "\t two spaces  \n\n", "   "])
def test_prompt_ids_are_the_official_codes(model, text):
    tok = model.tokenizer
    p = model.build_prompt(text, "", True, (4, 4))
    want = [tok.bos_token_id] + tok(official_janus_prompt(text), add_special_tokens=False)["input_ids"]
    assert p.ids[0].tolist() == want
    # the unconditional stream: every id but BOS and the image start set to pad (generation_inference.py)
    assert p.ids[1].tolist() == [want[0]] + [tok.pad_token_id] * (len(want) - 2) + [want[-1]]


def test_no_forced_tokens_and_image_embeddings(model):
    layout = model.layout()
    assert layout.row_stride == 4 and bool((layout.forced < 0).all()) and layout.num_slots == 16
    ids = model.code_to_id(torch.tensor([0, 5]))
    emb = model.embed(ids[None])[0]
    ref = model.model.prepare_embeddings_for_image_generation(torch.tensor([0, 5]))
    assert torch.equal(emb, ref)
    text = model.embed(torch.tensor([[3]]))[0, 0]
    assert torch.equal(text, model.model.get_input_embeddings().weight[3])
    with pytest.raises(ssd_core.SSDError):
        model.layout((3, 4))


def test_cfg_batched_equals_unbatched(model):
    check_cfg_matches_unbatched(model, PROMPT, (4, 4), negative="", cfg=5.0)


def test_every_decoder_full_image(model, tmp_path):
    heads = ssd_core.DraftHeads.for_model(model)
    heads.save(tmp_path / "h.safetensors")
    heads = ssd_core.load_heads(tmp_path / "h.safetensors", model)
    results = check_every_decoder(model, heads, PROMPT, (4, 4), pixel_factor=2, negative="")
    # pixels come from the model's own VQ decoder
    ref = model.model.decode_image_tokens(results["ar"].tokens.reshape(1, -1))[0]
    torch.testing.assert_close(results["ar"].image, ((ref.clamp(-1, 1) + 1) / 2))


def test_same_tokens_as_transformers_janus_image_generation(folder):
    """Greedy CFG decoding through the adapter gives the tokens of transformers' own Janus image generation
    (its doubled batch with the padded unconditional prompt, generation head, generation embeddings)."""
    m = ssd_core.load_model(folder, dtype="fp32")
    with torch.no_grad():  # sharper than the random init, so the tokens vary
        m.model.model.generation_embeddings.weight.mul_(20)
        m.model.model.generation_head.vision_head.weight.mul_(20)
    for prompt in ("a red cat", "two dogs"):
        ids = m.build_prompt(prompt, "", True, (4, 4)).ids[:1]
        theirs = m.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                  do_sample=False, guidance_scale=5.0)
        ours = ssd_core.generate(m, None, prompt=prompt, negative_prompt="", decoder="ar", cfg=5.0, temperature=0,
                                 score=False, decode_pixels=False)
        assert ours.tokens.flatten().tolist() == theirs[0].tolist()


def test_random_init_of_released_shapes():
    from tiny_families import check_random_init

    m = check_random_init(JanusModel, "janus", (4, 4), {"Janus-Pro-7B": (6.9, 7.3), "Janus-Pro-1B": (1.5, 1.9)})
    p = m.build_prompt([5, 6, 7], "", True, (4, 4))
    assert p.ids.tolist() == [[m.bos_id, 5, 6, 7, m.boi_id], [m.bos_id, m.pad_id, m.pad_id, m.pad_id, m.boi_id]]
