"""A tiny random Lumina-mGPT-7B folder in the RELEASED layout (Alpha-VLLM/Lumina-mGPT-7B-512 / -768 / -1024).

    build_lumina_released(tmp_path / "Lumina-mGPT-7B-768", side=768) -> the folder

What the release holds, and where each fact comes from (Alpha-VLLM/Lumina-mGPT; .work/docs_lumina.md has more):
- config.json written by the fork's ChameleonXLLMXConfig (lumina_mgpt/model/configuration_xllmx_chameleon.py:
  z_loss_weight; its ChameleonConfig in lumina_mgpt/model/chameleon/configuration_chameleon.py: model_parallel_size,
  swin_norm, mask_image_logits, dropout, vq_config, vocabulary_map), architectures
  ["ChameleonXLLMXForConditionalGeneration"], model_type "chameleon"; exps/7B.sh trains with --unmask_image_logits
  (mask_image_logits false), --dropout 0.05, --z_loss_weight 1e-5, --max_seq_len 4096; the vq_config keeps the
  vqgan.yaml names beside the renamed ones (convert_chameleon_weights_to_hf.py copies, never deletes);
- weights: the fork's state_dict (xllmx/util/ckpt.py save: model.save_pretrained(state_dict=...)) with the VQ
  encoder deleted (finetune_solver.py _model_func: `del model.model.vqmodel`), q/k norms [model_parallel_size,
  head_dim] (modeling_chameleon.py ChameleonLayerNorm), sharded: model-0000N-of-00002.safetensors + index;
- generation_config.json, and the tokenizer files only in the 768 folder: Lumina-mGPT's item processor reads its
  tokenizer from Alpha-VLLM/Lumina-mGPT-7B-768 whatever the model (data/item_processor.py FlexARItemProcessor);
- vqgan.safetensors: not in the release; the user converts Meta's vqgan.ckpt (`python -m ssd_core convert-vqgan`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tiny_families import CODES, FFN, HEADS, HIDDEN, LAYERS, _lumina_tokenizer, chameleon_image_name, \
    tiny_vqgan_config

SIDES = {512: 32, 768: 48, 1024: 64}  # px -> tokens a side (16 px a token)
# max_position_embeddings: 7B.sh's --max_seq_len 4096 (512 / 768); the 1024 model needs more than 64 x 65 + 1
# positions and its value is not in the repo: 5120 here (unverified)
POSITIONS = {512: 4096, 768: 4096, 1024: 5120}
SIZE_TOKENS = range(0, 33)  # <reserved08800> .. <reserved08832>: up to 1024 px (32 units of 32 px)
SPECIALS = ["<s>", "<pad>", "</s>", "<reserved08707>"]  # Chameleon's ids 0..3; image tokens from id 4
LUMINA = ["<eoss>", "<racm3:break>", "<reserved08706>", "<reserved08799>", "<image>"] + \
    [f"<reserved{8800 + n:05d}>" for n in SIZE_TOKENS]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def released_config(vocab: dict, side: int) -> dict:
    """config.json as the fork's save_pretrained writes it (tiny sizes, the released fields)."""
    vq = dict(embed_dim=8, num_embeddings=CODES, latent_channels=8, resolution=32, base_channels=32,
              channel_multiplier=[1, 1], num_res_blocks=1, double_latent=False, in_channels=3, attn_resolutions=[],
              dropout=0.0, attn_type="vanilla", initializer_range=0.02, model_type="chameleon_vqgan",
              # vqgan.yaml's own names, kept by the fork's converter beside the renamed ones
              ch=32, ch_mult=[1, 1], n_embed=CODES, z_channels=8, double_z=False, out_ch=3)
    return {
        "architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
        "vocab_size": len(vocab) + 4, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,  # 7B: no GQA
        "hidden_act": "silu", "max_position_embeddings": POSITIONS[side], "initializer_range": 0.02,
        "rms_norm_eps": 1e-05, "use_cache": True, "pad_token_id": None, "bos_token_id": vocab["<s>"],
        "eos_token_id": vocab["</s>"], "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "model_parallel_size": 1, "swin_norm": False,
        "mlp_bias": False, "mask_image_logits": False, "dropout": 0.05, "z_loss_weight": 1e-05,
        "vq_config": vq, "vocabulary_map": dict(vocab), "torch_dtype": "float32", "transformers_version": "4.44.0",
    }


def released_state_dict(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """The tensors of the release: a transformers Chameleon's, without model.vqmodel.*, q/k norms as the fork's
    [model_parallel_size, head_dim] (random, so that they matter)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    kw = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype",
                                                      "transformers_version")}
    model = ChameleonForConditionalGeneration(ChameleonConfig(**kw))
    rows, head_dim = config["model_parallel_size"], config["hidden_size"] // config["num_attention_heads"]
    out = {}
    for name, t in model.state_dict().items():
        if name.startswith("model.vqmodel."):
            continue
        if ".self_attn.q_norm." in name or ".self_attn.k_norm." in name:
            base = 1.0 if name.endswith("weight") else 0.0
            t = base + 0.5 * torch.randn(rows, head_dim)
        out[name] = t.detach().clone().contiguous()
    return out


def write_shards(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """model-00001-of-00002.safetensors (embeddings, first half of the layers), model-00002-of-00002 (the rest,
    the final norm, lm_head) and model.safetensors.index.json with metadata.total_size, as save_pretrained."""
    from safetensors.torch import save_file

    def shard_of(name: str) -> int:
        if name.startswith("model.layers."):
            return 1 if int(name.split(".")[2]) < LAYERS // 2 else 2
        return 1 if name.startswith("model.embed_tokens") else 2

    names = {1: "model-00001-of-00002.safetensors", 2: "model-00002-of-00002.safetensors"}
    weight_map = {}
    for n, file in names.items():
        part = {k: v for k, v in tensors.items() if shard_of(k) == n}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def build_lumina_released(folder, side: int = 768, seed: int = 0, vqgan: bool = True,
                          tokenizer: bool | None = None) -> Path:
    """A tiny Lumina-mGPT-7B-`side` folder in the released layout (`tokenizer` None: as the release, the 768
    folder only), with the vqgan.safetensors a user adds (`vqgan`)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {sorted(SIDES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images = [chameleon_image_name(i) for i in range(CODES)]
    tok, vocab = _lumina_tokenizer(SPECIALS, images, LUMINA)
    config = released_config(vocab, side)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"], "transformers_version": "4.44.0"}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    write_shards(folder, released_state_dict(config, seed))
    if tokenizer if tokenizer is not None else side == 768:
        tok.save_pretrained(folder)
    if vqgan:
        from ssd_core.pixel_decoders.chameleon_vqgan import VQGANDecoder

        torch.manual_seed(seed + 1)
        VQGANDecoder(tiny_vqgan_config()).save(str(folder / "vqgan.safetensors"))
    return folder
