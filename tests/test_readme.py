"""The README stays short and true: its results table is made from the committed bench of record
(tools/readme_results.py), its headline figures match that JSON, and every docs file it names exists."""
import importlib.util
import io
import json
import re
import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _tool():
    spec = importlib.util.spec_from_file_location("readme_results", ROOT / "tools" / "readme_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_table_is_the_bench_of_record():
    tool = _tool()
    assert tool.in_readme(README) == tool.current(), "run: python tools/readme_results.py --write"


def test_headline_figures_come_from_the_bench_of_record():
    rows = {r["decoder"]: r for r in json.loads((ROOT / "docs" / "bench_reference.json").read_text())["rows"]}
    rows48 = {r["decoder"]: r for r in json.loads((ROOT / "docs" / "bench_reference48.json").read_text())["rows"]}
    intro = README[:README.index("## Results")]
    fewest = max(rows[k]["step_ratio"] for k in ("ssd-exact@3", "ssd-exact@4"))  # its widest rows, with heads
    assert f"up to {round(fewest)}x fewer model steps at 24x24 tokens and {round(rows48['ssd-exact@3']['step_ratio'])}x at 48x48" in intro
    assert rows48["ssd-exact@3"]["identical_to_ar"] is True  # every 48x48 image ar's
    default = rows["ssd-exact"]  # what the default picked on the bench's CPU
    assert f"{default['step_ratio']:.1f}x fewer steps, {default['wall_ratio']:.1f}x less time" in intro
    assert default["params"]["draft_rows_picked"] == 1 and "guesses one row" in intro
    assert f"`ssd` goes further ({rows['ssd f=2']['step_ratio']:.1f}x)" in intro
    # "the very same picture", but for a near-tie that rounding decides (one image of 33: its stats line says so)
    assert rows["ssd-exact"]["same_cells_as_ar"] >= 0.99 and "rounding could flip it" in intro


def test_readme_is_short_and_its_docs_exist():
    assert len(README.splitlines()) <= 200
    named = set(re.findall(r"docs/[\w.-]+\.(?:md|png|json)", README))
    assert named and all((ROOT / path).is_file() for path in named), sorted(p for p in named if not (ROOT / p).is_file())


def test_the_prerequisites_to_develop_are_named():
    """Issue 41: `make install` and what it needs were not named."""
    line = README[README.index("- Develop / test prerequisites:"):]
    line = line[:line.index("\n- ")]
    for needed in ("Python 3.11", "`make`", "node", "Chromium", "`make install`"):
        assert needed in line, needed


def _package_bytes() -> int:
    """The registry package as `comfy node pack` makes it: a deflated zip of the files git tracks, less those
    .comfyignore names (comfy-cli's zip_files; on cba4679 this gave its 32,365,111 bytes to the byte)."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("the package is measured from a git checkout")

    def listed(*args):
        out = subprocess.run([git, "-C", str(ROOT), "ls-files", "-z", *args], capture_output=True, check=True)
        return [p for p in out.stdout.decode().split("\0") if p]

    ignored = set(listed("-c", "-i", "--exclude-from=.comfyignore"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in listed():
            if path not in ignored and (ROOT / path).is_file():
                z.write(ROOT / path, path)
    return buf.tell()


def test_the_package_size_is_measured():
    """README quotes the package's size as `comfy node pack` makes it (it said 38 MB where the tool made 36.2)."""
    quoted = float(re.search(r"The package is ([\d.]+) MB \(`comfy node pack`\)", README).group(1))
    measured = _package_bytes() / 1e6
    assert abs(quoted - measured) <= 0.1, f"README says {quoted} MB; comfy node pack makes {measured:.1f} MB"


def test_one_comfyui_floor_everywhere():
    """pyproject's requires-comfyui, the import's message, README, the root __init__ and the testing doc name one
    ComfyUI version floor (they said 0.3.50 in some places, 0.3.64 in others)."""
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["comfy"]["requires-comfyui"]
    assert floor.startswith(">=")
    version = floor[2:]
    assert f'MIN_COMFYUI = "{version}"' in (ROOT / "nodes" / "_io.py").read_text()
    assert f"Needs ComfyUI {version} or newer" in README
    assert f"ComfyUI >= {version}" in (ROOT / "__init__.py").read_text()
    doc = (ROOT / "docs" / "testing-comfyui.md").read_text()
    assert f"`requires-comfyui` (pyproject.toml) is `>={version}`" in doc
    for name, text in (("README.md", README), ("docs/testing-comfyui.md", doc)):
        others = set(re.findall(r"needs ComfyUI (\d+\.\d+\.\d+)", text, re.I)) - {version}
        assert not others, f"{name} names another floor: {others}"
