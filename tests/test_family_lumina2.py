"""Lumina-mGPT 2.0 (`lumina2`) on a tiny random folder in the released layout (tests/released_lumina2.py).

Its generation loop and logits processors (Alpha-VLLM/Lumina-mGPT-2.0 lumina_mgpt/inference_solver.py:
LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor, MultiModalLogitsProcessor,
InterleavedTopKLogitsWarper; generate.py's t2i prompt; data/item_processor.py's tokens) and its MoVQGAN decoder
(lumina_mgpt/movqgan/models/vqgan.py decode_code, modules/vqvae/movq_modules.py MOVQDecoder) are re-created here
from the release's code and compared with the pack.
"""
import json
import math
import shutil
import warnings

import pytest
import torch
import torch.nn as nn

import ssd_core
from conftest import ROOT, load_pack, run
from released_lumina import build_lumina_released
from released_lumina2 import MOVQ, TOKENIZER_FILES, build_lumina2_released, tiny_movqgan
from ssd_core import cli
from ssd_core.families.lumina import ForkHeadNorm
from ssd_core.families.lumina2 import Lumina2Model
from ssd_core.sampling import gumbel
from tiny_families import check_cfg_matches_unbatched, check_every_decoder

pytestmark = pytest.mark.engine457  # no 5.x-only API: also run under transformers 4.57 (make test-engine-457)

GRID = (4, 8)  # rows != columns: the size tokens are height, then width


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_lumina2_released(tmp_path_factory.mktemp("ssd_models") / "Lumina-mGPT-2.0")


@pytest.fixture(scope="module")
def m2(folder):
    return ssd_core.load_model(folder, dtype="fp32")


