"""The weights' memory of the released models at each quantization, from meta-device inits of their configs
(no download): `python -m tools.memory_table` prints docs/models-and-memory.md's table."""
from __future__ import annotations

import torch

from ssd_core import check_model
from ssd_core.memory import QUANTIZATIONS
from tools.random_models import _model_class, random_config


def weights_bytes(model: torch.nn.Module, quantization: str, family: str) -> int:
    """Bytes of a model's weights at `quantization` ('none' = bf16): check_model.weights_bytes, the one formula."""
    return check_model.weights_bytes(model, "bf16" if quantization == "none" else quantization, family)


# the released models: (family, SHAPES name); their vision / VQ parts at transformers' default (released) sizes
RELEASED = {"Janus-Pro-1B": "janus", "Janus-Pro-7B": "janus", "Emu3-Gen": "emu3", "Lumina-mGPT-7B": "lumina",
            "Lumina-mGPT-2.0": "lumina2", "Emu3.5-Image": "emu3.5"}


def released_config(name: str):
    """The full config of a released model: the family's language-model SHAPES with the vision encoder and
    VQ model at transformers' defaults (which are the released ones)."""
    family = RELEASED[name]
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


def released_counts(name: str) -> dict:
    """Weights' GiB of a released model at each quantization, from a meta-device init of its config."""
    family = RELEASED[name]
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
