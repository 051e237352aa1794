"""`make gpu-check` (tools/gpu_check.py) without a GPU: it stops at once saying it needs one; its --dry run writes
the one JSON with every part (the CUDA tests collected and skipped, gpu-memory's and bench-gpu's tiny CPU shapes);
a part past its cap is killed with its children and reported `timeout` while the next part still runs; the caps
fit the deadline; the verdict; each GPU part's command and pass rule on the figures its script writes; the random
models are built in their dtype with no float32 copy (counted on the meta device); the closeness rules of
tests/test_cuda.py pass bf16's rounding and catch a broken cache; the Makefile's .PHONY names only rules."""
import json
import os
import re
import subprocess
import sys
import threading
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


def test_dry_run_writes_one_json_with_every_part(dry):
    rc, report = dry
    assert rc == 0 and report["pass"] is True and report["dry"] is True
    assert report["env"]["torch"] == torch.__version__ and report["env"]["device"] == "cpu"
    parts = report["parts"]
    assert set(parts) == set(gpu_check.PARTS) == set(report["budget"])
    for name, part in parts.items():
        assert part["status"] in ("pass", "skipped") and 0 < part["seconds"] < part["cap_s"], name
        assert not part["timed_out"] and part["rc"] == 0 and part["started_s"] >= 0, name
        assert report["budget"][name]["cap_s"] == gpu_check.CAPS_S[name], name
    tests = parts["cuda-tests"]
    assert tests["status"] == "skipped"
    cases = tests["figures"]["cases"]
    assert {re.sub(r"\[.*\]$", "", c["name"]) for c in cases} == set(CUDA_TESTS) and len(CUDA_TESTS) >= 7
    assert all(c["outcome"] == "skipped" and "needs a CUDA GPU" in c["message"] for c in cases)
    memory = parts["gpu-memory"]
    assert memory["status"] == "pass" and "--dry" in memory["command"]
    rows = memory["figures"]["rows"]
    assert [(r["quantization"], r["source"]) for r in rows] == [("none", "built"), ("none", "loaded")]
    assert rows[0]["weights_gib"] == rows[1]["weights_gib"] > 0 and rows[0]["grid"] == [8, 8]
    bench = parts["bench-gpu"]
    assert bench["status"] == "pass" and "--dry" in bench["command"]
    summary = bench["figures"]["summary"]
    assert list(summary) == gpu_check.BENCH_DECODERS.split(",") == ["ar", "ssd-exact"]
    assert summary["ssd-exact"]["steps"] < summary["ar"]["steps"]
    assert all(row["ms_per_step_eager"] > 0 and row["ms_per_step_compiled"] > 0 for row in summary.values())
    assert bench["figures"]["report"]["modes"]["compiled"]["rows"][1]["identical_to_ar"] is True
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


def test_a_stalled_part_times_out_and_the_next_part_still_runs(tmp_path):
    out = tmp_path / "gpu_check.json"
    argv = ["--dry", "--serial", "--parts", "gpu-memory,cuda-tests", "--stall", "gpu-memory=600", "--cap",
            "gpu-memory=4", "--json", str(out)]
    box = {}
    main = threading.Thread(target=lambda: box.update(rc=gpu_check.main(argv)))
    main.start()
    seen = None
    while main.is_alive() and seen is None:  # the JSON says which part is running while it runs
        time.sleep(0.2)
        if out.is_file():
            try:
                parts = json.loads(out.read_text())["parts"]
            except ValueError:  # caught mid-write
                continue
            if parts["gpu-memory"]["status"] == "running":
                seen = parts
    main.join()
    assert seen is not None and seen["cuda-tests"]["status"] == "pending"
    report = json.loads(out.read_text())
    stalled, after = report["parts"]["gpu-memory"], report["parts"]["cuda-tests"]
    assert box["rc"] == 1 and report["pass"] is False
    assert stalled["status"] == "timeout" and stalled["timed_out"] and 4 <= stalled["seconds"] < 15
    assert stalled["cap_s"] == 4 and stalled["figures"]["rows"] == []
    assert after["status"] == "skipped" and after["rc"] == 0 and after["started_s"] >= stalled["seconds"]
    assert after["figures"]["tests"] > 0


