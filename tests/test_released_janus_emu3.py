"""Janus-Pro (deepseek-community/Janus-Pro-1B, -7B) and Emu3-Gen (BAAI/Emu3-Gen-hf) folders IN THE RELEASED
LAYOUT (tests/released_layouts.py: file names, shards + index, 4.x config keys, tensor names, dtypes, tokenizer
and processor files) load through the API, the loader node and the CLI, with the weights the files hold; they
generate; ssd-exact gives ar's tokens; the prompt ids are the official code's with the released tokenizer; greedy
ar equals the official pipelines (transformers' Janus image generation; transformers generate with BAAI's
logits processors) at two cfg values and two prompts; one sampled run equals the official sampler driven with
the pack's Gumbel noise (tokens = argmax(log p_guided + g(seed, slot)))."""
import json

import pytest
import torch
from safetensors import safe_open

import ssd_core
from conftest import load_pack
from official_prompts import (OFFICIAL_NEGATIVE, OFFICIAL_POSITIVE, Emu3LayoutConstraint, official_ids,
                              official_janus_prompt)
from released_layouts import build_emu3_gen_hf_released, build_janus_pro_released
from ssd_core.sampling import gumbel
from tiny_families import sequence_ids

GRID = (3, 4)  # the Emu3 grid of these tests; Janus makes its 4x4
PROMPTS = ("a red cat", "  two dogs on a hill\n")
RELEASES = ("Janus-Pro-1B", "Janus-Pro-7B", "Emu3-Gen-hf")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("ssd_models")
    build_janus_pro_released(root / "Janus-Pro-1B", size="1B")
    build_janus_pro_released(root / "Janus-Pro-7B", size="7B", seed=1)
    build_emu3_gen_hf_released(root / "Emu3-Gen-hf")
    return root


def load(folder):
    return ssd_core.load_model(folder, dtype="fp32")


def grid_of(name):
    return None if name.startswith("Janus") else GRID


def file_tensors(folder):
    """Every tensor the folder's safetensors hold, by name."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


# ---- the layout and the weights -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", RELEASES)
def test_released_files_load_with_their_weights(released, name):
    folder = released / name
    cfg = json.loads((folder / "config.json").read_text())
    janus = name.startswith("Janus")
    assert cfg["torch_dtype"] == ("bfloat16" if janus else "float32") and "dtype" not in cfg
    index = folder / "model.safetensors.index.json"
    tensors = file_tensors(folder)
    if name == "Janus-Pro-1B":
        assert (folder / "model.safetensors").is_file() and not index.exists()
    else:
        idx = json.loads(index.read_text())
        m = 3 if janus else 8
        names = [f"model-{i:05d}-of-{m:05d}.safetensors" for i in range(1, m + 1)]
        assert sorted(set(idx["weight_map"].values())) == names
        assert idx["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    m = load(folder)
    assert m.family == ("janus" if janus else "emu3") and m.tokenizer is not None
    if janus:  # the converter's names (MAPPINGS), bf16 in the files
        assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
        for key in ("model.vision_model.embeddings.position_embedding.weight", "model.generation_head.proj_out.weight",
                    "model.generation_aligner.hidden_layers.0.weight", "model.aligner.fc1.weight", "lm_head.weight"):
            assert key in tensors, key
        head = tensors["model.generation_head.proj_out.weight"].float()
        assert torch.equal(m.model.model.generation_head.proj_out.weight, head)
        assert m.boi_id == m.tokenizer.convert_tokens_to_ids(m.tokenizer.boi_token)
    else:  # transformers 4.48's names, renamed on load: the loaded weights are the file's, not a random init
        assert all(k.split(".")[0] in ("text_model", "vqmodel") for k in tensors)
        assert torch.equal(m.model.lm_head.weight, tensors["text_model.lm_head.weight"])
        codebook = tensors["vqmodel.quantize.embedding.weight"]
        assert torch.equal(m.model.model.vqmodel.quantize.embedding.weight, codebook)


def test_janus_boi_where_the_converter_writes_it(tmp_path):
    """convert_janus_weights_to_hf.py sets generation_config.boi_token_id (top level), transformers' generate
    reads generation_kwargs: a folder with the converter's form loads (the id read at the top level; the
    tokenizer's boi_token names the same token)."""
    folder = build_janus_pro_released(tmp_path / "j", boi_where="top")
    assert "generation_kwargs" not in json.loads((folder / "generation_config.json").read_text())
    m = load(folder)
    assert m.boi_id == m.tokenizer.convert_tokens_to_ids("<begin_of_image>")


