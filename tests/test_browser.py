"""The widget in a real browser (runs when SSD_COMFYUI_DIR points at a ComfyUI checkout, Chromium is at
/usr/bin/chromium or SSD_CHROMIUM, and `npm install` has put playwright-core in node_modules).

    npm install   # devDependency playwright-core only; it downloads no browser
    SSD_COMFYUI_DIR=/path/to/ComfyUI SSD_COMFYUI_PYTHON=/path/to/comfy-venv/bin/python pytest tests/test_browser.py

Opens the UI, loads the bundled example workflow (from the template route), presses Run, waits for
both samplers, checks the widget (grid with accepted and corrected colours, legend, hover), takes
screenshots, reloads the page and checks the grid survives. SSD_SCREENSHOT_DIR (optional) receives
widget.png and widget_grid.png (the README's screenshots live in docs/).
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
        return "playwright-core is not installed: run `npm install` in the repository (devDependency)"
    return None


pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))


@pytest.fixture(scope="module")
def browser_run(tmp_path_factory):
    out = Path(os.environ.get("SSD_SCREENSHOT_DIR") or tmp_path_factory.mktemp("browser"))
    srv = harness.ComfyServer()
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
    counts, run_line = ssd["legend"]
    assert "accepted" in counts and "steps" in run_line and "tokens/step" in run_line and run_line.endswith("s")
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
    assert "ssd_grid" not in after["serialized"] and len(json.loads(after["serialized"])) == 14  # 13 inputs with a widget + control_after_generate
    again = browser_run["reloaded"]["4"]
    assert again["widget"] and again["done"] and again["grid"] == after["grid"]
    assert again["pixels"]["accepted"] > 50


# What ComfyUI's own frontend logs on a fresh profile of an offline machine, with or without this pack:
# 404s for a new user's files and settings, and the unreachable api.comfy.org release check.
CORE_NOISE = (re.compile(r"^http://127\.0\.0\.1:\d+/(api/userdata\b|user\.css$|api/settings/|favicon\.ico$)"),
              re.compile(r"^https://api\.comfy\.org/"))


def core_noise(err):
    return err["text"].startswith("Failed to load resource") and any(p.search(err["url"]) for p in CORE_NOISE)


def test_no_console_errors(browser_run):
    assert browser_run["pageErrors"] == []
    errors = [e for e in browser_run["consoleErrors"] if not core_noise(e)]
    assert errors == [], errors


def test_loaded_from_the_template_browser(browser_run):
    assert browser_run["loadedBy"] == "template browser", browser_run.get("templateBrowserError")


def test_batch_selector_shows_every_image(browser_run):
    before, after = browser_run["batchBefore"], browser_run["batchAfter"]
    assert before["shown"] and before["images"] == 3 and before["label"].startswith("image 1 of 3")
    assert (after["index"], after["seed"]) == (1, 101) and "image 2 of 3" in after["label"]
    pixels = browser_run["batchPixels"]
    assert pixels["accepted"] > 0 and pixels["ar"] == 0  # image 1 (all accepted) is the one drawn
