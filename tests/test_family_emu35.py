"""Emu3.5-Image (`emu3.5`) on a tiny random folder in the released layout (tests/released_emu35.py).

Re-created here from the release's code (baaivision/Emu3.5 at 8fcf1da) and compared with the pack:
- the decoder (src/emu3p5/modeling_emu3.py: Emu3RMSNorm, Emu3RotaryEmbedding, apply_rotary_pos_emb, repeat_kv,
  Emu3Attention with q_norm / k_norm, Emu3MLP, Emu3DecoderLayer, Emu3Model, Emu3ForCausalLM), eager, no cache;
- its T2I generation: configs/example_config_t2i.py (template, unc_prompt, cfg, sampling_params), inference.py
  (BOS check, tokenizer.encode without special tokens), src/utils/logits_processor.py
  (UnbatchedClassifierFreeGuidanceLogitsForVisualTokenWithDifferentialTopKProcessor: the forced h*w and image
  token, log-softmax CFG on the unconditional stream, the row-end / image-end rule, visual ids from BOV, image
  top-k, temperature) and transformers' sampling (GenerationConfig top_k 131072);
- its tokenizer (src/tokenizer_emu3_ibq/tokenization_emu3.py) through tiktoken itself.
"""
import json
import math
import shutil
import unicodedata
import warnings

import pytest
import torch
from safetensors.torch import load_file

import ssd_core
from conftest import load_pack, run
from released_emu35 import FIRST_VISUAL, ReleaseEmu35, build_emu35_released, tiktoken_ranks
from ssd_core import cli
from ssd_core.families.emu35 import Emu35Model
from ssd_core.families.emu35_tokenizer import PAT_STR, Emu35Tokenizer
from ssd_core.sampling import gumbel
from tiny_families import build_emu3, check_cfg_matches_unbatched, check_every_decoder

pytestmark = pytest.mark.engine457  # no 5.x-only API: also run under transformers 4.57 (make test-engine-457)

GRID = (4, 6)  # rows != columns
BOS, EOS, IMG, BOI, EOI, EOL = 151849, 151850, 151851, 151852, 151853, 151846  # logits_processor.py
BOV = 151854
T2I = "<|extra_203|>You are a helpful assistant for t2i task. USER: {question} ASSISTANT: <|extra_100|>"
UNC = "<|extra_203|>You are a helpful assistant. USER:  ASSISTANT: <|extra_100|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_emu35_released(tmp_path_factory.mktemp("ssd_models") / "Emu3.5-Image")


@pytest.fixture(scope="module")
def m35(folder):
    return ssd_core.load_model(folder, dtype="fp32")


# ---- the release's decoder, re-created from src/emu3p5/modeling_emu3.py (tests/released_emu35.py) ----------
@pytest.fixture(scope="module")
def release(folder):
    return ReleaseEmu35.from_folder(folder)


def test_the_decoder_computes_what_the_release_computes(m35, release):
    ids = m35.build_prompt("a red cat", "", False, GRID).ids[0].tolist() + [BOV + 3, BOV + 7, EOL, BOV + 1]
    with torch.no_grad():
        ours = m35.model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert torch.allclose(ours, release.logits(ids), atol=2e-5, rtol=1e-5)
    assert type(m35.model).__name__ == "Emu35ForCausalLM"  # transformers' Qwen3 layers under the released names


