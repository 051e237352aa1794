"""The one seam between the nodes and ComfyUI: its modules, looked up when a node needs them.

Each glue module (_folders, _devices, _progress, _patcher, _routes) asks `module` at call time and has a
stand-in for when ComfyUI is absent, so the node classes work inside ComfyUI and in plain tests. A module
that imports but lacks what the glue needs (e.g. a folder named ``comfy`` on ``sys.path``, which Python
imports as an empty namespace package) counts as absent too: the stand-in is used.
"""

import importlib


def module(name, *needs):
    """ComfyUI's module ``name`` when it imports and has every attribute in ``needs``; else None (outside
    ComfyUI, or a stray module or folder of that name that is not ComfyUI's)."""
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    return mod if all(hasattr(mod, n) for n in needs) else None
