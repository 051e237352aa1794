"""The widget in a real browser (runs when SSD_COMFYUI_DIR points at a ComfyUI checkout, Chromium is at
/usr/bin/chromium or SSD_CHROMIUM, and `npm install` has put playwright-core in node_modules).

    npm install   # devDependency playwright-core only; it downloads no browser
    SSD_COMFYUI_DIR=/path/to/ComfyUI SSD_COMFYUI_PYTHON=/path/to/comfy-venv/bin/python pytest tests/test_browser.py

Every test runs twice: against the frontend that ComfyUI pins ("pinned", comfyui-frontend-package from its
requirements.txt) and against another one (a newer one) given by SSD_FRONTEND_ROOT, the static folder of an
unzipped comfyui-frontend-package wheel, served through ComfyUI's --front-end-root ("frontend-root"; skipped,
saying how, when unset). docs/testing-comfyui.md has the versions tested and the setup.

Opens the UI, loads the bundled example workflow (from the template browser), presses Run, waits for the three
samplers, checks the widget (grid with accepted and corrected colours, legend, hover), takes screenshots, reloads
the page and checks the grid survives; then a batch selector, a node created without a widgets array, a copy and
paste of a sampler, a sampler moved into a subgraph and run there, and the sampler's help (web/docs) in English
and Chinese in the frontend's node help panel. SSD_SCREENSHOT_DIR (optional) receives
widget.png and widget_grid.png (the README's screenshots live in docs/), one folder per frontend.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("SSD_CHROMIUM", "/usr/bin/chromium")
DRIVER = ROOT / "tests" / "js" / "browser_widget.mjs"


def _load_comfy_harness():
    spec = importlib.util.spec_from_file_location("ssd_test_comfyui_harness", ROOT / "tests" / "test_comfyui.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


harness = _load_comfy_harness()


def browser_missing():
    reason = harness.comfy_missing() or harness.bundled_missing()
    if reason:
        return reason
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set SSD_CHROMIUM)"
    if not shutil.which("node"):
        return "node is not installed"
    r = subprocess.run(["node", "-e", "require.resolve('playwright-core')"], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        return (f"the browser driver is missing: run `npm install` in {ROOT} first (it installs playwright-core, "
                "package.json's devDependency, and downloads no browser); the browser tests skip until then")
    return None


pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

NEWER = os.environ.get("SSD_FRONTEND_ROOT", "")


def newer_missing():
    if browser_missing():
        return browser_missing()
    if not NEWER:
        return ("set SSD_FRONTEND_ROOT to a newer frontend's static folder to test it too: pip download --no-deps "
                "comfyui-frontend-package, unzip the wheel, point it at comfyui_frontend_package/static")
    if not (Path(NEWER) / "index.html").is_file():
        return f"SSD_FRONTEND_ROOT={NEWER} has no index.html (use the wheel's comfyui_frontend_package/static)"
    return None


FRONTENDS = [pytest.param(None, id="pinned"),
             pytest.param(NEWER, id="frontend-root", marks=pytest.mark.skipif(newer_missing() is not None,
                                                                      reason=str(newer_missing())))]


@pytest.fixture(scope="module", params=FRONTENDS)
def browser_run(request, tmp_path_factory):
    name = "frontend-root" if request.param else "pinned"
    shots = os.environ.get("SSD_SCREENSHOT_DIR")
    out = Path(shots) / name if shots else tmp_path_factory.mktemp(f"browser-{name}")
    srv = harness.ComfyServer(front_end_root=request.param or None)
    srv.start()
    try:
        env = dict(os.environ, SSD_URL=srv.url, SSD_OUT=str(out), SSD_CHROMIUM=CHROMIUM,
                   SSD_PACK_NAME=harness.PACK_NAME, SSD_RUN_TIMEOUT_S=os.environ.get("SSD_RUN_TIMEOUT_S", "600"))
        proc = subprocess.run(["node", str(DRIVER)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        result_path = out / "result.json"
        assert result_path.is_file(), f"the browser driver wrote no result:\n{proc.stdout}\n{proc.stderr}"
        result = json.loads(result_path.read_text())
        result["_driver_output"] = proc.stdout[-3000:] + proc.stderr[-3000:]
        result["_server_log"] = srv.log_tail(80)
        result["_out"] = str(out)
        yield result
    finally:
        srv.stop()
        srv.cleanup()


def test_driver_completed(browser_run):
    assert "error" not in browser_run, f"{browser_run.get('error')}\n{browser_run['_driver_output']}\n{browser_run['_server_log']}"
    assert browser_run["steps"][-1] == "done"


def test_widget_draws_the_grid_with_both_colours_and_the_legend(browser_run):
    after = browser_run["after"]
    ar, exact, ssd = after["3"], after["4"], after["5"]
    assert ar["widget"] and exact["widget"] and ssd["widget"]
    assert ar["done"] and exact["done"] and ssd["done"]
    assert (ar["decoder"], exact["decoder"], ssd["decoder"]) == ("ar", "ssd-exact", "ssd")
    assert ssd["pixels"]["accepted"] > 50, ssd["pixels"]
    assert ssd["pixels"]["corrected"] > 0 or ssd["pixels"]["accepted"] > 0
    assert ar["pixels"]["ar"] > 50 and ar["pixels"]["accepted"] == 0
    counts, run_line, details = ssd["legend"]  # the colours in plain words, the speed-up and time, the details
    assert "drafted right" in counts and "fewer steps than one at a time" in run_line and run_line.endswith("s")
    assert "steps" in details and "tokens/step" in details
    assert exact["legend"][2].startswith("same image as plain AR") and ar["legend"][1].startswith("ar · one token")
    assert ssd["steps"] < ar["steps"]
    assert (Path(browser_run["_out"]) / "widget.png").stat().st_size > 10_000


def test_live_updates_reached_the_page(browser_run):
    live = browser_run["live"]
    assert live["events"] >= 2 and live["running"] >= 1


def test_hover_shows_step_and_round(browser_run):
    title = browser_run.get("hoverTitle") or ""
    assert title.startswith("row 1, col 1:") and "step" in title and "round" in title, title


def test_the_widget_adds_no_widget_value_and_survives_a_reload(browser_run):
    after = browser_run["after"]["4"]
    assert after["saved"], "the final trace is kept in node.properties"
    assert "ssd_grid" not in after["serialized"] and len(json.loads(after["serialized"])) == 15  # 14 inputs with a widget + control_after_generate
    again = browser_run["reloaded"]["4"]
    assert again["widget"] and again["done"] and again["grid"] == after["grid"]
    assert again["pixels"]["accepted"] > 50


# What ComfyUI's own frontend logs on a fresh profile of an offline machine, with or without this pack:
# 404s for a new user's files and settings, and the unreachable api.comfy.org release check; a newer frontend
# (1.58) on the 0.3.64 backend also asks for routes that backend does not have yet (jobs, global subgraphs,
# template index files) and checks its templates' model links on huggingface.co (offline here).
CORE_NOISE = (re.compile(r"^http://127\.0\.0\.1:\d+/(api/userdata\b|user\.css$|api/settings/|favicon\.ico$"
                         r"|api/jobs\b|api/global_subgraphs$|templates/index_[\w.]+$)"),
              re.compile(r"^https://(api\.comfy\.org|huggingface\.co)/"),
              # the node help: the frontend asks for docs/<node>/<locale>.md first, then falls back to docs/<node>.md
              re.compile(rf"/extensions/{re.escape(harness.PACK_NAME)}/docs/SSD\w+/en\.md$"))
# Frontend 1.47 (ComfyUI 0.30.0's pin) logs "graph accessed before initialization" once per page load from its own
# code (the pack's files are not on its stack: test_no_console_warning_from_the_pack checks that).
CORE_NOISE_TEXT = re.compile(r"^(\[Jobs API\] Error fetching jobs: JobsApiError|Failed to fetch queue: JobsApiError"
                             r"|ComfyApp graph accessed before initialization$)")


def core_noise(err):
    if CORE_NOISE_TEXT.match(err["text"]) and f"/extensions/{harness.PACK_NAME}/" not in err["url"]:
        return True
    return err["text"].startswith("Failed to load resource") and any(p.search(err["url"]) for p in CORE_NOISE)


def test_no_console_errors(browser_run):
    assert browser_run["pageErrors"] == []
    errors = [e for e in browser_run["consoleErrors"] if not core_noise(e)]
    assert errors == [], errors


def test_loaded_from_the_template_browser(browser_run):
    assert browser_run["loadedBy"] == "template browser", browser_run.get("templateBrowserError")


def test_the_bundled_template_is_the_first_card(browser_run):
    """The template browser's first card of the pack is the bundled 24x24 model's, the one that runs at once, on every
    frontend: ComfyUI lists the files in directory order, which the pack puts in name order (nodes/_routes.py)."""
    order = browser_run["templateOrder"]
    assert len(order) == 8 and order[0] == "SSD Bundled 24x24 model - ar vs ssd-exact vs ssd", order


def test_batch_selector_shows_every_image(browser_run):
    before, after = browser_run["batchBefore"], browser_run["batchAfter"]
    assert before["shown"] and before["images"] == 3 and before["label"].startswith("image 1 of 3")
    assert (after["index"], after["seed"]) == (1, 101) and "image 2 of 3" in after["label"]
    pixels = browser_run["batchPixels"]
    assert pixels["accepted"] > 0 and pixels["ar"] == 0  # image 1 (all accepted) is the one drawn


def test_the_frontend_is_the_one_asked_for(browser_run, request):
    version = browser_run.get("frontendVersion")
    pinned = re.search(r"comfyui-frontend-package==([\d.]+)",
                       (Path(harness.COMFY_DIR) / "requirements.txt").read_text()).group(1)
    if request.node.callspec.id == "frontend-root":
        wheel = [p.name for p in Path(NEWER).parent.parent.glob("comfyui_frontend_package-*.dist-info")]
        assert version and (not wheel or wheel[0] == f"comfyui_frontend_package-{version}.dist-info"), (wheel, version)
    else:
        assert version == pinned


def test_no_console_warning_from_the_pack(browser_run):
    """Nothing the pack calls warns: no deprecated call (checkState() warns from 1.58), nothing logged by it."""
    ours = [w for w in browser_run["consoleWarnings"]
            if f"/extensions/{harness.PACK_NAME}/" in w["url"] or re.search(r"checkState|ssd", w["text"], re.I)]
    assert ours == [], ours
    # and no console.warn / console.error whose stack passes through the pack's files
    assert browser_run["packLogged"] == [], browser_run["packLogged"]


def test_the_model_default_values_read_auto(browser_run):
    """cfg -1, draft_rows 0 and verify_rounds -1 (the template's) are drawn as "auto"; a set value shows as its number;
    the saved widget values keep the numbers."""
    auto = browser_run["autoWidgets"]
    assert auto["cfg"] == {"value": -1, "shown": "auto"} and auto["draft_rows"]["shown"] == "auto", auto
    assert auto["verify_rounds"] == {"value": -1, "shown": "auto"}, auto
    assert auto["cfgSet"]["value"] == 2.5 and auto["cfgSet"]["shown"].startswith("2.5"), auto
    assert auto["seed"]["shown"] != "auto" and -1 in auto["saved"], auto


def test_the_model_default_values_say_auto_under_the_vue_node_renderer(browser_run):
    """Nodes 2.0 (the Vue renderer) draws its own number inputs, which show -1: the auto values' labels say "auto"
    there, a typed value drops it, and back on the canvas renderer the labels are the names again."""
    vue = browser_run["vueNodes"]
    assert vue["on"], vue
    assert vue["before"]["cfg"] == "cfg \u00b7 auto" and vue["before"]["draft_rows"] == "draft_rows \u00b7 auto", vue
    assert vue["before"]["verify_rounds"] == "verify_rounds \u00b7 auto", vue
    assert vue["before"]["seed"] == "seed", vue  # a value with no auto keeps its name
    assert vue["value"] == 2.5 and vue["typed"]["cfg"] == "cfg", vue
    assert vue["canvasLabel"] == "cfg", vue  # node 4's cfg is still auto: on the canvas the value says it


def test_the_widget_is_made_when_the_node_has_no_widgets_array(browser_run):
    assert browser_run["noWidgets"] == {"error": None, "widgets": 1, "api": True}


def test_a_pasted_sampler_has_one_widget_with_the_grid(browser_run):
    assert browser_run["paste"]["added"] == ["SSDSampler"], browser_run["paste"]
    pasted, original = browser_run["pasted"], browser_run["pastedOriginal"]
    assert pasted["widgets"] == 1 and pasted["element"] is True
    assert pasted["done"] and pasted["grid"] == original["grid"] and pasted["decoder"] == "ssd-exact"
    assert original["widgets"] == 1 and original["done"]


def test_a_sampler_inside_a_subgraph_fills_from_its_events(browser_run):
    sub = browser_run["subgraph"]
    if sub.get("skipped"):
        pytest.skip(sub["skipped"])
    assert sub["outer"] is not None and sub["inner"] is not None, sub
    after = browser_run["subgraphAfter"]
    assert after["widgets"] == 1 and after["done"] and after["grid"] == [8, 8] and after["seed"] == 4242
    assert after["decoder"] == "ssd" and after["saved"]
    live = browser_run["subgraphLive"]
    assert f"{sub['outer']}:{sub['inner']}" in live["nodes"] and live["running"] >= 1, live


def test_the_node_help_shows_in_the_frontend(browser_run):
    """web/docs/SSDSampler.md (English, the fallback of every locale) and web/docs/SSDSampler/zh.md render in the
    frontend's node help panel; the frontend asks for /extensions/<pack>/docs/<node>/<locale>.md first."""
    help = browser_run["help"]
    for locale in ("en", "zh"):
        assert help[locale].get("error") is None and help[locale]["found"], help
    assert help["en"]["headings"] == ["SSD Sampler"] and help["zh"]["headings"] == ["SSD Sampler（SSD 采样器）"], help
    base = f"/extensions/{harness.PACK_NAME}/docs/SSDSampler"
    assert f"200 {base}.md" in help["requests"] and f"200 {base}/zh.md" in help["requests"], help["requests"]


def _overlaps(nodes):
    return [(a["id"], a["type"], b["id"], b["type"]) for i, a in enumerate(nodes) for b in nodes[i + 1:]
            if a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]]


def test_the_template_lays_out_cleanly_after_a_run(browser_run):
    """No node covers another once the samplers have grown to show their grids and images, and the view the
    template opens with starts every node inside the canvas (none past the left or top edge)."""
    layout = browser_run["layout"]
    assert len(layout["nodes"]) >= 10
    assert not _overlaps(layout["nodes"]), _overlaps(layout["nodes"])
    scale, (ox, oy) = layout["scale"], layout["offset"]
    outside = [(n["id"], n["type"]) for n in layout["nodes"] if (n["x"] + ox) * scale < 0 or (n["y"] + oy) * scale < 0]
    assert not outside, outside


def test_the_stats_fit_their_boxes(browser_run):
    """Each sampler's stats (two lines in the PreviewAny box the template puts under it) show whole, without a
    scrollbar, on both frontends."""
    boxes = browser_run["statsBoxes"]
    assert len(boxes) == 3 and not any(b.get("missing") for b in boxes), boxes
    for b in boxes:
        assert "model steps" in b["text"], b
        assert b["scrollHeight"] <= b["clientHeight"] + 1 and b["scrollWidth"] <= b["clientWidth"] + 1, b
