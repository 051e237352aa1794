"""A local model folder: reading its JSON files and weights with every check, and loading it with the options.

Everything here reads files the caller already has: only files inside the folder, JSON objects of sane shape
and size, safetensors of float tensors (pickles are never opened). Downloads live in hub.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import torch

from .errors import SSDError, printable, reason, shown

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


def parse_dtype(dtype) -> torch.dtype | None:
    """'bf16' / 'fp16' / 'fp32' / a torch.dtype / None or 'auto' (the checkpoint's own) -> torch.dtype | None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower()
    if key == "auto":
        return None
    if key not in DTYPES:
        raise SSDError(f"unknown dtype {dtype!r}: use bf16, fp16 or fp32")
    return DTYPES[key]



# ---- a path as text: what every file system refuses, refused before any file is touched -----------------------
MAX_NAME_BYTES = 255  # one file or folder name (ext4, APFS, NTFS: 255; longer is ENAMETOOLONG)
MAX_PATH_BYTES = 4095  # a whole path (Linux's PATH_MAX 4,096 with its NUL)


def _bytes(text: str) -> int:
    """The length of `text` as the file system gets it (os.fsencode), in bytes."""
    try:
        return len(os.fsencode(text))
    except UnicodeEncodeError:  # a lone surrogate that no file name decoded to
        return len(text.encode("utf-8", "surrogatepass"))


def _start(text: str) -> str:
    """The first characters of a long name, quoted and escaped: 'abc...'..."""
    return printable(repr(text[:24])) + ("..." if len(text) > 24 else "")


def check_path(path, what: str) -> None:
    """One SSDError line, naming `what` (e.g. "--out", "model folder"), for a path no file system takes: a NUL
    in it, a name (one part between separators) over MAX_NAME_BYTES or the whole over MAX_PATH_BYTES (the
    OSError or ValueError the first look at the path would raise). None passes."""
    if path is None:
        return
    text = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
    if "\0" in text:
        raise SSDError(f"{what} {shown(text)} holds a NUL character (\\x00), which no file system takes: give a "
                       "path without it")
    longest = max(Path(text).parts, key=_bytes, default="")
    if _bytes(longest) > MAX_NAME_BYTES:
        raise SSDError(f"{what}: the name {_start(longest)} in its path is {_bytes(longest):,} bytes long; a "
                       f"file or folder name takes at most {MAX_NAME_BYTES} bytes: give a shorter name")
    if _bytes(text) > MAX_PATH_BYTES:
        raise SSDError(f"{what} {_start(text)} is {_bytes(text):,} bytes long; a path takes at most "
                       f"{MAX_PATH_BYTES:,} bytes: give a shorter path")


# ---- reading a model folder: only files inside it, JSON objects of sane shape and size -----------------------
MAX_JSON_BYTES = 64 << 20  # Emu3-Gen's config.json (its vocabulary map) is about 6 MB
MAX_JSON_DEPTH = 32  # released configs nest 4 levels
# sizes a config.json (or any of its sub-configs) may ask for: generous caps, far above any released model,
# checked before transformers builds (allocates) anything
SIZE_LIMITS = {
    "num_hidden_layers": 1024, "num_layers": 1024, "n_layer": 1024,
    "hidden_size": 65_536, "n_embd": 65_536, "d_model": 65_536,
    "intermediate_size": 262_144, "ffn_dim": 262_144,
    "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 8192,
    "vocab_size": 1 << 22, "max_position_embeddings": 1 << 24, "n_positions": 1 << 24,
    "num_embeddings": 1 << 20, "codebook_size": 1 << 20,
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the dtypes a weight or bias may have
COPY_IN = "copy the file itself into the folder (cp -L), or download into a folder of its own (local_dir)"


BUNDLED_ROOT = Path(__file__).resolve().parent / "reference"  # the bundled models' folders share its files


def inside(folder, name, what: str, fix: str = COPY_IN) -> Path:
    """`folder`/`name` resolved (symlinks and '..' followed) and refused unless its real path lies inside the
    folder's real path (for a bundled model's folder: inside the pack's reference folder, so the bundled models
    share one VQ decoder and yardstick). `what` names the entry in messages (e.g. "ssd_model.json's vq_decoder"),
    `fix` says what to do when it lies outside."""
    if not isinstance(name, (str, os.PathLike)):
        raise SSDError(f"{what} must be a file name inside the model folder {folder}, got {shown(name)}")
    text = os.fspath(name)
    if not text or not text.isprintable():
        raise SSDError(f"{what} {shown(text)} is not a usable file name (empty, or it holds a control "
                       f"character): name a file inside the model folder {folder}")
    try:
        root = Path(folder).resolve()
        full = (root / text).resolve()
        full.exists()  # a name too long for the file system raises here, not in resolve()
    except (OSError, ValueError, RuntimeError) as err:  # a name too long, a symlink loop
        raise SSDError(f"{what} {shown(text)} cannot be resolved in {folder} ({type(err).__name__}): name a file "
                       "inside the model folder") from None
    if BUNDLED_ROOT in root.parents:
        root = BUNDLED_ROOT
    if full != root and root not in full.parents:
        raise SSDError(f"{what} {shown(text)} lies outside the model folder {folder} (it resolves to {full}); "
                       f"the pack reads only files inside it: {fix}")
    return full


def _check_tree(data, path, fix: str, sizes: bool) -> None:
    """Depth, names (model_type anywhere, family and architectures at the top) and, for a config, SIZE_LIMITS."""
    for key, kind in (("family", str), ("architectures", list)):  # family present: a name; architectures: or null
        value = data.get(key)
        if (key in data if kind is str else value is not None) and (not isinstance(value, kind) or
                                  (kind is list and not all(isinstance(v, str) for v in value))):
            want = "a name (a JSON string)" if kind is str else "a list of class names (JSON strings)"
            raise SSDError(f"{path}: {key} must be {want}, got {shown(value)}; {fix}")
    stack = [(data, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise SSDError(f"{path} nests JSON more than {MAX_JSON_DEPTH} levels deep (at {shown(where)}): it is "
                           f"not a file of this kind; {fix}")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            at = f"{where}.{key}" if where else str(key)
            if key == "model_type" and isinstance(node, dict) and value is not None and not isinstance(value, str):
                raise SSDError(f"{path}: {at} must be a name (a JSON string), got {shown(value)}; {fix}")
            if sizes and isinstance(node, dict) and key in SIZE_LIMITS and value is not None:
                limit = SIZE_LIMITS[key]
                if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
                    raise SSDError(f"{path}: {at} is {shown(value)}; this pack loads whole numbers from 1 to "
                                   f"{limit:,} there (far above any released model): {fix}")
            if isinstance(value, (dict, list)):
                stack.append((value, depth + 1, at))


def read_json_object(folder, name: str, fix: str, missing: str | None = None, sizes: bool = False) -> dict:
    """The JSON object in `folder`/`name`, or one SSDError line ending in `fix`: the file missing (`missing`,
    else a default), outside the folder, too large, not JSON, not an object, nested too deep, a name key
    (family, architectures, model_type) that is not a name, or (`sizes`, config.json) a size past SIZE_LIMITS."""
    folder = Path(folder)
    path = folder / name
    full = inside(folder, name, name) if os.path.lexists(path) else path
    if not full.is_file():
        raise SSDError(missing or f"{folder} has no {name}; {fix}")
    size = full.stat().st_size
    if size > MAX_JSON_BYTES:
        raise SSDError(f"{path} is {size:,} bytes, more than the {MAX_JSON_BYTES:,} a JSON file of a model folder "
                       f"may have; {fix}")
    try:
        data = json.loads(full.read_bytes().decode("utf-8"))
    except RecursionError:
        raise SSDError(f"{path} nests JSON too deeply to read: it is not a file of this kind; {fix}") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError, a number of 5,000 digits
        raise SSDError(f"{path} is not valid JSON ({str(err)[:200]}); {fix}") from None
    if not isinstance(data, dict):
        raise SSDError(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}")
    _check_tree(data, path, fix, sizes)
    return data


def read_config(folder) -> dict:
    """config.json of a transformers folder, checked by read_json_object (sizes included) before any load."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SSDError(f"model folder {folder} does not exist")
    return read_json_object(folder, "config.json", "fix config.json, or re-download the model",
                            f"{folder} has no config.json: it is not a transformers model folder", sizes=True)


SSD_MODEL_JSON = "ssd_model.json"  # the pack's own description of a model folder (its family, a llama-grid's layout)
SSD_MODEL_DOC = "see docs/models-and-memory.md, section 'ssd_model.json'"


def read_ssd_model_json(folder, missing: str | None = None) -> dict:
    """ssd_model.json read by read_json_object: the JSON object, or one SSDError line pointing at its documentation
    (`missing`: the message when the file is absent)."""
    return read_json_object(folder, SSD_MODEL_JSON, SSD_MODEL_DOC, missing)


def check_links(folder) -> None:
    """Every entry at the top of the folder (what transformers and the tokenizer read) lies inside it."""
    folder = Path(folder)
    for entry in sorted(folder.iterdir()):
        if not entry.name.startswith("."):
            inside(folder, entry.name, "the entry")


def weight_files(folder) -> list[Path]:
    """The safetensors files transformers will read for the folder's model (model.safetensors, else the shards
    model.safetensors.index.json names), each resolved inside the folder; pickled weights are refused by name."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if os.path.lexists(single):
        return [inside(folder, single.name, single.name)]
    if not os.path.lexists(index):
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickled:
            raise SSDError(f"{folder} holds only pickled weights ({', '.join(pickled[:3])}), which this pack never "
                           "loads: convert them to model.safetensors where you trust the file (load with "
                           "transformers, then save_pretrained(folder, safe_serialization=True))")
        raise SSDError(f"{folder} has no model weights (model.safetensors or model.safetensors.index.json): copy "
                       "the model's weights into it")
    fix = "re-download the model, or re-save it with save_pretrained"
    data = read_json_object(folder, index.name, fix)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise SSDError(f"{index} has no weight_map object of tensor names and shard files; {fix}")
    files = {}
    for tensor, shard in weight_map.items():
        what = f"{index.name}'s shard for {shown(tensor)}"
        if not isinstance(shard, str) or not shard.endswith(".safetensors"):
            raise SSDError(f"{what} must be a .safetensors file name inside the folder, got {shown(shard)}; {fix}")
        if shard not in files:
            files[shard] = inside(folder, shard, what)
            if not files[shard].is_file():
                raise SSDError(f"{what}, {shown(shard)}, is not a file in {folder}: the download is incomplete; "
                               f"{fix}")
    return list(files.values())


def check_weights(folder, config: dict | None = None) -> list[Path]:
    """weight_files, each with a readable safetensors header whose weights and biases are floating point (unless
    config.json declares a quantization_config: transformers then reads its own packed formats)."""
    from safetensors import safe_open

    folder = Path(folder)
    files = weight_files(folder)
    quantized = isinstance(config, dict) and config.get("quantization_config") is not None
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                if quantized:
                    continue
                for key in f.keys():
                    dtype = f.get_slice(key).get_dtype()
                    if key.endswith((".weight", ".bias")) and dtype not in FLOAT_DTYPES:
                        raise SSDError(f"{path.name} in {folder} holds {shown(key)} as {dtype}: this pack loads "
                                       "unquantized weights (bf16 / fp16 / fp32) and quantizes them itself; use the "
                                       "model's original safetensors and the 8-bit / 4-bit quantization option")
        except SSDError:
            raise
        except Exception as err:  # noqa: BLE001 -- safetensors raises several types for a damaged header
            raise SSDError(f"could not load the model in {folder}: {path.name} is not a readable safetensors file "
                           f"({reason(err)}); re-download or re-save the weights (model.safetensors)") from None
    return files


# tensors a released checkpoint may hold that its transformers class does not use, each with the model and the
# reason; every other unused tensor is refused. Empty: transformers' Janus and Emu3 converters load their state
# dicts with strict=True before save_pretrained (convert_janus_weights_to_hf.py, convert_emu3_weights_to_hf.py),
# Lumina-mGPT's saver writes the model's own state_dict (xllmx/util/ckpt.py save), and the bundled models are
# written by save_pretrained.
UNUSED_TENSORS: tuple[str, ...] = ()
LAYER_KEY = re.compile(r"^(.*?layers\.)(\d+)\.")  # "<prefix>layers.<i>." of a decoder stack's tensor names


def _listed(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _layer_counts(model, keys, missing: bool = False) -> tuple[str, int, int] | None:
    """(prefix, layers the weights hold, layers the model has) when `keys` are the tensors of whole layers the
    model lacks (unused tensors), or (`missing`) of the model's last layers that the weights lack."""
    found = [(m.group(1), int(m.group(2))) for m in map(LAYER_KEY.match, keys) if m]
    if not found or (missing and len(found) != len(keys)) or len({p for p, _ in found}) != 1:
        return None
    prefix = found[0][0]
    stack = dict(model.named_modules()).get(prefix[:-1])
    if not isinstance(stack, torch.nn.ModuleList):
        return None
    indices = {i for _, i in found}
    if missing:  # the missing ones are exactly the last layers, each wholly
        held = min(indices)
        whole = sum(1 for k, _ in model.named_parameters() if k.startswith(prefix) and
                    int(k[len(prefix):].split(".", 1)[0]) >= held)
        return (prefix, held, len(stack)) if indices == set(range(held, len(stack))) and whole <= len(keys) \
            else None
    held = max(indices) + 1
    return (prefix, held, len(stack)) if held > len(stack) else None


def _layers_line(folder, layers) -> str:
    prefix, held, declared = layers
    return (f"the weights in {folder} hold {held} layers ({prefix}0-{held - 1}), config.json declares {declared}: "
            "fix num_hidden_layers in config.json (it must match the weights)")


def check_loaded(model, folder, info: dict, optional: tuple[str, ...] = ()) -> None:
    """Every tensor the model has came from the weights (names starting with one of `optional` excepted), and
    every tensor of the weights is used (UNUSED_TENSORS excepted): else one SSDError line naming them, or saying
    that config.json declares another number of layers than the weights hold."""
    missing = [k for k in info.get("missing_keys") or () if not k.startswith(tuple(optional))]
    unused = [k for k in info.get("unexpected_keys") or () if k not in UNUSED_TENSORS]
    for keys, lacking in ((unused, False), (missing, True)):
        layers = _layer_counts(model, keys, lacking) if keys else None
        if layers is not None:
            raise SSDError(_layers_line(folder, layers))
    if missing:
        raise SSDError(f"the weights in {folder} lack {_listed(missing)}: the model would run with random values "
                       "there; re-download the model, or re-save it with save_pretrained")
    if unused:
        raise SSDError(f"the weights in {folder} hold tensors the model does not use: {_listed(unused)}; config.json "
                       "does not describe these weights (another model or version): use the config.json that came "
                       "with them, or re-download the model")


@contextlib.contextmanager
def _quiet_load_report(quiet: bool):
    """transformers' warnings muted while it loads (`quiet`): its report would list every optional tensor as
    missing, and check_loaded refuses what matters in one line."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def from_pretrained(cls, folder, optional: tuple[str, ...] = (), **kwargs):
    """`cls.from_pretrained(folder)` on a checked folder: every file it reads lies inside the folder, the weights
    are safetensors (pickles are never opened) of float tensors, every tensor the model has is in them (those
    under the `optional` name prefixes excepted) and every tensor in them is used (check_loaded)."""
    folder = Path(folder)
    check_links(folder)
    check_weights(folder, read_config(folder))
    try:
        with _quiet_load_report(bool(optional)):
            model, info = cls.from_pretrained(str(folder), use_safetensors=True, output_loading_info=True, **kwargs)
    except (MemoryError, torch.OutOfMemoryError, SSDError):
        raise
    except Exception as err:  # noqa: BLE001 -- transformers / safetensors raise many types for a bad folder
        why = reason(err, 300, empty="no details")
        raise SSDError(f"could not load the model in {folder} ({type(err).__name__}: {why}); check "
                       "config.json and re-download or re-save the weights (model.safetensors)") from None
    check_loaded(model, folder, info, optional)
    return model


def load_pretrained(cls, folder, dtype=None, device="cpu", device_map=None, low_cpu_mem_usage: bool = True,
                    **kwargs):
    """`cls.from_pretrained` with the loading options: dtype (bf16/fp16/fp32/auto), device, low-memory
    loading, and `device_map` (through accelerate) for a model larger than one device."""
    kw = dict(kwargs)
    torch_dtype = parse_dtype(dtype)
    if torch_dtype is not None:
        kw["dtype"] = torch_dtype
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise SSDError("device_map needs the accelerate package (pip install accelerate)") from None
        kw["device_map"] = device_map
        low_cpu_mem_usage = True
    kw["low_cpu_mem_usage"] = bool(low_cpu_mem_usage)
    model = from_pretrained(cls, folder, **kw)
    if device_map is None and device is not None:
        model = model.to(device)
    return model.eval()


def load_tokenizer(folder):
    """The model folder's own tokenizer, or None when it has none."""
    folder = Path(folder)
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as err:  # noqa: BLE001
        raise SSDError(f"could not read the tokenizer in {folder}: {err}") from None
