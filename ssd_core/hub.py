"""Reading a transformers folder with the loading options, downloads, and the token helpers families share.

Nothing here touches the network unless the caller asks for a download (`download=True`); then the repo is
fetched with huggingface_hub into the folder the caller names, never into a hidden cache. Offline, or a repo
that cannot be fetched: an SSDError that names the repo id and the folder to put its files in.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from .errors import SSDError

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


def read_config(folder) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise SSDError(f"model folder {folder} does not exist")
    path = folder / "config.json"
    if not path.is_file():
        raise SSDError(f"{folder} has no config.json: it is not a transformers model folder")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SSDError(f"{path} is not valid JSON ({err}); re-download the model") from None
    if not isinstance(config, dict):
        raise SSDError(f"{path} holds a JSON {type(config).__name__}, not an object; re-download the model")
    return config


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
    try:
        model = cls.from_pretrained(str(folder), **kw)
    except (OSError, ValueError) as err:
        raise SSDError(f"could not load {cls.__name__} from {folder}: {err}") from None
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
    path = Path(folder) / "preprocessor_config.json" if folder is not None else None
    if path is not None and path.is_file():
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise SSDError(f"{path} is not valid JSON ({err})") from None
        m, s = cfg.get("image_mean", mean), cfg.get("image_std", std)
        mean = [float(m)] * 3 if isinstance(m, (int, float)) else [float(v) for v in m]
        std = [float(s)] * 3 if isinstance(s, (int, float)) else [float(v) for v in s]
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
