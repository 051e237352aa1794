"""The family registry: each adapter turns one kind of transformers model into a GridModel.

A family is one file here (a GridModel subclass that names its repo ids, model types and architectures)
plus one line in FAMILIES. Adapters are imported when first used.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..errors import SSDError, a_or_an, shown

# family name -> (module, class)
FAMILIES = {
    "llama-grid": (".llama_grid", "LlamaGridModel"),
    "janus": (".janus", "JanusModel"),
    "emu3": (".emu3", "Emu3Model"),
    "lumina": (".lumina", "LuminaModel"),
    "lumina2": (".lumina2", "Lumina2Model"),
    "emu3.5": (".emu35", "Emu35Model"),
    "emu3.5-flashar": (".flashar", "FlashARModel"),
}


def family_class(name: str):
    if not isinstance(name, str) or name not in FAMILIES:
        raise SSDError(f"unknown model family {shown(name)}; known: {', '.join(FAMILIES)}")
    module, cls = FAMILIES[name]
    return getattr(importlib.import_module(module, __name__), cls)


def families_with_negative_prompts() -> list[str]:
    return [name for name in FAMILIES if family_class(name).negative_prompts]


def _fitting(names: list[str], config: dict | None) -> str | None:
    """The first of `names` whose class takes this config (fits_config: Lumina-mGPT 1 and 2.0 share one
    architecture), else the first."""
    fits = lambda name: getattr(family_class(name), "fits_config", lambda c: True)(config or {})  # noqa: E731
    return next((n for n in names if fits(n)), names[0] if names else None)


def family_of_model_type(model_type, config: dict | None = None) -> str | None:
    """The family whose transformers class has this config.json model_type (None: not one of ours)."""
    return _fitting([name for name in FAMILIES if model_type in family_class(name).model_types], config)


def family_of_folder(folder) -> str | None:
    """The family whose transformers class a folder's config.json names (None: not one of ours)."""
    from ..model_files import read_config

    config = read_config(folder)
    return family_of_model_type(config.get("model_type"), config)


def detect_family(folder: Path) -> str:
    """The family of a transformers folder: ssd_model.json wins, else config.json's architectures, else its
    model_type."""
    if not folder.is_dir():
        raise SSDError(f"model folder {folder} does not exist; put the model's files (config.json, "
                       "*.safetensors) in a folder under ComfyUI/models/ssd_models or pass its path")
    from ..model_files import SSD_MODEL_JSON, read_config, read_ssd_model_json

    if os.path.lexists(folder / SSD_MODEL_JSON):  # an SSDError when it is not a JSON object or its family not a name
        return read_ssd_model_json(folder).get("family", "llama-grid")

    config = read_config(folder)  # an SSDError when config.json is missing or not JSON
    archs = config.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    by_arch = _fitting([name for name in FAMILIES if arch in family_class(name).architectures], config)
    if by_arch is not None:
        return by_arch
    by_type = family_of_folder(folder)  # an unlisted class name of a known model_type
    if by_type is not None:
        return by_type
    known = [a for name in FAMILIES for a in family_class(name).architectures]
    raise SSDError(f"{folder} holds {a_or_an(arch or 'model without architectures')}: not a supported AR image model. "
                   f"Supported: {', '.join(known)}, or any causal LM with an ssd_model.json (llama-grid)")
