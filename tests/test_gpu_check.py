"""`make gpu-check` (tools/gpu_check.py) without a GPU: it stops at once saying it needs one; its --dry
run writes the one JSON with the CPU parts (the CUDA tests collected and skipped, bench-gpu's tiny CPU shape,
gpu-memory skipped); a part past its cap is killed with its children; the run's deadline and the verdict; each
GPU part's command and pass rule on the figures its script writes; the Makefile's .PHONY names only rules."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tools import gpu_check

ROOT = Path(__file__).resolve().parent.parent
CUDA_TESTS = re.findall(r"^def (test_\w+)", (ROOT / "tests" / "test_cuda.py").read_text(), re.M)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "sub" / "gpu_check.json"
    rc = gpu_check.main(["--dry", "--json", str(out)])
    return rc, json.loads(out.read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the message is for machines without")
def test_make_gpu_check_stops_at_once_without_cuda(tmp_path):
    out = tmp_path / "gpu_check.json"
    t = time.perf_counter()
    run = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={sys.executable}", f"GPU_CHECK_JSON={out}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - t < 60 and run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "make gpu-check needs a CUDA GPU" in lines[0] and "--dry" in lines[0], run.stderr
    assert not out.exists()


def test_dry_run_writes_one_json_with_the_cpu_parts(dry):
    rc, report = dry
    assert rc == 0 and report["pass"] is True and report["dry"] is True
    assert report["env"]["torch"] == torch.__version__ and report["env"]["device"] == "cpu"
    parts = report["parts"]
    assert list(parts) == ["cuda-tests", "bench-gpu", "gpu-memory"]
    tests = parts["cuda-tests"]
    assert tests["status"] == "skipped" and tests["rc"] == 0 and not tests["timed_out"]
    cases = tests["figures"]["cases"]
    assert {re.sub(r"\[.*\]$", "", c["name"]) for c in cases} == set(CUDA_TESTS) and len(CUDA_TESTS) >= 7
    assert all(c["outcome"] == "skipped" and "needs a CUDA GPU" in c["message"] for c in cases)
    bench = parts["bench-gpu"]
    assert bench["status"] == "pass" and "--dry" in bench["command"]
    summary = bench["figures"]["summary"]
    assert list(summary) == ["ar", "ssd", "ssd-exact", "sjd"]
    assert summary["ssd-exact"]["steps"] < summary["ar"]["steps"]
    assert all(row["ms_per_step_eager"] > 0 and row["ms_per_step_compiled"] > 0 for row in summary.values())
    assert bench["figures"]["report"]["modes"]["compiled"]["rows"][0]["identical_to_ar"] is True
    assert parts["gpu-memory"]["status"] == "skipped" and "CUDA" in parts["gpu-memory"]["reason"]
    assert report["seconds"] < gpu_check.DEADLINE_S


def test_a_part_past_its_cap_is_killed_with_its_children():
    code = ("import subprocess, sys, time; "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('child', child.pid, flush=True); time.sleep(60)")
    t = time.perf_counter()
    run = gpu_check.run_process([sys.executable, "-c", code], cap=3.0, log=lambda s: None)
    assert run["timed_out"] and time.perf_counter() - t < 20
    pid = int(run["output_tail"][0].split()[1])
    time.sleep(0.5)
    assert not running(pid)  # the grandchild went with its group


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for its new parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and re.search(r"^State:\s+Z", status.read_text(), re.M))


def test_the_deadline_skips_parts_it_cannot_fit_and_fails_the_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry", "--deadline", "10", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["pass"] is False
    assert all(p["status"] == "skipped" and "10 s are spent" in p["reason"] for p in report["parts"].values())


def test_verdict():
    ok, skip, bad = {"status": "pass"}, {"status": "skipped"}, {"status": "timeout"}
    assert gpu_check.verdict({"a": ok, "b": skip}, dry=True)
    assert not gpu_check.verdict({"a": ok, "b": skip}, dry=False)  # on a GPU every part must run
    assert not gpu_check.verdict({"a": ok, "b": bad}, dry=True)
    assert not gpu_check.verdict({"a": skip}, dry=True)  # nothing ran at all


def fake_run(writes: dict, rc: int = 0, timed_out: bool = False):
    """run_process stand-in: records the command, writes the figures file its script would write."""
    seen = {}

    def run(argv, cap, log=print):
        seen["argv"], seen["cap"] = argv, cap
        path = Path(argv[argv.index("--json") + 1])
        if writes is not None:
            path.write_text(json.dumps(writes))
        return {"rc": rc, "timed_out": timed_out, "seconds": 1.0, "output_tail": []}

    return run, seen


def test_gpu_memory_part_on_a_gpu(tmp_path, monkeypatch):
    rows = [{"quantization": "none", "weights_gib": 13.2, "peak_gib": 14.1, "grid": [24, 24], "steps": 200,
             "wall_s": 9.0}]
    run, seen = fake_run({"shapes": "Janus-Pro-7B", "rows": rows})
    monkeypatch.setattr(gpu_check, "run_process", run)
    monkeypatch.setattr(gpu_check, "_version", lambda name: None)  # no bitsandbytes
    part = gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)
    assert part["status"] == "pass" and seen["cap"] == 100.0
    assert seen["argv"][seen["argv"].index("--quantizations") + 1] == "none"
    assert part["figures"]["not_measured"] == {"8-bit": "bitsandbytes is not installed",
                                               "4-bit": "bitsandbytes is not installed"}
    run, _ = fake_run({"rows": rows}, timed_out=True)
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] == "timeout"
    monkeypatch.setattr(gpu_check, "_version", lambda name: "0.45.0")  # bitsandbytes: all three wanted
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] in ("timeout", "fail")
    run, seen = fake_run({"rows": rows})
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] == "fail"  # 8-bit, 4-bit missing
    assert seen["argv"][seen["argv"].index("--quantizations") + 1] == "none,8-bit,4-bit"


def test_bench_gpu_part_on_a_gpu(tmp_path, monkeypatch):
    row = {"decoder": "ar", "steps": 576, "wall_s": 11.0, "ms_per_step": 19.1, "peak_memory_mb": 15000.0}
    run, seen = fake_run({"modes": {"off": {"rows": [row]}}})  # stopped before the compiled mode
    monkeypatch.setattr(gpu_check, "run_process", run)
    part = gpu_check.part_bench_gpu(False, 170.0, tmp_path, print)
    argv = seen["argv"]
    assert part["status"] == "fail" and "--dry" not in argv
    assert argv[argv.index("--buckets") + 1] == gpu_check.BENCH_BUCKETS and argv[argv.index("--budget") + 1] == "90"
    fast = dict(row, wall_s=5.5, ms_per_step=9.5)
    run, _ = fake_run({"modes": {"off": {"rows": [row]}, "compiled": {"rows": [fast]}}})
    monkeypatch.setattr(gpu_check, "run_process", run)
    part = gpu_check.part_bench_gpu(False, 190.0, tmp_path, print)
    assert part["status"] == "pass" and part["figures"]["summary"]["ar"]["speedup_compiled"] == 2.0


def test_cuda_tests_part_on_a_gpu_fails_on_a_skip(tmp_path, monkeypatch):
    xml = ('<testsuites><testsuite><testcase name="test_a" time="1.5"/><testcase name="test_b" time="0">'
           '<skipped message="needs a CUDA GPU"/></testcase></testsuite></testsuites>')

    def run(argv, cap, log=print):
        Path(argv[argv.index("--junitxml") + 1]).write_text(xml)
        return {"rc": 0, "timed_out": False, "seconds": 2.0, "output_tail": []}

    monkeypatch.setattr(gpu_check, "run_process", run)
    part = gpu_check.part_cuda_tests(False, 150.0, tmp_path, print)
    assert part["status"] == "fail" and part["figures"]["passed"] == 1 and part["figures"]["skipped"] == 1
    assert "tests/test_cuda.py" in part["command"]


def test_makefile_phony_names_only_rules():
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    rules = set(re.findall(r"^([\w.-]+):(?!=)", text, re.M))
    assert [name for name in phony if name not in rules] == []
    assert {"gpu-check", "gpu-memory", "bench-gpu"} <= set(phony)
