"""A tiny random Emu3.5-Image folder in the RELEASED layout (BAAI/Emu3.5-Image + baaivision/Emu3.5's tokenizer).

    build_emu35_released(tmp_path / "Emu3.5-Image") -> the folder

What the release holds, and where each fact comes from (baaivision/Emu3.5 at 8fcf1da):
- config.json of its remote-code Emu3Config (src/emu3p5/configuration_emu3.py): model_type "Emu3" (capital E),
  architectures ["Emu3ForCausalLM"], head_dim, the special ids (pad 151643, bos 151849, eos 151850, img 151851,
  boi 151852, eoi 151853, eol 151846, eof 151847), image_area, pretraining_tp, rope_theta 1e6, attention_dropout
  0.1, auto_map to its remote code (which the pack never runs);
- vocab_size: the text vocabulary and specials (151854 ids) + the visual tokens (131,072 upstream, 16 here);
- weights: src/emu3p5/modeling_emu3.py's module names (Emu3ForCausalLM: model.embed_tokens, model.layers.N
  .self_attn.{q,k,v,o}_proj (no bias), .self_attn.q_norm / k_norm [head_dim] (Emu3RMSNorm), .mlp.{gate,up,down}
  _proj, .input_layernorm, .post_attention_layernorm, model.norm, lm_head, untied), sharded with an index;
- the tokenizer (src/tokenizer_emu3_ibq, which the release reads from the repository, not the model folder; the
  pack reads it from the model folder): emu3.tiktoken ("base64 rank" lines: 256 bytes and a few merges here, Qwen's
  151,643 upstream), emu3_vision_tokens.txt (`<|image token|>`, `<|image start|>`, `<|image end|>`, then the
  visual tokens), tokenizer_config.json (its auto_map to tokenization_emu3.Emu3Tokenizer);
- ibq.safetensors: not in the release; the user converts BAAI/Emu3.5-VisionTokenizer's model.ckpt + config.yaml
  (`python -m ssd_core convert-ibq`). Here a tiny IBQ decoder (tests/tiny_ibq.py).
Not verified (no real file seen): the real config.json's values (hidden 5120, 64 layers, 40 heads, 8 kv heads,
intermediate 27648, max_position_embeddings 32768 are inferred from the published 34.1B = 31.2B transformer +
2.9B embeddings and its 32,768-token context), the shard count.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import torch

from released_lumina import write_shards
from tiny_families import CODES, FFN, HEADS, HIDDEN, LAYERS

FIRST_VISUAL = 151854
KV_HEADS, HEAD_DIM = 2, 16  # head_dim != hidden / heads (32 / 4 = 8), as configuration_emu3.py allows
MERGES = [b"ca", b"cat", b" c", b" cat", b"re", b"ed", b" r", b" re", b" red", b"he", b"an", b" a", b"in", b"ing",
          b"ou", b" y", b" you", b"is", b" is", b"as", b"st", b"ant", b" assist", b" assistant", b"or", b"ask"]


def tiktoken_ranks() -> dict[bytes, int]:
    """The 256 single bytes (ranks 0..255, in GPT-2's order: printable first) and MERGES after them."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    order = printable + [b for b in range(256) if b not in printable]
    ranks = {bytes([b]): i for i, b in enumerate(order)}
    for m in MERGES:
        ranks.setdefault(m, len(ranks))
    return ranks


def vision_tokens(codes: int = CODES) -> list[str]:
    return ["<|image token|>", "<|image start|>", "<|image end|>"] + [f"<|visual token {c:06d}|>" for c in range(codes)]


def write_tokenizer(folder: Path, codes: int = CODES) -> None:
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in tiktoken_ranks().items()]
    (folder / "emu3.tiktoken").write_text("\n".join(lines) + "\n")
    (folder / "emu3_vision_tokens.txt").write_text("\n".join(vision_tokens(codes)) + "\n")
    config = {"model_max_length": 1000000000000000000, "tokenizer_class": "Emu3Tokenizer",
              "auto_map": {"AutoTokenizer": ["tokenization_emu3.Emu3Tokenizer", None]}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def released_config(codes: int = CODES, max_positions: int = 8192) -> dict:
    return {
        "architectures": ["Emu3ForCausalLM"], "model_type": "Emu3",
        "auto_map": {"AutoConfig": "configuration_emu3.Emu3Config", "AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"},
        "vocab_size": FIRST_VISUAL + codes, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "max_position_embeddings": max_positions,
        "initializer_range": 0.02, "rms_norm_eps": 1e-05, "use_cache": True, "pad_token_id": 151643,
        "bos_token_id": 151849, "eos_token_id": 151850, "img_token_id": 151851, "boi_token_id": 151852,
        "eoi_token_id": 151853, "eol_token_id": 151846, "eof_token_id": 151847, "image_area": 1048576,
        "pretraining_tp": 1, "tie_word_embeddings": False, "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_dropout": 0.1, "torch_dtype": "bfloat16", "transformers_version": "4.48.2",
    }


def released_state_dict(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random tensors under modeling_emu3.py's names and shapes (norm scales near 1, so the norms matter)."""
    g = torch.Generator().manual_seed(seed)
    d, f, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv, v = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd, config["vocab_size"]
    rand = lambda *shape, s=0.2: s * torch.randn(*shape, generator=g)  # noqa: E731
    norm = lambda n: 1 + 0.2 * torch.randn(n, generator=g)  # noqa: E731
    out = {"model.embed_tokens.weight": rand(v, d, s=1.0)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": rand(q, d), p + "self_attn.k_proj.weight": rand(kv, d),
                    p + "self_attn.v_proj.weight": rand(kv, d), p + "self_attn.o_proj.weight": rand(d, q),
                    p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
                    p + "mlp.gate_proj.weight": rand(f, d), p + "mlp.up_proj.weight": rand(f, d),
                    p + "mlp.down_proj.weight": rand(d, f), p + "input_layernorm.weight": norm(d),
                    p + "post_attention_layernorm.weight": norm(d)})
    out["model.norm.weight"] = norm(d)
    out["lm_head.weight"] = rand(v, d, s=0.5)
    return {k: t.to(torch.bfloat16).float() for k, t in out.items()}  # bf16-representable, as the release


def build_emu35_released(folder, seed: int = 0, ibq: bool = True, tokenizer: bool = True,
                         max_positions: int = 8192) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = released_config(max_positions=max_positions)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": 151849, "eos_token_id": 151850, "pad_token_id": 151643, "transformers_version": "4.48.2"}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    write_shards(folder, released_state_dict(config, seed))
    if tokenizer:
        write_tokenizer(folder)
    if ibq:
        from tiny_ibq import tiny_ibq_decoder

        tiny_ibq_decoder(seed + 1, n_embed=CODES).save(folder / "ibq.safetensors")
    return folder


# ---- the release's decoder, re-created from src/emu3p5/modeling_emu3.py ------------------------------------------
class ReleaseEmu35:
    """Emu3Model / Emu3ForCausalLM's forward (eager attention, fp32, no cache) over released tensors: `w` maps the
    release's names (model.embed_tokens.weight, model.layers.N..., model.norm.weight, lm_head.weight) to tensors.
    FlashAR's copy of the file (lxazjk/Emu3.5-FlashAR src/emu3p5/modeling_emu3.py) adds what `run` takes: a 4-D
    additive mask used as is, explicit position ids, the hidden state before a layer (capture_hidden_before_layer)."""

    def __init__(self, cfg: dict, w: dict):
        self.cfg, self.w = cfg, w

    @classmethod
    def from_folder(cls, folder):
        from safetensors.torch import load_file

        w = {}
        for shard in sorted(Path(folder).glob("model-*.safetensors")):
            w.update(load_file(str(shard)))
        return cls(json.loads((Path(folder) / "config.json").read_text()), w)

    @staticmethod
    def rms(x, weight, eps):  # Emu3RMSNorm
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + eps)
        return weight * x.to(input_dtype)

    @staticmethod
    def rotary(seq_len, dim, base):  # Emu3RotaryEmbedding._set_cos_sin_cache
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        t = torch.arange(seq_len, dtype=inv_freq.dtype)
        emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
        return emb.cos(), emb.sin()

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def layer(self, p: str, h, mask, position_ids):
        """Emu3DecoderLayer with Emu3Attention (q_norm / k_norm before RoPE), tensors under prefix `p`."""
        import math

        c, w = self.cfg, self.w
        eps, heads, kv, hd = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        B, n, _ = h.shape
        cos, sin = self.rotary(int(position_ids.max()) + 1, hd, c["rope_theta"])
        residual = h
        x = self.rms(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, n, heads, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, n, kv, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, n, kv, hd).transpose(1, 2)
        q = self.rms(q, w[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k = self.rms(k, w[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        cq, sq = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)
        q, k = q * cq + self.rotate_half(q) * sq, k * cq + self.rotate_half(k) * sq
        k = k[:, :, None].expand(B, kv, heads // kv, n, hd).reshape(B, heads, n, hd)  # repeat_kv
        v = v[:, :, None].expand(B, kv, heads // kv, n, hd).reshape(B, heads, n, hd)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + mask
        att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        h = residual + torch.matmul(att, v).transpose(1, 2).reshape(B, n, -1) @ w[p + "self_attn.o_proj.weight"].T
        residual = h
        x = self.rms(h, w[p + "post_attention_layernorm.weight"], eps)
        x = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
        return residual + x @ w[p + "mlp.down_proj.weight"].T

    def run(self, ids, mask, position_ids, prefix: str = "model.", capture: int | None = None):
        """Emu3Model.forward: ids [B, n] -> (final-normed hidden [B, n, d], the hidden before layer `capture`)."""
        h = self.w[prefix + "embed_tokens.weight"][ids]
        captured = None
        for i in range(self.cfg["num_hidden_layers"]):
            if i == capture:
                captured = h
            h = self.layer(f"{prefix}layers.{i}.", h, mask, position_ids)
        return self.rms(h, self.w[prefix + "norm.weight"], self.cfg["rms_norm_eps"]), captured

    def logits(self, ids: list[int]) -> torch.Tensor:
        """Emu3ForCausalLM with its causal mask: the last position's logits [vocab]."""
        n = len(ids)
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        h, _ = self.run(torch.tensor([ids]), mask, torch.arange(n)[None])
        return (h @ self.w["lm_head.weight"].T)[0, -1].float()
