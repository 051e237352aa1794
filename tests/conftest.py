"""Shared by the tests: the import path, one thread, the pack imported as ComfyUI does, the bundled model
through the nodes and through the API, stand-ins for ComfyUI's modules (comfy_api.latest: comfy_stand_in.py), and the
family test modules' model fixtures."""
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

import comfy_stand_in  # noqa: E402

# The nodes import ComfyUI's V3 schema (comfy_api.latest): without ComfyUI, the stand-in's, installed before any
# test imports them.
comfy_stand_in.install()

# Tiny models run fastest on one thread, and a busy machine makes more threads stall each other.
torch.set_num_threads(1)

PACK = "comfyui_ssd_pack"
REF_DIR = ROOT / "ssd_core" / "reference" / "model"
SMALL = "12x12"  # a smaller grid for the node checks that do not need the model's full one (CPU time)


# ---- the pack as ComfyUI imports it ---------------------------------------------------------------------------
class _RootIsAFolder:
    """pytest collects a folder holding an __init__.py as a package and imports it with the folder ABOVE it first
    on sys.path: the repo root is the pack, so the clone's siblings (a ComfyUI checkout's `comfy` next to it,
    say) would become importable and shadow the stand-ins. The root is collected as a plain folder instead;
    the pack itself is imported by load_pack, from its own folder only."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path, parent):
        if Path(path).resolve() == ROOT:
            return pytest.Dir.from_parent(parent, path=Path(path))
        return None


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("ssd-root-is-a-folder"):
        config.pluginmanager.register(_RootIsAFolder(), "ssd-root-is-a-folder")


def load_pack(name=PACK):
    """The repo root imported as a package (as ComfyUI does), without ComfyUI; returns its `nodes` module."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "__init__.py",
                                                      submodule_search_locations=[str(ROOT)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return importlib.import_module(name + ".nodes")


def pack_module(dotted: str):
    """A module of the pack imported as ComfyUI does, e.g. pack_module("ssd_core.trace")."""
    load_pack()
    return importlib.import_module(f"{PACK}.{dotted}")


def model_missing():
    if not (REF_DIR / "config.json").is_file():
        return f"the bundled reference model is absent ({REF_DIR}/config.json)"
    if not any(REF_DIR.glob("*.safetensors")) and not any(REF_DIR.glob("*.bin")):
        return f"the bundled reference model's weights are absent from {REF_DIR}"
    return None


def heads_missing():
    if not (REF_DIR / "heads.safetensors").is_file():
        return f"the bundled heads are absent ({REF_DIR}/heads.safetensors)"
    return None


@pytest.fixture(scope="module")
def ref_model():
    """The bundled model through the loader node, without heads (ar, sjd, zipar)."""
    if model_missing():
        pytest.skip(model_missing())
    (m,) = load_pack().SSDLoadModel().load("reference", "auto", "cpu")
    return m


@pytest.fixture(scope="module")
def ref(ref_model):
    """The bundled model with its bundled heads, through the two loader nodes."""
    if heads_missing():
        pytest.skip(heads_missing())
    (mh,) = load_pack().SSDLoadHeads().load(ref_model, "reference")
    return mh


@pytest.fixture(scope="module")
def bundled():
    """The bundled model and its heads through ssd_core's API, as (model, heads): loaded once per test module."""
    import ssd_core

    model = ssd_core.load_model("reference")
    return model, ssd_core.load_heads("reference", model)


def run(model, **kw):
    """The SSD Sampler node on `model` with the node's defaults, overridden by kw."""
    args = dict(prompt="face", negative_prompt="", seed=7, cfg=-1, temperature=-1, top_k=-1, top_p=-1,
                decoder="ssd", draft_rows=1, verify_rounds=-1, grid="auto", unique_id="7")
    args.update(kw)
    return load_pack().SSDSampler().sample(model, **args)


def ar_through(model, cell, **kw):
    """ar's tokens [H, W] through `cell` (row, column) in reading order, -1 after it: the run is cancelled once that
    cell is final (should_cancel, as ComfyUI's cancel button does). ar makes one cell a step, each final when made,
    so these are the whole run's tokens there."""
    import ssd_core
    from ssd_core.errors import Cancelled

    seen = {}

    def done():
        t = seen.get("tokens")
        return t is not None and bool((t.flatten()[:cell[0] * t.shape[1] + cell[1] + 1] >= 0).all())

    try:
        ssd_core.generate(model, None, decoder="ar", decode_pixels=False, score=False, should_cancel=done,
                          on_step=lambda p: seen.__setitem__("tokens", p.tokens.clone()), **kw)
    except Cancelled:
        pass
    assert done()
    return seen["tokens"]


# ---- stand-ins for ComfyUI's modules ------------------------------------------------------------------------------
class FakeComfy:
    def __init__(self):
        self.progress, self.previews, self.events = [], [], []
        self.interrupt_after = None  # processing_interrupted() turns True after this many calls
        self.polls = 0


@pytest.fixture
def fake_comfy(monkeypatch):
    rec = FakeComfy()
    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    mm = types.ModuleType("comfy.model_management")

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            rec.progress.append((value, total))
            if preview is not None:
                rec.previews.append(preview)

    class InterruptProcessingException(Exception):
        pass

    def processing_interrupted():
        rec.polls += 1
        return rec.interrupt_after is not None and rec.polls > rec.interrupt_after

    utils.ProgressBar = ProgressBar
    mm.InterruptProcessingException = InterruptProcessingException
    mm.processing_interrupted = processing_interrupted
    mm.get_torch_device = lambda: torch.device("cpu")
    mm.soft_empty_cache = lambda: None
    comfy.utils, comfy.model_management = utils, mm
    server = types.ModuleType("server")

    class Instance:
        client_id = "client-1"

        def send_sync(self, event, data, sid=None):
            json.dumps(data)  # must be JSON-able
            rec.events.append((event, data, sid))

    server.PromptServer = types.SimpleNamespace(instance=Instance())
    for name, mod in (("comfy", comfy), ("comfy.utils", utils), ("comfy.model_management", mm), ("server", server)):
        monkeypatch.setitem(sys.modules, name, mod)
    rec.InterruptProcessingException = InterruptProcessingException
    return rec


# ---- the family test modules: a tiny model folder built by the module's BUILD(folder) -----------------------
@pytest.fixture(scope="module")
def folder(request, tmp_path_factory):
    return request.module.BUILD(tmp_path_factory.mktemp(request.module.__name__) / "model")


@pytest.fixture(scope="module")
def model(folder):
    import ssd_core

    return ssd_core.load_model(folder, dtype="fp32")


@pytest.fixture
def keep_dir(tmp_path, monkeypatch):
    """The temp folder write_or_keep keeps a failed write's result in (this test's own)."""
    import tempfile

    keep = tmp_path / "kept"
    keep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(keep))
    return keep


