"""`make bench-gpu`'s script in its --dry mode: the same code as on a GPU (verify curve, eager and compiled
decoders), on the CPU at a tiny Janus shape, torch.compile with the graph-capture-only backend."""
import json

import pytest
import torch

from tools import bench_gpu

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


def test_bench_gpu_dry_run_reports_both_modes(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert bench_gpu.main(["--dry", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"off", "compiled"}
    for mode, entry in report["modes"].items():
        assert list(entry["verify_ms"]) == ["1", "8", "16"] and all(v > 0 for v in entry["verify_ms"].values())
        rows = {r["decoder"]: r for r in entry["rows"]}
        assert list(rows) == ["ar", "ssd", "ssd-exact", "sjd"], mode
        assert rows["ssd-exact"]["identical_to_ar"] and rows["ar"]["step_ratio"] == 1.0, mode
        assert rows["ssd-exact"]["steps"] < rows["ar"]["steps"] and rows["ar"]["steps"] == 63, mode
        assert all(r["peak_memory_mb"] > 0 and r["ms_per_step"] > 0 for r in rows.values())
    assert all("same_tokens_as_eager" in r for r in report["modes"]["compiled"]["rows"])
    text = capsys.readouterr().out
    assert "summary: ratios against ar" in text and "speedup" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the message is for CPU-only ones")
def test_bench_gpu_without_cuda_says_so(capsys):
    assert bench_gpu.main([]) == 2
    assert "no CUDA device here; run with --dry" in capsys.readouterr().out
