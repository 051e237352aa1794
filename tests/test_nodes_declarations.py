"""The pack's declarations without ComfyUI: node mappings and inputs (their limits are the engine's), the
widget's palette, pyproject, and pure input handling (grid text, class prompts)."""
import importlib
import json
import re
import sys
import tomllib

import pytest

from conftest import PACK, ROOT, load_pack, pack_module

nodes = load_pack()
core = pack_module("ssd_core")
core_trace = pack_module("ssd_core.trace")
grid_text = pack_module("ssd_core.grid_text")


# ---- the package and its declarations -----------------------------------------------------------------------------
def test_root_import_outside_comfyui_exports_no_nodes():
    root = sys.modules[PACK]
    assert "folder_paths" not in sys.modules
    # inside ComfyUI the root exports comfy_entrypoint (the V3 schema) and never the classic mappings: ComfyUI
    # 0.3.64 reads NODE_CLASS_MAPPINGS first and would never call comfy_entrypoint
    assert not hasattr(root, "comfy_entrypoint") and not hasattr(root, "NODE_CLASS_MAPPINGS")
    assert root.WEB_DIRECTORY == "./web"
    assert (ROOT / "web" / "ssd_grid.js").is_file()
    text = (ROOT / "__init__.py").read_text()
    assert "from .nodes import comfy_entrypoint" in text and "NODE_CLASS_MAPPINGS =" not in text
    assert nodes.io is sys.modules["comfy_api.latest"].io  # the V3 names: the stand-in here (conftest installs it)


def pack_in_fresh_interpreter(tmp_path, code, comfyui=False):
    """`code` run in a fresh interpreter that has only a folder holding the pack (as ComfyUI-SSD) and, with
    comfyui, ComfyUI's folder_paths module on its path (no comfy_api: a ComfyUI older than the V3 schema)."""
    import subprocess

    (tmp_path / "ComfyUI-SSD").symlink_to(ROOT, target_is_directory=True)
    if comfyui:
        (tmp_path / "folder_paths.py").write_text("models_dir = '.'\nfolder_names_and_paths = {}\n"
                                                  "def get_folder_paths(key):\n    return []\n")
    code = f"import importlib, sys; sys.path.insert(0, {str(tmp_path)!r}); " + code
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def test_root_import_outside_comfyui_needs_no_comfy_api(tmp_path):
    """A plain import of the pack outside ComfyUI (no folder_paths) imports neither the nodes nor comfy_api."""
    out = pack_in_fresh_interpreter(tmp_path, "root = importlib.import_module('ComfyUI-SSD'); "
                                    "print(root.__all__, sorted(m for m in sys.modules if 'comfy' in m.lower()))")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['WEB_DIRECTORY']", "['ComfyUI-SSD']"], out.stdout


def test_a_comfyui_without_the_v3_schema_fails_saying_which_is_needed(tmp_path):
    out = pack_in_fresh_interpreter(tmp_path, "importlib.import_module('ComfyUI-SSD')", comfyui=True)
    minimum = pack_module("nodes._io").MIN_COMFYUI
    assert out.returncode == 1 and "ImportError" in out.stderr, out.stderr[-2000:]
    assert f"ComfyUI-SSD needs ComfyUI {minimum} or newer" in out.stderr and "comfy_api.latest" in out.stderr


def test_the_extension_lists_the_four_v3_nodes():
    import asyncio

    ext = asyncio.run(nodes.comfy_entrypoint())
    assert isinstance(ext, nodes.SSDExtension)
    listed = asyncio.run(ext.get_node_list())
    assert [c.define_schema().node_id for c in listed] == ["SSDLoadModel", "SSDLoadHeads", "SSDSampler",
                                                           "SSDTraceToImage"]
    for cls in listed:
        assert issubclass(cls, nodes.io.ComfyNode)
        assert "execute" in cls.__dict__ and "define_schema" in cls.__dict__
    # the custom link types are declared once, and every node uses those objects
    types_mod = pack_module("nodes.types")
    assert types_mod.SSD_MODEL.io_type == "SSD_MODEL" and types_mod.SSD_TRACE.io_type == "SSD_TRACE"
    for mod in ("nodes.loaders", "nodes.sampler", "nodes.trace"):
        text = (ROOT / (mod.replace(".", "/") + ".py")).read_text()
        assert 'io.Custom(' not in text, f"{mod} declares its own link type"