def rewrite_safetensors(src, dst=None, meta=None, tensors=None):
    """A safetensors file written again (to dst, else over src) with some metadata entries and tensors changed
    (a tensor None: removed) -> the path written."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), "pt") as f:
        old_meta, old = dict(f.metadata() or {}), {k: f.get_tensor(k) for k in f.keys()}
    old_meta.update(meta or {})
    for key, value in (tensors or {}).items():
        if value is None:
            old.pop(key)
        else:
            old[key] = value
    save_file(old, str(dst or src), metadata=old_meta)
    return dst or src


# ---- the costliest test files first (make test's xdist workers, with --no-loadscope-reorder) -----------------------
_COSTS_FILE = ROOT / "tests" / "costs.json"  # seconds per file: tools/test_costs.py writes it
COSTS = json.loads(_COSTS_FILE.read_text()) if _COSTS_FILE.is_file() else {}  # a copy without it: collection order
NEW_FILE_COST = 10.0  # a file the table does not know yet


def pytest_collection_modifyitems(session, config, items):
    """Files in falling cost order (the order within a file kept): with `--dist loadfile --no-loadscope-reorder`
    the workers take the longest files first, so no long file starts last and ends alone."""
    def cost(item):
        path = Path(item.path).resolve()
        return COSTS.get(path.relative_to(ROOT).as_posix(), NEW_FILE_COST) if path.is_relative_to(ROOT) else 0.0

    items.sort(key=lambda item: -cost(item))  # stable: a file's tests stay together and in order
