"""The sampler's grid list: the token grids each family makes, labelled with pixels and aspect.

ComfyUI's lists are fixed per node type, so the list holds every family's sizes, each tagged with its family
("24x24 (384x384 px, 1:1) janus"); the sampler refuses a size of another family and says which to pick.
"""
from math import gcd

from ..ssd_core.families.emu3 import UPSTREAM_SIDE as EMU3_SIDE
from ..ssd_core.families.emu3 import ratio_grids
from ..ssd_core.families.lumina import UPSTREAM_SIDE as LUMINA_SIDE
from ..ssd_core.families.lumina import crop_size_grids
from ..ssd_core.errors import SSDError

AUTO = "auto"
# tag -> (the family it stands for, pixels per token, grids as (rows, cols)); upstream sizes of the released models
SIZES = {
    "reference": ("llama-grid", 4, [(24, 24), (16, 16), (12, 12), (8, 8)]),
    "janus": ("janus", 16, [(24, 24)]),
    "emu3": ("emu3", 8, ratio_grids((EMU3_SIDE, EMU3_SIDE))),
    "lumina": ("lumina", 16, [(LUMINA_SIDE, LUMINA_SIDE)] + [g for g in crop_size_grids(LUMINA_SIDE // 2)
                                                           if g != (LUMINA_SIDE, LUMINA_SIDE)]),
}


def label(grid, px: int, tag: str) -> str:
    h, w = grid
    d = gcd(h, w)
    return f"{h}x{w} ({w * px}x{h * px} px, {w // d}:{h // d}) {tag}"


def choices() -> list[str]:
    return [AUTO] + [label(g, px, tag) for tag, (_, px, grids) in SIZES.items() for g in grids]


def parse(choice, family: str):
    """A list entry (or a bare 'HxW') -> (rows, cols), or None for auto; a size tagged for another family is
    refused with the sizes of this one."""
    text = "" if choice is None else str(choice).strip()
    if text in ("", AUTO):
        return None
    size, _, rest = text.partition(" ")
    tag = rest.rsplit(" ", 1)[-1] if rest else None
    if tag is not None and tag in SIZES and SIZES[tag][0] != family:
        own = [label(g, px, t) for t, (f, px, grids) in SIZES.items() if f == family for g in grids]
        raise SSDError(f"grid '{text}' is a {tag} size and this model is {family}: pick "
                       + (f"auto or one of: {', '.join(own)}" if own else "auto"))
    from ..ssd_core.trace import parse_grid

    return parse_grid(size)