def combo(spec):
    """The entries of a list input as the V3 schema declares it: ("COMBO", {"options": [...], ...})."""
    assert spec[0] == "COMBO", spec
    return spec[1]["options"]


def test_the_widget_shows_auto_for_the_sampler_s_own_auto_values():
    """web/ssd_grid_core.js AUTO_VALUES (the canvas writes "auto" for them) are the sampler's defaults that mean
    "decided for you", each the lowest value its widget takes, and every tooltip says what the value means."""
    text = (ROOT / "web" / "ssd_grid_core.js").read_text()
    body = re.search(r"AUTO_VALUES = Object.freeze\(\{(.*?)\}\)", text, re.S).group(1)
    shown = {k: int(v) for k, v in re.findall(r"(\w+): (-?\d+)", body)}
    info = nodes.NODES["SSDSampler"].GET_NODE_INFO_V1()["input"]
    widgets = {**info["required"], **info["optional"]}
    sampler = pack_module("nodes.sampler")
    assert shown == {**{k: sampler.AUTO for k in ("cfg", "temperature", "top_k", "top_p", "min_p", "verify_rounds")},
                     "draft_rows": sampler.DRAFT_ROWS.default}
    for name, value in shown.items():
        spec = widgets[name][1]
        assert spec["default"] == value and spec["min"] == value, name
        assert f"{value} (shown as auto) = " in spec["tooltip"], name


def test_node_mappings_and_inputs():
    m = nodes.NODES
    assert set(m) == {"SSDLoadModel", "SSDLoadHeads", "SSDSampler", "SSDTraceToImage"}
    assert {k: c.define_schema().display_name for k, c in m.items()} == {
        "SSDLoadModel": "Load AR Image Model (SSD)", "SSDLoadHeads": "Load SSD Heads",
        "SSDSampler": "SSD Sampler", "SSDTraceToImage": "SSD Trace to Image"}
    for cls in m.values():
        assert cls.define_schema().category == "sampling/SSD"
    info = m["SSDSampler"].GET_NODE_INFO_V1()
    req = info["input"]["required"]
    assert list(req) == ["ssd_model", "prompt", "seed", "cfg", "temperature", "top_k", "top_p",
                         "decoder", "draft_rows", "verify_rounds", "grid"]
    opt = info["input"]["optional"]
    assert list(opt) == ["negative_prompt", "batch_size", "min_p", "official_suffix"]  # new widgets go last: saved workflows keep theirs
    assert opt["min_p"][1]["default"] == -1 and opt["min_p"][1]["max"] < 1  # -1 = the model's; the engine refuses 1
    assert combo(req["decoder"]) == list(core.DECODERS) == ["ar", "ssd", "ssd-exact", "sjd", "zipar", "scd",
                                                            "sjd-pac", "gsd", "flashar"]
    assert req["decoder"][1]["default"] == "ssd-exact"
    assert req["seed"][1]["control_after_generate"] is True and req["seed"][1]["max"] == 2**64 - 1
    assert req["prompt"] == ("STRING", {"tooltip": req["prompt"][1]["tooltip"], "multiline": True, "default": "face"})
    # the negative prompt's tooltip names exactly the families that take one
    families = pack_module("ssd_core.families")
    tip = opt["negative_prompt"][1]["tooltip"]
    for name in families.FAMILIES:
        assert (name in tip) == families.family_class(name).negative_prompts, name
    # the widgets' limits are the engine's: the largest value is accepted, one more is refused
    for name in ("draft_rows", "verify_rounds"):
        top = req[name][1]["max"]
        make_policy = importlib.import_module(PACK + ".ssd_core.decoders").make_policy
        make_policy("ssd", **{name: top})
        with pytest.raises(core.SSDError, match=name):
            make_policy("ssd", **{name: top + 1})
    api = importlib.import_module(PACK + ".ssd_core.api")
    top = opt["batch_size"][1]["max"]
    assert top == api.MAX_BATCH  # one batch limit: the API's refuses one more
    with pytest.raises(core.SSDError, match="batch_size"):
        api.generate_batch(None, None, prompts=["face"] * (top + 1), seeds=list(range(top + 1)))
    assert info["output"] == ["IMAGE", "SSD_TRACE", "STRING"] and info["output_name"] == ["image", "trace", "stats"]
    assert info["output_node"] is True and all(info["output_tooltips"])
    # the node id for the widget's events (the prompt and png info come with every output node)
    assert info["input"]["hidden"] == {"unique_id": ("UNIQUE_ID",), "prompt": ("PROMPT",),
                                       "extra_pnginfo": ("EXTRA_PNGINFO",)}
    load = m["SSDLoadModel"].GET_NODE_INFO_V1()
    assert combo(load["input"]["required"]["model"])[:2] == ["reference", "reference-48"]
    assert combo(load["input"]["required"]["device"]) == ["auto", "cpu", "cuda", "mps"]
    assert list(load["input"]["optional"]) == ["quantization", "offload", "compile"]
    assert load["output"] == ["SSD_MODEL"] and load["output_name"] == ["ssd_model"]
    heads = m["SSDLoadHeads"].GET_NODE_INFO_V1()["input"]
    assert combo(heads["required"]["heads"])[:3] == ["reference", "reference-48", "none"]  # bundled first
    assert heads["required"]["ssd_model"] == ("SSD_MODEL", {})
    assert list(heads["optional"]) == ["hub_repo", "hub_file", "download"]
    trace = m["SSDTraceToImage"].GET_NODE_INFO_V1()
    assert trace["input"]["required"]["trace"] == ("SSD_TRACE", {}) and trace["output"] == ["IMAGE"]
    assert list(trace["input"]["required"]) == ["trace", "cell_size", "color_by", "gridlines", "index"]


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
    # the oldest ComfyUI the V3 nodes are tested on (docs/testing-comfyui.md), the same figure the import names
    assert comfy["requires-comfyui"] == ">=" + pack_module("nodes._io").MIN_COMFYUI
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")



