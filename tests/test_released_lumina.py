"""Lumina-mGPT-7B folders in the released layout (tests/released_lumina.py) load and generate as Lumina-mGPT does.

The fork's q/k norm and its image generation (greedy, and its sampler driven by the pack's Gumbel noise) are
re-created here from Alpha-VLLM/Lumina-mGPT's code (lumina_mgpt/model/chameleon/modeling_chameleon.py,
lumina_mgpt/inference_solver.py) and compared with the pack.
"""
import json
import shutil
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import ssd_core
from ssd_core import cli
from conftest import load_pack, pack_module, run
from released_lumina import SIDES, TOKENIZER_FILES, build_lumina_released
from ssd_core.families.lumina import ForkHeadNorm, LuminaModel
from ssd_core.sampling import gumbel
from tiny_families import build_emu3

pytestmark = pytest.mark.engine457  # no 5.x-only API: also run under transformers 4.57 (make test-engine-457)

GRID = (4, 6)  # rows != columns: the size tokens are height then width


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """side -> a released folder, named as the repo; 512 / 1024 get the 768's tokenizer files, as a user adds."""
    root = tmp_path_factory.mktemp("ssd_models")
    out = {s: build_lumina_released(root / f"Lumina-mGPT-7B-{s}", s, seed=s) for s in SIDES}
    for side in (512, 1024):
        for name in TOKENIZER_FILES:
            if (out[768] / name).is_file():
                shutil.copy(out[768] / name, out[side] / name)
    return out


@pytest.fixture(scope="module")
def m768(released):
    return ssd_core.load_model(released[768], dtype="fp32")


# ---- the fork's q/k norm ----------------------------------------------------------------------------------------
def fork_layer_norm(x, weight, bias, n_heads_per_mp):
    """lumina_mgpt/model/chameleon/modeling_chameleon.py, ChameleonLayerNorm.forward: layer_norm over the last
    dim without affine, then weight / bias [model_parallel_size, head_dim] repeat_interleave'd over dim 0."""
    x = torch.nn.functional.layer_norm(x, (x.shape[-1],), None, None, eps=1e-5)
    return x * weight.repeat_interleave(n_heads_per_mp, dim=0) + bias.repeat_interleave(n_heads_per_mp, dim=0)


def file_tensor(folder, name):
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(folder / index[name]), framework="pt") as f:
        return f.get_tensor(name)