# ---- API, loader node, CLI ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", RELEASES)
def test_api_node_and_cli_generate(released, name, monkeypatch, tmp_path):
    m, grid = load(released / name), grid_of(name)
    ar = ssd_core.generate(m, None, prompt=PROMPTS[0], decoder="ar", seed=4, grid=grid, score=False)
    exact = ssd_core.generate(m, ssd_core.DraftHeads.for_model(m), prompt=PROMPTS[0], decoder="ssd-exact", seed=4,
                              grid=grid, draft_rows=2, score=False)
    assert torch.equal(ar.tokens, exact.tokens) and tuple(ar.tokens.shape) == (grid or m.default_grid)
    assert ar.image is not None and float(ar.image.min()) >= 0 and float(ar.image.max()) <= 1
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(released))
    (sm,) = nodes.SSDLoadModel().load(name, "float32", "cpu")
    assert sm.model.family == m.family
    out = nodes.SSDSampler().sample(sm, prompt=PROMPTS[0], negative_prompt="", seed=4, cfg=-1, temperature=-1,
                                    top_k=-1, top_p=-1, decoder="ar", draft_rows=1, verify_rounds=1,
                                    grid="auto" if grid is None else "3x4", unique_id="1")
    assert out["result"][1]["tokens"] == ar.tokens.tolist()
    from ssd_core import cli

    trace = tmp_path / "t.json"
    flags = [] if grid is None else ["--grid", "3x4"]
    assert cli.main(["generate", "--model", str(released / name), "--heads", "none", "--decoder", "ar", "--seed", "4",
                     "--prompt", PROMPTS[0], "--dtype", "fp32", "--trace", str(trace), "--out", str(tmp_path / "i.png"),
                     *flags]) == 0
    assert json.loads(trace.read_text())["tokens"] == ar.tokens.tolist()


# ---- the official prompts, with the released tokenizer -------------------------------------------------------
@pytest.mark.parametrize("text", PROMPTS + ("   ",))
def test_janus_prompt_ids_are_the_official_ones(released, text):
    from transformers import AutoProcessor

    m = load(released / "Janus-Pro-1B")
    tok = m.tokenizer
    want = tok.encode(official_janus_prompt(text, tok.boi_token))  # the released tokenizer writes BOS itself
    p = m.build_prompt(text, "", True, None)
    assert want[0] == tok.bos_token_id and p.ids[0].tolist() == want
    assert p.ids[1].tolist() == [want[0]] + [tok.pad_token_id] * (len(want) - 2) + [want[-1]]
    if text.strip():  # transformers' path: the release's chat template, then the processor's image mode
        proc = AutoProcessor.from_pretrained(released / "Janus-Pro-1B")
        chat = proc.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": text}]}],
                                        add_generation_prompt=True)
        assert proc(text=chat, generation_mode="image")["input_ids"][0].tolist() == want


@pytest.mark.parametrize("text", PROMPTS)
def test_emu3_prompt_ids_are_the_official_ones(released, text):
    from transformers import AutoProcessor

    m = load(released / "Emu3-Gen-hf")
    tok = m.tokenizer
    assert (tok.boi_token, tok.image_wrapper_token) == ("<|image start|>", "<|image token|>")
    p = m.build_prompt(text, "", True, GRID)
    assert p.ids[0][p.mask[0]].tolist() == official_ids(tok, text + OFFICIAL_POSITIVE, GRID)
    assert p.ids[1][p.mask[1]].tolist() == official_ids(tok, OFFICIAL_NEGATIVE, GRID)
    # transformers' Emu3Processor (the HF card's path): ratio 4:3 at area 24 x 32 px -> the 3x4 grid
    proc = AutoProcessor.from_pretrained(released / "Emu3-Gen-hf")
    theirs = proc(text=text + OFFICIAL_POSITIVE, return_for_image_generation=True, ratio="4:3", image_area=768,
                  return_tensors="pt")
    assert theirs["input_ids"][0].tolist() == p.ids[0][p.mask[0]].tolist() and theirs["image_sizes"][0] == [3, 4]


# ---- the official pipelines ------------------------------------------------------------------------------------
class GumbelReplay:
    """A LogitsProcessor adding the pack's noise g(seed, slot) for the slot of each call (one call a token;
    scores over the image codes, or over the vocabulary with `image_ids` the codes' ids), so that greedy decoding
    takes argmax(log p + g): the pack's sample for the seed."""

    def __init__(self, seed, vocab, image_ids=None):
        self.seed, self.V, self.image_ids, self.slot = seed, vocab, image_ids, 0

    def __call__(self, input_ids, scores):
        g = gumbel(self.seed, torch.tensor([self.slot]), self.V)[0]
        self.slot += 1
        if self.image_ids is not None:
            g = torch.zeros(scores.shape[-1]).index_copy_(0, self.image_ids, g)
        return scores + g.to(scores.dtype)


def sharpened(folder, janus):
    """The release loaded fp32 with sharper image logits than the random init, so that the tokens vary, and for
    Janus (whose text and image embeddings are separate tables) a louder prompt, so that the image depends on it."""
    m = load(folder)
    with torch.no_grad():
        (m.model.model.generation_head.vision_head.weight if janus else m.model.lm_head.weight).mul_(20)
        if janus:
            m.model.model.generation_embeddings.weight.mul_(20)
            m.model.get_input_embeddings().weight.mul_(3)
    return m


