"""ComfyUI-SSD: spatially speculative decoding for autoregressive image models.

ComfyUI imports this folder as a package and reads NODE_CLASS_MAPPINGS and WEB_DIRECTORY.
Outside ComfyUI (no ``folder_paths`` module, e.g. pytest or a plain ``import``) the mappings
stay empty so that importing the pack never fails; the nodes live in ``.nodes``.
"""

WEB_DIRECTORY = "./web"

try:
    import folder_paths  # noqa: F401  (only importable inside ComfyUI)
except ImportError:
    NODE_CLASS_MAPPINGS = {}
    NODE_DISPLAY_NAME_MAPPINGS = {}
else:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