# ---- pure input handling ----------------------------------------------------------------------------------------
def test_grid_parsing():
    parse = grid_text.parse_grid
    assert parse("auto") is None and parse("") is None and parse(" AUTO ") is None
    assert parse("8x12") == (8, 12) and parse("16") == (16, 16) and parse("8 x 8") == (8, 8)
    for bad in ("big", "0x4", "4x"):
        with pytest.raises(core.SSDError, match="grid"):
            parse(bad)


def test_class_prompts():
    """A class-conditional family reads a class name, index or unique part (the sampler passes the text on)."""
    m = ["cat", "dog", "sea life", "sea bird"]
    r = pack_module("ssd_core.families.llama_grid").class_index
    assert r(m, "cat") == 0 and r(m, " DOG ") == 1 and r(m, "2") == 2 and r(m, "life") == 2
    with pytest.raises(core.SSDError, match="several classes"):
        r(m, "sea")
    with pytest.raises(core.SSDError, match="0: cat, 1: dog"):
        r(m, "unicorn")
    with pytest.raises(core.SSDError, match="out of range"):
        r(m, "9")
    with pytest.raises(core.SSDError, match="class name or index"):
        r(m, "  ")


DOCS = ROOT / "web" / "docs"


@pytest.mark.parametrize("locale", ["", "zh"])
def test_every_node_has_help_naming_every_input(locale):
    """ComfyUI's frontend shows WEB_DIRECTORY/docs/<node>.md (and docs/<node>/<locale>.md) as the node's help: one
    per node, in English and Simplified Chinese, naming every input and output as the node declares it."""
    for cls in nodes.NODE_LIST:
        schema = cls.define_schema()
        path = DOCS / schema.node_id / f"{locale}.md" if locale else DOCS / f"{schema.node_id}.md"
        text = path.read_text(encoding="utf-8")
        assert text.startswith(f"# {schema.display_name}"), path
        names = [i.id for i in schema.inputs] + [o.id for o in schema.outputs if o.id and schema.node_id == "SSDSampler"]
        missing = [n for n in names if f"**{n}**" not in text]
        assert missing == [], (path, missing)
        if locale == "zh":
            assert re.search(r"[\u4e00-\u9fff]", text), path


