"""The pack's link types, declared once (V3 ``io.Custom``): the strings are what saved workflows hold on their
links, so they never change."""

from ..ssd_core.errors import printable
from ._io import io

SSD_MODEL = io.Custom("SSD_MODEL")  # an SSDModel: the engine's model and its draft heads (or none)
SSD_TRACE = io.Custom("SSD_TRACE")  # how each token became final: a trace dict, or a list of them for a batch
CATEGORY = "sampling/SSD"


def check_choices(cls, **values):
    """``validate_inputs`` for list inputs: each value must be one of its list's entries (ComfyUI 0.3.64 checks
    the lists of classic nodes before a run, not those of V3 nodes). True, or a message naming the input."""
    lists = {i.id: _choices(i) for i in cls.define_schema().inputs}
    for name, value in values.items():
        choices = lists.get(name)
        if choices is None or value is None or value in choices:
            continue
        shown = ", ".join(map(str, choices[:20])) + (f" ... ({len(choices)} in all)" if len(choices) > 20 else "")
        return f"{name}: '{printable(value)}' is not in the list ({printable(shown)})"
    return True


def _choices(inp):
    """The entries of a Combo input (real or stand-in), else None."""
    d = inp.as_dict()
    return list(d["options"]) if "options" in d and inp.get_io_type() == "COMBO" else None
