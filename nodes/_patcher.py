"""ComfyUI's model management: a loaded engine model handed to a ModelPatcher (so ComfyUI unloads it when
another model needs the memory), reloaded before a run, and the list of what the pack holds."""

import weakref

from ._comfy import module

_HELD = weakref.WeakSet()  # every engine model the loader made that is still alive (for GET /ssd/models)


def _holder_class():
    import torch

    class SSDWeights(torch.nn.Module):
        """The AR model's transformers module as ComfyUI's ModelPatcher sees it: one module with a plain
        ``device`` attribute (ModelPatcher writes it; a transformers model's ``device`` is read-only)."""

        def __init__(self, module, device, engine_model=None):
            super().__init__()
            self.inner = module
            self.device = device
            self.engine_model = engine_model  # the GridModel: its static caches are freed when ComfyUI moves it

        def _apply(self, fn, *args, **kwargs):
            out = super()._apply(fn, *args, **kwargs)
            if self.engine_model is not None:  # caches stay where they were made: unloaded with the weights
                from ..ssd_core import static_cache

                static_cache.release(self.engine_model)
            return out

    return SSDWeights


def manage(model, device):
    """Hand an engine model to ComfyUI's model management: a ModelPatcher loaded with ``load_models_gpu``,
    so that ComfyUI unloads it when another model needs the memory and on "Unload models" / POST /free.
    None outside ComfyUI, and for a quantized or device-mapped model (its weights cannot be moved)."""
    _HELD.add(model)
    mm = module("comfy.model_management", "load_models_gpu", "unet_offload_device", "module_size")
    mp = module("comfy.model_patcher", "ModelPatcher")
    if mm is None or mp is None:
        return None
    from ..ssd_core.memory import is_placed

    if is_placed(model.model):
        return None
    from ..ssd_core import static_cache

    holder = _holder_class()(model.model, device, model)
    # a static cache lives beside the weights for as long as the model: ComfyUI counts both
    cache = static_cache.cache_bytes(model)
    patcher = mp.ModelPatcher(holder, load_device=device, offload_device=mm.unet_offload_device(),
                              size=mm.module_size(model.model) + cache)
    load_to_device(patcher)
    return patcher


def load_to_device(patcher):
    """(Re)load a managed model onto its device, whole (ComfyUI's partial loading would split a transformers
    model across devices without moving its inputs); ComfyUI first frees memory from other models."""
    if patcher is None:
        return
    import comfy.model_management as mm

    mm.load_models_gpu([patcher], force_full_load=True)


def held_models():
    """What the pack holds now: each live engine model, its device, and whether ComfyUI has it loaded.
    Cheap enough for the server's event loop: no garbage collection here (a full gc.collect takes ~0.5 s and
    would stall every other request); ComfyUI's prompt worker collects after unloading models (POST /free)."""
    mm = module("comfy.model_management", "current_loaded_models")
    loaded = set() if mm is None else {
        id(m.model.model.inner) for m in list(mm.current_loaded_models)
        if getattr(m, "model", None) is not None and hasattr(m.model.model, "inner")}
    return [{"family": getattr(m, "family", "?"), "device": str(m.device), "loaded_in_comfyui": id(m.model) in loaded}
            for m in list(_HELD)]
