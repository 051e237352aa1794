"""Devices, memory and cancel as ComfyUI sees them: the device choice, making room on a GPU, free memory,
emptying its cache, and the user's cancel (each with a stand-in outside ComfyUI)."""

from ._comfy import module


def torch_device(choice):
    """``auto`` = ComfyUI's device (CPU when ComfyUI is absent)."""
    import torch

    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was chosen but this machine has no CUDA GPU visible to "
                             "torch: pick 'auto' or 'cpu'.")
        return torch.device("cuda")
    if choice == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError("device 'mps' was chosen but this machine has no Apple GPU visible to torch "
                             "(macOS with Apple silicon): pick 'auto' or 'cpu'.")
        return torch.device("mps")
    if choice != "auto":
        raise ValueError(f"unknown device '{choice}': pick auto, cpu, cuda or mps.")
    mm = module("comfy.model_management", "get_torch_device")
    return torch.device("cpu") if mm is None else mm.get_torch_device()


def processing_interrupted():
    mm = module("comfy.model_management", "processing_interrupted")
    return False if mm is None else bool(mm.processing_interrupted())


def interrupt_exception():
    """ComfyUI's exception for a cancelled run (a plain stand-in outside ComfyUI)."""
    mm = module("comfy.model_management", "InterruptProcessingException")
    return InterruptedError if mm is None else mm.InterruptProcessingException


def make_room(nbytes, device):
    """Before a model goes to a GPU, ask ComfyUI to unload its own models until ``nbytes`` fit."""
    if nbytes <= 0 or getattr(device, "type", str(device)) == "cpu":
        return False
    mm = module("comfy.model_management", "free_memory")
    if mm is None:
        return False
    mm.free_memory(int(nbytes * 1.2), device)
    return True


def free_vram(device):
    """Free bytes on a GPU as ComfyUI counts them (torch's figure outside ComfyUI)."""
    import torch

    mm = module("comfy.model_management", "get_free_memory")
    if mm is None:
        return torch.cuda.mem_get_info(device)[0] if torch.device(device).type == "cuda" else None
    return int(mm.get_free_memory(device))


def soft_empty_cache():
    mm = module("comfy.model_management", "soft_empty_cache")
    if mm is not None:
        mm.soft_empty_cache()
