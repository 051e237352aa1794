"""The pack's declarations without ComfyUI: node mappings and inputs (their limits are the engine's), the
widget's palette, pyproject, and pure input handling (grid text, class prompts)."""
import importlib
import json
import re
import sys
import tomllib
import types

import pytest

from conftest import PACK, ROOT, load_pack, pack_module

nodes = load_pack()
core = pack_module("ssd_core")
sampler_mod = pack_module("nodes.sampler")
core_trace = pack_module("ssd_core.trace")


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
    assert list(req) == ["ssd_model", "prompt", "seed", "cfg", "temperature", "top_k", "top_p",
                         "decoder", "draft_rows", "verify_rounds", "grid"]
    opt = m["SSDSampler"].INPUT_TYPES()["optional"]
    assert list(opt) == ["negative_prompt", "batch_size", "min_p"]  # new widgets go last: saved workflows keep theirs
    assert opt["min_p"][1]["default"] == -1 and opt["min_p"][1]["max"] < 1  # -1 = the model's; the engine refuses 1
    assert req["decoder"][0] == list(core.DECODERS) == ["ar", "ssd", "ssd-exact", "sjd", "zipar"]
    assert req["decoder"][1]["default"] == "ssd-exact"
    assert req["seed"][1]["control_after_generate"] is True
    # the negative prompt's tooltip names exactly the families that take one
    families = pack_module("ssd_core.families")
    tip = m["SSDSampler"].INPUT_TYPES()["optional"]["negative_prompt"][1]["tooltip"]
    for name in families.FAMILIES:
        assert (name in tip) == families.family_class(name).negative_prompts, name
    # the widgets' limits are the engine's: the largest value is accepted, one more is refused
    for name in ("draft_rows", "verify_rounds"):
        top = req[name][1]["max"]
        make_policy = importlib.import_module(PACK + ".ssd_core.decoders").make_policy
        make_policy("ssd", **{name: top})
        with pytest.raises(core.SSDError, match=name):
            make_policy("ssd", **{name: top + 1})
    assert m["SSDSampler"].RETURN_TYPES == ("IMAGE", "SSD_TRACE", "STRING")
    assert m["SSDSampler"].INPUT_TYPES()["hidden"] == {"unique_id": "UNIQUE_ID"}
    assert m["SSDLoadModel"].INPUT_TYPES()["required"]["model"][0][0] == "reference"
    assert m["SSDLoadHeads"].INPUT_TYPES()["required"]["heads"][0][:2] == ["reference", "none"]
    assert m["SSDTraceToImage"].INPUT_TYPES()["required"]["trace"] == ("SSD_TRACE",)


def test_palette_and_codes_match_the_widget():
    js = (ROOT / "web" / "ssd_grid_core.js").read_text()
    names = json.loads(re.search(r"STATUS_NAMES = (\[[^\]]*\])", js).group(1))
    assert tuple(names) == core_trace.STATUSES
    block = re.search(r"PALETTE = \{(.*?)\}", js, re.S).group(1)
    js_pal = {k: v for k, v in re.findall(r"(\w+): \"(#[0-9a-f]{6})\"", block)}
    py_pal = {k: "#%02x%02x%02x" % v for k, v in core_trace.STATUS_COLORS.items()}
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



# ---- pure input handling ----------------------------------------------------------------------------------------
def test_grid_parsing():
    parse = core_trace.parse_grid
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
