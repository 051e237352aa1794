"""ComfyUI's V3 node schema for the nodes: ``io`` and ``ComfyExtension`` of ``comfy_api.latest``.

The pack's root imports the nodes only inside ComfyUI; there a ComfyUI too old to have the module fails the
pack's import with a message that says which ComfyUI is needed. The tests run the nodes without ComfyUI through
a stand-in of the module (tests/comfy_stand_in.py), installed before the nodes import.
"""

MIN_COMFYUI = "0.3.64"  # the oldest ComfyUI the pack is tested on (pyproject's requires-comfyui, README)

try:
    from comfy_api.latest import ComfyExtension, io
except ImportError as e:
    raise ImportError(f"ComfyUI-SSD needs ComfyUI {MIN_COMFYUI} or newer (its nodes use the V3 schema, "
                      f"comfy_api.latest): update ComfyUI ({e})") from e

__all__ = ["MIN_COMFYUI", "ComfyExtension", "io"]