def test_the_deadline_skips_parts_it_cannot_fit_and_fails_the_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry", "--deadline", "10", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["pass"] is False
    assert all(p["status"] == "skipped" and "10 s are spent" in p["reason"] for p in report["parts"].values())


def test_the_caps_fit_the_deadline_and_the_phases_hold_every_part():
    assert sorted(n for phase in gpu_check.PHASES for n in phase) == sorted(gpu_check.PARTS)
    for name, estimate in gpu_check.ESTIMATE_S.items():
        assert gpu_check.ALLOWANCE * estimate <= gpu_check.CAPS_S[name] < gpu_check.ALLOWANCE * estimate + 5, name
    assert gpu_check.worst_case_s() <= gpu_check.DEADLINE_S <= 480 - 15  # every part at its cap still ends in time
    serial = gpu_check.worst_case_s([[n] for n in gpu_check.PARTS])  # --serial's worst case overruns: the deadline
    assert serial > gpu_check.DEADLINE_S  # then skips what cannot start (test above)
    assert gpu_check.plan(["bench-gpu", "cuda-tests"]) == [["cuda-tests"], ["bench-gpu"]]
    assert gpu_check.plan(["bench-gpu", "cuda-tests"], serial=True) == [["bench-gpu"], ["cuda-tests"]]
    assert gpu_check.plan(list(gpu_check.PARTS), dry=True) == [list(gpu_check.PARTS)]
    with pytest.raises(SystemExit, match="unknown part 'bench'"):
        gpu_check.main(["--dry", "--stall", "bench=3"])


def test_verdict():
    ok, skip, bad = {"status": "pass"}, {"status": "skipped"}, {"status": "timeout"}
    assert gpu_check.verdict({"a": ok, "b": skip}, dry=True)
    assert not gpu_check.verdict({"a": ok, "b": skip}, dry=False)  # on a GPU every part must run
    assert not gpu_check.verdict({"a": ok, "b": bad}, dry=True)
    assert not gpu_check.verdict({"a": skip}, dry=True)  # nothing ran at all


def fake_run(writes: dict, rc: int = 0, timed_out: bool = False):
    """run_process stand-in: records the command, writes the figures file its script would write."""
    seen = {}

    def run(argv, cap, log=print, stall=0.0):
        seen["argv"], seen["cap"] = argv, cap
        path = Path(argv[argv.index("--json") + 1])
        if writes is not None:
            path.write_text(json.dumps(writes))
        return {"rc": rc, "timed_out": timed_out, "seconds": 1.0, "output_tail": []}

    return run, seen


def test_gpu_memory_part_on_a_gpu(tmp_path, monkeypatch):
    row = {"quantization": "none", "source": "built", "weights_gib": 13.2, "peak_gib": 14.1, "grid": [24, 24],
           "steps": 200, "ready_s": 5.0, "wall_s": 9.0}
    rows = [row]
    run, seen = fake_run({"shapes": "Janus-Pro-7B", "rows": rows})
    monkeypatch.setattr(gpu_check, "run_process", run)
    monkeypatch.setattr(gpu_check, "_version", lambda name: None)  # no bitsandbytes
    part = gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)
    assert part["status"] == "pass" and seen["cap"] == 100.0 and "--dry" not in seen["argv"]
    assert seen["argv"][seen["argv"].index("--quantizations") + 1] == "none"
    assert part["figures"]["not_measured"] == {"8-bit": "bitsandbytes is not installed",
                                               "4-bit": "bitsandbytes is not installed"}
    run, _ = fake_run({"rows": rows}, timed_out=True)
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] == "timeout"
    monkeypatch.setattr(gpu_check, "_version", lambda name: "0.45.0")  # bitsandbytes: all three wanted
    run, seen = fake_run({"rows": rows})
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] == "fail"  # 8-bit, 4-bit missing
    assert seen["argv"][seen["argv"].index("--quantizations") + 1] == "none,8-bit,4-bit"
    loaded = [dict(row, quantization=q, source="loaded", weights_gib=w, peak_gib=w + 1) for q, w in
              (("8-bit", 7.4), ("4-bit", 4.3))]
    run, _ = fake_run({"rows": rows + loaded})
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] == "pass"
    run, _ = fake_run({"rows": rows + [dict(loaded[0], peak_gib=1.0), loaded[1]]})  # a peak below the weights
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_gpu_memory(False, 100.0, tmp_path, print)["status"] == "fail"


