"""Reading a transformers folder with the loading options, downloads, and the token helpers families share.

Nothing here touches the network unless the caller asks for a download (`download=True`); then the repo is
fetched with huggingface_hub into the folder the caller names, never into a hidden cache. Offline, or a repo
that cannot be fetched: an SSDError that names the repo id and the folder to put its files in.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import torch

from .errors import SSDError, shown

# prompts the head trainer samples when it is given none (self-distillation wants thousands: pass a prompt file)
TRAINING_PROMPTS = (
    "a photo of a cat sitting on a windowsill", "a red sports car on a mountain road at sunset",
    "a bowl of fresh fruit on a wooden table", "a lighthouse on a rocky coast in a storm",
    "an astronaut riding a horse, digital art", "a cozy cabin in a snowy forest at night",
    "a portrait of an old fisherman, oil painting", "a city skyline reflected in a river",
    "a field of sunflowers under a blue sky", "a steaming cup of coffee next to a book",
    "a watercolor painting of a hummingbird", "a futuristic robot in a neon-lit alley",
)

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


def first_id(*candidates) -> int | None:
    """The first token id given among candidates (None skipped; a list stands for its first id)."""
    for c in candidates:
        if isinstance(c, (list, tuple)):
            c = c[0] if c else None
        if c is not None:
            return int(c)
    return None


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


def inside(folder, name, what: str, fix: str = COPY_IN) -> Path:
    """`folder`/`name` resolved (symlinks and '..' followed) and refused unless its real path lies inside the
    folder's real path. `what` names the entry in messages (e.g. "ssd_model.json's vq_decoder"), `fix` says what
    to do when it lies outside."""
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
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise SSDError(f"could not load the model in {folder}: {path.name} is not a readable safetensors file "
                           f"({first[:200]}); re-download or re-save the weights (model.safetensors)") from None
    return files


def from_pretrained(cls, folder, **kwargs):
    """`cls.from_pretrained(folder)` on a checked folder: every file it reads lies inside the folder, the weights
    are safetensors (pickles are never opened) of float tensors, and every tensor the model has is in them."""
    folder = Path(folder)
    check_links(folder)
    check_weights(folder, read_config(folder))
    try:
        model, info = cls.from_pretrained(str(folder), use_safetensors=True, output_loading_info=True, **kwargs)
    except (MemoryError, torch.OutOfMemoryError, SSDError):
        raise
    except Exception as err:  # noqa: BLE001 -- transformers / safetensors raise many types for a bad folder
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise SSDError(f"could not load the model in {folder} ({type(err).__name__}: {first[:300]}); check "
                       "config.json and re-download or re-save the weights (model.safetensors)") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise SSDError(f"the weights in {folder} lack {', '.join(missing[:3])}{more}: the model would run with "
                       "random values there; re-download the model, or re-save it with save_pretrained")
    return model


# ---- downloads: checked names, and a failed download removes what it wrote -----------------------------------------
HUB_NAME = re.compile(r"[A-Za-z0-9._-]{1,96}")  # one part of a Hugging Face repo id (owner/name)
MAX_HUB_FILE = 1024  # characters of a file's path inside a Hub repo


def _cut(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60]) + f"... ({len(text)} characters)"


def hub_repo_id(repo_id) -> str:
    """`repo_id` without surrounding spaces, refused (one-line SSDError) unless it is a Hugging Face repo id:
    owner/name, each part 1-96 of A-Z a-z 0-9 . _ - and neither '.' nor '..'. Checked before any path is made
    from it (a 100,000-character id would otherwise reach the file system as an OSError)."""
    text = repo_id.strip() if isinstance(repo_id, str) else ""
    parts = text.split("/")
    if len(parts) != 2 or not all(HUB_NAME.fullmatch(p) and p not in (".", "..") for p in parts):
        raise SSDError(f"Hub repo id {_cut(str(repo_id))} is not of the form owner/name (each part 1-96 letters, "
                       "digits, '.', '_' or '-', e.g. deepseek-ai/Janus-Pro-7B): copy the id from the repo's page")
    return text


def _hub_filename(filename, repo_id: str) -> str:
    """A .safetensors path inside a Hub repo ('/'-separated parts of at most 255 bytes, no '.' or '..', printable)."""
    text = filename.strip() if isinstance(filename, str) else ""
    parts = text.split("/")
    if not (text.endswith(".safetensors") and len(text) <= MAX_HUB_FILE and text.isprintable() and "\\" not in text
            and not Path(text).is_absolute()
            and all(p and p not in (".", "..") and len(p.encode("utf-8", "replace")) <= 255 for p in parts)):
        raise SSDError(f"Hub file {_cut(str(filename))} must be a .safetensors path inside the repo {repo_id} "
                       f"('/'-separated, at most {MAX_HUB_FILE} characters, no '..'), e.g. heads.safetensors")
    return text


def _undo_new(folder):
    """A function that removes what was added to `folder` since this call, for a failed download: the outermost
    new folder when `folder` does not exist yet, else each file and folder under it that was not there. What
    was there is left as it was."""
    folder = Path(folder).absolute()
    top, p = None, folder
    while not os.path.lexists(p):
        top = p
        if p.parent == p:
            break
        p = p.parent
    before = set()
    if top is None:
        for dirpath, dirnames, filenames in os.walk(folder):
            before.update(os.path.join(dirpath, n) for n in dirnames + filenames)

    def remove(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass

    def undo():
        if top is not None:
            remove(top)
            return
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in [n for n in dirnames + filenames if os.path.join(dirpath, n) not in before]:
                remove(os.path.join(dirpath, name))
                if name in dirnames:
                    dirnames.remove(name)

    return undo


def download(repo_id: str, folder, extra_files: str = "", local_files_only: bool | None = None) -> Path:
    """Fetch `repo_id` into `folder` with huggingface_hub (only call this when the user asked for a download);
    `extra_files`: what the folder needs besides the repo's files (named in the error message). A download that
    fails removes what it wrote (the folder too when it made it)."""
    repo_id = hub_repo_id(repo_id)
    folder = Path(folder)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SSDError(f"downloading needs the huggingface_hub package (pip install huggingface_hub); or fetch "
                       f"{repo_id} yourself into {folder}") from None
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    undo = _undo_new(folder)
    try:
        snapshot_download(repo_id=repo_id, local_dir=str(folder), local_files_only=local_files_only)
    except Exception as err:  # offline, unknown repo, gated repo, network: one clear message
        undo()
        extra = f", and add {extra_files}" if extra_files else ""
        raise SSDError(f"could not download {repo_id} into {folder} ({type(err).__name__}: "
                       f"{str(err).splitlines()[0] if str(err) else 'no details'}); "
                       f"without network access, copy the files of {repo_id} into {folder}{extra}") from None
    if not (folder / "config.json").is_file():
        raise SSDError(f"the download of {repo_id} into {folder} holds no config.json; copy the files of "
                       f"{repo_id} into {folder}")
    return folder


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


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows of different lengths -> (ids [B, P], mask [B, P]) left-padded with `pad_id`."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, P - len(r):] = True
    return ids, mask


def token_id(vocab: dict | None, tokenizer, name: str, fallback: int | None = None) -> int:
    """A special token's id by name: the model's vocabulary map, then its tokenizer, then a known default."""
    if vocab and name in vocab:
        return int(vocab[name])
    if tokenizer is not None:
        tid = tokenizer.convert_tokens_to_ids(name)
        unk = getattr(tokenizer, "unk_token_id", None)
        if isinstance(tid, int) and tid >= 0 and (tid != unk or unk is None):
            return tid
    if fallback is not None:
        return int(fallback)
    raise SSDError(f"the model's vocabulary has no {name!r} token")


def pixel_normalization(folder) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) [3] that map a VQ decoder's output back to [0, 1]: the folder's preprocessor_config.json
    (image_mean / image_std, as the model's image processor un-normalizes), else 0.5 / 0.5 (output in [-1, 1])."""
    mean, std = [0.5] * 3, [0.5] * 3
    name = "preprocessor_config.json"
    if folder is not None and os.path.lexists(Path(folder) / name):
        fix = "fix it (image_mean / image_std: a number or 3 numbers each), or re-download the model"
        cfg = read_json_object(folder, name, fix)
        out = []
        for key, value in (("image_mean", cfg.get("image_mean", mean)), ("image_std", cfg.get("image_std", std))):
            values = [value] * 3 if isinstance(value, (int, float)) else value
            if not (isinstance(values, list) and len(values) == 3 and
                    all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
                    and (key == "image_mean" or min(values) > 0)):
                raise SSDError(f"{Path(folder) / name}: {key} is {shown(value)}; {fix}")
            out.append([float(v) for v in values])
        mean, std = out
    return torch.tensor(mean), torch.tensor(std)