# ---- the release's generation, re-created ------------------------------------------------------------------------
def release_generation(model, prompt: str, grid, cfg: float, image_top_k: int = 4096, noise=None) -> list[int]:
    """FlexARInferenceSolver.generate with create_logits_processor(cfg, image_top_k) as a plain loop without a cache
    over the pack's loaded weights: greedy, or at temperature 1 with `noise` (slot -> [vocab] Gumbel) replacing
    transformers' multinomial (argmax(scores + g) is a sample of softmax(scores)). The prompt is the item
    processor's [bos_id] + encode(q + "<reserved08706>") (bos_id: the tokenizer's BOS, else its EOS); the image
    start and size tokens the model writes itself are given, as the pack forces them."""
    H, W = grid
    tok, lm = model.tokenizer, model.model
    token2id = tok.convert_tokens_to_ids
    id2token = tok.convert_ids_to_tokens
    q = f"Generate an image of {W * 8}x{H * 8} according to the following prompt:\n{prompt}"  # generate.py t2i
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    seq = [bos] + tok.encode(q + "<reserved08706>", add_special_tokens=False)
    get_n_grids_token = lambda n: f"<reserved{8800 + n:05d}>"  # noqa: E731 -- FlexARItemProcessor
    seq += [token2id("<racm3:break>"), token2id(get_n_grids_token(H * 8 // 32)), token2id(get_n_grids_token(W * 8 // 32))]
    start = len(seq) - 3
    start_id, end_id, new_line_id = token2id("<racm3:break>"), token2id("<eoss>"), token2id("<reserved08799>")
    assert (start_id, end_id, new_line_id) == (151665, 151666, 151670)  # the ids decode_ids writes literally
    voc_size = lm.config.vocab_size
    image_token_list = range(155000, 171383 + 1)
    suppress = torch.tensor([x not in image_token_list for x in range(voc_size)])
    guidance_scale = cfg

    def last_logits(ids):
        with torch.no_grad():
            hidden = lm.model(input_ids=torch.tensor([ids])).last_hidden_state[:, -1:]  # the row generate reads
            return lm.lm_head(hidden).float()[0, -1]

    while seq[-1] != 151666:  # GenerationConfig(eos_token_id=[151666])
        scores = last_logits(seq)
        new_token_num = len(seq) - start - 1
        h_grids, w_grids = (int(id2token(seq[start + i])[-5:-1]) - 8800 for i in (1, 2))
        # the CFG processor: unconditional = input_ids[:, image_start_token_id_index:], its own schedule
        if guidance_scale != 1.0:
            guidance_scale = max(4.0, guidance_scale * (1 - new_token_num / (h_grids * 2 * w_grids * 2)))
            uncond = last_logits(seq[start:])
            scores = guidance_scale * (scores - uncond) + uncond
        # MultiModalLogitsProcessor: latent dims grids * 4
        h_latent, w_latent = h_grids * 4, w_grids * 4
        tokens = seq[start + 3:]
        if (len(tokens) + 1) % (w_latent + 1) == 0:
            scores = torch.full_like(scores, -math.inf)
            scores[new_line_id] = 0
        elif len(tokens) + 1 == (w_latent + 1) * h_latent + 1:
            scores = torch.full_like(scores, -math.inf)
            scores[end_id] = 0
        else:
            scores = torch.where(suppress, -float("inf"), scores)
        # InterleavedTopKLogitsWarper: inside an image, image_top_k
        k = min(image_top_k, scores.numel())
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
        if noise is not None:  # temperature 1.0: transformers adds no TemperatureLogitsWarper
            scores = scores + noise(len(tokens))
        seq.append(int(scores.argmax()))
    return seq[start + 3:]


def release_codes(official: list[int], grid) -> list[int]:
    """decode_ids: the ids between the size tokens and <eoss>, row ends (151670) dropped, minus 155000."""
    H, W = grid
    assert len(official) == H * (W + 1) + 1 and official[-1] == 151666
    assert [official[y * (W + 1) + W] for y in range(H)] == [151670] * H
    return [t - 155000 for t in official[:-1] if t != 151670]


def replayed_noise(model, seed: int):
    """slot -> [vocab]: the pack's Gumbel noise g(seed, slot) over the image codes, at their ids, 0 elsewhere."""
    def at(slot: int) -> torch.Tensor:
        g = gumbel(seed, torch.tensor([slot]), model.image_vocab_size)[0]
        return torch.zeros(model.model.lm_head.out_features).index_copy_(0, model.image_ids, g)
    return at


@pytest.mark.parametrize("cfg", [4.0, 1.0])
@pytest.mark.parametrize("prompt", ["a red cat", "Image of a dog playing water, and a water fall is in the background."])
def test_greedy_ar_equals_the_release_generation(m2, prompt, cfg):
    res = ssd_core.generate(m2, None, prompt=prompt, decoder="ar", temperature=0, cfg=cfg, grid=GRID, score=False,
                            decode_pixels=False)
    assert res.tokens.flatten().tolist() == release_codes(release_generation(m2, prompt, GRID, cfg), GRID)


def test_sampled_ar_equals_the_release_sampler_with_the_pack_noise(m2):
    prompt, seed, k = "a red cat", 7, 6  # top-k 6 of the 16 codes (4096 of 16,384 upstream)
    ours = ssd_core.generate(m2, None, prompt=prompt, decoder="ar", seed=seed, cfg=4.0, top_k=k, temperature=1.0,
                             grid=GRID, score=False, decode_pixels=False).tokens.flatten().tolist()
    assert ours == release_codes(release_generation(m2, prompt, GRID, 4.0, k, replayed_noise(m2, seed)), GRID)
    other = release_codes(release_generation(m2, prompt, GRID, 4.0, k, replayed_noise(m2, seed + 1)), GRID)
    assert other != ours  # the comparison sees the seed


# ---- the adapter ---------------------------------------------------------------------------------------------------
def test_release_facts(m2, folder):
    assert isinstance(m2, Lumina2Model) and m2.family == "lumina2"
    assert m2.defaults == {"cfg": 4.0, "temperature": 1.0, "top_k": 4096, "top_p": 1.0, "min_p": 0.0}
    assert m2.default_grid == (96, 96)  # README: 768 x 768 at 8 px a token
    assert m2.image_vocab_size == 16 and m2.image_ids.tolist() == list(range(155000, 155016))
    assert isinstance(m2.model.model.layers[0].self_attn.q_norm, ForkHeadNorm)  # Lumina-mGPT 1's loader, shared
    x = torch.randn(3, m2.hidden_size)
    assert torch.equal(m2.head_logits(x), m2.model.lm_head(x)[:, 155000:155016])
    p = m2.build_prompt("a cat", "", True, (8, 12))
    tok = m2.tokenizer
    assert p.ids[1][p.mask[1]].tolist() == [151665] + tok.convert_tokens_to_ids(["<reserved08802>", "<reserved08803>"])
    text = tok.decode(p.ids[0][p.mask[0]].tolist()[1:-3])
    assert text == "Generate an image of 96x64 according to the following prompt:\na cat<reserved08706>"
    assert m2.sequence_length((96, 96)) == 96 * 97 + 1 and m2.check_grid((96, 96)) == (96, 96)
    with pytest.raises(ssd_core.SSDError, match="multiples of 4"):
        m2.check_grid((6, 8))
    with pytest.raises(ssd_core.SSDError, match="no negative prompt"):
        m2.build_prompt("a cat", "blurry", True, GRID)


def test_every_decoder_and_ssd_exact_equals_ar(m2, tmp_path):
    ssd_core.DraftHeads.for_model(m2).save(tmp_path / "h.safetensors")
    check_every_decoder(m2, ssd_core.load_heads(tmp_path / "h.safetensors", m2), "a red cat", GRID, 8)
    for seed in (1, 2):
        a = ssd_core.generate(m2, None, prompt="a lighthouse", decoder="ar", seed=seed, grid=(8, 4), score=False)
        b = ssd_core.generate(m2, None, prompt="a lighthouse", decoder="ssd-exact", seed=seed, grid=(8, 4),
                              score=False)
        assert torch.equal(a.tokens, b.tokens)


def test_batched_cfg_equals_unbatched(m2):
    check_cfg_matches_unbatched(m2, "a red cat", GRID, cfg=4.0)


def test_loads_through_api_node_and_cli(folder, m2, tmp_path, monkeypatch):
    ar = ssd_core.generate(m2, None, prompt="a red cat", decoder="ar", seed=3, grid=(4, 4))
    assert tuple(ar.image.shape) == (32, 32, 3)
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    (loaded,) = nodes.SSDLoadModel().load(folder.name, "float32", "cpu")
    assert loaded.model.family == "lumina2" and loaded.model.default_grid == (96, 96)
    out = run(loaded, prompt="a red cat", decoder="ar", seed=3, grid="4x4")
    assert out["result"][1]["tokens"] == ar.tokens.tolist()
    trace = tmp_path / "trace.json"
    rc = cli.main(["generate", "--model", str(folder), "--prompt", "a red cat", "--decoder", "ar", "--seed", "3",
                   "--grid", "4x4", "--dtype", "fp32", "--heads", "none", "--trace", str(trace),
                   "--out", str(tmp_path / "x.png")])
    assert rc == 0 and json.loads(trace.read_text())["tokens"] == ar.tokens.tolist()


# ---- the release's MoVQGAN decoder, re-created from lumina_mgpt/movqgan ------------------------------------------
class RSpatialNorm(nn.Module):  # movq_modules.SpatialNorm (add_conv False, GroupNorm 32 / 1e-6 / affine)
    def __init__(self, f_channels, zq_channels):
        super().__init__()
        self.norm_layer = nn.GroupNorm(num_channels=f_channels, num_groups=32, eps=1e-6, affine=True)
        self.conv_y = nn.Conv2d(zq_channels, f_channels, kernel_size=1, stride=1, padding=0)
        self.conv_b = nn.Conv2d(zq_channels, f_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, f, zq):
        zq = torch.nn.functional.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


def nonlinearity(x):
    return x * torch.sigmoid(x)


class RResnetBlock(nn.Module):  # movq_modules.ResnetBlock, temb_channels 0
    def __init__(self, in_channels, out_channels, zq_ch):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = RSpatialNorm(in_channels, zq_ch)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.norm2 = RSpatialNorm(out_channels, zq_ch)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x, temb, zq):
        h = self.conv1(nonlinearity(self.norm1(x, zq)))
        h = self.conv2(nonlinearity(self.norm2(h, zq)))
        if self.in_channels != self.out_channels:
            x = self.nin_shortcut(x)
        return x + h


class RAttnBlock(nn.Module):  # movq_modules.AttnBlock: bmm attention, scale c ** -0.5
    def __init__(self, in_channels, zq_ch):
        super().__init__()
        self.norm = RSpatialNorm(in_channels, zq_ch)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(in_channels, in_channels, 1) for _ in range(4))

    def forward(self, x, zq):
        h_ = self.norm(x, zq)
        q, k, v = self.q(h_), self.k(h_), self.v(h_)
        b, c, h, w = q.shape
        q = q.reshape(b, c, h * w).permute(0, 2, 1)
        k = k.reshape(b, c, h * w)
        w_ = torch.nn.functional.softmax(torch.bmm(q, k) * (int(c) ** (-0.5)), dim=2)
        h_ = torch.bmm(v.reshape(b, c, h * w), w_.permute(0, 2, 1)).reshape(b, c, h, w)
        return x + self.proj_out(h_)


class RUpsample(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x):
        return self.conv(torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"))


class RMOVQDecoder(nn.Module):  # movq_modules.MOVQDecoder
    def __init__(self, *, ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels, zq_ch):
        super().__init__()
        self.num_resolutions, self.num_res_blocks = len(ch_mult), num_res_blocks
        block_in = ch * ch_mult[self.num_resolutions - 1]
        curr_res = resolution // 2 ** (self.num_resolutions - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = RResnetBlock(block_in, block_in, zq_ch)
        self.mid.attn_1 = RAttnBlock(block_in, zq_ch)
        self.mid.block_2 = RResnetBlock(block_in, block_in, zq_ch)
        self.up = nn.ModuleList()
        for i_level in reversed(range(self.num_resolutions)):
            block, attn = nn.ModuleList(), nn.ModuleList()
            block_out = ch * ch_mult[i_level]
            for _ in range(self.num_res_blocks + 1):
                block.append(RResnetBlock(block_in, block_out, zq_ch))
                block_in = block_out
                if curr_res in attn_resolutions:
                    attn.append(RAttnBlock(block_in, zq_ch))
            up = nn.Module()
            up.block, up.attn = block, attn
            if i_level != 0:
                up.upsample = RUpsample(block_in)
                curr_res = curr_res * 2
            self.up.insert(0, up)
        self.norm_out = RSpatialNorm(block_in, zq_ch)
        self.conv_out = nn.Conv2d(block_in, out_ch, kernel_size=3, stride=1, padding=1)

    def forward(self, z, zq):
        temb = None
        h = self.conv_in(z)
        h = self.mid.block_1(h, temb, zq)
        h = self.mid.attn_1(h, zq)
        h = self.mid.block_2(h, temb, zq)
        for i_level in reversed(range(self.num_resolutions)):
            for i_block in range(self.num_res_blocks + 1):
                h = self.up[i_level].block[i_block](h, temb, zq)
                if len(self.up[i_level].attn) > 0:
                    h = self.up[i_level].attn[i_block](h, zq)
            if i_level != 0:
                h = self.up[i_level].upsample(h)
        return self.conv_out(nonlinearity(self.norm_out(h, zq)))


class RMOVQ(nn.Module):  # models/vqgan.py MOVQ: the decoding half (decode_code)
    def __init__(self, ddconfig, n_embed, embed_dim):
        super().__init__()
        self.decoder = RMOVQDecoder(zq_ch=embed_dim, **ddconfig)
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, ddconfig["z_channels"], 1)
        self.embed_dim = embed_dim

    def decode_code(self, code_b, h, w):
        quant = self.quantize.embedding(code_b.flatten())
        quant = quant.view((1, h, w, self.embed_dim)).permute(0, 3, 1, 2).contiguous()  # 'b h w c -> b c h w'
        return self.decoder(self.post_quant_conv(quant), quant)


def release_movq():
    dd = {k: MOVQ[k] for k in ("ch", "out_ch", "ch_mult", "num_res_blocks", "attn_resolutions", "resolution",
                               "z_channels")}
    return RMOVQ(dd, MOVQ["n_embed"], MOVQ["embed_dim"]).eval()


def show_images(batch):  # FlexARInferenceSolver.show_images, as an array
    return ((batch + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def test_movqgan_equals_the_release_decoder_on_the_same_weights(folder, m2):
    from ssd_core.pixel_decoders.movqgan import MoVQDecoder

    ours = MoVQDecoder.load(folder / "movqgan.safetensors")
    ref = release_movq()
    missing, unexpected = ref.load_state_dict(ours.state_dict(), strict=True)  # the release's tensor names
    assert not missing and not unexpected
    torch.manual_seed(0)
    codes = torch.randint(0, MOVQ["n_embed"], (4, 8))
    with torch.no_grad():
        theirs = ref.decode_code(codes, 4, 8)
    mine = ours(codes[None])
    assert tuple(mine.shape) == (1, 3, 32, 64) and theirs.std() > 0.05
    scale = float(theirs.abs().max())  # the attention here is one fused kernel, there two bmm: float tolerance
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5 * scale)
    pixels = m2.decode(codes)  # what the pipeline returns: [H_px, W_px, 3] in [0, 1]
    want = show_images(theirs)[0].float() / 255
    assert tuple(pixels.shape) == (32, 64, 3) and (pixels - want).abs().max() <= 1 / 255 + 1e-6


def test_convert_movqgan_reads_the_release_checkpoint(tmp_path, folder):
    """movqgan_270M.ckpt as get_movqgan_model loads it: a plain state_dict of the whole MOVQ (encoder too)."""
    from ssd_core.pixel_decoders.movqgan import MoVQDecoder

    state = {k: v.clone() for k, v in tiny_movqgan(5).state_dict().items()}
    state["encoder.conv_in.weight"] = torch.randn(32, 3, 3, 3)  # dropped: the pack draws pixels only
    state["quant_conv.weight"] = torch.randn(4, 4, 1, 1)
    torch.save(state, tmp_path / "movqgan_270M.ckpt")
    out = tmp_path / "m" / "movqgan.safetensors"
    assert cli.main(["convert-movqgan", str(tmp_path / "movqgan_270M.ckpt"), str(out)]) == 0
    back = MoVQDecoder.load(out)
    assert back.config.__dict__ == MoVQDecoder(back.config).config.__dict__
    assert {k: v.shape for k, v in back.state_dict().items()} == {k: v.shape for k, v in tiny_movqgan().state_dict().items()}
    assert all(torch.equal(back.state_dict()[k], state[k]) for k in back.state_dict())
    assert cli.main(["convert-movqgan", str(tmp_path / "nope.ckpt"), str(out)]) == 2


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
    for name in TOKENIZER_FILES:
        bare = _copy(folder, tmp_path, f"no-{name}")
        (bare / name).unlink()
        cases.append((bare, f"lacks {name}: download them from Alpha-VLLM/Lumina-mGPT-2.0"))
    novq = _copy(folder, tmp_path, "no-movqgan")
    (novq / "movqgan.safetensors").unlink()
    cases.append((novq, r"has no movqgan.safetensors .*python -m ssd_core convert-movqgan movqgan_270M.ckpt"))
    pickled = _copy(folder, tmp_path, "pickle-only")
    (pickled / "movqgan.safetensors").unlink()
    torch.save({"decoder.conv_in.weight": torch.zeros(1)}, pickled / "movqgan_270M.ckpt")
    cases.append((pickled, r"holds only the pickle movqgan_270M.ckpt, which the pack never unpickles: .*convert-movqgan"))
    cut = _copy(folder, tmp_path, "cut-movqgan")
    data = (cut / "movqgan.safetensors").read_bytes()
    (cut / "movqgan.safetensors").write_bytes(data[:len(data) // 2])
    cases.append((cut, r"is not a converted MoVQGAN decoder .*convert-movqgan"))
    for bad, match in cases:
        with pytest.raises(ssd_core.SSDError, match=match) as err:
            ssd_core.load_model(bad, dtype="fp32")
        assert "\n" not in str(err.value), bad.name


def test_the_two_releases_are_told_apart(folder, tmp_path):
    one = build_lumina_released(tmp_path / "Lumina-mGPT-7B-768", 768)
    assert ssd_core.load_model(one, dtype="fp32").family == "lumina"
    with pytest.raises(ssd_core.SSDError, match=r"holds a Lumina-mGPT 1 model .* load it as family 'lumina'$"):
        ssd_core.load_model(one, dtype="fp32", family="lumina2")
    with pytest.raises(ssd_core.SSDError, match=r"holds a Lumina-mGPT 2.0 model .* load it as family 'lumina2'$"):
        ssd_core.load_model(folder, dtype="fp32", family="lumina")


def test_without_movqgan_file_given_by_path_no_pixels(folder, m2):
    m = Lumina2Model(m2.model, m2.tokenizer, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ssd_core.generate(m, None, prompt="a cat", decoder="ar", grid=(4, 4), score=False)
    assert res.image is None and any("convert-movqgan" in str(w.message) for w in caught)


# ---- fitting it on users' cards, the template ------------------------------------------------------------------
def test_memory_row_plan_and_cache_at_the_largest_grid(m2):
    """Meta-device counts of the 7B config (tools/memory_table.py), --plan's shape, and the static cache's
    positions at the largest listed grid (192x48: 192 rows of 48 + row end, then <eoss>)."""
    from ssd_core import static_cache
    from ssd_core.memory import KEEP_FULL
    from ssd_core.training import TrainConfig, plan
    from tools.memory_table import released_counts

    c = released_counts("Lumina-mGPT-2.0")
    assert 7.8e9 < c["params"] < 8.0e9 and c["none"] > c["8-bit"] > c["4-bit"] > c["none"] / 4
    assert KEEP_FULL["lumina2"][0] == "lm_head"  # its image rows are sliced: kept in full precision
    shape = plan.MODELS["Lumina-mGPT-2.0"]
    assert shape.family == "lumina2" and shape.slots == m2.sequence_length((96, 96)) - 1
    assert abs(shape.params - c["params"]) / c["params"] < 0.01
    plan.check("Lumina-mGPT-2.0", "H100", "1,8")
    one, eight = (plan.project(shape, "H100", n, TrainConfig(samples=800, epochs=1, batch_grids=16, gen_batch=8))
                  for n in (1, 8))
    assert 7.0 < one["generation_s"] / eight["generation_s"] <= 8.0
    static_cache.enable(m2, "static")
    try:
        slots = {g: m2.layout(g).num_slots for g in m2.grid_options()}
        assert max(slots.values()) == m2.static.slots == 192 * 49 + 1 == slots[(192, 48)]
        assert static_cache.capacity(m2.static, 256) == 10752  # 256 + 9409 + the widest window, to 64
    finally:
        static_cache.enable(m2, "off")


def test_template_and_the_loaders_error_say_what_to_download(tmp_path, monkeypatch):
    root = json.loads((ROOT / "tests" / "workflows_api" / "SSD Lumina-mGPT 2.0 - ar vs ssd-exact.json").read_text())
    assert [n["inputs"]["model"] for n in root.values() if n["class_type"] == "SSDLoadModel"] == ["Lumina-mGPT-2.0"]
    assert sorted(n["inputs"]["decoder"] for n in root.values() if n["class_type"] == "SSDSampler") == \
        ["ar", "ssd-exact"]
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        nodes.SSDLoadModel().load("Lumina-mGPT-2.0", "auto", "cpu")
    line = str(err.value)
    assert "\n" not in line and "download Alpha-VLLM/Lumina-mGPT-2.0" in line
    assert "movqgan_270M.ckpt" in line and "python -m ssd_core convert-movqgan" in line


def test_check_model_knows_the_folder_and_what_it_lacks(folder, tmp_path):
    from ssd_core.check_model import check_folder

    report = check_folder(folder)
    assert report.family == "lumina2" and report.loadable, [f.line for f in report.blocking()]
    assert any(f.topic == "vq" and f.level == "ok" and "16 codes, 8 px a code" in f.line for f in report.findings)
    bare = _copy(folder, tmp_path, "bare")
    (bare / "movqgan.safetensors").unlink()
    (bare / "tokenizer.json").unlink()
    (bare / "tokenizer_config.json").unlink()
    lines = [f.line for f in check_folder(bare).blocking()]
    assert any("convert-movqgan" in line for line in lines) and any("Alpha-VLLM/Lumina-mGPT-2.0" in line for line in lines)