def test_bench_gpu_part_on_a_gpu(tmp_path, monkeypatch):
    rows = [{"decoder": d, "steps": s, "wall_s": 11.0, "ms_per_step": 19.1, "peak_memory_mb": 15000.0}
            for d, s in (("ar", 576), ("ssd-exact", 300))]
    run, seen = fake_run({"modes": {"off": {"rows": rows}}})  # stopped before the compiled mode
    monkeypatch.setattr(gpu_check, "run_process", run)
    part = gpu_check.part_bench_gpu(False, 170.0, tmp_path, print)
    argv = seen["argv"]
    assert part["status"] == "fail" and "--dry" not in argv
    assert argv[argv.index("--buckets") + 1] == gpu_check.BENCH_BUCKETS == "1,128"
    assert argv[argv.index("--decoders") + 1] == "ar,ssd-exact" and argv[argv.index("--budget") + 1] == "140"
    fast = [dict(r, wall_s=5.5, ms_per_step=9.5) for r in rows]
    run, _ = fake_run({"modes": {"off": {"rows": rows}, "compiled": {"rows": fast[:1]}}})  # ssd-exact missing
    monkeypatch.setattr(gpu_check, "run_process", run)
    assert gpu_check.part_bench_gpu(False, 190.0, tmp_path, print)["status"] == "fail"
    run, _ = fake_run({"modes": {"off": {"rows": rows}, "compiled": {"rows": fast, "curve_s_with_compile": 96.0}}})
    monkeypatch.setattr(gpu_check, "run_process", run)
    part = gpu_check.part_bench_gpu(False, 190.0, tmp_path, print)
    assert part["status"] == "pass" and part["figures"]["summary"]["ar"]["speedup_compiled"] == 2.0
    assert part["figures"]["compile_s"] == 96.0


def test_cuda_tests_part_on_a_gpu_fails_on_a_skip_and_keeps_the_recorded_figures(tmp_path, monkeypatch):
    xml = ('<testsuites><testsuite><testcase name="test_a" time="1.5"><properties><property name="closeness" '
           'value="[{&quot;tv_mean&quot;: 0.01}]"/></properties></testcase><testcase name="test_b" time="0">'
           '<skipped message="needs a CUDA GPU"/></testcase></testsuite></testsuites>')

    def run(argv, cap, log=print, stall=0.0):
        Path(argv[argv.index("--junitxml") + 1]).write_text(xml)
        return {"rc": 0, "timed_out": False, "seconds": 2.0, "output_tail": []}

    monkeypatch.setattr(gpu_check, "run_process", run)
    part = gpu_check.part_cuda_tests(False, 150.0, tmp_path, print)
    assert part["status"] == "fail" and part["figures"]["passed"] == 1 and part["figures"]["skipped"] == 1
    assert part["figures"]["cases"][0]["recorded"] == {"closeness": [{"tv_mean": 0.01}]}
    assert "tests/test_cuda.py" in part["command"]


