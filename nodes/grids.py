"""The sampler's grid list: the token grids each model can draw, labelled with pixels and aspect and tagged with
the model they are for ("48x48 (192x192 px, 1:1) reference-48", "24x24 (384x384 px, 1:1) janus").

ComfyUI's lists are fixed per node type, so the list holds a short list per model: the bundled models' own sizes
(their ssd_model.json's grid and grids), then each released family's (GridModel.listed_grids, pixels_per_token).
The sampler refuses a size tagged for another model and names the ones this model takes. A family added to the
registry shows up here with no change to the nodes.
"""
import json
from math import gcd

from ..ssd_core.api import BUNDLED_MODELS
from ..ssd_core.errors import SSDError
from ..ssd_core.families import FAMILIES, family_class
from ..ssd_core.grid_text import parse_grid

AUTO = "auto"
BUNDLED_FAMILY = "llama-grid"
PREVIEW_SIDES = (16, 12, 8)  # square grids below a bundled model's own sizes: quick previews (and quick tests)


def _bundled_grids(folder) -> list[tuple[int, int]]:
    """A bundled model's grids: ssd_model.json's grid, its other grids, then the smaller preview squares ([] when
    the model is absent)."""
    try:
        spec = json.loads((folder / "ssd_model.json").read_text())
    except (OSError, ValueError):
        return []
    out = [tuple(spec["grid"])]
    out += [tuple(g) for g in spec.get("grids", []) if tuple(g) not in out]
    smallest = min(min(g) for g in out)
    return out + [(s, s) for s in PREVIEW_SIDES if s < smallest]


def sizes() -> dict[str, tuple[str, int, list[tuple[int, int]]]]:
    """tag -> (the family it stands for, pixels per token, grids as (rows, cols)): the bundled models by name,
    then the families in registry order; families that list no grids are left out."""
    px = family_class(BUNDLED_FAMILY).pixels_per_token
    out = {name: (BUNDLED_FAMILY, px, grids) for name, folder in BUNDLED_MODELS.items()
           if (grids := _bundled_grids(folder))}
    for name in FAMILIES:
        cls = family_class(name)
        grids = [tuple(g) for g in cls.listed_grids()]
        if grids:
            out[name] = (name, cls.pixels_per_token, grids)
    return out


def label(grid, px: int, tag: str) -> str:
    h, w = grid
    d = gcd(h, w)
    return f"{h}x{w} ({w * px}x{h * px} px, {w // d}:{h // d}) {tag}"


def choices() -> list[str]:
    return [AUTO] + [label(g, px, tag) for tag, (_, px, grids) in sizes().items() for g in grids]


def _is_for(tag: str, family: str, name: str) -> bool:
    """Whether a size tagged `tag` is for the model the user loaded as `name` (of `family`)."""
    if tag in BUNDLED_MODELS:
        return tag == name
    return sizes()[tag][0] == family and name not in BUNDLED_MODELS


def parse(choice, family: str, name: str = ""):
    """A list entry (or a bare 'HxW') -> (rows, cols), or None for auto. A size tagged for another model is
    refused with this model's sizes; `name` is the model as the user picked it (the loader's entry)."""
    text = "" if choice is None else str(choice).strip()
    if text in ("", AUTO):
        return None
    size, _, rest = text.partition(" ")
    tag = rest.rsplit(" ", 1)[-1] if rest else None
    listed = sizes()
    name = name or family
    if tag is not None and tag in listed and not _is_for(tag, family, name):
        own = [label(g, px, t) for t, (_, px, grids) in listed.items() if _is_for(t, family, name) for g in grids]
        raise SSDError(f"grid '{text}' is a size for {tag} and this model is {name}: pick "
                       + (f"auto or one of: {', '.join(own)}" if own else "auto (its own size)"))
    return parse_grid(size)