# ---- the release's T2I generation, re-created ----------------------------------------------------------------------
def release_generation(release, tok, prompt: str, grid, cfg: float, image_top_k: int = 5120, temperature=1.0,
                       noise=None) -> list[int]:
    """inference.py + generation_utils.generate with the t2i config's logits processor, as a plain loop: greedy,
    or with `noise` (slot -> [vocab] Gumbel) replacing transformers' multinomial (argmax(scores + g) samples
    softmax(scores)). The model writes the image start itself in the release; here it is given, as the pack forces
    it. Returns the tokens after the image token up to the image end."""
    h, w = grid
    input_ids = tok.encode(T2I.format(question=prompt))
    if input_ids[0] != BOS:
        input_ids = [BOS] + input_ids
    unconditional = tok.encode(UNC)
    seq = input_ids + [BOI]
    unc = unconditional  # update_unconditional_context appends each token from the image start on
    hw_tokens = tok.encode(f"{h}*{w}")
    while seq[-1] != EOI:
        scores = release.logits(seq)
        unc = unc + [seq[-1]]
        unc_scores = release.logits(unc)  # get_unconditional_logits: on every step in the image
        boi_idx = max(i for i, t in enumerate(seq) if t == BOI)
        in_visual = IMG in seq[boi_idx:]
        mask = torch.full_like(scores, -math.inf)
        if not in_visual:  # the h*w tokens and the image token: forced
            hw_idx = len(seq) - boi_idx
            mask[hw_tokens[hw_idx - 1] if hw_idx <= len(hw_tokens) else IMG] = 0
            scores = scores + mask
        else:
            img_idx = max(i for i, t in enumerate(seq) if t == IMG)
            vis_idx = len(seq) - img_idx
            if seq[-1] != IMG and vis_idx == h * (w + 1):
                mask[EOI] = 0
                scores = scores + mask
            elif seq[-1] != IMG and vis_idx % (w + 1) == 0:
                mask[EOL] = 0
                scores = scores + mask
            else:  # apply_cfg "no_text": on log-probs, then only visual tokens
                s = torch.log_softmax(scores, dim=-1)
                u = torch.log_softmax(unc_scores, dim=-1)
                scores = cfg * (s - u) + u
                mask[BOV:] = 0
                scores = scores + mask
                if temperature != 1.0:  # apply_differential_topk (image)
                    scores = scores / temperature
                k = min(image_top_k, scores.numel())
                scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -math.inf)
                if noise is not None:
                    scores = scores + noise(vis_idx - 1 - (vis_idx - 1) // (w + 1))
        k = min(131072, scores.numel())  # GenerationConfig top_k=131072 (TopKLogitsWarper)
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -math.inf)
        seq.append(int(scores.argmax()))
    start = max(i for i, t in enumerate(seq) if t == IMG) + 1
    return seq[start:]


def release_codes(official: list[int], grid) -> list[int]:
    """decode_image: the visual tokens of each row (rows split at <|extra_200|>), minus BOV."""
    H, W = grid
    assert len(official) == H * (W + 1) and official[-1] == EOI
    assert [official[y * (W + 1) + W] for y in range(H - 1)] == [EOL] * (H - 1)
    return [t - BOV for t in official if t not in (EOL, EOI)]


def replayed_noise(model, seed: int):
    """cell -> [vocab]: the pack's Gumbel noise g(seed, slot) of that cell over the image codes, 0 elsewhere."""
    layout = model.layout(GRID)

    def at(cell: int) -> torch.Tensor:
        slot = int(layout.slot_of_cell[cell])
        g = gumbel(seed, torch.tensor([slot]), model.image_vocab_size)[0]
        return torch.zeros(model.model.lm_head.out_features).index_copy_(0, model.image_ids, g)
    return at


@pytest.mark.parametrize("cfg", [5.0, 1.0])
@pytest.mark.parametrize("prompt", ["a red cat", "A lively comic-style illustration of two dogs, \"Relax!\" 日本"])
def test_greedy_ar_equals_the_release_generation(m35, release, prompt, cfg):
    res = ssd_core.generate(m35, None, prompt=prompt, decoder="ar", temperature=0, cfg=cfg, grid=GRID, score=False,
                            decode_pixels=False)
    official = release_generation(release, m35.tokenizer, prompt, GRID, cfg)
    assert res.tokens.flatten().tolist() == release_codes(official, GRID)


def test_sampled_ar_equals_the_release_sampler_with_the_pack_noise(m35, release):
    prompt, seed, k = "a red cat", 7, 5  # image top-k 5 of the 16 codes (5120 of 131,072 upstream)
    ours = ssd_core.generate(m35, None, prompt=prompt, decoder="ar", seed=seed, cfg=5.0, top_k=k, temperature=1.0,
                             grid=GRID, score=False, decode_pixels=False).tokens.flatten().tolist()
    official = release_generation(release, m35.tokenizer, prompt, GRID, 5.0, k, noise=replayed_noise(m35, seed))
    assert ours == release_codes(official, GRID)
    other = release_generation(release, m35.tokenizer, prompt, GRID, 5.0, k, noise=replayed_noise(m35, seed + 1))
    assert release_codes(other, GRID) != ours  # the comparison sees the seed


