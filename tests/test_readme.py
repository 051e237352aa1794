"""The README stays short and true: its results table is made from the committed bench of record
(tools/readme_results.py), its headline figures match that JSON, and every docs file it names exists."""
import importlib.util
import json
import re
from pathlib import Path

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
    intro = README[:README.index("## Results")]
    assert f"up to {round(rows['ssd-exact@3']['step_ratio'])}x fewer model steps" in intro  # 3 rows: the fewest
    default = rows["ssd-exact"]  # what the default picked on the bench's CPU
    assert f"{default['step_ratio']:.1f}x fewer steps, {default['wall_ratio']:.1f}x less time" in intro
    assert default["params"]["draft_rows_picked"] == 1 and "guesses one row" in intro
    assert f"`ssd` goes further ({rows['ssd f=2']['step_ratio']:.1f}x)" in intro
    assert rows["ssd-exact"]["identical_to_ar"] is True  # "the very same picture"


def test_readme_is_short_and_its_docs_exist():
    assert len(README.splitlines()) <= 200
    named = set(re.findall(r"docs/[\w.-]+\.(?:md|png|json)", README))
    assert named and all((ROOT / path).is_file() for path in named), sorted(p for p in named if not (ROOT / p).is_file())
