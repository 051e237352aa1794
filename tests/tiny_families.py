"""Tiny random-init models of the real families' transformers classes, saved with save_pretrained (offline).

Each builder writes a model folder the way a user would have it: config + safetensors weights, a generation
config where the family reads one, and the model's own tokenizer (a byte-level BPE with no merges, so any text
tokenizes, plus the family's special tokens under their real names). Token ids differ from the released models;
the adapters look special tokens up by name, as they must for the real ones.

    build_janus(tmp_path / "janus")    -> JanusForConditionalGeneration, 4x4 grid, 16 codes
    build_emu3(tmp_path / "emu3")      -> Emu3ForConditionalGeneration, 16 visual tokens, any grid
    build_lumina(tmp_path / "lumina")  -> ChameleonForConditionalGeneration (Lumina-mGPT layout) + vqgan.safetensors
"""
from __future__ import annotations

from pathlib import Path

import torch

HIDDEN = 32
LAYERS = 2
HEADS = 4
FFN = 64
CODES = 16


def _text_kwargs(vocab_size: int, **extra) -> dict:
    kw = dict(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=512)
    kw.update(extra)
    return kw


def byte_tokenizer(specials: list[str], plain: list[str] = (), bos: str | None = None, eos: str | None = None,
                   pad: str | None = None, extra_special: dict | None = None):
    """A PreTrainedTokenizerFast: ids 0.. for `specials` (matched whole in text), then `plain` names (in the
    vocabulary, e.g. image tokens), then the 256 byte-level characters. No merges: text is one token a byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for name in list(specials) + list(plain):
        vocab.setdefault(name, len(vocab))
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):  # a Rust HashSet: its order changes per process
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    kw = {}
    if extra_special:
        kw["extra_special_tokens"] = extra_special
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, **kw)
    return fast, vocab


def _seeded(seed: int):
    torch.manual_seed(seed)


# ---- Janus-Pro -------------------------------------------------------------------------------------------------
JANUS_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<begin_of_image>",
                  "<end_of_image>", "<image_placeholder>", "<|User|>", "<|Assistant|>"]


def build_janus(folder, seed: int = 0, grid: int = 4, dtype=torch.float32) -> Path:
    from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

    folder = Path(folder)
    tok, vocab = byte_tokenizer(JANUS_SPECIALS, bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>",
                                pad="<｜▁pad▁｜>")
    patch = 16
    cfg = JanusConfig(
        text_config=dict(model_type="llama", **_text_kwargs(len(vocab) + 4, bos_token_id=0, eos_token_id=1,
                                                            pad_token_id=2)),
        vision_config=dict(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, image_size=grid * patch,
                           patch_size=patch, projection_dim=HIDDEN, num_image_tokens=grid * grid, depth=1),
        vq_config=dict(embed_dim=8, num_embeddings=CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=HIDDEN,
                       image_token_embed_dim=HIDDEN, num_hidden_layers=1),
        image_token_id=vocab["<image_placeholder>"],
    )
    _seeded(seed)
    model = JanusForConditionalGeneration(cfg).to(dtype).eval()
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2,
                                               generation_kwargs={"boi_token_id": vocab["<begin_of_image>"]})
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# ---- Emu3 ------------------------------------------------------------------------------------------------------
EMU3_SPECIALS = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|image start|>", "<|image end|>",
                 "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>"]


def build_emu3(folder, seed: int = 0, dtype=torch.float32) -> Path:
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    folder = Path(folder)
    visual = [f"<|visual token {i:06d}|>" for i in range(CODES)]
    tok, vocab = byte_tokenizer(EMU3_SPECIALS, plain=visual, bos="<|extra_203|>", eos="<|extra_204|>",
                                pad="<|endoftext|>")
    cfg = Emu3Config(
        text_config=_text_kwargs(len(vocab) + 4, bos_token_id=vocab["<|extra_203|>"],
                                 eos_token_id=vocab["<|extra_204|>"], pad_token_id=vocab["<|endoftext|>"],
                                 attention_dropout=0.0),
        vq_config=dict(codebook_size=CODES, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                       num_attention_heads=1, temporal_downsample_factor=4),
        vocabulary_map=dict(vocab),
    )
    _seeded(seed)
    model = Emu3ForConditionalGeneration(cfg).to(dtype).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# ---- Lumina-mGPT (Chameleon) -----------------------------------------------------------------------------------
def chameleon_image_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


LUMINA_SIZES = range(0, 9)  # <reserved08800> .. <reserved08808>: sizes 0..256 px in steps of 32


def build_lumina(folder, seed: int = 0, dtype=torch.float32, with_vqgan: bool = True) -> Path:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    folder = Path(folder)
    specials = ["<s>", "<pad>", "</s>", "<reserved08707>"]
    images = [chameleon_image_name(i) for i in range(CODES)]
    lumina = ["<eoss>", "<racm3:break>", "<reserved08706>", "<reserved08799>", "<image>"] + \
        [f"<reserved{8800 + n:05d}>" for n in LUMINA_SIZES]
    tok, vocab = _lumina_tokenizer(specials, images, lumina)
    cfg = ChameleonConfig(
        **_text_kwargs(len(vocab) + 4, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                       pad_token_id=vocab["<pad>"]),
        vq_config=dict(embed_dim=8, num_embeddings=CODES, latent_channels=8, resolution=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1),
        vocabulary_map=dict(vocab),
    )
    _seeded(seed)
    model = ChameleonForConditionalGeneration(cfg).to(dtype).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if with_vqgan:
        from ssd_core.pixel_decoders.chameleon_vqgan import VQGANDecoder

        vq = VQGANDecoder(tiny_vqgan_config())
        vq.save(str(folder / "vqgan.safetensors"))
    return folder


def tiny_vqgan_config():
    from ssd_core.pixel_decoders.chameleon_vqgan import VQGANConfig

    return VQGANConfig(n_embed=CODES, embed_dim=8, z_channels=32, ch=32, ch_mult=[1, 2], num_res_blocks=1,
                       resolution=32, attn_resolutions=[16])


def _lumina_tokenizer(specials, images, lumina):
    """Chameleon's order: specials, image tokens (ids 4..), then the Lumina-mGPT control tokens, then bytes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for name in specials + images + lumina:
        vocab.setdefault(name, len(vocab))
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):  # a Rust HashSet: its order changes per process
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials + lumina])
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    return fast, vocab


