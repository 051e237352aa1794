"""Model families: each adapter turns one kind of transformers model into a GridModel."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from ..errors import SSDError

# family name -> (module, class); architectures in config.json -> family
FAMILIES = {
    "llama-grid": (".llama_grid", "LlamaGridModel"),
    "janus": (".janus", "JanusModel"),
    "emu3": (".emu3", "Emu3Model"),
    "lumina": (".lumina", "LuminaModel"),
}
ARCHITECTURES = {
    "JanusForConditionalGeneration": "janus",
    "Emu3ForConditionalGeneration": "emu3",
    "ChameleonForConditionalGeneration": "lumina",
    "ChameleonXLLMXForConditionalGeneration": "lumina",  # Lumina-mGPT's released config.json
}


def family_class(name: str):
    if name not in FAMILIES:
        raise SSDError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    module, cls = FAMILIES[name]
    return getattr(importlib.import_module(module, __name__), cls)


def detect_family(folder: Path) -> str:
    """The family of a transformers folder: ssd_model.json wins, else config.json's architectures."""
    if not folder.is_dir():
        raise SSDError(f"model folder {folder} does not exist; put the model's files (config.json, "
                       "*.safetensors) in a folder under ComfyUI/models/ssd_models or pass its path")
    spec = folder / "ssd_model.json"
    if spec.is_file():
        try:
            data = json.loads(spec.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise SSDError(f"{spec} is not valid JSON ({err}); see the README, section 'ssd_model.json'") from None
        return data.get("family", "llama-grid") if isinstance(data, dict) else "llama-grid"  # llama-grid says why
    from ..hub import read_config

    config = read_config(folder)  # an SSDError when missing or not JSON
    archs = config.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch]
    from ..hub import family_of_folder

    by_type = family_of_folder(folder)  # an unlisted class name of a known model_type
    if by_type is not None:
        return by_type
    raise SSDError(f"{folder} holds a {arch or 'model without architectures'}: not a supported AR image model. "
                   f"Supported: {', '.join(ARCHITECTURES)}, or any causal LM with an ssd_model.json (llama-grid)")
