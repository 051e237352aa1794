"""Everything the nodes need from ComfyUI, each with a stand-in for when ComfyUI is absent.

The choice is made at call time, so the node classes work inside ComfyUI and in plain tests.
Outside ComfyUI the model folders come from the environment variables ``SSD_MODELS_DIR`` and
``SSD_HEADS_DIR`` (``os.pathsep``-separated lists); progress, previews and events are dropped.
A module that imports but lacks what the glue needs (e.g. a folder named ``comfy`` on ``sys.path``, which
Python imports as an empty namespace package) counts as absent too: the stand-in is used.
"""

import importlib
import os
import sys
import time
import weakref

MODELS_KEY = "ssd_models"
HEADS_KEY = "ssd_heads"
HEADS_EXTENSIONS = {".safetensors"}
BUNDLED = "reference"
NO_HEADS = "none"


def _module(name, *needs):
    """ComfyUI's module ``name`` when it imports and has every attribute in ``needs``; else None (outside
    ComfyUI, or a stray module or folder of that name that is not ComfyUI's)."""
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    return mod if all(hasattr(mod, n) for n in needs) else None


def _folder_paths():
    return _module("folder_paths", "models_dir", "folder_names_and_paths", "get_folder_paths")


def register_folders():
    """Register ``models/ssd_models`` and ``models/ssd_heads``, keeping paths added already
    (extra_model_paths.yaml is read before custom nodes load)."""
    fp = _folder_paths()
    if fp is None:
        return
    for key, exts in ((MODELS_KEY, {"folder"}), (HEADS_KEY, HEADS_EXTENSIONS)):
        default = os.path.join(fp.models_dir, key)
        if key in fp.folder_names_and_paths:
            paths, old_exts = fp.folder_names_and_paths[key]
            if default not in paths:
                paths.insert(0, default)
            fp.folder_names_and_paths[key] = (paths, set(old_exts) | exts)
        else:
            fp.folder_names_and_paths[key] = ([default], set(exts))


def folder_dirs(key):
    """The directories searched for ``key`` (``ssd_models`` or ``ssd_heads``)."""
    fp = _folder_paths()
    if fp is not None:
        try:
            return list(fp.get_folder_paths(key))
        except KeyError:
            register_folders()
            return list(fp.get_folder_paths(key))
    env = os.environ.get("SSD_MODELS_DIR" if key == MODELS_KEY else "SSD_HEADS_DIR", "")
    return [p for p in env.split(os.pathsep) if p]


MAX_DEPTH = 8  # folders below a models folder that the lists look into (a Hub repo id + file is 3-4)
MAX_DIRS = 20000  # folders one listing looks into at most


def _dir_key(path):
    """What identifies a real folder: (device, inode), or its real path where the file system has no inodes."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino) if st.st_ino else os.path.realpath(path)


def _walk(top):
    """``os.walk(top)`` following links (a models folder may link to model folders kept elsewhere), sorted and
    without hidden folders, that looks into each real folder once (links to a parent, or two links to one
    folder, neither loop nor repeat: a folder reached twice is listed under the first name found), at most
    MAX_DEPTH folders deep and MAX_DIRS folders in all: the lists are built for every /object_info request."""
    seen = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        try:
            key = _dir_key(dirpath)
        except (OSError, ValueError):
            dirnames[:] = []
            continue
        if key in seen:
            dirnames[:] = []
            continue
        seen.add(key)
        if len(seen) > MAX_DIRS:
            print(f"[SSD] stopped listing {top} after {MAX_DIRS} folders: keep models and heads fewer folders "
                  f"deep, or link to their folders rather than to a large tree", file=sys.stderr)
            return
        rel = os.path.relpath(dirpath, top)
        depth = 0 if rel == os.curdir else rel.count(os.sep) + 1
        dirnames[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirnames if not d.startswith("."))
        yield dirpath, dirnames, filenames


def list_model_folders():
    """Relative names (``/``-separated) of folders holding a ``config.json``, sorted."""
    found = set()
    for top in folder_dirs(MODELS_KEY):
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in _walk(top):
            if "config.json" in filenames:
                rel = os.path.relpath(dirpath, top)
                if rel != ".":
                    found.add(rel.replace(os.sep, "/"))
                dirnames[:] = []  # a model folder's subfolders are its own business
    return sorted(found)


def list_heads_files():
    found = set()
    for top in folder_dirs(HEADS_KEY):
        if not os.path.isdir(top):
            continue
        for dirpath, _dirnames, filenames in _walk(top):
            for f in filenames:
                if os.path.splitext(f)[1].lower() in HEADS_EXTENSIONS:
                    found.add(os.path.relpath(os.path.join(dirpath, f), top).replace(os.sep, "/"))
    return sorted(found)


def model_choices():
    return [BUNDLED] + [m for m in list_model_folders() if m != BUNDLED]


def heads_choices():
    return [BUNDLED, NO_HEADS] + [h for h in list_heads_files() if h not in (BUNDLED, NO_HEADS)]


def _resolve(key, name, want_dir):
    rel = os.path.normpath(name.replace("/", os.sep))
    if rel.startswith("..") or os.path.isabs(rel):
        return None
    for top in folder_dirs(key):
        path = os.path.join(top, rel)
        if (os.path.isdir(path) if want_dir else os.path.isfile(path)):
            return path
    return None


def resolve_model(name):
    """``reference`` stays a name for the engine; anything else becomes a folder path."""
    if name == BUNDLED:
        return BUNDLED
    path = _resolve(MODELS_KEY, name, want_dir=True)
    if path is None:
        dirs = folder_dirs(MODELS_KEY) or ["ComfyUI/models/ssd_models"]
        raise FileNotFoundError(
            f"SSD model folder '{name}' was not found in {', '.join(dirs)}. Put the downloaded "
            f"transformers-format folder (with its config.json) there, then press R in ComfyUI to "
            f"refresh the list, or pick 'reference' (the bundled model).")
    return path


def resolve_heads(name):
    if name in (BUNDLED, NO_HEADS):
        return name
    path = _resolve(HEADS_KEY, name, want_dir=False)
    if path is None:
        dirs = folder_dirs(HEADS_KEY) or ["ComfyUI/models/ssd_heads"]
        raise FileNotFoundError(
            f"SSD heads file '{name}' was not found in {', '.join(dirs)}. Put the .safetensors "
            f"heads file there and refresh (R), or pick 'reference' or 'none'.")
    return path


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
    mm = _module("comfy.model_management", "get_torch_device")
    return torch.device("cpu") if mm is None else mm.get_torch_device()


def processing_interrupted():
    mm = _module("comfy.model_management", "processing_interrupted")
    return False if mm is None else bool(mm.processing_interrupted())


def interrupt_exception():
    """ComfyUI's exception for a cancelled run (a plain stand-in outside ComfyUI)."""
    mm = _module("comfy.model_management", "InterruptProcessingException")
    return InterruptedError if mm is None else mm.InterruptProcessingException


