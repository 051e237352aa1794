"""Model and heads folders: ComfyUI's ``models/ssd_models`` and ``models/ssd_heads`` (registered beside any
paths extra_model_paths.yaml added), their listings for the loaders' lists, and a listed name back to a path.
Outside ComfyUI the folders come from ``SSD_MODELS_DIR`` and ``SSD_HEADS_DIR`` (``os.pathsep``-separated)."""

import os
import sys

from .. import ssd_core
from ._comfy import module

MODELS_KEY = "ssd_models"
HEADS_KEY = "ssd_heads"
HEADS_EXTENSIONS = {".safetensors"}
BUNDLED = "reference"  # the default; every bundled name (reference, reference-48) comes from ssd_core
NO_HEADS = "none"


def _folder_paths():
    return module("folder_paths", "models_dir", "folder_names_and_paths", "get_folder_paths")


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


def _walk_folders(key):
    """_walk over every existing folder searched for `key`: (top, dirpath, dirnames, filenames); emptying
    dirnames in place prunes the walk, as with os.walk."""
    for top in folder_dirs(key):
        if os.path.isdir(top):
            for dirpath, dirnames, filenames in _walk(top):
                yield top, dirpath, dirnames, filenames


def list_model_folders():
    """Relative names (``/``-separated) of folders holding a ``config.json``, sorted."""
    found = set()
    for top, dirpath, dirnames, filenames in _walk_folders(MODELS_KEY):
        if "config.json" in filenames:
            rel = os.path.relpath(dirpath, top)
            if rel != ".":
                found.add(rel.replace(os.sep, "/"))
            dirnames[:] = []  # a model folder's subfolders are its own business
    return sorted(found)


def list_heads_files():
    found = set()
    for top, dirpath, _dirnames, filenames in _walk_folders(HEADS_KEY):
        for f in filenames:
            if os.path.splitext(f)[1].lower() in HEADS_EXTENSIONS:
                found.add(os.path.relpath(os.path.join(dirpath, f), top).replace(os.sep, "/"))
    return sorted(found)


def bundled(kind):
    """The bundled models' (kind 'models') or heads' ('heads') names, `reference` first."""
    return ssd_core.list_bundled()[kind] or [BUNDLED]


def model_choices():
    names = bundled("models")
    return names + [m for m in list_model_folders() if m not in names]


def heads_choices():
    names = bundled("heads")
    return names + [NO_HEADS] + [h for h in list_heads_files() if h not in names and h != NO_HEADS]


def _resolve(key, name, want_dir, missing):
    """The path of `name` (a folder, or a file) inside a folder searched for `key`; else FileNotFoundError with
    `missing`, its {name} and {dirs} filled in."""
    rel = os.path.normpath(name.replace("/", os.sep))
    if not (rel.startswith("..") or os.path.isabs(rel)):
        for top in folder_dirs(key):
            path = os.path.join(top, rel)
            if (os.path.isdir(path) if want_dir else os.path.isfile(path)):
                return path
    dirs = folder_dirs(key) or [f"ComfyUI/models/{key}"]
    raise FileNotFoundError(missing.format(name=name, dirs=", ".join(dirs)))


def resolve_model(name):
    """A bundled name (``reference``, ``reference-48``) stays a name for the engine; anything else becomes a
    folder path."""
    if name in bundled("models"):
        return name
    try:
        return _resolve(MODELS_KEY, name, True, "SSD model folder '{name}' was not found in {dirs}. Put the "
                        "downloaded transformers-format folder (with its config.json) there, then press R in ComfyUI "
                        "to refresh the list, or pick 'reference' (the bundled model).")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err}{_released_as(name)}") from None


def _released_as(name) -> str:
    """' For NAME: what to download and add', when NAME is a released repo's name (a template's model), else ''.
    The extra files' commands name the folder itself where the family writes <folder> (convert-ibq's output)."""
    from ..ssd_core.families import FAMILIES, family_class

    for family in FAMILIES:
        cls = family_class(family)
        if any(repo.split("/")[-1] == name for repo in cls.repo_ids):
            top = (folder_dirs(MODELS_KEY) or [f"ComfyUI/models/{MODELS_KEY}"])[0]
            target = os.path.join(top, name)
            return f" For {name}: {cls.where_to_get(target).replace('<folder>', target)}."
    return ""


def resolve_heads(name):
    if name in bundled("heads") or name == NO_HEADS:
        return name
    return _resolve(HEADS_KEY, name, False, "SSD heads file '{name}' was not found in {dirs}. Put the .safetensors "
                    "heads file there and refresh (R), or pick 'reference' or 'none'.")


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


def calibration_file():
    """Where ssd-exact's measured costs are kept across ComfyUI restarts (ComfyUI's user directory,
    ssd/calibration.json), so a model's pick on this device is measured once; None outside ComfyUI or when
    SSD_CALIBRATION_FILE names a file of the user's own."""
    fp = module("folder_paths", "get_user_directory")
    if fp is None or os.environ.get("SSD_CALIBRATION_FILE"):
        return None
    return os.path.join(fp.get_user_directory(), "ssd", "calibration.json")
