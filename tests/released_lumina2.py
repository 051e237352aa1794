"""A tiny random Lumina-mGPT 2.0 folder in the RELEASED layout (Alpha-VLLM/Lumina-mGPT-2.0).

    build_lumina2_released(tmp_path / "Lumina-mGPT-2.0") -> the folder

What the release holds, and where each fact comes from (Alpha-VLLM/Lumina-mGPT-2.0 at f44a4d7):
- config.json of the fork's ChameleonXLLMXConfig (lumina_mgpt/model/configuration_xllmx_chameleon.py over
  lumina_mgpt/model/chameleon/configuration_chameleon.py), written by finetune_solver.py's
  ChameleonXLLMXForConditionalGeneration (architectures ["ChameleonXLLMXForConditionalGeneration"], model_type
  "chameleon", model_parallel_size, swin_norm, mask_image_logits false from scripts/train.sh's
  --unmask_image_logits, dropout 0.05, z_loss_weight 1e-5, vq_config and vocabulary_map);
- vocab_size past the image ids 155000-171383 (inference_solver.py MultiModalLogitsProcessor; here 155000 + 16
  codes: the processor's range clipped to the vocabulary, as it is on any model);
- weights: the fork's state_dict without the VQ encoder (finetune_solver.py: `del model.model.vqmodel`), q/k norms
  [model_parallel_size, head_dim] (ChameleonLayerNorm), sharded with an index (tests/released_lumina.py's writer);
- the tokenizer in the model folder (xllmx/model/tokenizer.py: AutoTokenizer.from_pretrained(model_path), which
  needs tokenizer.json + tokenizer_config.json): Qwen2-style ids, `<|endoftext|>` 151643 as EOS and no BOS, the
  Lumina tokens the release writes literally at 151665 (`<racm3:break>`), 151666 (`<eoss>`), 151670
  (`<reserved08799>`), the size tokens `<reserved088NN>` and the turn separator `<reserved08706>` after them;
- movqgan.safetensors: not in the release; the user converts ai-forever/MoVQGAN's movqgan_270M.ckpt (`python -m
  ssd_core convert-movqgan`). Here a tiny MoVQGAN of 16 codes (4 levels: 8 px a code, as the 270M model).
Not verified (no real file seen): the config's exact vocab_size and max_position_embeddings, the ids of the size
tokens and of `<reserved08706>`, whether the tokenizer has a BOS, the shard count.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from released_lumina import released_state_dict, write_shards
from tiny_families import CODES, FFN, HEADS, HIDDEN, LAYERS

IMAGE_FIRST = 155000
SPECIAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
               "<racm3:break>": 151665, "<eoss>": 151666, "<reserved08796>": 151667, "<reserved08797>": 151668,
               "<reserved08798>": 151669, "<reserved08799>": 151670}
SIZE_UNITS = range(0, 65)  # <reserved08800> .. <reserved08864>: up to 2048 px
SIZE_FIRST_ID = 151671  # unverified: the size tokens right after <reserved08799>
TURN_END_ID = SIZE_FIRST_ID + len(SIZE_UNITS)  # unverified: <reserved08706> after them
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MOVQ = dict(n_embed=CODES, embed_dim=4, z_channels=4, ch=32, out_ch=3, ch_mult=[1, 1, 1, 2], num_res_blocks=1,
            resolution=32, attn_resolutions=[4], add_conv=False)  # level 3 works at 32 / 8 = 4: attention there


def vocabulary() -> dict[str, int]:
    """The tokenizer's vocabulary: byte-level characters from 0, the Qwen2 specials and Lumina's tokens above."""
    from tokenizers import pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update(SPECIAL_IDS)
    vocab.update({f"<reserved{8800 + n:05d}>": SIZE_FIRST_ID + i for i, n in enumerate(SIZE_UNITS)})
    vocab["<reserved08706>"] = TURN_END_ID
    return vocab


def write_tokenizer(folder: Path, vocab: dict[str, int]) -> None:
    """tokenizer.json (byte-level BPE, the specials as added tokens at their ids) and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = [n for n in vocab if n.startswith("<") and len(n) > 1]
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in specials])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|endoftext|>",
              "pad_token": "<|endoftext|>", "model_max_length": 131072, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def released_config(vocab: dict[str, int], codes: int = CODES) -> dict:
    vq = dict(embed_dim=8, num_embeddings=64, latent_channels=8, resolution=32, base_channels=32,
              channel_multiplier=[1, 1], num_res_blocks=1, double_latent=False, in_channels=3, attn_resolutions=[],
              dropout=0.0, attn_type="vanilla", initializer_range=0.02, model_type="chameleon_vqgan")
    return {
        "architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
        "vocab_size": IMAGE_FIRST + codes, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "hidden_act": "silu", "max_position_embeddings": 10240, "initializer_range": 0.02,
        "rms_norm_eps": 1e-05, "use_cache": True, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": vocab["<eoss>"], "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "model_parallel_size": 1, "swin_norm": False,
        "mlp_bias": False, "mask_image_logits": False, "dropout": 0.05, "z_loss_weight": 1e-05,
        "vq_config": vq, "vocabulary_map": dict(vocab), "torch_dtype": "bfloat16", "transformers_version": "4.47.1",
    }


def tiny_movqgan(seed: int = 1):
    """The pack's MoVQGAN decoder at the tiny config, random weights (norm scales near 1, so they matter)."""
    from ssd_core.pixel_decoders.movqgan import MoVQConfig, MoVQDecoder

    torch.manual_seed(seed)
    dec = MoVQDecoder(MoVQConfig(**MOVQ))
    with torch.no_grad():
        for name, p in dec.named_parameters():
            p.add_(0.3 * torch.randn_like(p))  # GroupNorm's ones / zeros and the codebook moved off their init
        dec.decoder.conv_out.weight.mul_(0.05)  # pixels mostly inside [-1, 1], so few are clamped
        dec.decoder.conv_out.bias.mul_(0.05)
    return dec


def build_lumina2_released(folder, seed: int = 0, movqgan: bool = True, tokenizer: bool = True) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    config = released_config(vocab)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"eos_token_id": vocab["<eoss>"], "transformers_version": "4.47.1"}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    write_shards(folder, released_state_dict(config, seed))
    if tokenizer:
        write_tokenizer(folder, vocab)
    if movqgan:
        tiny_movqgan(seed + 1).save(folder / "movqgan.safetensors")
    return folder
