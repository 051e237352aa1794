"""The pack's nodes: thin adapters from ComfyUI inputs to ssd_core calls."""

from . import _comfy
from .loaders import SSDLoadHeads, SSDLoadModel, SSDModel
from .sampler import SSDSampler
from .trace import SSDTraceToImage

_comfy.register_folders()
_comfy.register_routes()

NODE_CLASS_MAPPINGS = {
    "SSDLoadModel": SSDLoadModel,
    "SSDLoadHeads": SSDLoadHeads,
    "SSDSampler": SSDSampler,
    "SSDTraceToImage": SSDTraceToImage,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "SSDLoadModel": "Load AR Image Model (SSD)",
    "SSDLoadHeads": "Load SSD Heads",
    "SSDSampler": "SSD Sampler",
    "SSDTraceToImage": "SSD Trace to Image",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "SSDModel"]