def janus_official(m, text, cfg, processors=()):
    """transformers' Janus image generation on the official prompt ids (tokenizer.encode, BOS included)."""
    from transformers import LogitsProcessorList

    ids = torch.tensor([m.tokenizer.encode(official_janus_prompt(text, m.tokenizer.boi_token))])
    out = m.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False,
                           guidance_scale=cfg, logits_processor=LogitsProcessorList(processors))
    return out[0].tolist()


def emu3_official(m, text, cfg, extra=()):
    """image_generation.py's call: UnbatchedClassifierFreeGuidanceLogitsProcessor on the NEGATIVE_PROMPT ids and
    PrefixConstrainedLogitsProcessor with the processor's layout constraint, on the official prompt ids."""
    from transformers import LogitsProcessorList, PrefixConstrainedLogitsProcessor
    from transformers import UnbatchedClassifierFreeGuidanceLogitsProcessor as Unbatched

    tok = m.tokenizer
    pos = torch.tensor([official_ids(tok, text + OFFICIAL_POSITIVE, GRID)])
    neg = torch.tensor([official_ids(tok, OFFICIAL_NEGATIVE, GRID)])
    layout = m.layout(GRID)
    constraint = Emu3LayoutConstraint(tok, GRID, m.image_vocab_size)
    procs = LogitsProcessorList([Unbatched(cfg, m.model, unconditional_ids=neg),
                                 PrefixConstrainedLogitsProcessor(constraint, 1), *extra])
    out = m.model.generate(pos, attention_mask=torch.ones_like(pos), logits_processor=procs, do_sample=False,
                           max_new_tokens=layout.num_slots, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id)
    return out[0, pos.shape[1]:].tolist()


@pytest.mark.parametrize("cfg", [5.0, 2.0])
def test_janus_greedy_equals_transformers_image_generation(released, cfg):
    m = sharpened(released / "Janus-Pro-7B", janus=True)
    seen = set()
    for text in PROMPTS:
        ours = ssd_core.generate(m, None, prompt=text, decoder="ar", cfg=cfg, temperature=0, score=False,
                                 decode_pixels=False)
        assert ours.tokens.flatten().tolist() == janus_official(m, text, cfg)
        seen.add(tuple(ours.tokens.flatten().tolist()))
    assert len(seen) == 2  # the prompts lead to different images: the comparison sees the prompt


@pytest.mark.parametrize("cfg", [3.0, 1.5])
def test_emu3_greedy_equals_baai_generation(released, cfg):
    m = sharpened(released / "Emu3-Gen-hf", janus=False)
    layout = m.layout(GRID)
    seen = set()
    for text in PROMPTS:
        ours = ssd_core.generate(m, None, prompt=text, decoder="ar", cfg=cfg, temperature=0, grid=GRID, score=False,
                                 decode_pixels=False)
        assert sequence_ids(m, layout, ours.tokens).tolist() == emu3_official(m, text, cfg)
        seen.add(tuple(ours.tokens.flatten().tolist()))
    assert len(seen) == 2


def test_janus_sampled_equals_the_official_sampler_with_the_pack_noise(released):
    """cfg 5, temperature 1, every code (the official defaults): the guidance adds the same noise to both
    streams, so u + g + 5 (c - u) = guided + g, as the pack samples."""
    m = sharpened(released / "Janus-Pro-1B", janus=True)
    ours = ssd_core.generate(m, None, prompt=PROMPTS[0], decoder="ar", seed=11, score=False, decode_pixels=False)
    theirs = janus_official(m, PROMPTS[0], 5.0, [GumbelReplay(11, m.image_vocab_size)])
    assert ours.tokens.flatten().tolist() == theirs
    greedy = ssd_core.generate(m, None, prompt=PROMPTS[0], decoder="ar", temperature=0, score=False,
                               decode_pixels=False)
    assert not torch.equal(greedy.tokens, ours.tokens)  # the noise decided tokens


def test_emu3_sampled_equals_the_official_sampler_with_the_pack_noise(released):
    """BAAI's processors, then transformers' TopKLogitsWarper (top_k 6 of the 16 codes here; 2048 upstream), then
    the pack's noise: the sequence of the pack's ar at the same seed."""
    from transformers import TopKLogitsWarper

    m = sharpened(released / "Emu3-Gen-hf", janus=False)
    ours = ssd_core.generate(m, None, prompt=PROMPTS[0], decoder="ar", seed=5, top_k=6, grid=GRID, score=False,
                             decode_pixels=False)
    replay = GumbelReplay(5, m.image_vocab_size, m.image_ids)
    theirs = emu3_official(m, PROMPTS[0], 3.0, [TopKLogitsWarper(6), replay])
    assert sequence_ids(m, m.layout(GRID), ours.tokens).tolist() == theirs
    greedy = ssd_core.generate(m, None, prompt=PROMPTS[0], decoder="ar", temperature=0, grid=GRID, score=False,
                               decode_pixels=False)
    assert not torch.equal(greedy.tokens, ours.tokens)  # the noise decided tokens
