"""The weights' memory of the released models at each quantization, from meta-device inits of their configs
(no download): `python -m tools.memory_table` prints docs/models-and-memory.md's table."""
from __future__ import annotations

import torch

from ssd_core import memory
from ssd_core.memory import QUANTIZATIONS
from tools.random_models import _model_class, random_config


def weights_bytes(model: torch.nn.Module, quantization: str, family: str) -> int:
    """Bytes of a model's weights at `quantization` ('none' = bf16): memory.weights_bytes, the one formula."""
    return memory.weights_bytes(model, "bf16" if quantization == "none" else quantization, family)


# the released models: (family, SHAPES name); their vision / VQ parts at transformers' default (released) sizes
RELEASED = {"Janus-Pro-1B": "janus", "Janus-Pro-7B": "janus", "Emu3-Gen": "emu3", "Lumina-mGPT-7B": "lumina",
            "Lumina-mGPT-2.0": "lumina2", "Emu3.5-Image": "emu3.5", "Emu3.5-Image-FlashAR": "emu3.5-flashar"}
FLASHAR_VERTICAL_LAYERS = 2  # lxazjk/Emu3.5-FlashAR configs/benchmark_t2i_flashar.py EMU35_FLASHAR_VERTICAL_LAYERS


def flashar_config() -> dict:
    """Emu3.5-Image-FlashAR's config.json in the layout its trainer saves (checkpoint_utils.py
    _write_hf_checkpoint_dir; tests/released_flashar.py): Emu3.5-Image's backbone at SHAPES' sizes as
    backbone_config, the vertical block of the released checkpoint (2 layers, start -1: the last two)."""
    from ssd_core.families.emu35 import FIRST_VISUAL
    from tools.random_models import SHAPES

    sh = dict(SHAPES["emu3.5"]["Emu3.5-Image"])
    sh.pop("codes")
    backbone = {"architectures": ["Emu3ForCausalLM"], "model_type": "Emu3", "hidden_act": "silu",
                "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "tie_word_embeddings": False, "pad_token_id": 151643,
                "bos_token_id": 151849, "eos_token_id": 151850, **sh}
    return {"model_type": "emu3_flashar", "architectures": ["Emuflashar"], "vocab_size": sh["vocab_size"],
            "hidden_size": sh["hidden_size"], "visual_token_offset": FIRST_VISUAL, "use_vertical_block": True,
            "vertical_layers": FLASHAR_VERTICAL_LAYERS, "vertical_start_layer": -1, "backbone_config": backbone}


def released_config(name: str):
    """The full config of a released model: the family's language-model SHAPES with the vision encoder and
    VQ model at transformers' defaults (which are the released ones)."""
    family = RELEASED[name]
    if family == "emu3.5-flashar":
        return flashar_config()
    cfg = random_config(family, name)
    if family == "janus":
        from transformers import JanusConfig

        d = cfg.text_config.hidden_size
        cfg = JanusConfig(text_config=cfg.text_config.to_dict(), vision_config={"projection_dim": d},
                          vq_config={"projection_dim": d, "image_token_embed_dim": d}, tie_word_embeddings=False)
    elif family in ("lumina", "lumina2"):
        from transformers import ChameleonConfig

        kw = cfg.to_dict()
        kw.pop("vq_config", None)
        cfg = ChameleonConfig(**kw)
    return cfg


def flashar_parameters(net) -> dict[str, int]:
    """Parameters of a FlashAR net (families/flashar.py: the checkpoint's own names) by top-level name: backbone,
    horizontal_head, vertical_head, vertical_block, vertical_norm, hv_gate_mlp, hv_gate_corner."""
    parts: dict[str, int] = {}
    for name, p in net.named_parameters():
        top = name.split(".")[0]
        parts[top] = parts.get(top, 0) + p.numel()
    return parts


def released_counts(name: str) -> dict:
    """Weights' GiB of a released model at each quantization, from a meta-device init of its config (FlashAR: its
    wrapper, families/flashar.py build_net, with its parameters by module in "parts")."""
    family = RELEASED[name]
    if family == "emu3.5-flashar":
        from ssd_core.families.flashar import build_net

        net = build_net(released_config(name), device="meta")
        parts = flashar_parameters(net)
        return {"params": sum(parts.values()), "parts": parts,
                **{q: weights_bytes(net, q, family) / 2**30 for q in QUANTIZATIONS}}
    with torch.device("meta"):
        model = _model_class(family)(released_config(name))
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, **{q: weights_bytes(model, q, family) / 2**30 for q in QUANTIZATIONS}}


def table() -> str:
    lines = ["| model | parameters | bf16 | 8-bit | 4-bit (NF4) |", "|---|---:|---:|---:|---:|"]
    for name in RELEASED:
        c = released_counts(name)
        lines.append(f"| {name} | {c['params'] / 1e9:.2f} B | {c['none']:.1f} GiB | {c['8-bit']:.1f} GiB | "
                     f"{c['4-bit']:.1f} GiB |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
