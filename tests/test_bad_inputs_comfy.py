"""The ComfyUI side under hostile folders and inputs (issue 29): model folders with link loops, GET /ssd/models
on the server's event loop, Hub ids and files of any length, failed downloads, and a folder named `comfy` next
to the clone (a ComfyUI checkout) that must not shadow the stand-ins."""
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types

import pytest

from conftest import ROOT, load_pack, pack_module

nodes = load_pack()
core = pack_module("ssd_core")
hub = pack_module("ssd_core.hub")
devices_glue = pack_module("nodes._devices")
folders_glue = pack_module("nodes._folders")
patcher_glue = pack_module("nodes._patcher")
progress_glue = pack_module("nodes._progress")
routes_glue = pack_module("nodes._routes")

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32",
                                    reason="symlinks need privileges on Windows")


def finishes(fn, seconds):
    """fn() in a thread: (True, its result) when it returns within `seconds`, else (False, None)."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), out.get("value")


# ---- 1. the model and heads lists under link loops -------------------------------------------------------------
@needs_symlinks
def test_lists_finish_under_link_loops_and_list_linked_models_once(tmp_path, monkeypatch):
    models, heads, store = tmp_path / "ssd_models", tmp_path / "ssd_heads", tmp_path / "store"
    (models / "org" / "Emu3-Gen").mkdir(parents=True)
    (models / "org" / "Emu3-Gen" / "config.json").write_text("{}")
    (store / "Janus-Pro-7B").mkdir(parents=True)
    (store / "Janus-Pro-7B" / "config.json").write_text("{}")
    (store / "loop").symlink_to(store)  # a loop inside the linked-to tree too
    os.symlink(".", models / "a")  # a -> ., b -> .: 2^40 paths without a loop check
    os.symlink(".", models / "b")
    os.symlink("..", models / "org" / "up")
    os.symlink(store / "Janus-Pro-7B", models / "linked")
    os.symlink(store, models / "more")  # reaches Janus-Pro-7B again: listed once, as "linked"
    (heads / "repo" / "v1").mkdir(parents=True)
    (heads / "x.safetensors").write_text("x")
    (heads / "repo" / "v1" / "h.safetensors").write_text("x")
    (store / "heads").mkdir()
    (store / "heads" / "e.safetensors").write_text("x")
    os.symlink(".", heads / "a")
    os.symlink(".", heads / "b")
    os.symlink("../..", heads / "repo" / "v1" / "up")
    os.symlink(store / "heads", heads / "ext")
    monkeypatch.setenv("SSD_MODELS_DIR", str(models))
    monkeypatch.setenv("SSD_HEADS_DIR", str(heads))
    start = time.monotonic()
    done, found = finishes(lambda: (folders_glue.model_choices(), folders_glue.heads_choices()), 20)
    assert done, "listing model folders with link loops did not finish in 20 s (it blocks /object_info)"
    assert time.monotonic() - start < 5
    assert found[0] == ["reference", "reference-48", "linked", "org/Emu3-Gen"]
    assert found[1] == ["reference", "reference-48", "none", "ext/e.safetensors", "repo/v1/h.safetensors", "x.safetensors"]
    assert folders_glue.resolve_model("linked") == str(models / "linked")


def test_lists_stop_at_a_sane_depth(tmp_path, monkeypatch):
    models = tmp_path / "ssd_models"
    shallow = models / "a" / "b" / "c"
    deep = models.joinpath(*[f"d{i}" for i in range(folders_glue.MAX_DEPTH + 2)])
    for d in (shallow, deep):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    monkeypatch.setenv("SSD_MODELS_DIR", str(models))
    assert folders_glue.list_model_folders() == ["a/b/c"]


# ---- 2. GET /ssd/models does no heavy work on the event loop ------------------------------------------------------
class _Model:  # what the loader hands manage(): weak-referenceable, with a family and a device
    family, device, model = "llama-grid", "cpu", None


def test_ssd_models_route_does_not_collect_garbage_on_the_event_loop(monkeypatch):
    routes = {}

    class Routes:
        def get(self, path):
            return lambda handler: routes.setdefault(path, handler)

    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(routes=Routes()))
    monkeypatch.setitem(sys.modules, "server", server)
    try:
        import aiohttp.web  # noqa: F401  (the real json_response when aiohttp is here, as in ComfyUI)
    except ImportError:
        web = types.ModuleType("aiohttp.web")
        web.json_response = lambda data: data
        aiohttp = types.ModuleType("aiohttp")
        aiohttp.web = web
        monkeypatch.setitem(sys.modules, "aiohttp", aiohttp)
        monkeypatch.setitem(sys.modules, "aiohttp.web", web)
    on_loop = []

    def collect(*args):
        try:
            asyncio.get_running_loop()
            on_loop.append(args)
        except RuntimeError:
            pass
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    routes_glue.register_routes()
    handler = routes["/ssd/models"]
    held = _Model()
    assert patcher_glue.manage(held, "cpu") is None  # outside ComfyUI: listed, not managed

    async def twenty_at_once():
        start = time.monotonic()
        answers = await asyncio.gather(*(handler(types.SimpleNamespace()) for _ in range(20)))
        return answers, time.monotonic() - start

    answers, took = asyncio.run(twenty_at_once())
    assert on_loop == [], "GET /ssd/models ran gc.collect() on the server's event loop (~0.5 s each)"
    assert took < 1.0
    body = answers[0] if isinstance(answers[0], dict) else json.loads(answers[0].text)
    assert {"family": "llama-grid", "device": "cpu", "loaded_in_comfyui": False} in body["models"]


# ---- 3. Hub ids and files of any length: one clear line before any file system use -------------------------------
LONG = "x" * 100_000


@pytest.mark.parametrize("repo, file, match", [
    (LONG, "heads.safetensors", "owner/name"),
    ("owner/" + LONG, "heads.safetensors", "owner/name"),
    (LONG + "/name", "heads.safetensors", "owner/name"),
    ("own er/name", "heads.safetensors", "owner/name"),
    ("owner/na\x00me", "heads.safetensors", "owner/name"),
    ("owner/" + "n" * 97, "heads.safetensors", "owner/name"),
    ("owner/name", LONG + ".safetensors", "safetensors path"),
    ("owner/name", "v1/" + "h" * 300 + ".safetensors", "safetensors path"),
    ("owner/name", "v1/he\nads.safetensors", "safetensors path"),
    ("owner/name", "v1\\..\\..\\x.safetensors", "safetensors path"),
])
def test_hub_inputs_of_any_length_are_refused_in_one_line(tmp_path, monkeypatch, repo, file, match):
    heads = tmp_path / "ssd_heads"
    heads.mkdir()
    monkeypatch.setenv("SSD_HEADS_DIR", str(heads))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for download in (False, True):
        with pytest.raises(core.SSDError, match=match) as err:
            nodes.SSDLoadHeads().load(nodes.SSDModel(None), "none", hub_repo=repo, hub_file=file, download=download)
        msg = str(err.value)
        assert "\n" not in msg and len(msg) < 400, msg
    assert list(heads.iterdir()) == []


def test_a_good_repo_id_passes_and_model_downloads_check_theirs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_repo_id(" deepseek-ai/Janus-Pro-7B ") == "deepseek-ai/Janus-Pro-7B"
    assert hub.hub_repo_id("a/" + "n" * 96) == "a/" + "n" * 96
    with pytest.raises(core.SSDError, match="owner/name") as err:
        hub.download(LONG, tmp_path / "model")
    assert len(str(err.value)) < 400
    assert list(tmp_path.iterdir()) == []


# ---- 4. a failed download removes what it wrote, and only that --------------------------------------------------
@pytest.fixture()
def offline(tmp_path, monkeypatch):
    """An empty Hugging Face cache and HF_HUB_OFFLINE=1 (a download fails without touching the network)."""
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_failed_heads_download_leaves_nothing_behind(offline, monkeypatch):
    heads = offline / "ssd_heads"
    heads.mkdir()
    monkeypatch.setenv("SSD_HEADS_DIR", str(heads))
    with pytest.raises(core.SSDError, match="could not download"):
        nodes.SSDLoadHeads().load(nodes.SSDModel(None), "none", hub_repo="someone/heads",
                                  hub_file="v1/heads.safetensors", download=True)
    assert tree(heads) == []  # no models/ssd_heads/someone/heads/.cache/huggingface/...


def test_failed_heads_download_keeps_what_was_there(offline, monkeypatch):
    heads = offline / "ssd_heads"
    kept = heads / "someone" / "heads"
    (kept / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (kept / ".cache" / "huggingface" / "download" / "old.safetensors.metadata").write_text("earlier download")
    (kept / "old.safetensors").write_text("x")
    before = tree(heads)
    with pytest.raises(core.SSDError, match="could not download"):
        core.hub_file("someone/heads", "v2/heads.safetensors", heads, download=True)
    assert tree(heads) == before


def test_failed_model_download_leaves_the_folder_as_it_was(offline):
    with pytest.raises(core.SSDError, match="could not download"):
        hub.download("someone/model", offline / "models" / "org" / "model")
    assert not (offline / "models").exists()
    folder = offline / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's")
    with pytest.raises(core.SSDError, match="holds no config.json"):  # offline, huggingface_hub keeps the folder
        hub.download("someone/model", folder)
    assert tree(folder) == ["notes.txt"]


def test_undo_removes_only_new_entries(tmp_path):
    folder = tmp_path / "f"
    (folder / "old").mkdir(parents=True)
    (folder / "old" / "a.txt").write_text("a")
    undo = hub._undo_new(folder)
    (folder / "old" / "b.txt").write_text("b")
    (folder / "new" / "deep").mkdir(parents=True)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.lock").write_text("")
    undo()
    assert tree(folder) == ["old", os.path.join("old", "a.txt")]
    undo = hub._undo_new(tmp_path / "g" / "h")
    (tmp_path / "g" / "h" / ".cache").mkdir(parents=True)
    undo()
    assert not (tmp_path / "g").exists()


# ---- 5. a folder named `comfy` beside the clone -------------------------------------------------------------------
@pytest.fixture()
def stray_comfy(tmp_path, monkeypatch):
    """Folders `comfy/` (with an empty utils.py), `folder_paths/` and an empty `server.py` first on sys.path, as a
    ComfyUI checkout beside the clone would be: Python imports them, and they hold nothing ComfyUI's do."""
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "utils.py").write_text("")
    (tmp_path / "folder_paths").mkdir()
    (tmp_path / "server.py").write_text("")
    names = ("comfy", "comfy.utils", "comfy.model_management", "comfy.model_patcher", "server", "folder_paths")
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in names:  # the imported stray modules go; monkeypatch puts back what was there before
        sys.modules.pop(name, None)