# ---- the tokenizer ----------------------------------------------------------------------------------------------
def test_tokenizer_encodes_as_tiktoken(folder):
    tiktoken = pytest.importorskip("tiktoken")  # requirements-dev.txt pins it: CI runs this
    ours = Emu35Tokenizer.from_folder(folder)
    enc = tiktoken.Encoding("Emu3", pat_str=PAT_STR, mergeable_ranks=tiktoken_ranks(), special_tokens=ours.special_ids)
    texts = [T2I.format(question="a red cat assistant"), UNC, "<|image start|>64*64<|image token|>", "55*73",
             "café naïve Å 日本語 🐱\n\n\ttabs  and   spaces <|notspecial|> <|visual token 000003|> it's WE'LL",
             "the cat is red, you asked: ‘ring’ — red-eds"]
    gen = torch.Generator().manual_seed(0)
    alphabet = "abcdertyouisn ACR 0123456789.,;:'\"!?*<|>\n\t-_é日🐱"
    texts += ["".join(alphabet[i] for i in torch.randint(len(alphabet), (int(n),), generator=gen))
              for n in torch.randint(1, 60, (200,), generator=gen)]
    for t in texts:
        assert ours.encode(t) == enc.encode(unicodedata.normalize("NFC", t), allowed_special="all"), t
    assert ours.decode(ours.encode(texts[4])) == unicodedata.normalize("NFC", texts[4])
    assert ours.convert_tokens_to_ids(["<|extra_203|>", "<|image start|>", "<|visual token 000000|>"]) == \
        [BOS, BOI, BOV]
    assert ours.encode("<|image start|>64*64<|image token|>")[1:-1] == [tiktoken_ranks()[c.encode()] for c in "64*64"]


# ---- the adapter ---------------------------------------------------------------------------------------------------
def test_release_facts(m35):
    assert isinstance(m35, Emu35Model) and m35.family == "emu3.5"
    assert m35.defaults == {"cfg": 5.0, "temperature": 1.0, "top_k": 5120, "top_p": 1.0, "min_p": 0.0}
    assert m35.default_grid == (64, 64)  # image_area 1048576 at 16 px a token, "1:1": "64*64"
    assert (55, 73) in m35.grid_options() and (73, 55) in m35.grid_options()
    assert m35.image_vocab_size == 16 and m35.image_ids.tolist() == list(range(BOV, BOV + 16))
    x = torch.randn(3, m35.hidden_size)
    assert torch.allclose(m35.head_logits(x), m35.model.lm_head(x)[:, BOV:BOV + 16], atol=1e-5)
    p = m35.build_prompt("a cat", "", True, (8, 12))
    tok = m35.tokenizer
    assert tok.decode(p.ids[0][p.mask[0]].tolist()) == T2I.format(question="a cat") + \
        "<|image start|>8*12<|image token|>"
    assert tok.decode(p.ids[1][p.mask[1]].tolist()) == UNC + "<|image start|>8*12<|image token|>"
    neg = m35.build_prompt("a cat", "blurry", True, (8, 12))
    assert tok.decode(neg.ids[1][neg.mask[1]].tolist()).startswith(UNC.replace("USER:  ", "USER: blurry "))
    layout = m35.layout((3, 5))
    assert layout.forced.tolist() == [-1] * 5 + [EOL] + [-1] * 5 + [EOL] + [-1] * 5 + [EOI]
    assert m35.sequence_length((64, 64)) == 64 * 65 and layout.num_slots == m35.sequence_length((3, 5))
    with pytest.raises(ssd_core.SSDError, match="Emu3.5 cannot make a 200x200 token grid"):
        m35.check_grid((200, 200))


def test_every_decoder_and_ssd_exact_equals_ar(m35, tmp_path):
    ssd_core.DraftHeads.for_model(m35).save(tmp_path / "h.safetensors")
    check_every_decoder(m35, ssd_core.load_heads(tmp_path / "h.safetensors", m35), "a red cat", GRID, 16)
    for seed in (1, 2):
        a = ssd_core.generate(m35, None, prompt="a lighthouse", decoder="ar", seed=seed, grid=(6, 4), score=False)
        b = ssd_core.generate(m35, None, prompt="a lighthouse", decoder="ssd-exact", seed=seed, grid=(6, 4),
                              score=False)
        assert torch.equal(a.tokens, b.tokens)