def test_the_tooltips_say_what_the_help_says():
    """The sampler's tooltips are the short form of its help: the decoders' promises and the dtype rule."""
    # ssd-exact's promise is the measured one (docs/exactness_sweep.json), in every place it is made
    sweep = json.loads((ROOT / "docs" / "exactness_sweep.json").read_text())["summary"]["all"]
    rate = f"{sweep['equal']:,} of {sweep['pairs']:,}"
    tips = {i.id: i.tooltip or "" for i in nodes.SSDSampler.define_schema().inputs}
    assert "plain ar's picture" in tips["decoder"] and rate in tips["decoder"] and "near-tie" in tips["decoder"]
    assert "close in quality" in tips["decoder"] and "peers, other published methods" in tips["decoder"]
    peers = ("sjd", "scd", "sjd-pac", "zipar", "gsd")  # grouped after the pack's own, in the tooltip and the help
    assert all(f" {p}" in tips["decoder"].split("peers")[1] for p in peers)
    assert rate in nodes.SSDSampler.define_schema().description
    help_text = (DOCS / "SSDSampler.md").read_text(encoding="utf-8")
    for phrase in ("plain `ar`'s picture", rate, "near-tie", "close in quality", "other published speed-up methods",
                   "differ slightly from plain AR's"):
        assert phrase in help_text
    assert all(f"**{p}**" in help_text.split("Peers")[1] for p in peers)
    rate_zh = f"{sweep['pairs']:,} 次新对比中 {sweep['equal']:,} 次"
    assert rate_zh in (DOCS / "SSDSampler" / "zh.md").read_text(encoding="utf-8")
    dtype = {i.id: i.tooltip for i in nodes.SSDLoadModel.define_schema().inputs}["dtype"]
    assert "float32" in dtype and rate in dtype and "differ slightly from plain AR's" in dtype
    assert rate in (DOCS / "SSDLoadModel.md").read_text(encoding="utf-8")
    assert rate_zh in (DOCS / "SSDLoadModel" / "zh.md").read_text(encoding="utf-8")
    assert rate in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_registry_icon_is_committed_where_its_url_points():
    """[tool.comfy] Icon is the raw GitHub URL of docs/icon.png on the repository's main branch: a square PNG."""
    from PIL import Image

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    repo = data["project"]["urls"]["Repository"].removeprefix("https://github.com/").rstrip("/")
    icon = data["tool"]["comfy"]["Icon"]
    prefix = f"https://raw.githubusercontent.com/{repo}/main/"
    assert icon.startswith(prefix), icon
    path = ROOT / icon.removeprefix(prefix)
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] == img.size[1] >= 256


def test_the_package_leaves_out_what_a_user_does_not_run():
    """.comfyignore (comfy node pack / publish): no tests, dev scripts, training recipe, tooling; of docs/ only the
    pictures README shows (README is rewritten from time to time: keep the two in step)."""
    rules = [ln.strip() for ln in (ROOT / ".comfyignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    for left_out in ("tests/", "reference_recipe/", "node_modules/", ".venv*/", "tools/", "docs/*"):
        assert left_out in rules, left_out
    # developer tooling lives in tools/ (left out above), never inside the runtime packages nor imported by them
    assert not (ROOT / "ssd_core" / "dev").exists()
    for path in [*(ROOT / "ssd_core").rglob("*.py"), *(ROOT / "nodes").rglob("*.py")]:
        assert not re.search(r"^\s*(from|import) tools\b", path.read_text(), re.M), path
    shown = set(re.findall(r"\]\((docs/[\w./-]+\.(?:png|jpg|gif|webp))\)", (ROOT / "README.md").read_text()))
    kept = {r[1:] for r in rules if r.startswith("!docs/")}
    assert shown == kept, f"README shows {sorted(shown)}, .comfyignore keeps {sorted(kept)}: keep them in step"
    assert all((ROOT / k).is_file() for k in kept), kept


def test_the_nodes_import_as_comfyui_imports_them(tmp_path):
    """ComfyUI imports the pack as a package from custom_nodes/, with the pack's own folder NOT on sys.path: an
    absolute `import ssd_core` anywhere in nodes/ works under pytest (the repository root is on the path) and
    fails there ("IMPORT FAILED", no SSD node at all). A fresh interpreter with only custom_nodes on its path
    must import the nodes and list the bundled models."""
    import subprocess

    (tmp_path / "ComfyUI-SSD").symlink_to(ROOT, target_is_directory=True)
    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
            "assert not any(p and p.rstrip('/') == sys.argv[2] for p in sys.path), sys.path; "
            "sys.path.append(sys.argv[2] + '/tests'); import comfy_stand_in; comfy_stand_in.install(); "
            "nodes = importlib.import_module('ComfyUI-SSD.nodes'); "
            "print(sorted(nodes.NODES)); print(nodes._folders.model_choices())")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path), str(ROOT)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SSDSampler" in out.stdout and "reference-48" in out.stdout, out.stdout