def to_unit_image(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[..., 3] channels-last VQ output -> [0, 1] pixels with the model's un-normalization."""
    mean, std = norm
    return (x.float().cpu() * std + mean).clamp(0, 1)


def token_id_list(prompt) -> list[int] | None:
    """A prompt given as already-tokenized ids (a list / tuple / 1-D tensor of ints) -> list; text -> None."""
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.flatten().tolist()
    if isinstance(prompt, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise SSDError("a prompt given as token ids must be a list of non-negative integers")
        return [int(t) for t in prompt]
    return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def hub_file(repo_id: str, filename: str, folder, download: bool = False) -> Path:
    """One file of a Hub repo, kept at `folder`/<repo_id>/<filename>; fetched (huggingface_hub) only when
    `download` is on: from the local Hugging Face cache when it holds the file, else from the Hub."""
    repo_id = hub_repo_id(repo_id)
    filename = _hub_filename(filename, repo_id)
    target = Path(folder) / repo_id
    path = target / filename
    if path.is_file():
        return path
    where = f"{filename} of {repo_id} into {target}"
    if not download:
        raise SSDError(f"{filename} of the Hub repo {repo_id} is not in {target}: turn download on to fetch it, "
                       f"or copy it there yourself")
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        raise SSDError(f"downloading needs the huggingface_hub package (pip install huggingface_hub); or copy "
                       f"{filename} of {repo_id} into {target}") from None
    cached = try_to_load_from_cache(repo_id, filename)  # a path when the local HF cache holds it (no network)
    undo = _undo_new(target)  # a failed fetch leaves nothing behind (hf_hub_download writes target/.cache/...)
    if isinstance(cached, str) and Path(cached).is_file():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached, path)
        except OSError as err:
            undo()
            raise SSDError(f"could not copy {filename} of {repo_id} from the Hugging Face cache into {target} "
                           f"({type(err).__name__}: {err.strerror or err}); free some disk space, or copy it "
                           "there yourself") from None
        return path
    try:
        return Path(hf_hub_download(repo_id, filename, local_dir=str(target), local_files_only=_offline()))
    except Exception as err:  # offline, unknown repo or file, gated repo, network: one clear message
        undo()
        raise SSDError(f"could not download {where} ({type(err).__name__}: "
                       f"{str(err).splitlines()[0] if str(err) else 'no details'}); without network access, "
                       f"copy {filename} of {repo_id} into {target}") from None
