"""A tiny random Emu3.5-Image-FlashAR folder in the RELEASED layout (lxazjk/Emu3.5-Image-FlashAR).

    build_flashar_released(tmp_path / "Emu3.5-Image-FlashAR") -> the folder

What the release holds, and where each fact comes from (lxazjk/Emu3.5-FlashAR at 2d4a74e):
- config.json as flashar/utils/checkpoint_utils.py _write_hf_checkpoint_dir writes it: model_type "emu3_flashar",
  architectures ["Emuflashar"], format "hf_safetensors", vocab_size, hidden_size, visual_token_offset (eoi + 1 =
  151854), use_vertical_block, vertical_layers, vertical_start_layer, backbone_config (the Emu3.5 config dict);
  checkpoint_meta.json (format, global_step, epoch, save_reason); the HF card lists configuration.json too;
- weights: Emuflashar's state_dict as save_torch_state_dict shards it ("model{suffix}.safetensors" + index):
  backbone.* (Emu3Model's names), horizontal_head.weight, vertical_head.weight, vertical_block.K.* (copies of the
  backbone's layers from vertical_start_layer), vertical_norm.weight, hv_gate_mlp.{0.weight, 2.weight, 2.bias},
  hv_gate_corner.{weight, bias} (flashar/model/modeling_emu_flashar.py Emuflashar.__init__); no lm_head;
- the Emu3.5 tokenizer files and ibq.safetensors the user adds, as for Emu3.5-Image (tests/released_emu35.py).
The released checkpoint: vertical_layers 2 (configs/benchmark_t2i_flashar.py EMU35_FLASHAR_VERTICAL_LAYERS), start
auto (the last two layers). Here 3 backbone layers, the vertical block copies layers 1-2 (start 1).
Not verified (no real file seen): the real config.json's values, the shard count (16 on the HF card).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from released_emu35 import FIRST_VISUAL, released_config, released_state_dict, write_tokenizer
from tiny_families import CODES

LAYERS, VERTICAL_LAYERS, VERTICAL_START = 3, 2, 1


def flashar_state(backbone: dict, seed: int) -> dict[str, torch.Tensor]:
    """The wrapper's tensors: the backbone's under backbone.*, and random heads, vertical block and gates."""
    g = torch.Generator().manual_seed(seed + 100)
    d, v = backbone["hidden_size"], backbone["vocab_size"]
    base = released_state_dict(backbone, seed)
    out = {"backbone." + k[len("model."):]: t for k, t in base.items() if k.startswith("model.")}
    for i in range(VERTICAL_LAYERS):  # copies of the backbone's layers (Emuflashar.__init__), post-trained: moved
        src = f"model.layers.{VERTICAL_START + i}."
        for k, t in base.items():
            if k.startswith(src):
                out[f"vertical_block.{i}." + k[len(src):]] = t + 0.05 * torch.randn(t.shape, generator=g)
    gate = max(64, d // 8)
    out.update({
        "vertical_norm.weight": 1 + 0.2 * torch.randn(d, generator=g),
        "horizontal_head.weight": 0.5 * torch.randn(v, d, generator=g),
        "vertical_head.weight": 0.5 * torch.randn(v, d, generator=g),
        "hv_gate_mlp.0.weight": 0.3 * torch.randn(gate, 2 * d, generator=g),
        "hv_gate_mlp.2.weight": 0.3 * torch.randn(1, gate, generator=g),
        "hv_gate_mlp.2.bias": 0.1 * torch.randn(1, generator=g),
        "hv_gate_corner.weight": 0.3 * torch.randn(1, d, generator=g),
        "hv_gate_corner.bias": 0.1 * torch.randn(1, generator=g),
    })
    return {k: t.to(torch.bfloat16).float() for k, t in out.items()}


def write_state(folder: Path, tensors: dict[str, torch.Tensor], shards: int = 2) -> None:
    from safetensors.torch import save_file

    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i::shards]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))


def build_flashar_released(folder, seed: int = 0, ibq: bool = True, tokenizer: bool = True) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    backbone = {**released_config(), "num_hidden_layers": LAYERS}
    config = {"model_type": "emu3_flashar", "architectures": ["Emuflashar"], "format": "hf_safetensors",
              "format_version": 1, "base_model_name_or_path": "./weights/Emu3.5-Image",
              "tokenizer_name_or_path": "./src/tokenizer_emu3_ibq", "vq_model_name_or_path": "./weights/Emu3.5-VisionTokenizer",
              "torch_dtype": "bf16", "vocab_size": backbone["vocab_size"], "hidden_size": backbone["hidden_size"],
              "visual_token_offset": FIRST_VISUAL, "use_vertical_block": True, "vertical_layers": VERTICAL_LAYERS,
              "vertical_start_layer": VERTICAL_START, "backbone_config": backbone}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    meta = {"format": "hf_safetensors", "global_step": 74000, "epoch": None, "save_reason": "final"}
    (folder / "checkpoint_meta.json").write_text(json.dumps(meta, indent=2))
    (folder / "configuration.json").write_text(json.dumps({"framework": "pytorch", "task": "text-to-image"}))
    write_state(folder, flashar_state(backbone, seed))
    if tokenizer:
        write_tokenizer(folder)
    if ibq:
        from tiny_ibq import tiny_ibq_decoder

        tiny_ibq_decoder(seed + 1, n_embed=CODES).save(folder / "ibq.safetensors")
    return folder