def test_glue_falls_back_to_its_stand_ins_when_comfy_lacks_what_it_needs(stray_comfy, monkeypatch):
    import torch

    import comfy.utils  # the stray one
    assert not hasattr(comfy.utils, "ProgressBar")
    monkeypatch.setenv("SSD_MODELS_DIR", str(stray_comfy / "models"))
    progress = progress_glue.Progress(10, "7")
    assert progress.bar is None and progress.server is None
    progress.update(5, 10)
    assert progress.send("ssd.grid", {}, force=True) is False
    assert devices_glue.torch_device("auto") == torch.device("cpu")
    assert devices_glue.processing_interrupted() is False
    assert devices_glue.interrupt_exception() is InterruptedError
    assert devices_glue.make_room(1000, torch.device("cuda")) is False
    assert devices_glue.free_vram(torch.device("cpu")) is None
    devices_glue.soft_empty_cache()
    assert folders_glue.folder_dirs(folders_glue.MODELS_KEY) == [str(stray_comfy / "models")]
    folders_glue.register_folders()
    routes_glue.register_routes()
    assert patcher_glue.manage(_Model(), "cpu") is None
    assert isinstance(patcher_glue.held_models(), list)


def test_node_tests_pass_with_a_comfy_folder_beside_the_clone(tmp_path):
    """The clone at X/clone with X/comfy/utils.py beside it (a ComfyUI checkout next to the clone): pytest must
    not put X on sys.path, and the sampler node's tests pass there."""
    clone = tmp_path / "clone"
    skip = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".hypothesis", "*.pyc")
    clone.mkdir()
    for name in ("__init__.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, clone / name)
    for name in ("nodes", "ssd_core"):
        shutil.copytree(ROOT / name, clone / name, ignore=skip)
    (clone / "tests").mkdir()
    for name in ("conftest.py", "comfy_stand_in.py", "test_nodes_sampler.py"):
        shutil.copy2(ROOT / "tests" / name, clone / "tests" / name)
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "utils.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SSD_MODELS_DIR", "SSD_HEADS_DIR")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_nodes_sampler.py",
         "-k", "test_sampler_grid_option or test_cancel_outside_comfyui"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert "2 passed" in proc.stdout, tail