def test_random_7b_is_built_in_bf16_with_no_float32_copy():
    from tools.bench_gpu import TINY
    from tools.random_models import AllocationCounter, build_random, construction_bytes, random_model

    full = construction_bytes("janus", "Janus-Pro-7B", torch.bfloat16, device="meta")  # shapes only
    assert 14.1e9 < full["parameters"] < 14.3e9
    assert full["allocated"]["bfloat16"] == full["parameters"]  # every parameter once, in bf16
    assert sum(v for k, v in full["allocated"].items() if k != "bfloat16") < 2**16  # position ids, inv_freq
    assert full["largest"].get("float32", 0) < 2**12

    def float32_then_cast(cls, config, dev, dtype):  # the old recipe: the counter does see its float32 copy
        with torch.device(dev):
            return cls(config).to(dtype)

    old = construction_bytes("janus", "Janus-Pro-7B", torch.bfloat16, build=float32_then_cast)
    assert old["allocated"]["float32"] >= 2 * full["parameters"] and old["allocated"]["bfloat16"] >= full["parameters"]
    counter = AllocationCounter()
    with counter:  # the tiny shape on the CPU: the random init runs for real, in place
        model = random_model("janus", TINY, device="cpu", dtype=torch.bfloat16)
    weights = [p.detach() for p in model.model.parameters()]
    assert counter.bytes[torch.bfloat16] == sum(p.numel() * 2 for p in weights)
    assert counter.bytes.get(torch.float32, 0) < 2**10
    assert model.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in weights)
    assert all(float(p.float().std()) > 0 for p in weights if p.dim() == 2)  # initialised, not left empty
    assert torch.get_default_dtype() == torch.float32  # restored
    with pytest.raises(TypeError, match="floating dtype"):
        build_random(None, None, dtype=torch.int8)


def test_gpu_memory_reuses_only_a_whole_saved_model(tmp_path):
    from tools.peak_memory import complete

    folder = tmp_path / "Janus-Pro-7B"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert not complete(folder)  # no weights
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    (folder / shards[0]).write_bytes(b"")
    assert not complete(folder)  # a save stopped after its first shard
    (folder / shards[1]).write_bytes(b"")
    assert complete(folder)


def test_the_closeness_rules_pass_rounding_and_catch_a_broken_cache(monkeypatch):
    import ssd_core
    from ssd_core import static_cache
    from ssd_core.static_cache import StaticSession
    from test_cuda import GRID, WINDOWS, closeness, misses

    def load(dtype, mode="off"):
        return static_cache.enable(ssd_core.load_model("reference", dtype=dtype), mode, buckets=WINDOWS)

    fp32, bf16, static32, static16 = load("fp32"), load("bf16"), load("fp32", "static"), load("bf16", "static")
    tokens = ssd_core.generate(fp32, None, prompt=0, decoder="ar", seed=0, grid=GRID, decode_pixels=False,
                               score=False).tokens
    assert misses(closeness(fp32, static32, 0, tokens), "fp32") == []  # another cache's fp32 rounding
    assert misses(closeness(fp32, bf16, 0, tokens), "bf16") == []  # all of bf16's rounding
    assert misses(closeness(bf16, static16, 0, tokens), "bf16") == []  # another cache's bf16 rounding
    offsets = StaticSession._offsets
    monkeypatch.setattr(StaticSession, "_offsets", lambda self, width, positions: offsets(self, width, positions) + 1)
    assert "tv_mean" in misses(closeness(fp32, static32, 0, tokens), "fp32")  # positions one off
    monkeypatch.undo()
    window = StaticSession._window

    def leaky(self, width, visible):  # every query also sees the window's last key
        mask = window(self, width, visible).clone()
        mask[..., width - 1] = True
        return mask

    monkeypatch.setattr(StaticSession, "_window", leaky)
    assert misses(closeness(bf16, static16, 0, tokens), "bf16") != []


def test_makefile_phony_names_only_rules():
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    rules = set(re.findall(r"^([\w.-]+):(?!=)", text, re.M))
    assert [name for name in phony if name not in rules] == []
    assert {"gpu-check", "gpu-memory", "bench-gpu"} <= set(phony)