BUILDERS = {"janus": build_janus, "emu3": build_emu3, "lumina": build_lumina}


# ---- checks every family runs (the test_family_* files call these) ---------------------------------------------
def reference_logits(model, prompt, row: int, seq_ids: torch.Tensor) -> torch.Tensor:
    """Image logits [L, V] predicting every slot of `seq_ids` for one stream, from ONE plain unbatched forward of
    the transformers backbone over [real prompt tokens ; seq_ids[:-1]] (no cache, no custom mask, default
    positions), through the final norm the backbone applies itself."""
    real = prompt.ids[row][prompt.mask[row]]
    full = torch.cat([real, seq_ids[:-1]])[None].to(model.device)
    with torch.no_grad():
        out = model.backbone()(inputs_embeds=model.embed(full), use_cache=False)
        logits = model.head_logits(out.last_hidden_state).float()[0]
    return logits[real.numel() - 1:]


def stepwise_logits(model, prompt, seq_ids: torch.Tensor) -> torch.Tensor:
    """Per-stream image logits [B, L, V] from the engine's CFG-batched session, fed one slot a step."""
    session = model.start(prompt)
    out = [model.image_logits(session.last_features)]
    for t in range(seq_ids.numel() - 1):
        out.append(model.image_logits(session.forward(seq_ids[t:t + 1]))[:, 0])
    return torch.stack(out, dim=1)


def sequence_ids(model, layout, codes_of_cells: torch.Tensor) -> torch.Tensor:
    ids = layout.forced.clone()
    ids[layout.slot_of_cell] = model.code_to_id(codes_of_cells.flatten().long())
    return ids