def test_batched_cfg_equals_unbatched(m35):
    # the raw logits (|l| ~ 10 here) agree to 1e-4 (asserted; 6e-6 measured); guidance at cfg 5 weighs them by up
    # to 2 cfg - 1 = 9 in the log-probs
    check_cfg_matches_unbatched(m35, "a red cat", GRID, cfg=5.0, tol=9e-5)
    check_cfg_matches_unbatched(m35, "a red cat", GRID, negative="blurry", cfg=5.0, tol=9e-5)


def test_loads_through_api_node_and_cli(folder, m35, tmp_path, monkeypatch):
    ar = ssd_core.generate(m35, None, prompt="a red cat", decoder="ar", seed=3, grid=(4, 4))
    assert tuple(ar.image.shape) == (64, 64, 3)
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    (loaded,) = nodes.SSDLoadModel().load(folder.name, "float32", "cpu")
    assert loaded.model.family == "emu3.5" and loaded.model.default_grid == (64, 64)
    out = run(loaded, prompt="a red cat", decoder="ar", seed=3, grid="4x4")
    assert out["result"][1]["tokens"] == ar.tokens.tolist()
    trace = tmp_path / "trace.json"
    rc = cli.main(["generate", "--model", str(folder), "--prompt", "a red cat", "--decoder", "ar", "--seed", "3",
                   "--grid", "4x4", "--dtype", "fp32", "--heads", "none", "--trace", str(trace),
                   "--out", str(tmp_path / "x.png")])
    assert rc == 0 and json.loads(trace.read_text())["tokens"] == ar.tokens.tolist()


