"""The nodes' glue to ComfyUI through stand-ins for its modules: model folders, device choice, making room."""
import json
import sys
import types

import pytest
import torch

from conftest import load_pack, pack_module

nodes = load_pack()
devices_glue = pack_module("nodes._devices")
folders_glue = pack_module("nodes._folders")


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
    assert folders_glue.model_choices() == ["reference", "reference-48", "Janus-Pro-7B", "org/Emu3-Gen"]
    assert folders_glue.heads_choices() == ["reference", "reference-48", "none", "janus.safetensors",
                                            "sub/emu3.safetensors"]
    assert folders_glue.resolve_model("reference-48") == "reference-48"  # a bundled name stays a name
    assert nodes.SSDLoadModel.INPUT_TYPES()["required"]["model"][1]["options"] == folders_glue.model_choices()
    # a folder that is not there is refused before the run (ComfyUI calls validate_inputs), by name
    assert nodes.SSDLoadModel.validate_inputs(model="org/Emu3-Gen") is True
    msg = nodes.SSDLoadModel.validate_inputs(model="Janus-Pro-7B-missing")
    assert msg.startswith("model: 'Janus-Pro-7B-missing' is not in the list") and "org/Emu3-Gen" in msg
    assert nodes.SSDLoadHeads.validate_inputs(heads="sub/emu3.safetensors") is True
    assert "not in the list" in nodes.SSDLoadHeads.validate_inputs(heads="gone.safetensors")
    assert folders_glue.resolve_model("org/Emu3-Gen") == str(models / "org" / "Emu3-Gen")
    assert folders_glue.resolve_heads("sub/emu3.safetensors") == str(heads / "sub" / "emu3.safetensors")
    with pytest.raises(FileNotFoundError, match="ssd_models.*config.json"):
        folders_glue.resolve_model("Nope")
    with pytest.raises(FileNotFoundError, match="not found"):
        folders_glue.resolve_model("../ssd_heads")
    with pytest.raises(FileNotFoundError, match="ssd_heads"):
        folders_glue.resolve_heads("missing.safetensors")


def test_register_folders_keeps_paths_from_extra_model_paths(tmp_path, monkeypatch):
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(tmp_path / "models")
    fp.folder_names_and_paths = {"ssd_heads": (["/elsewhere/heads"], set())}
    fp.get_folder_paths = lambda key: fp.folder_names_and_paths[key][0][:]
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    folders_glue.register_folders()
    folders_glue.register_folders()  # twice is harmless
    assert fp.folder_names_and_paths["ssd_models"][0] == [str(tmp_path / "models" / "ssd_models")]
    assert fp.folder_names_and_paths["ssd_heads"][0] == [str(tmp_path / "models" / "ssd_heads"), "/elsewhere/heads"]
    assert ".safetensors" in fp.folder_names_and_paths["ssd_heads"][1]
    assert folders_glue.folder_dirs("ssd_models") == [str(tmp_path / "models" / "ssd_models")]


def test_device_choice(fake_comfy):
    assert devices_glue.torch_device("auto") == torch.device("cpu")
    assert devices_glue.torch_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            devices_glue.torch_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="no Apple GPU"):
            devices_glue.torch_device("mps")
    else:
        assert devices_glue.torch_device("mps") == torch.device("mps")
    with pytest.raises(ValueError, match="pick auto, cpu, cuda or mps"):
        devices_glue.torch_device("tpu")


def test_make_room_asks_comfyui_to_unload_before_a_gpu_load(fake_comfy, tmp_path, monkeypatch):
    calls = []
    sys.modules["comfy.model_management"].free_memory = lambda n, dev, keep_loaded=(): calls.append((n, str(dev)))
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert folders_glue.weights_bytes(str(tmp_path)) == 1000
    assert folders_glue.weights_bytes("reference") == 0
    assert devices_glue.make_room(1000, torch.device("cuda")) is True
    assert calls == [(1200, "cuda")]
    assert devices_glue.make_room(1000, torch.device("cpu")) is False
    assert devices_glue.make_room(0, torch.device("cuda")) is False


def test_the_loader_keeps_ssd_exacts_costs_in_comfyuis_user_directory(tmp_path, monkeypatch):
    """In ComfyUI the measured costs behind ssd-exact's pick go to the user directory's ssd/calibration.json, so a
    restart picks the same rows without measuring; a file named by SSD_CALIBRATION_FILE is the user's choice."""
    calibrate = pack_module("ssd_core.calibrate")
    fp = types.ModuleType("folder_paths")
    fp.get_user_directory = lambda: str(tmp_path / "user")
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    monkeypatch.delenv("SSD_CALIBRATION_FILE", raising=False)
    (m,) = nodes.SSDLoadModel().load("reference", "float32", "cpu")
    cal = calibrate.calibration_of(m.model)  # shared with every load of the bundled model in this process
    try:
        assert cal.file() == str(tmp_path / "user" / "ssd" / "calibration.json")
        key = calibrate._key(m.model, m.model.layout((12, 12)), 2)
        cal.costs.pop(key, None)  # measured now, whatever ran before in this process
        out = nodes.SSDSampler().sample(m, prompt="face", seed=1, decoder="ssd-exact", draft_rows=0,
                                        grid="12x12 (48x48 px, 1:1) reference")
        assert out["result"][1]["settings"]["draft_rows_picked"] >= 1
        assert key in json.loads((tmp_path / "user" / "ssd" / "calibration.json").read_text())
        monkeypatch.setenv("SSD_CALIBRATION_FILE", str(tmp_path / "mine.json"))
        assert folders_glue.calibration_file() is None  # the user's own file wins
    finally:
        cal.path = None  # the next test's loads get ComfyUI's file (or none) again


# ---- the template browser's order ------------------------------------------------------------------------------
def test_the_template_list_puts_the_packs_templates_in_name_order():
    """GET /workflow_templates lists each pack's templates in directory order (ComfyUI globs them; Janus-Pro 7B came
    first on this machine's ext4). The pack's middleware sorts its own list by name, ignoring case, and leaves
    every other pack's list and every other route as they were (the real server: tests/test_comfyui.py)."""
    import asyncio

    routes_glue = pack_module("nodes._routes")

    class Response:  # aiohttp.web.Response's part the middleware reads
        def __init__(self, data, content_type="application/json"):
            self.body, self.content_type = json.dumps(data).encode(), content_type

    web = types.SimpleNamespace(middleware=lambda f: f, json_response=Response)
    order = routes_glue.own_templates_in_order(web)
    ours = routes_glue.PACK_FOLDER
    listed = {ours: ["SSD Janus-Pro 7B - ar vs ssd-exact", "SSD Bundled 24x24 model - ar vs ssd-exact vs ssd",
                     "SSD bundled 48x48", "SSD Emu3 - ar vs ssd-exact"], "other-pack": ["b", "a"]}

    def get(path, data=listed, method="GET"):
        request = types.SimpleNamespace(method=method, path=path)

        async def handler(_):
            return Response(data)
        return json.loads(asyncio.run(order(request, handler)).body)

    for path in ("/workflow_templates", "/api/workflow_templates"):
        assert get(path) == {ours: ["SSD Bundled 24x24 model - ar vs ssd-exact vs ssd", "SSD bundled 48x48",
                                    "SSD Emu3 - ar vs ssd-exact", "SSD Janus-Pro 7B - ar vs ssd-exact"],
                             "other-pack": ["b", "a"]}
    assert get("/api/other") == listed and get("/workflow_templates", method="POST") == listed
    assert get("/workflow_templates", {"other-pack": ["b", "a"]}) == {"other-pack": ["b", "a"]}
