"""Output files: checked before the work starts (a long run is never lost to a bad path), and a result kept
when its write still fails after the run (disk full, permissions changed): written beside, in the temp
folder or the current one, and the error says where it is."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import SSDError
from .model_files import check_path

WRITTEN: list[str] = []  # every file written through write_or_keep, in order (the CLI's 'interrupted' line)


def _reason(err: BaseException) -> str:
    text = getattr(err, "strerror", None) or str(err) or type(err).__name__
    return " ".join(str(text).split())[:160]


def _probe(folder: Path) -> str | None:
    """None when a new file can be created in `folder`, else why not (a real create and delete: the only
    answer that holds for read-only mounts, /sys and /proc, and for root)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ssd-probe-", dir=folder)
    except OSError as err:
        return _reason(err)
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass
    return None


def _existing_ancestor(path: Path) -> Path:
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _writable_folder(folder: Path, flag: str, path: Path) -> None:
    if not folder.is_dir():
        raise SSDError(f"{flag} {path}: {folder} is a file, not a folder; pick another place")
    reason = _probe(folder)
    if reason is not None:
        raise SSDError(f"{flag} {path}: cannot write in the folder {folder} ({reason}); pick a folder you can "
                       "write to")


def _shown(extensions) -> str:
    common = (".png", ".jpg", ".webp", ".json", ".safetensors")
    shown = sorted(extensions, key=lambda e: (e not in common, e))
    return ", ".join(shown[:4]) + (" ..." if len(shown) > 4 else "")


def check_output(path, flag: str, extensions=None, make_folder: bool = False) -> None:
    """An output file can be written: a file name with one of `extensions`, in a folder that exists (or,
    with make_folder, can be created) and takes new files; an existing file can be overwritten."""
    if path is None:
        return
    if str(path).strip() == "":
        raise SSDError(f"{flag} is empty: give a file name")
    check_path(path, flag)
    path = Path(path)
    if extensions is not None and path.suffix.lower() not in extensions:
        raise SSDError(f"{flag} {path}: the file name must end in one of {_shown(extensions)}")
    if path.is_dir():
        raise SSDError(f"{flag} {path} is a folder: give a file name")
    if make_folder:
        _writable_folder(_existing_ancestor(path.parent), flag, path)
    elif not path.parent.is_dir():
        raise SSDError(f"{flag} {path}: the folder {path.parent} does not exist; create it first")
    else:
        _writable_folder(path.parent, flag, path)
    if path.exists():
        try:
            with open(path, "ab"):  # opened for appending, nothing written: the file stays as it is
                pass
        except OSError as err:
            raise SSDError(f"{flag} {path} exists and cannot be overwritten ({_reason(err)}); give another "
                           "file name") from None


def check_output_dir(path, flag: str) -> None:
    """An output folder: an existing folder that takes new files, or one that can be created."""
    if path is None:
        return
    if str(path).strip() == "":
        raise SSDError(f"{flag} is empty: give a folder")
    check_path(path, flag)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise SSDError(f"{flag} {path} is a file: give a folder (it is created when missing)")
    _writable_folder(_existing_ancestor(path), flag, path)


def _write_errors():
    errors = [OSError]
    try:
        from safetensors import SafetensorError  # safetensors' own I/O error (save_file on a full disk)

        errors.append(SafetensorError)
    except ImportError:  # an older safetensors
        pass
    return tuple(errors)


def replace_file(path, write, sync: bool = False) -> None:
    """write(temp) into a unique temp file beside `path` (tempfile.mkstemp: O_EXCL, never a file or link already
    there), fsync it when `sync`, then rename it over `path`: a write that fails (disk full, Ctrl-C) leaves the
    old content, or no file, and no temp file. A link is followed (its target is replaced); an existing file
    keeps its permission bits (a new one is the owner's only, as mkstemp makes it)."""
    target = Path(os.path.realpath(path))
    # the target's extension kept: writers pick the format by it
    fd, name = tempfile.mkstemp(prefix=f".{target.stem[:40]}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        write(Path(name))
        if sync:
            fd = os.open(name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if target.exists():
            os.chmod(name, stat.S_IMODE(target.stat().st_mode))
        os.replace(name, target)
    except BaseException:
        try:
            os.unlink(name)
        except OSError:
            pass
        raise


def _write_new(path: Path, write) -> None:
    """write(path) for a new file (or a device such as /dev/null): a half-written new file is removed."""
    existed = os.path.lexists(path)
    try:
        write(path)
    except BaseException:
        if not existed and path.is_file():  # a half-written new file is no result
            try:
                path.unlink()
            except OSError:
                pass
        raise


def write_or_keep(path, write, flag: str = "output") -> Path:
    """write(path) (an existing file through a temp file renamed over it: replace_file); when that fails (disk
    full, folder gone or read-only since the check), write(copy) to a new file of the same name and extension in
    the temp folder (else the current folder) and raise one SSDError saying why and where the result is kept.
    Returns the path written."""
    path = Path(path)
    errors = _write_errors()
    try:
        (replace_file if path.is_file() else _write_new)(path, write)
        WRITTEN.append(str(path))
        return path
    except errors as err:
        reason = _reason(err)
    tried = []
    for folder in (tempfile.gettempdir(), os.getcwd()):
        name = None
        try:
            fd, name = tempfile.mkstemp(prefix=f"{path.stem[:60]}.kept-", suffix=path.suffix, dir=folder)
            os.close(fd)
            write(Path(name))
        except errors:
            tried.append(folder)
            if name is not None:
                try:
                    os.unlink(name)
                except OSError:
                    pass
            continue
        WRITTEN.append(name)
        raise SSDError(f"could not write {flag} {path} ({reason}); the result is kept in {name}: move it where "
                       "you want it")
    raise SSDError(f"could not write {flag} {path} ({reason}), nor a copy in {' or '.join(tried)}: free some "
                   "disk space and run again")
