"""The bench across grid sizes (tools/bench_sizes.py): one real bench run per size, one JSON, one plot; at 32x32
(reference-48, its middle grid) ssd-exact with its heads gives ar's very tokens (test_reference48 does 48x48)."""
import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image

from ssd_core.api import BUNDLED_HEADS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not BUNDLED_HEADS.get("reference-48", ROOT / "missing").is_file(),
                                reason="reference-48 not present")


def _tool():
    spec = importlib.util.spec_from_file_location("bench_sizes", ROOT / "tools" / "bench_sizes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sweep_writes_one_row_per_decoder_and_size_and_a_plot(tmp_path, capsys):
    out, png = tmp_path / "sizes.json", tmp_path / "sizes.png"
    assert _tool().main(["--images", "1", "--sides", "24,32", "--decoders", "ar,ssd-exact@2",
                         "--json", str(out), "--plot", str(png)]) == 0
    report = json.loads(out.read_text())
    assert [(s["model"], s["side"]) for s in report["sizes"]] == [("reference", 24), ("reference-48", 32)]
    for size in report["sizes"]:
        rows = {r["decoder"]: r for r in size["rows"]}
        assert set(rows) == {"ar", "ssd-exact@2"}
        assert rows["ar"]["steps"] == size["side"] ** 2 - 1  # one token a step (the first comes with the prefill)
        exact = rows["ssd-exact@2"]  # with each model's heads: reference-48 at 32x32 is exact too
        assert exact["identical_to_ar"] == 1.0 and exact["step_ratio"] > 2.5
        assert exact["class_acc"] is not None  # the yardstick scores both models' pictures
        assert "ops_per_step" not in exact  # --no-step-ops: no extra run per row for a column the table lacks
    assert Image.open(png).size == (640, 420)
    table = capsys.readouterr().out
    assert "| 32 | ssd-exact@2 |" in table and "steps / side" in table
