"""ComfyUI-SSD: spatially speculative decoding for autoregressive image models.

ComfyUI imports this folder as a package and reads WEB_DIRECTORY and ``comfy_entrypoint`` (its V3 node schema,
ComfyUI >= 0.3.64). Outside ComfyUI (no ``folder_paths`` module, e.g. pytest or a plain ``import``) nothing is
imported, so that importing the pack never fails; the nodes live in ``.nodes``.
"""

WEB_DIRECTORY = "./web"

try:
    import folder_paths  # only importable inside ComfyUI
except ImportError:
    folder_paths = None
if getattr(folder_paths, "get_folder_paths", None) is not None:  # ComfyUI's (not a folder of that name)
    from .nodes import comfy_entrypoint

    __all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
else:
    __all__ = ["WEB_DIRECTORY"]
del folder_paths