def check_cfg_matches_unbatched(model, prompt_text: str, grid, negative=None, cfg: float = 3.0, seed: int = 0,
                                tol: float = 1e-5):
    """The batched CFG log-probs equal those from two separate unbatched forwards at every step (`tol`, fp32)."""
    import ssd_core
    from ssd_core.sampling import SamplerSettings, guide, log_probs

    res = ssd_core.generate(model, None, prompt=prompt_text, negative_prompt=negative, decoder="ar", seed=seed,
                            cfg=cfg, grid=grid, decode_pixels=False, score=False)
    layout = model.layout(grid)
    prompt = model.build_prompt(prompt_text, negative, True, layout.grid)
    assert prompt.ids.shape[0] == 2
    ids = sequence_ids(model, layout, res.tokens)
    batched = stepwise_logits(model, prompt, ids)  # [2, L, V]
    ref = torch.stack([reference_logits(model, prompt, r, ids) for r in (0, 1)])  # [2, L, V]
    settings = SamplerSettings(seed=seed, cfg=cfg, temperature=1.0)
    lp_batched = log_probs(guide(batched, cfg), settings)
    lp_ref = log_probs(ref[1] + cfg * (ref[0] - ref[1]), settings)  # u + s (c - u), computed here
    image = layout.forced < 0
    diff = (lp_batched - lp_ref)[image].abs().max().item()
    assert diff < tol, f"batched CFG log-probs differ from the unbatched reference by {diff}"
    raw = (batched - ref)[:, image].abs().max().item()
    assert raw < 1e-4, raw
    return diff


def check_every_decoder(model, heads, prompt_text: str, grid, pixel_factor: int, negative=None, seed: int = 3):
    """Every decoder makes a full image of the right size; ssd-exact gives the very tokens of ar."""
    import ssd_core

    results = {}
    for dec in ssd_core.ENGINE_DECODERS:
        res = ssd_core.generate(model, heads, prompt=prompt_text, negative_prompt=negative, decoder=dec, seed=seed,
                                grid=grid, draft_rows=2, verify_rounds=1, window=2, score=(dec == "ar"))
        H, W = grid
        assert tuple(res.tokens.shape) == (H, W), dec
        assert int(res.tokens.min()) >= 0 and int(res.tokens.max()) < model.image_vocab_size, dec
        assert res.image is not None and tuple(res.image.shape) == (H * pixel_factor, W * pixel_factor, 3), dec
        assert float(res.image.min()) >= 0 and float(res.image.max()) <= 1, dec
        assert res.trace.steps >= 1, dec
        results[dec] = res
    assert torch.equal(results["ssd-exact"].tokens, results["ar"].tokens)
    return results


# ---- random-weight models of given shapes (tools/random_models.py, here at tiny shapes) ---------------
TINY_SHAPES = {
    "janus": {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": 2, "vocab_size": 300,
              "max_position_embeddings": 512, "codes": CODES, "image_size": 64, "patch_size": 16},
    "emu3": {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS, "num_key_value_heads": 2, "vocab_size": 300,
             "max_position_embeddings": 512, "codes": CODES, "vq_base_channels": 32,
             "vq_channel_multiplier": [1, 1]},
    "lumina": {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
               "num_attention_heads": HEADS, "num_key_value_heads": 2, "vocab_size": 8960,
               "max_position_embeddings": 512, "codes": CODES},
}


def check_random_init(cls, family: str, grid, full_sizes: dict):
    """A random-weight model at tiny shapes generates from token-id prompts (no tokenizer); the released shapes count the
    expected parameters (on the meta device)."""
    import ssd_core
    from tools import random_models

    m = random_models.random_model(family, TINY_SHAPES[family], device="cpu", dtype=torch.float32,
                                   grid=None if family == "janus" else grid)
    assert isinstance(m, cls)
    assert m.tokenizer is None and m.default_grid == tuple(grid)
    heads = ssd_core.DraftHeads.for_model(m)
    ar = ssd_core.generate(m, None, prompt=[5, 6, 7], negative_prompt=[] if family == "emu3" else "",
                           decoder="ar", seed=1, score=False, decode_pixels=False)
    ex = ssd_core.generate(m, heads, prompt=[5, 6, 7], negative_prompt=[] if family == "emu3" else "",
                           decoder="ssd-exact", seed=1, score=False, decode_pixels=False)
    assert torch.equal(ar.tokens, ex.tokens) and tuple(ar.tokens.shape) == tuple(grid)
    for name, (lo, hi) in full_sizes.items():
        n = random_models.count_parameters(family, name)
        assert lo < n / 1e9 < hi, (name, n)
    return m
