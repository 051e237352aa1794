"""The nodes' Python behaviour without ComfyUI: inputs -> outputs with the bundled model, errors,
model folders, progress / previews / live events / cancel through stand-ins for ComfyUI's modules."""

import importlib
import importlib.util
import json
import re
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

PACK = "comfyui_ssd_pack"


def load_pack():
    """The repo root imported as a package (as ComfyUI does), without ComfyUI."""
    if PACK not in sys.modules:
        spec = importlib.util.spec_from_file_location(PACK, ROOT / "__init__.py",
                                                      submodule_search_locations=[str(ROOT)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[PACK] = mod
        spec.loader.exec_module(mod)
    return importlib.import_module(PACK + ".nodes")


nodes = load_pack()
core = importlib.import_module(PACK + ".ssd_core")
comfy_glue = importlib.import_module(PACK + ".nodes._comfy")
sampler_mod = importlib.import_module(PACK + ".nodes.sampler")
trace_mod = importlib.import_module(PACK + ".nodes.trace")

REF_DIR = ROOT / "ssd_core" / "reference" / "model"


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
    (m,) = nodes.SSDLoadModel().load("reference", "auto", "cpu")
    return m


@pytest.fixture(scope="module")
def ref(ref_model):
    """The bundled model with its bundled heads, through the two loader nodes."""
    if heads_missing():
        pytest.skip(heads_missing())
    (mh,) = nodes.SSDLoadHeads().load(ref_model, "reference")
    return mh


SMALL = "12x12"  # a smaller grid for the checks that do not need the model's full one (CPU time)


def run(model, **kw):
    args = dict(prompt="face", negative_prompt="", seed=7, cfg=-1, temperature=-1, top_k=-1, top_p=-1,
                decoder="ssd", draft_rows=1, verify_rounds=2, grid="auto", unique_id="7")
    args.update(kw)
    return nodes.SSDSampler().sample(model, **args)


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


# ---- the package and its declarations -----------------------------------------------------------------------------
def test_root_import_outside_comfyui_exports_empty_mappings():
    root = sys.modules[PACK]
    assert "folder_paths" not in sys.modules
    assert root.NODE_CLASS_MAPPINGS == {} and root.NODE_DISPLAY_NAME_MAPPINGS == {}
    assert root.WEB_DIRECTORY == "./web"
    assert (ROOT / "web" / "ssd_grid.js").is_file()


def test_node_mappings_and_inputs():
    m = nodes.NODE_CLASS_MAPPINGS
    assert set(m) == {"SSDLoadModel", "SSDLoadHeads", "SSDSampler", "SSDTraceToImage"}
    assert nodes.NODE_DISPLAY_NAME_MAPPINGS == {
        "SSDLoadModel": "Load AR Image Model (SSD)", "SSDLoadHeads": "Load SSD Heads",
        "SSDSampler": "SSD Sampler", "SSDTraceToImage": "SSD Trace to Image"}
    for cls in m.values():
        assert callable(getattr(cls, cls.FUNCTION))
        assert cls.CATEGORY == "sampling/SSD"
    req = m["SSDSampler"].INPUT_TYPES()["required"]
    assert list(req) == ["ssd_model", "prompt", "negative_prompt", "seed", "cfg", "temperature", "top_k", "top_p",
                         "decoder", "draft_rows", "verify_rounds", "grid"]
    assert req["decoder"][0] == list(core.DECODERS) == ["ar", "ssd", "ssd-exact", "sjd", "zipar"]
    assert req["seed"][1]["control_after_generate"] is True
    assert m["SSDSampler"].RETURN_TYPES == ("IMAGE", "SSD_TRACE", "STRING")
    assert m["SSDSampler"].INPUT_TYPES()["hidden"] == {"unique_id": "UNIQUE_ID"}
    assert m["SSDLoadModel"].INPUT_TYPES()["required"]["model"][0][0] == "reference"
    assert m["SSDLoadHeads"].INPUT_TYPES()["required"]["heads"][0][:2] == ["reference", "none"]
    assert m["SSDTraceToImage"].INPUT_TYPES()["required"]["trace"] == ("SSD_TRACE",)


def test_palette_and_codes_match_the_widget():
    js = (ROOT / "web" / "ssd_grid_core.js").read_text()
    names = json.loads(re.search(r"STATUS_NAMES = (\[[^\]]*\])", js).group(1))
    assert tuple(names) == trace_mod.STATUS_NAMES
    block = re.search(r"PALETTE = \{(.*?)\}", js, re.S).group(1)
    js_pal = {k: v for k, v in re.findall(r"(\w+): \"(#[0-9a-f]{6})\"", block)}
    py_pal = {k: "#%02x%02x%02x" % v for k, v in trace_mod.PALETTE.items()}
    assert js_pal == py_pal


def test_pyproject_is_ready_for_the_registry():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    proj = data["project"]
    assert proj["name"] == "comfyui-ssd" and proj["version"] == "0.1.0" and proj["description"]
    assert "MIT" in json.dumps(proj["license"])
    deps = " ".join(proj["dependencies"])
    assert "transformers" in deps and "safetensors" in deps
    assert not any(d.split("=")[0].split(">")[0].split("<")[0].strip() in ("torch", "torchvision")
                   for d in proj["dependencies"]), "never pin torch"
    assert proj["urls"]["Repository"].startswith("https://")
    comfy = data["tool"]["comfy"]
    assert {"PublisherId", "DisplayName", "Icon", "requires-comfyui"} <= set(comfy)
    assert "web" not in comfy, "tool.comfy.web would load the widget twice (WEB_DIRECTORY already serves it)"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


# ---- model folders --------------------------------------------------------------------------------------------
def test_model_and_heads_lists_come_from_the_folders(tmp_path, monkeypatch):
    models, heads = tmp_path / "ssd_models", tmp_path / "ssd_heads"
    for d in ("Janus-Pro-7B", "org/Emu3-Gen", "empty", "Janus-Pro-7B/sub"):
        (models / d).mkdir(parents=True, exist_ok=True)
    (models / "Janus-Pro-7B" / "config.json").write_text("{}")
    (models / "Janus-Pro-7B" / "sub" / "config.json").write_text("{}")
    (models / "org" / "Emu3-Gen" / "config.json").write_text("{}")
    (heads / "sub").mkdir(parents=True)
    for f in ("janus.safetensors", "sub/emu3.safetensors", "notes.txt"):
        (heads / f).write_text("x")
    monkeypatch.setenv("SSD_MODELS_DIR", str(models))
    monkeypatch.setenv("SSD_HEADS_DIR", str(heads))
    assert comfy_glue.model_choices() == ["reference", "Janus-Pro-7B", "org/Emu3-Gen"]
    assert comfy_glue.heads_choices() == ["reference", "none", "janus.safetensors", "sub/emu3.safetensors"]
    assert nodes.SSDLoadModel.INPUT_TYPES()["required"]["model"][0] == comfy_glue.model_choices()
    assert comfy_glue.resolve_model("org/Emu3-Gen") == str(models / "org" / "Emu3-Gen")
    assert comfy_glue.resolve_heads("sub/emu3.safetensors") == str(heads / "sub" / "emu3.safetensors")
    with pytest.raises(FileNotFoundError, match="ssd_models.*config.json"):
        comfy_glue.resolve_model("Nope")
    with pytest.raises(FileNotFoundError, match="not found"):
        comfy_glue.resolve_model("../ssd_heads")
    with pytest.raises(FileNotFoundError, match="ssd_heads"):
        comfy_glue.resolve_heads("missing.safetensors")


def test_register_folders_keeps_paths_from_extra_model_paths(tmp_path, monkeypatch):
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(tmp_path / "models")
    fp.folder_names_and_paths = {"ssd_heads": (["/elsewhere/heads"], set())}
    fp.get_folder_paths = lambda key: fp.folder_names_and_paths[key][0][:]
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    comfy_glue.register_folders()
    comfy_glue.register_folders()  # twice is harmless
    assert fp.folder_names_and_paths["ssd_models"][0] == [str(tmp_path / "models" / "ssd_models")]
    assert fp.folder_names_and_paths["ssd_heads"][0] == [str(tmp_path / "models" / "ssd_heads"), "/elsewhere/heads"]
    assert ".safetensors" in fp.folder_names_and_paths["ssd_heads"][1]
    assert comfy_glue.folder_dirs("ssd_models") == [str(tmp_path / "models" / "ssd_models")]


def test_device_choice(fake_comfy):
    assert comfy_glue.torch_device("auto") == torch.device("cpu")
    assert comfy_glue.torch_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            comfy_glue.torch_device("cuda")


def test_make_room_asks_comfyui_to_unload_before_a_gpu_load(fake_comfy, tmp_path, monkeypatch):
    calls = []
    sys.modules["comfy.model_management"].free_memory = lambda n, dev, keep_loaded=(): calls.append((n, str(dev)))
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert comfy_glue.weights_bytes(str(tmp_path)) == 1000
    assert comfy_glue.weights_bytes("reference") == 0
    assert comfy_glue.make_room(1000, torch.device("cuda")) is True
    assert calls == [(1200, "cuda")]
    assert comfy_glue.make_room(1000, torch.device("cpu")) is False
    assert comfy_glue.make_room(0, torch.device("cuda")) is False


# ---- pure input handling ----------------------------------------------------------------------------------------
def test_grid_parsing():
    parse = sampler_mod.parse_grid
    assert parse("auto") is None and parse("") is None and parse(" AUTO ") is None
    assert parse("8x12") == (8, 12) and parse("16") == (16, 16) and parse("8 x 8") == (8, 8)
    for bad in ("big", "0x4", "4x"):
        with pytest.raises(core.SSDError, match="grid"):
            parse(bad)


def test_class_prompts():
    m = types.SimpleNamespace(class_names=["cat", "dog", "sea life", "sea bird"])
    r = sampler_mod.resolve_prompt
    assert r(m, "cat") == 0 and r(m, " DOG ") == 1 and r(m, "2") == 2 and r(m, "life") == 2
    with pytest.raises(core.SSDError, match="several classes"):
        r(m, "sea")
    with pytest.raises(core.SSDError, match="0: cat, 1: dog"):
        r(m, "unicorn")
    with pytest.raises(core.SSDError, match="out of range"):
        r(m, "9")
    with pytest.raises(core.SSDError, match="class name or index"):
        r(m, "  ")
    assert r(types.SimpleNamespace(class_names=None), "a fox") == "a fox"


# ---- the bundled model through the nodes ----------------------------------------------------------------------
def test_loaders(ref):
    assert isinstance(ref, nodes.SSDModel)
    assert ref.model.family == "llama-grid" and ref.heads is not None
    (bare,) = nodes.SSDLoadHeads().load(ref, "none")
    assert bare.heads is None and ref.heads is not None, "the cached input must not change"
    with pytest.raises(core.SSDError, match="Load AR Image Model"):
        nodes.SSDLoadHeads().load("not a model", "reference")


def test_sampler_ar_and_ssd(ref):
    H, W = ref.model.default_grid
    ar = run(ref, decoder="ar")
    ssd = run(ref, decoder="ssd")
    for out in (ar, ssd):
        image, trace, stats = out["result"]
        assert image.dtype == torch.float32 and image.dim() == 4 and image.shape[0] == 1 and image.shape[3] == 3
        assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
        assert trace["grid"] == [H, W] and len(trace["status"]) == H
        small = out["ui"]["ssd_trace"][0]
        assert len(small["status"]) == H * W and small["done"] is True
        assert len(small["step"]) == H * W and len(small["round"]) == H * W
        json.dumps(out["ui"], allow_nan=False)  # browsers refuse Infinity / NaN
        assert f"{H}x{W}" in stats and "steps" in stats and "seed 7" in stats
    assert ar["result"][1]["steps"] in (H * W - 1, H * W)  # the prefill may write the first token
    assert ssd["result"][1]["steps"] < ar["result"][1]["steps"]
    assert ssd["result"][1]["counts"].get("accepted", 0) > 0
    assert set(ar["ui"]["ssd_trace"][0]["status"]) == {"1"}


def test_sampler_exact_matches_ar_and_seed_matters(ref):
    ar = run(ref, decoder="ar", seed=11, grid=SMALL)
    exact = run(ref, decoder="ssd-exact", seed=11, draft_rows=2, grid=SMALL)
    assert exact["result"][1]["tokens"] == ar["result"][1]["tokens"]
    assert torch.equal(exact["result"][0], ar["result"][0])
    other = run(ref, decoder="ar", seed=12, grid=SMALL)
    assert other["result"][1]["tokens"] != ar["result"][1]["tokens"]


@pytest.mark.parametrize("decoder", ["sjd", "zipar"])
def test_sampler_peers_without_heads(ref_model, decoder):
    out = run(ref_model, decoder=decoder, grid=SMALL)
    assert out["result"][1]["decoder"] == decoder


def test_sampler_passes_settings_and_class_names(ref_model, monkeypatch):
    ref = ref_model
    seen = []
    real = core.generate

    def spy(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(sampler_mod.ssd_core, "generate", spy)
    run(ref, prompt="heart", cfg=-1, temperature=-1, top_k=-1, top_p=-1, grid=SMALL, decoder="ar")
    run(ref, decoder="sjd", prompt="1", cfg=2.5, temperature=0.0, top_k=5, top_p=0.9, draft_rows=2, verify_rounds=0, grid=SMALL)
    a, b = seen
    assert a["prompt"] == 1 and b["prompt"] == 1
    assert (a["cfg"], a["temperature"], a["top_k"], a["top_p"]) == (None, None, None, None)
    assert a["grid"] == b["grid"] == (12, 12)
    assert (b["cfg"], b["temperature"], b["top_k"], b["top_p"]) == (2.5, 0.0, 5, 0.9)
    assert (b["draft_rows"], b["verify_rounds"]) == (2, 0)
    assert callable(a["on_step"]) and callable(a["should_cancel"])
    big = run(ref, decoder="ar", grid="4x4", seed=0xFFFFFFFFFFFFFFFF)  # the widget's largest seed
    assert big["result"][1]["seed"] == 0xFFFFFFFFFFFFFFFF


def test_sampler_grid_option(ref_model):
    small = run(ref_model, decoder="zipar", grid="8x8")
    wide = run(ref_model, decoder="zipar", grid="8x12")
    assert small["result"][1]["grid"] == [8, 8] and wide["result"][1]["grid"] == [8, 12]
    assert small["result"][0].shape[1] == wide["result"][0].shape[1]
    assert small["result"][0].shape[2] * 12 == wide["result"][0].shape[2] * 8


@pytest.mark.parametrize("kw, match", [
    (dict(prompt="unicorn-class-that-does-not-exist"), "not a class"),
    (dict(prompt="999"), "out of range"),
    (dict(negative_prompt="blurry"), "no negative prompt"),
    (dict(decoder="beam"), "unknown decoder"),
    (dict(grid="huge"), "grid"),
    (dict(grid="4096x4096"), "grid"),
])
def test_sampler_errors_say_what_to_do(ref_model, kw, match):
    with pytest.raises(ValueError, match=match):
        run(ref_model, **{"decoder": "ar", **kw})


def test_sampler_needs_heads_for_ssd(ref_model):
    (bare,) = nodes.SSDLoadHeads().load(ref_model, "none")
    for decoder in ("ssd", "ssd-exact"):
        with pytest.raises(core.SSDError, match="Load SSD Heads"):
            run(bare, decoder=decoder)
    with pytest.raises(core.SSDError, match="Load AR Image Model"):
        run("nothing")


def test_bad_heads_file_is_refused(ref_model, tmp_path, monkeypatch):
    ref = ref_model
    (tmp_path / "broken.safetensors").write_bytes(b"this is not a safetensors file" * 10)
    monkeypatch.setenv("SSD_HEADS_DIR", str(tmp_path))
    with pytest.raises(ValueError):
        nodes.SSDLoadHeads().load(ref, "broken.safetensors")
    assert run(ref, decoder="ar", grid=SMALL)["result"][1]["steps"] > 0  # nothing else broke


def test_heads_of_another_model_are_refused(ref, tmp_path, monkeypatch):
    make_llama_grid = pytest.importorskip("tiny", reason="tests/tiny.py (the engine's tiny-model builders) is absent").make_llama_grid

    folder = make_llama_grid(tmp_path / "models" / "tiny", grid=(4, 5))
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path / "models"))
    (tiny,) = nodes.SSDLoadModel().load("tiny", "float32", "cpu")
    assert tiny.model.family == "llama-grid" and tiny.name == "tiny"
    with pytest.raises(core.SSDError):
        nodes.SSDLoadHeads().load(tiny, "reference")
    out = run(nodes.SSDLoadHeads().load(tiny, "none")[0], prompt="class1", decoder="ar")
    assert out["result"][1]["grid"] == [4, 5]
    # no pixel decoder in this model: the IMAGE is the token grid, and the stats say so
    assert out["result"][0].shape == (1, 4 * 102, 5 * 102, 3) and "no pixel decoder" in out["result"][2]
    assert folder.is_dir()


def test_progress_previews_and_live_events(ref_model, fake_comfy, monkeypatch):
    ref = ref_model
    monkeypatch.setattr(sampler_mod, "PREVIEW_INTERVAL_S", 0.0)
    H, W = 12, 12
    out = run(ref, decoder="zipar", unique_id="12", grid=SMALL)
    values = [v for v, _ in fake_comfy.progress]
    assert values == sorted(values) and values[-1] == H * W
    assert all(t == H * W for _, t in fake_comfy.progress)
    assert fake_comfy.previews, "no preview image"
    kind, img, size = fake_comfy.previews[-1]
    assert kind == "JPEG" and size == 512
    final_img = out["result"][0]
    assert img.size == (final_img.shape[2], final_img.shape[1])
    grid_events = [d for e, d, sid in fake_comfy.events if e == "ssd.grid"]
    assert all(sid == "client-1" for _, _, sid in fake_comfy.events)
    assert len(grid_events) >= 2 and all(d["node"] == "12" for d in grid_events)
    assert grid_events[0]["done"] is False and len(grid_events[0]["status"]) == H * W
    assert grid_events[-1]["done"] is True and grid_events[-1] == {**out["ui"]["ssd_trace"][0], "node": "12"}


def test_cancel_raises_comfy_interrupt_and_model_stays_usable(ref_model, fake_comfy):
    ref = ref_model
    fake_comfy.interrupt_after = 3
    with pytest.raises(fake_comfy.InterruptProcessingException):
        run(ref, decoder="ar")
    fake_comfy.interrupt_after = None
    assert run(ref, decoder="ar", grid=SMALL)["result"][1]["steps"] > 0


def test_cancel_outside_comfyui(ref_model, monkeypatch):
    ref = ref_model
    monkeypatch.setattr(comfy_glue, "processing_interrupted", lambda: True)
    with pytest.raises(InterruptedError):
        run(ref, decoder="ar")


# ---- trace to image ------------------------------------------------------------------------------------------
def fake_trace():
    return {"decoder": "ssd", "grid": [2, 3], "steps": 2,
            "status": [["ar", "accepted", "corrected"], ["forced", "accepted", "pending"]],
            "step": [[1, 2, 2], [2, 2, -1]], "round": [[0, 0, 1], [0, 0, -1]], "counts": {}, "seed": 0}


def test_trace_to_image_colours():
    (img,) = nodes.SSDTraceToImage().render(fake_trace(), 10, "status", False)
    assert img.shape == (1, 20, 30, 3) and img.dtype == torch.float32
    for (r, c), name in {(0, 0): "ar", (0, 1): "accepted", (0, 2): "corrected", (1, 0): "forced",
                         (1, 2): "pending"}.items():
        px = (img[0, r * 10 + 5, c * 10 + 5] * 255).round().tolist()
        assert px == list(trace_mod.PALETTE[name]), name
    (step,) = nodes.SSDTraceToImage().render(fake_trace(), 4, "step", True)
    assert step.shape == (1, 8, 12, 3)
    (rnd,) = nodes.SSDTraceToImage().render(fake_trace(), 1, "round", True)
    assert rnd.shape == (1, 2, 3, 3)


def test_trace_to_image_errors():
    with pytest.raises(ValueError, match="SSD Sampler"):
        nodes.SSDTraceToImage().render({"nope": 1}, 8, "status", True)
    bad = fake_trace()
    bad["status"] = bad["status"][:1]
    with pytest.raises(ValueError, match="damaged"):
        nodes.SSDTraceToImage().render(bad, 8, "status", True)
    with pytest.raises(ValueError, match="color_by"):
        nodes.SSDTraceToImage().render(fake_trace(), 8, "rainbow", True)


def test_trace_to_image_of_a_real_run(ref):
    trace = run(ref, decoder="ssd", grid=SMALL)["result"][1]
    H, W = trace["grid"]
    (img,) = nodes.SSDTraceToImage().render(trace, 8, "status", True)
    assert img.shape == (1, H * 8, W * 8, 3)
    colours = {tuple((img[0, r * 8 + 4, c * 8 + 4] * 255).round().int().tolist()) for r in range(H) for c in range(W)}
    assert tuple(trace_mod.PALETTE["accepted"]) in colours


def test_compact_trace_is_strict_json():
    t = fake_trace()
    t.update(nll=float("inf"), wall_s=float("nan"), tokens_per_step=3.0)
    small = trace_mod.compact(t)
    json.dumps(small, allow_nan=False)
    assert small["nll"] is None and small["wall_s"] is None and small["tokens_per_step"] == 3.0
    assert "nll inf" in trace_mod.stats_text(t)
    t.update(nll=None, nll_full=2.5)  # as the engine writes it: null, with the untruncated figure
    assert "nll inf (untruncated 2.500)" in trace_mod.stats_text(t)


def test_stats_text():
    t = fake_trace()
    t.update(wall_s=1.5, nll=2.25, counts={"accepted": 2, "ar": 1}, seed=3)
    s = trace_mod.stats_text(t)
    assert s.startswith("ssd: 2x3 = 6 tokens in 2 steps") and "6/2 = 3.00 tokens per step" in s
    assert "ar 1, accepted 2" in s and "nll 2.250" in s and "seed 3" in s


# ---- the real families (tiny random models built like the real ones) ----------------------------------------------
@pytest.mark.parametrize("family", ["janus", "emu3", "lumina"])
def test_text_families_through_the_nodes(family, tmp_path, monkeypatch):
    tf = pytest.importorskip("tiny_families", reason="tests/tiny_families.py (the engine's builders) is absent")

    folder = tmp_path / "ssd_models" / f"tiny-{family}"
    {"janus": tf.build_janus, "emu3": tf.build_emu3, "lumina": tf.build_lumina}[family](folder)
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path / "ssd_models"))
    assert f"tiny-{family}" in nodes.SSDLoadModel.INPUT_TYPES()["required"]["model"][0]
    (m,) = nodes.SSDLoadModel().load(f"tiny-{family}", "float32", "cpu")
    assert m.model.family == family and m.model.text_prompts and m.model.class_names is None
    negative = "blurry" if m.model.negative_prompts else ""
    # zipar: no heads needed and few steps (these tiny models are slow enough on a busy CPU)
    out = run(m, prompt="a red fox in the snow", negative_prompt=negative, decoder="zipar", seed=3)
    image, trace, stats = out["result"]
    H, W = trace["grid"]
    assert trace["decoder"] == "zipar" and f"{H}x{W}" in stats
    assert image.shape[0] == 1 and image.shape[3] == 3 and image.dtype == torch.float32
    assert len(out["ui"]["ssd_trace"][0]["status"]) == H * W
    if not m.model.negative_prompts:
        with pytest.raises(core.SSDError, match="no negative prompt"):
            run(m, prompt="a fox", negative_prompt="blurry", decoder="zipar")
