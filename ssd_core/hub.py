"""Downloads from the Hugging Face Hub, only when the caller asks for one.

The repo is fetched with huggingface_hub into the folder the caller names, never into a hidden cache; the repo
id and file names are checked before any path is made from them. Offline, or a repo that cannot be fetched: an
SSDError that names the repo id and the folder to put its files in, and nothing left behind.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .errors import SSDError, reason
from .model_files import check_path

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
    check_path(folder, "download folder")
    folder = Path(folder)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SSDError(f"downloading needs the huggingface_hub package (pip install huggingface_hub); or fetch "
                       f"{repo_id} yourself into {folder}") from None
    if local_files_only is None:
        local_files_only = _offline()
    undo = _undo_new(folder)
    try:
        snapshot_download(repo_id=repo_id, local_dir=str(folder), local_files_only=local_files_only)
    except Exception as err:  # offline, unknown repo, gated repo, network: one clear message
        undo()
        extra = f", and add {extra_files}" if extra_files else ""
        raise SSDError(f"could not download {repo_id} into {folder} ({type(err).__name__}: "
                       f"{reason(err, empty='no details')}); "
                       f"without network access, copy the files of {repo_id} into {folder}{extra}") from None
    if not (folder / "config.json").is_file():
        raise SSDError(f"the download of {repo_id} into {folder} holds no config.json; copy the files of "
                       f"{repo_id} into {folder}")
    return folder



def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def hub_file(repo_id: str, filename: str, folder, download: bool = False) -> Path:
    """One file of a Hub repo, kept at `folder`/<repo_id>/<filename>; fetched (huggingface_hub) only when
    `download` is on: from the local Hugging Face cache when it holds the file, else from the Hub."""
    repo_id = hub_repo_id(repo_id)
    filename = _hub_filename(filename, repo_id)
    check_path(Path(folder) / repo_id / filename, "heads file")  # the folder given may be too long
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
                       f"{reason(err, empty='no details')}); without network access, "
                       f"copy {filename} of {repo_id} into {target}") from None
