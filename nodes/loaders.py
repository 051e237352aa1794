"""Load AR Image Model (SSD) and Load SSD Heads (V3 nodes): ComfyUI inputs -> ssd_core.load_model / load_heads.

``execute`` is ComfyUI's entry; ``load`` is the same work as a plain call (tests, scripts)."""

from .. import ssd_core
from ..ssd_core.calibrate import calibration_of
from ..ssd_core.errors import printable, shown
from ..ssd_core.memory import OFFLOADS, QUANTIZATIONS, out_of_memory
from ..ssd_core.static_cache import MODES as COMPILE_MODES
from . import _devices, _folders, _patcher
from ._io import io
from .types import CATEGORY, SSD_MODEL, check_choices

DTYPES = ["auto", "float32", "bfloat16", "float16"]
DEVICES = ["auto", "cpu", "cuda", "mps"]


class SSDModel:
    """What travels on an SSD_MODEL link: the engine's model, its draft heads (or None) and the
    names the user picked (for messages). Nodes never modify one in place: ComfyUI caches outputs."""

    def __init__(self, model, heads=None, name="reference", heads_name="none", patcher=None):
        self.model = model
        self.heads = heads
        self.name = name
        self.heads_name = heads_name
        self.patcher = patcher  # ComfyUI's ModelPatcher of the model (None outside ComfyUI or when not movable)

    def with_heads(self, heads, heads_name):
        return SSDModel(self.model, heads, self.name, heads_name, self.patcher)

    def __repr__(self):
        return (f"SSDModel({self.name!r}, family={getattr(self.model, 'family', '?')!r}, "
                f"heads={self.heads_name!r})")


class SSDLoadModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SSDLoadModel",
            display_name="Load AR Image Model (SSD)",
            category=CATEGORY,
            description=("Loads an autoregressive image model for the SSD Sampler: 'reference' is the small model "
                         "that comes with this pack (runs anywhere, right after install; 'reference-48' is its 48x48-token, "
                         "192-pixel sibling); others are "
                         "transformers-format folders (with config.json) placed in ComfyUI/models/ssd_models."),
            inputs=[
                io.Combo.Input("model", options=_folders.model_choices(), default=_folders.BUNDLED,
                               tooltip="reference / reference-48 (bundled: 96 / 192 px) or a folder under models/ssd_models holding a config.json"),
                io.Combo.Input("dtype", options=DTYPES, default="auto",
                               tooltip="auto = the model's own choice for the device; float32 = ssd-exact gives plain "
                                       "AR's picture (1,407 of 1,410 tests; the stats name any near-tie); bfloat16 / "
                                       "float16 = half the memory, the picture may differ slightly from plain AR's"),
                io.Combo.Input("device", options=DEVICES, default="auto",
                               tooltip="auto = ComfyUI's device; mps = an Apple GPU"),
                io.Combo.Input("quantization", options=list(QUANTIZATIONS), default="none", optional=True,
                               tooltip="8-bit / 4-bit (NF4) weights through bitsandbytes for 12-16 GB cards (the "
                                       "image head stays full precision); needs pip install bitsandbytes"),
                io.Combo.Input("offload", options=list(OFFLOADS), default="none", optional=True,
                               tooltip="auto: layers that do not fit in the free graphics memory wait on the CPU "
                                       "(slower, CUDA only)"),
                io.Combo.Input("compile", options=list(COMPILE_MODES), default="off", optional=True, tooltip=(
                    "static = a preallocated KV cache; compiled = that cache plus torch.compile (CUDA graphs on a "
                    "GPU; the first image of each window size compiles, slow; then faster steps)")),
            ],
            outputs=[SSD_MODEL.Output(display_name="ssd_model")],
        )

    @classmethod
    def validate_inputs(cls, model=None):
        """Before the run: a model folder that is not there (not downloaded yet) is refused by name."""
        return _one_line(check_choices(cls, model=model))

    @classmethod
    def execute(cls, model, dtype="auto", device="auto", quantization="none", offload="none", compile="off"):
        return io.NodeOutput(*cls.load(model, dtype, device, quantization, offload, compile))

    @classmethod
    def load(cls, model, dtype="auto", device="auto", quantization="none", offload="none", compile="off"):
        import torch

        if dtype not in DTYPES:
            raise ssd_core.SSDError(f"unknown dtype '{dtype}': pick one of {', '.join(DTYPES)}.")
        dev = _devices.torch_device(device)
        path = _resolved(_folders.resolve_model, "model", model)
        _devices.make_room(_folders.weights_bytes(path), dev)
        try:
            loaded = ssd_core.load_model(path, dtype=dtype, device=dev, quantization=quantization, offload=offload,
                                         free_bytes=_devices.free_vram(dev) if offload == "auto" else None,
                                         compile=compile)
            loaded.shown_as = model  # messages name the model as picked from the list, never its family's code name
            patcher = _patcher.manage(loaded, dev)
            calibration = calibration_of(loaded)  # shared by every load of this model (calibrate.py)
            if calibration.path is None:
                calibration.path = _folders.calibration_file()
        except torch.OutOfMemoryError:
            _devices.soft_empty_cache()
            raise out_of_memory("loading the model") from None
        except ssd_core.SSDError as err:
            raise with_check(err, path) from None
        return (SSDModel(loaded, None, model, _folders.NO_HEADS, patcher),)


