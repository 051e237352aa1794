"""The sampler's grid list: the token grids each family lists, labelled with pixels and aspect.

ComfyUI's lists are fixed per node type, so the list holds every family's sizes, each tagged with its family
("24x24 (384x384 px, 1:1) janus"); the sampler refuses a size of another family and says which to pick. The
sizes, pixels per token and tags are the family classes' own (GridModel.listed_grids, pixels_per_token,
grid_tag): a family added to the registry shows up here with no change to the nodes.
"""
from math import gcd

from ..ssd_core.errors import SSDError
from ..ssd_core.families import FAMILIES, family_class
from ..ssd_core.grid_text import parse_grid

AUTO = "auto"


def sizes() -> dict[str, tuple[str, int, list[tuple[int, int]]]]:
    """tag -> (the family it stands for, pixels per token, grids as (rows, cols)), in registry order; families
    that list no grids are left out."""
    out = {}
    for name in FAMILIES:
        cls = family_class(name)
        grids = [tuple(g) for g in cls.listed_grids()]
        if grids:
            out[cls.grid_tag or name] = (name, cls.pixels_per_token, grids)
    return out


def label(grid, px: int, tag: str) -> str:
    h, w = grid
    d = gcd(h, w)
    return f"{h}x{w} ({w * px}x{h * px} px, {w // d}:{h // d}) {tag}"


def choices() -> list[str]:
    return [AUTO] + [label(g, px, tag) for tag, (_, px, grids) in sizes().items() for g in grids]


def parse(choice, family: str):
    """A list entry (or a bare 'HxW') -> (rows, cols), or None for auto; a size tagged for another family is
    refused with the sizes of this one."""
    text = "" if choice is None else str(choice).strip()
    if text in ("", AUTO):
        return None
    size, _, rest = text.partition(" ")
    tag = rest.rsplit(" ", 1)[-1] if rest else None
    listed = sizes()
    if tag is not None and tag in listed and listed[tag][0] != family:
        own = [label(g, px, t) for t, (f, px, grids) in listed.items() if f == family for g in grids]
        raise SSDError(f"grid '{text}' is a {tag} size and this model is {family}: pick "
                       + (f"auto or one of: {', '.join(own)}" if own else "auto"))
    return parse_grid(size)
