"""The pack's nodes (ComfyUI's V3 schema): thin adapters from ComfyUI inputs to ssd_core calls.

ComfyUI reads ``comfy_entrypoint`` (re-exported by the pack's root ``__init__``): an extension listing the four
nodes. Their ids (``SSDLoadModel`` ...) and input order are those of the classic nodes they replaced, so saved
workflows load and run unchanged."""

from ._io import ComfyExtension, io  # first: a ComfyUI without the V3 schema fails here, saying which is needed
from . import _folders, _routes
from .loaders import SSDLoadHeads, SSDLoadModel, SSDModel
from .sampler import SSDSampler
from .trace import SSDTraceToImage

_folders.register_folders()
_routes.register_routes()

NODE_LIST = [SSDLoadModel, SSDLoadHeads, SSDSampler, SSDTraceToImage]
NODES = {cls.define_schema().node_id: cls for cls in NODE_LIST}  # node id -> class


class SSDExtension(ComfyExtension):
    async def get_node_list(self):
        return list(NODE_LIST)


async def comfy_entrypoint():
    return SSDExtension()


__all__ = ["NODES", "NODE_LIST", "SSDExtension", "SSDModel", "comfy_entrypoint", "io",
           "SSDLoadModel", "SSDLoadHeads", "SSDSampler", "SSDTraceToImage"]