def _one_line(found):
    """A validate_inputs answer: True, or its message with the name the user typed escaped (printable)."""
    return found if found is True else printable(found)


def _resolved(resolve, what, name):
    """resolve(name) for a name from the loader's list: a name that is not text refused, and a not-found error
    with the name's control characters (ESC, newlines) escaped, on one line."""
    if not isinstance(name, str):
        raise ssd_core.SSDError(f"the {what} input must be a name from its list, got {shown(name)}.")
    try:
        return resolve(name)
    except FileNotFoundError as err:
        raise FileNotFoundError(printable(str(err))) from None


def with_check(err, path):
    """A failed load's error with what check-model finds blocking in the folder, on the same line (the error
    itself when the check finds nothing more, or cannot run)."""
    from ..ssd_core.check_model import check_folder
    from ..ssd_core.check_report import key_findings

    try:
        found = key_findings(check_folder(path))
    except Exception:  # noqa: BLE001 -- the check never hides the load's own error
        return err
    if not found:
        return err
    return ssd_core.SSDError(f"{err} | {found} (python -m ssd_core check-model {path}: the whole report)")


class SSDLoadHeads(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SSDLoadHeads",
            display_name="Load SSD Heads",
            category=CATEGORY,
            description=("Adds draft heads (a .safetensors file in ComfyUI/models/ssd_heads) to a model: small "
                         "layers that guess rows ahead. ssd needs them; ssd-exact is faster with them; ar and the "
                         "peers (sjd, scd, sjd-pac, zipar, gsd) do not use them. 'reference' / 'reference-48' = the "
                         "heads of the bundled models (each for its own model). FlashAR's heads come inside its "
                         "checkpoint (load Emu3.5-Image-FlashAR, decoder flashar): no heads file."),
            inputs=[
                SSD_MODEL.Input("ssd_model"),
                io.Combo.Input("heads", options=_folders.heads_choices(), default=_folders.BUNDLED,
                               tooltip="a heads file in models/ssd_heads made for the loaded model; reference = the "
                                       "bundled model's; none = no heads"),
                io.String.Input("hub_repo", default="", optional=True,
                                tooltip="a Hugging Face repo id (owner/name) holding heads; when set it replaces the "
                                        "heads list. Kept in models/ssd_heads/<repo id>"),
                io.String.Input("hub_file", default="heads.safetensors", optional=True,
                                tooltip="the heads file in that repo"),
                io.Boolean.Input("download", default=False, optional=True,
                                 tooltip="fetch the file from the Hub when it is not in models/ssd_heads yet (off: "
                                         "never touch the network)"),
            ],
            outputs=[SSD_MODEL.Output(display_name="ssd_model")],
        )

    @classmethod
    def validate_inputs(cls, heads=None):
        return _one_line(check_choices(cls, heads=heads))

    @classmethod
    def execute(cls, ssd_model, heads="reference", hub_repo="", hub_file="heads.safetensors", download=False):
        return io.NodeOutput(*cls.load(ssd_model, heads, hub_repo, hub_file, download))

    @classmethod
    def load(cls, ssd_model, heads="reference", hub_repo="", hub_file="heads.safetensors", download=False):
        if not isinstance(ssd_model, SSDModel):
            raise ssd_core.SSDError("the ssd_model input must come from 'Load AR Image Model (SSD)'.")
        if hub_repo and hub_repo.strip():
            folders = _folders.folder_dirs(_folders.HEADS_KEY)
            if not folders:
                raise ssd_core.SSDError("no ssd_heads folder is known to keep Hub heads in (ComfyUI's "
                                        "models/ssd_heads, or SSD_HEADS_DIR outside ComfyUI)")
            path = ssd_core.hub_file(hub_repo, hub_file, folders[0], download=bool(download))
            heads = f"{hub_repo.strip()}/{hub_file.strip()}"
        elif heads == _folders.NO_HEADS:
            return (ssd_model.with_heads(None, heads),)
        else:
            path = _resolved(_folders.resolve_heads, "heads", heads)
        loaded = ssd_core.load_heads(path, ssd_model.model)
        return (ssd_model.with_heads(loaded, heads),)