def weights_bytes(path):
    """Bytes of the weight files in a model folder (0 when unknown, e.g. the bundled name)."""
    if not path or not os.path.isdir(path):
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            if f.endswith((".safetensors", ".bin", ".pt", ".ckpt")):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total


def make_room(nbytes, device):
    """Before a model goes to a GPU, ask ComfyUI to unload its own models until ``nbytes`` fit."""
    if nbytes <= 0 or getattr(device, "type", str(device)) == "cpu":
        return False
    mm = _module("comfy.model_management", "free_memory")
    if mm is None:
        return False
    mm.free_memory(int(nbytes * 1.2), device)
    return True


def free_vram(device):
    """Free bytes on a GPU as ComfyUI counts them (torch's figure outside ComfyUI)."""
    import torch

    mm = _module("comfy.model_management", "get_free_memory")
    if mm is None:
        return torch.cuda.mem_get_info(device)[0] if torch.device(device).type == "cuda" else None
    return int(mm.get_free_memory(device))


def soft_empty_cache():
    mm = _module("comfy.model_management", "soft_empty_cache")
    if mm is not None:
        mm.soft_empty_cache()


class Progress:
    """ComfyUI's progress bar (with previews) and the live ``ssd.grid`` events; no-ops without
    ComfyUI. Both are throttled (every progress update costs ComfyUI two websocket messages):
    ``update`` to ``bar_interval`` seconds unless it carries a preview or ends the run, ``send``
    to ``min_interval`` seconds unless ``force``."""

    def __init__(self, total, node_id=None, min_interval=0.05, bar_interval=0.1):
        self.node_id = node_id
        self.min_interval = min_interval
        self.bar_interval = bar_interval
        self._last_send = 0.0
        self._last_bar = 0.0
        utils = _module("comfy.utils", "ProgressBar")
        self.bar = None if utils is None else utils.ProgressBar(total)
        server = _module("server", "PromptServer")
        self.server = None if server is None else getattr(server.PromptServer, "instance", None)

    def update(self, value, total, preview=None):
        if self.bar is None or processing_interrupted():
            # leave the cancel to the engine's should_cancel, which keeps the model usable
            return
        now = time.monotonic()
        if preview is None and value < total and now - self._last_bar < self.bar_interval:
            return
        self._last_bar = now
        self.bar.update_absolute(value, total, preview)

    def due(self):
        return time.monotonic() - self._last_send >= self.min_interval

    def send(self, event, data, force=False):
        if self.server is None or (not force and not self.due()):
            return False
        self._last_send = time.monotonic()
        payload = dict(data)
        payload["node"] = None if self.node_id is None else str(self.node_id)
        self.server.send_sync(event, payload, getattr(self.server, "client_id", None))
        return True


# ---- ComfyUI's model management ---------------------------------------------------------------------------
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
    mm = _module("comfy.model_management", "load_models_gpu", "unet_offload_device", "module_size")
    mp = _module("comfy.model_patcher", "ModelPatcher")
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
    mm = _module("comfy.model_management", "current_loaded_models")
    loaded = set() if mm is None else {
        id(m.model.model.inner) for m in list(mm.current_loaded_models)
        if getattr(m, "model", None) is not None and hasattr(m.model.model, "inner")}
    return [{"family": getattr(m, "family", "?"), "device": str(m.device), "loaded_in_comfyui": id(m.model) in loaded}
            for m in list(_HELD)]


def register_routes():
    """GET /ssd/models: held_models() as JSON (what the pack keeps in memory)."""
    web = _module("aiohttp.web", "json_response")
    server = _module("server", "PromptServer")
    if web is None or server is None or getattr(server.PromptServer, "instance", None) is None:
        return

    @server.PromptServer.instance.routes.get("/ssd/models")
    async def _held(request):
        return web.json_response({"models": held_models()})
