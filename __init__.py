"""ComfyUI-SSD: spatially speculative decoding for autoregressive image models.

ComfyUI imports this folder as a package and reads NODE_CLASS_MAPPINGS and WEB_DIRECTORY.
Outside ComfyUI (no ``folder_paths`` module, e.g. pytest or a plain ``import``) the mappings
stay empty so that importing the pack never fails; the nodes live in ``.nodes``.
"""

WEB_DIRECTORY = "./web"

try:
    import folder_paths  # only importable inside ComfyUI
except ImportError:
    folder_paths = None
if getattr(folder_paths, "get_folder_paths", None) is None:  # not ComfyUI's (e.g. a folder of that name)
    NODE_CLASS_MAPPINGS = {}
    NODE_DISPLAY_NAME_MAPPINGS = {}
else:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
del folder_paths

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