def test_without_ibq_file_no_pixels(m35):
    m = Emu35Model(m35.model, m35.tokenizer, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ssd_core.generate(m, None, prompt="a cat", decoder="ar", grid=(4, 4), score=False)
    assert res.image is None and any("convert-ibq" in str(w.message) for w in caught)


# ---- damaged folders: refused before loading, one line naming the fix ---------------------------------------------
def _copy(folder, tmp_path, name):
    out = tmp_path / name
    shutil.copytree(folder, out)
    return out


def test_damaged_folders_are_refused_in_one_line(folder, tmp_path):
    cases = []
    shard = _copy(folder, tmp_path, "no-shard")
    (shard / "model-00002-of-00002.safetensors").unlink()
    cases.append((shard, "model-00002-of-00002.safetensors"))
    for name in ("emu3.tiktoken", "emu3_vision_tokens.txt"):
        bare = _copy(folder, tmp_path, f"no-{name}")
        (bare / name).unlink()
        cases.append((bare, r"lacks Emu3.5's tokenizer files .*baaivision/Emu3.5 src/tokenizer_emu3_ibq/"))
    noibq = _copy(folder, tmp_path, "no-ibq")
    (noibq / "ibq.safetensors").unlink()
    cases.append((noibq, r"has no ibq.safetensors .*python -m ssd_core convert-ibq model.ckpt config.yaml"))
    pickled = _copy(folder, tmp_path, "pickle-only")
    (pickled / "ibq.safetensors").unlink()
    torch.save({"decoder.conv_in.weight": torch.zeros(1)}, pickled / "model.ckpt")
    cases.append((pickled, r"holds only the pickle model.ckpt, which the pack never unpickles: .*convert-ibq"))
    cut = _copy(folder, tmp_path, "cut-ibq")
    data = (cut / "ibq.safetensors").read_bytes()
    (cut / "ibq.safetensors").write_bytes(data[:len(data) // 2])
    cases.append((cut, r"convert-ibq"))
    vocab = _copy(folder, tmp_path, "damaged-tiktoken")
    (vocab / "emu3.tiktoken").write_text("not base64 at all\n")
    cases.append((vocab, r"emu3.tiktoken line 1 is not 'base64 rank'"))
    for bad, match in cases:
        with pytest.raises(ssd_core.SSDError, match=match) as err:
            ssd_core.load_model(bad, dtype="fp32")
        assert "\n" not in str(err.value), bad.name


def test_the_other_releases_are_told_apart(folder, tmp_path):
    emu3 = build_emu3(tmp_path / "Emu3-Gen-hf")
    assert ssd_core.load_model(emu3, dtype="fp32").family == "emu3"
    with pytest.raises(ssd_core.SSDError, match=r"not an emu3.5 model .* load it as family 'emu3'"):
        ssd_core.load_model(emu3, dtype="fp32", family="emu3.5")
    with pytest.raises(ssd_core.SSDError, match=r"load it as family 'emu3.5'"):
        ssd_core.load_model(folder, dtype="fp32", family="emu3")
    # BAAI/Emu3-Gen's own remote-code release says model_type "Emu3" too, but has no q/k norms
    old = _copy(folder, tmp_path, "Emu3-Gen")
    for shard in old.glob("model-*.safetensors"):
        from safetensors.torch import save_file

        kept = {k: v for k, v in load_file(str(shard)).items() if "_norm.weight" not in k or "layernorm" in k}
        save_file(kept, str(shard), metadata={"format": "pt"})
    index = json.loads((old / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "q_norm" not in k and "k_norm" not in k}
    (old / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ssd_core.SSDError, match=r"no q_norm / k_norm: .*load BAAI/Emu3-Gen-hf as family .emu3.") as err:
        ssd_core.load_model(old, dtype="fp32")
    assert "\n" not in str(err.value)


# ---- fitting it on users' cards, check-model -----------------------------------------------------------------------
def test_memory_row_plan_and_cache_at_the_largest_grid(m35):
    """Meta-device counts of the 34B config (tools/memory_table.py: 34.1B = 31.2B transformer + 2.9B embeddings,
    as published), --plan's shape, and the static cache at the largest listed grid: 64x64 (64 rows of 64 + row end,
    the last row's end being the image end: 4,160 slots), more than any other aspect of the release's list (85x47:
    4,080; the widest, 41x97: 4,018)."""
    from types import SimpleNamespace

    from ssd_core import static_cache
    from ssd_core.memory import KEEP_FULL
    from ssd_core.training import TrainConfig, plan
    from tools.memory_table import released_counts
    from tools.random_models import SHAPES, _model_class, random_config

    hidden, vocab = 5120, 282926
    assert vocab == FIRST_VISUAL + 131072 == SHAPES["emu3.5"]["Emu3.5-Image"]["vocab_size"]
    assert _model_class("emu3.5") is Emu35Model.model_class(None)  # the loader's Qwen3 subclass
    c = released_counts("Emu3.5-Image")
    embeddings = 2 * vocab * hidden  # embed_tokens and lm_head, untied
    assert 34.05e9 < c["params"] < 34.15e9 and 2.85e9 < embeddings < 2.95e9
    assert 31.15e9 < c["params"] - embeddings < 31.25e9
    assert [round(c[q], 1) for q in ("none", "8-bit", "4-bit")] == [63.5, 34.5, 20.4]  # GiB: the docs' row
    assert KEEP_FULL["emu3.5"] == ["lm_head"]  # its image rows are sliced: kept in full precision
    shape = plan.MODELS["Emu3.5-Image"]
    assert shape.family == "emu3.5" and shape.slots == m35.sequence_length((64, 64)) == 64 * 65
    assert shape.vocab == vocab and shape.image_cells == 64 * 64 and shape.codes == 131072
    # the plan counts the image head (lm_head's image rows) on top of the vocabulary, as for Emu3 and Lumina
    assert abs(shape.params - shape.image_head - c["params"]) / c["params"] < 1e-4
    plan.check("Emu3.5-Image", "H100", "1,8")
    one, eight = (plan.project(shape, "H100", n, TrainConfig(samples=800, epochs=1, batch_grids=16, gen_batch=8))
                  for n in (1, 8))
    assert 7.0 < one["generation_s"] / eight["generation_s"] <= 8.0
    static_cache.enable(m35, "static")
    try:
        slots = {g: m35.layout(g).num_slots for g in m35.grid_options()}
        assert set(slots) == set(Emu35Model.listed_grids())
        assert max(slots.values()) == m35.static.slots == 64 * 65 == slots[(64, 64)]
        assert slots[(64, 64)] > slots[(85, 47)] == 85 * 48 > slots[(41, 97)] == 41 * 98
        assert static_cache.capacity(m35.static, 256) == 4928  # 256 + 4160 + the widest window (504), to 64
        full = SimpleNamespace(static=m35.static, dtype=torch.bfloat16,
                               backbone=lambda: SimpleNamespace(config=random_config("emu3.5", "Emu3.5-Image")))
        assert round(static_cache.cache_bytes(full) / 2**30, 2) == 2.41  # bf16, a guided image, the 34B's KV shape
    finally:
        static_cache.enable(m35, "off")


def test_check_model_knows_the_folder_and_what_it_lacks(folder, tmp_path):
    from ssd_core.check_model import check_folder

    report = check_folder(folder)  # config.json's model_type "Emu3": built from the loader's Qwen3Config
    assert report.family == "emu3.5" and report.loadable, [f.line for f in report.blocking()]
    assert not [f.line for f in report.findings if f.level != "ok"]
    assert any(f.topic == "shapes" and "read as transformers' Qwen3" in f.line for f in report.findings)
    assert any(f.topic == "tokenizer" and f.line == "emu3.tiktoken, emu3_vision_tokens.txt" for f in report.findings)
    assert any(f.topic == "vq" and f.line == "ibq.safetensors: 16 codes, 16 px a code" for f in report.findings)
    sub = _copy(folder, tmp_path, "subfolder")  # the release's own folder name for the tokenizer
    (sub / "tokenizer_emu3_ibq").mkdir()
    for name in ("emu3.tiktoken", "emu3_vision_tokens.txt"):
        (sub / name).rename(sub / "tokenizer_emu3_ibq" / name)
    found = check_folder(sub)
    assert found.loadable and any(f.topic == "tokenizer" and "tokenizer_emu3_ibq/emu3.tiktoken" in f.line
                                  for f in found.findings)
    bare = _copy(folder, tmp_path, "bare")
    for name in ("ibq.safetensors", "emu3.tiktoken", "emu3_vision_tokens.txt"):
        (bare / name).unlink()
    lines = [f.line for f in check_folder(bare).blocking()]
    assert len(lines) == 2
    assert any("no ibq.safetensors" in line and "BAAI/Emu3.5-VisionTokenizer" in line and "convert-ibq" in line
               for line in lines)
    assert any("emu3.tiktoken" in line and "baaivision/Emu3.5 src/tokenizer_emu3_ibq/" in line for line in lines)
    torch.save({"decoder.conv_in.weight": torch.zeros(1)}, bare / "model.ckpt")
    lines = [f.line for f in check_folder(bare).blocking()]
    assert any("only the pickle model.ckpt (never unpickled)" in line and "convert-ibq" in line for line in lines)


def test_template_and_the_loaders_error_say_what_to_download(tmp_path, monkeypatch):
    from conftest import ROOT

    name = "SSD Emu3.5 - ar vs ssd-exact"
    root = json.loads((ROOT / "tests" / "workflows_api" / f"{name}.json").read_text())
    assert [n["inputs"]["model"] for n in root.values() if n["class_type"] == "SSDLoadModel"] == ["Emu3.5-Image"]
    samplers = [n["inputs"] for n in root.values() if n["class_type"] == "SSDSampler"]
    assert sorted(s["decoder"] for s in samplers) == ["ar", "ssd-exact"]
    for s in samplers:  # the model's own grid and sampler defaults (example_config_t2i.py)
        assert s["grid"] == "auto" and [s[k] for k in ("cfg", "temperature", "top_k", "top_p", "min_p")] == [-1] * 5
    ui = json.loads((ROOT / "example_workflows" / f"{name}.json").read_text())
    note = next(n["widgets_values"][0] for n in ui["nodes"] if n["type"] == "MarkdownNote")
    for needed in ("ssd_models/Emu3.5-Image", "BAAI/Emu3.5-Image", "baaivision/Emu3.5", "src/tokenizer_emu3_ibq/",
                   "emu3.tiktoken", "emu3_vision_tokens.txt", "BAAI/Emu3.5-VisionTokenizer", "convert-ibq"):
        assert needed in note, needed
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        nodes.SSDLoadModel().load("Emu3.5-Image", "auto", "cpu")
    line = str(err.value)
    assert "\n" not in line and "download BAAI/Emu3.5-Image" in line and str(tmp_path / "Emu3.5-Image") in line
    assert "emu3.tiktoken and emu3_vision_tokens.txt (baaivision/Emu3.5 src/tokenizer_emu3_ibq/ on GitHub)" in line
    assert "BAAI/Emu3.5-VisionTokenizer's model.ckpt and config.yaml" in line
    assert f"`python -m ssd_core convert-ibq model.ckpt config.yaml {tmp_path / 'Emu3.5-Image'}/ibq.safetensors`" in line