def test_qk_norms_compute_the_forks_per_head_norm(released, m768):
    from transformers.models.chameleon.modeling_chameleon import ChameleonLayerNorm

    folder, cfg = released[768], m768.model.config
    heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    torch.manual_seed(0)
    h = torch.randn(2, 5, cfg.hidden_size)
    for i, layer in enumerate(m768.model.model.layers):
        attn = layer.self_attn
        for which, proj, n in (("q_norm", attn.q_proj, heads), ("k_norm", attn.k_proj, cfg.num_key_value_heads)):
            w, b = (file_tensor(folder, f"model.layers.{i}.self_attn.{which}.{p}") for p in ("weight", "bias"))
            assert tuple(w.shape) == (cfg.model_parallel_size, head_dim) == (1, head_dim)
            x = proj(h).reshape(-1, n, head_dim)  # as the attention forward reshapes before its norm
            fork = fork_layer_norm(x, w, b, n // cfg.model_parallel_size)
            norm = getattr(attn, which)
            assert isinstance(norm, ForkHeadNorm) and torch.equal(norm.weight.data, w)  # loaded, not re-initialized
            torch.testing.assert_close(norm(x), fork)
            ref = ChameleonLayerNorm((n, head_dim))  # transformers' own, on the expanded (converted) weights
            ref.weight.data.copy_(w.repeat_interleave(n, 0))
            ref.bias.data.copy_(b.repeat_interleave(n, 0))
            torch.testing.assert_close(ref(x), fork)


def test_whole_model_equals_transformers_chameleon_on_converted_weights(released, m768):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    cfg = m768.model.config
    plain = ChameleonForConditionalGeneration(ChameleonConfig(**cfg.to_dict())).eval()
    state = {k: v for k, v in m768.model.state_dict().items() if not k.startswith("model.vqmodel.")}
    for k in [k for k in state if ".q_norm." in k or ".k_norm." in k]:
        n = cfg.num_attention_heads if ".q_norm." in k else cfg.num_key_value_heads
        state[k] = state[k].repeat_interleave(n, 0)  # [1, head_dim] -> [heads, head_dim]
    plain.load_state_dict(state, strict=False)
    ids = m768.build_prompt("a red cat", "", False, GRID).ids
    with torch.no_grad():
        a = m768.model.model(input_ids=ids).last_hidden_state
        b = plain.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(a, b)


def test_released_layout_through_accelerate_device_map(released, m768):
    """The fork's norms load through accelerate's device_map too (the loader's offload path)."""
    mapped = LuminaModel.load(released[768], "fp32", None, device_map="auto")
    assert isinstance(mapped.model.model.layers[0].self_attn.q_norm, ForkHeadNorm)
    p = m768.build_prompt("a red cat", "", True, GRID)
    torch.testing.assert_close(mapped.image_logits(mapped.start(p).last_features),
                               m768.image_logits(m768.start(p).last_features), rtol=0, atol=0)


# ---- what loads and what is refused ------------------------------------------------------------------------------
def test_defaults_and_default_grid_per_side(released, m768, tmp_path):
    assert m768.defaults == {"cfg": 4.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0, "min_p": 0.0}
    for side, cells in SIDES.items():
        m = m768 if side == 768 else ssd_core.load_model(released[side], dtype="fp32")
        assert m.default_grid == (cells, cells), side  # 512 -> 32x32, 768 -> 48x48, 1024 -> 64x64
        assert m.check_grid(None) == (cells, cells)
    other = tmp_path / "my-lumina"  # a name without the resolution: the README's 768
    shutil.copytree(released[1024], other)
    assert ssd_core.load_model(other, dtype="fp32").default_grid == (48, 48)
    assert ssd_core.load_model(other, dtype="fp32", grid=(8, 8)).default_grid == (8, 8)


def _edit(folder, tmp_path, name, config=None, add=None, drop=()):
    """A copy of `folder` with config.json keys changed, tensors added to / dropped from the second shard."""
    out = tmp_path / name
    shutil.copytree(folder, out)
    if config:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(config)
        (out / "config.json").write_text(json.dumps(cfg))
    if add or drop:
        shard = "model-00002-of-00002.safetensors"
        with safe_open(str(out / shard), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys() if k not in drop}
        tensors.update(add or {})
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
        index = json.loads((out / "model.safetensors.index.json").read_text())
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in drop}
        index["weight_map"].update({k: shard for k in add or {}})
        (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize("name,change,match", [
    ("fewer-layers", dict(config={"num_hidden_layers": 1}),
     r"hold 2 layers \(model\.layers\.0-1\), config\.json declares 1: fix num_hidden_layers"),
    ("more-layers", dict(config={"num_hidden_layers": 3}),
     r"hold 2 layers \(model\.layers\.0-1\), config\.json declares 3: fix num_hidden_layers"),
    ("extra-tensor", dict(add={"model.extra.weight": torch.zeros(2)}), "does not use: model.extra.weight"),
    ("no-lm-head", dict(drop=("lm_head.weight",)), "lack lm_head.weight"),
    ("bad-shards", dict(config={"model_parallel_size": 3}), "model_parallel_size is 3; it must be a whole number"),
])
def test_bad_released_folders_are_refused_in_one_line(released, tmp_path, name, change, match):
    folder = _edit(released[768], tmp_path, f"Lumina-mGPT-7B-768-{name}", **change)
    with pytest.raises(ssd_core.SSDError, match=match) as err:
        ssd_core.load_model(folder, dtype="fp32")
    assert "\n" not in str(err.value)


def test_vq_model_may_be_absent_for_lumina_only(tmp_path):
    emu = build_emu3(tmp_path / "emu3")
    with safe_open(str(emu / "model.safetensors"), framework="pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys() if "vqmodel." not in k}  # saved as vqmodel.* (5.x)
    save_file(kept, str(emu / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ssd_core.SSDError, match=r"lack model\.vqmodel\..* and \d+ more: the model would run"):
        ssd_core.load_model(emu, dtype="fp32")


def test_folder_without_vqgan_or_tokenizer_says_what_to_add(tmp_path):
    bare = build_lumina_released(tmp_path / "Lumina-mGPT-7B-512", 512, vqgan=False)
    m = ssd_core.load_model(bare, dtype="fp32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ssd_core.generate(m, None, prompt=[5, 6, 7], decoder="ar", grid=(2, 2), score=False)
    assert res.image is None and tuple(res.tokens.shape) == (2, 2)
    lines = [str(w.message) for w in caught if "vqgan" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "vqgan.safetensors" in lines[0] and "python -m ssd_core convert-vqgan vqgan.ckpt" in lines[0]
    with pytest.raises(ssd_core.SSDError, match="no tokenizer: copy the tokenizer files of Alpha-VLLM/Lumina-mGPT-7B"):
        ssd_core.generate(m, None, prompt="a cat", decoder="ar", grid=(2, 2))


# ---- the three ways in, and the pictures ------------------------------------------------------------------------
@pytest.mark.parametrize("side", sorted(SIDES))
def test_loads_through_api_node_and_cli(released, side, tmp_path, monkeypatch):
    folder = released[side]
    m = ssd_core.load_model(folder, dtype="fp32")
    assert isinstance(m, LuminaModel) and m.family == "lumina"
    ar = ssd_core.generate(m, None, prompt="a red cat", decoder="ar", seed=3, grid=(4, 4))
    exact = ssd_core.generate(m, None, prompt="a red cat", decoder="ssd-exact", seed=3, grid=(4, 4))
    assert torch.equal(ar.tokens, exact.tokens) and tuple(ar.image.shape) == (8, 8, 3)

    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    (loaded,) = nodes.SSDLoadModel().load(folder.name, "float32", "cpu")
    assert loaded.model.default_grid == (SIDES[side],) * 2
    out = run(loaded, prompt="a red cat", decoder="ar", seed=3, grid="4x4")
    assert out["result"][1]["tokens"] == ar.tokens.tolist()

    trace = tmp_path / "trace.json"
    rc = cli.main(["generate", "--model", str(folder), "--prompt", "a red cat", "--decoder", "ar",
                            "--seed", "3", "--grid", "4x4", "--dtype", "fp32", "--heads", "none",
                            "--trace", str(trace), "--out", str(tmp_path / "x.png")])
    assert rc == 0 and json.loads(trace.read_text())["tokens"] == ar.tokens.tolist()
    assert (tmp_path / "x.png").is_file()


def official_generation(model, prompt: str, grid, cfg: float, image_top_k: int = 2000, noise=None) -> list[int]:
    """Lumina-mGPT's image generation (lumina_mgpt/inference_solver.py: generate with create_logits_processor's
    three processors), as a plain loop without a cache over the pack's loaded weights: greedy, or with `noise`
    (slot -> [vocab] Gumbel noise) its sampler at temperature 1 (transformers' softmax + multinomial) driven by
    that noise: the token is argmax(log softmax(scores) + g) = argmax(scores + g). The prompt is its
    item processor's [BOS] + encode(q + "<reserved08706>"); the image start and the two size tokens, which the
    model would write itself, are given (as the pack forces them). Logits: lm_head over the features in float,
    as the fork's forward with the released mask_image_logits false."""
    H, W = grid
    tok, vocab, lm = model.tokenizer, model.vocab, model.model
    q = f"Generate an image of {W * 16}x{H * 16} according to the following prompt:\n{prompt}"
    size = lambda cells: vocab[f"<reserved{8800 + cells // 2:05d}>"]  # noqa: E731 -- get_n_grids_token
    seq = [tok.bos_token_id] + tok.encode(q + "<reserved08706>", add_special_tokens=False)
    seq += [vocab["<racm3:break>"], size(H), size(W)]
    start = len(seq) - 3  # image_start_token_id_index
    base = vocab["<reserved08800>"]  # the real 8804: h_grids = input_ids[start + 1] - 8804
    image_ids = torch.arange(4, 4 + model.image_vocab_size)  # the real range(4, 8195 + 1): ids after the specials

    def last_logits(ids):
        with torch.no_grad():
            hidden = lm.model(input_ids=torch.tensor([ids])).last_hidden_state
            return lm.lm_head(hidden).float()[0, -1]

    while seq[-1] != vocab["<eoss>"]:
        scores = last_logits(seq)
        # LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor: unconditional = from the image start
        if cfg != 1.0:
            uncond = last_logits(seq[start:])
            scores = cfg * (scores - uncond) + uncond
        # MultiModalLogitsProcessor: row end after every w tokens, <eoss> after h rows, else image tokens only
        h, w = (seq[start + 1] - base) * 2, (seq[start + 2] - base) * 2
        tokens = seq[start + 3:]
        if (len(tokens) + 1) % (w + 1) == 0:
            scores = torch.full_like(scores, -torch.inf).index_fill_(0, torch.tensor([vocab["<reserved08799>"]]), 0)
        elif len(tokens) + 1 == (w + 1) * h + 1:
            scores = torch.full_like(scores, -torch.inf).index_fill_(0, torch.tensor([vocab["<eoss>"]]), 0)
        else:
            keep = torch.zeros_like(scores, dtype=torch.bool).index_fill_(0, image_ids, True)
            scores = torch.where(keep, scores, -torch.inf)
        # InterleavedTopKLogitsWarper (image_top_k; 2000 in the README), then greedy or the replayed sample
        k = min(image_top_k, scores.numel())
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][-1], -torch.inf)
        if noise is not None:  # temperature 1: transformers' TemperatureLogitsWarper is not added
            scores = scores + noise(len(tokens))  # the slot: the position after the size tokens
        seq.append(int(scores.argmax()))
    return seq[start + 3:]


def replayed_noise(model, seed: int):
    """slot -> [vocab]: the pack's Gumbel noise g(seed, slot) over the image codes (ssd_core.sampling.gumbel, as
    the pack's Run.gumbel_sample keys it), placed at the codes' token ids, 0 elsewhere (forced slots keep their
    one finite token)."""
    vocab = model.model.lm_head.out_features

    def at(slot: int) -> torch.Tensor:
        g = gumbel(seed, torch.tensor([slot]), model.image_vocab_size)[0]  # [codes], in code order
        return torch.zeros(vocab).index_copy_(0, model.image_ids, g)
    return at


def image_codes(model, official: list[int]) -> list[int]:
    """The codes of an official sequence (rows of W image tokens + row end, then <eoss>), checked for its
    forced tokens."""
    H, W = GRID
    row_end, end = model.vocab["<reserved08799>"], model.vocab["<eoss>"]
    assert len(official) == H * (W + 1) + 1 and official[-1] == end
    assert [official[y * (W + 1) + W] for y in range(H)] == [row_end] * H
    bpe2img = model.model.model.vocabulary_mapping.bpe2img
    return [bpe2img[t] for t in official[:-1] if t != row_end]


@pytest.mark.parametrize("cfg", [4.0, 1.5])
@pytest.mark.parametrize("prompt", ["a red cat", "Image of a dog playing water, and a waterfall is in the background."])
def test_greedy_ar_equals_lumina_official_generation(m768, prompt, cfg):
    res = ssd_core.generate(m768, None, prompt=prompt, decoder="ar", temperature=0, cfg=cfg, grid=GRID, score=False,
                            decode_pixels=False)
    assert res.tokens.flatten().tolist() == image_codes(m768, official_generation(m768, prompt, GRID, cfg))


def test_sampled_ar_equals_lumina_official_sampler_with_the_pack_noise(m768):
    """cfg 3, temperature 1, image_top_k 6 of the 16 codes (2000 upstream): the official processors, then its
    sampler driven by the pack's noise, give the pack's ar tokens at the same seed; the noise of seed + 1 gives
    other tokens, and greedy others again (the noise decided tokens)."""
    prompt, seed, cfg, k = "a red cat", 7, 3.0, 6
    ours = ssd_core.generate(m768, None, prompt=prompt, decoder="ar", seed=seed, cfg=cfg, top_k=k, temperature=1.0,
                             top_p=1.0, grid=GRID, score=False, decode_pixels=False).tokens.flatten().tolist()
    theirs = official_generation(m768, prompt, GRID, cfg, k, replayed_noise(m768, seed))
    assert ours == image_codes(m768, theirs)
    other = official_generation(m768, prompt, GRID, cfg, k, replayed_noise(m768, seed + 1))
    assert image_codes(m768, other) != ours  # the comparison sees the seed
    greedy = official_generation(m768, prompt, GRID, cfg, k)
    assert image_codes(m768, greedy) != ours


def test_pack_node_errors_are_the_packs(released):
    """The node path raises the pack's SSDError for the folder's missing tokenizer (what ComfyUI shows)."""
    core = pack_module("ssd_core")
    bare = released[512].parent / "no-tokenizer-Lumina-mGPT-7B-512"
    if not bare.exists():
        build_lumina_released(bare, 512, tokenizer=False)
    m = core.load_model(bare, dtype="fp32")
    with pytest.raises(core.SSDError, match="Alpha-VLLM/Lumina-mGPT-7B-768"):
        core.generate(m, None, prompt="a cat", decoder="ar", grid=(2, 2))
