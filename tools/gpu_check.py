"""`make gpu-check`: every check that needs a CUDA GPU, in one run of under 8 minutes, into one JSON.

  python -m tools.gpu_check                         # on a CUDA machine (make gpu-check): .work/gpu_check.json
  python -m tools.gpu_check --dry --json dry.json   # the same run's CPU parts, in about half a minute

Parts, in this order, each in its own process group with a time cap; the whole run ends by --deadline (460 s):
  cuda-tests  pytest tests/test_cuda.py: ssd-exact == ar in fp32, the static and the compiled cache give ar's
              tokens in fp32, bf16 runs every decoder, no host sync inside a step forward, no synchronize per
              step, peak memory figures (on the CPU every one skips, saying it needs a CUDA GPU)
  bench-gpu   `make bench-gpu` (tools.bench_gpu): a random Janus-Pro-7B-shaped model in bf16, eager and
              compiled, with three compiled buckets so that the compiles fit the cap (--dry: its tiny CPU shape)
  gpu-memory  `make gpu-memory` (tools.peak_memory): weights and peak memory of one ssd-exact generation
              per quantization (8-bit and 4-bit only where bitsandbytes is installed; --dry: skipped)

The JSON: pass (every part passed; in --dry, every part passed or skipped for want of CUDA), dry, env (python,
torch, CUDA, transformers, bitsandbytes, the device, the commit), parts (name -> status pass / fail / timeout /
skipped, seconds, command, figures, output_tail), seconds. It is rewritten after every part, so a run stopped
midway keeps what it measured. Exit code 0 when it passes, 1 when a part failed, 2 without a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 460.0  # the whole run, under 8 minutes with the interpreter's start and the JSON
CAPS_S = {"cuda-tests": 170.0, "bench-gpu": 170.0, "gpu-memory": 120.0}  # each part's own limit
MIN_PART_S = 20.0  # a part with less time than this left is skipped, not started
# compiled window lengths in bench-gpu: three compiles of the 7B (ar's 1, sjd's and zipar's short windows, and
# 128 for ssd and ssd-exact, whose windows on a 24-wide grid reach 4 rows + 8 = 104)
BENCH_BUCKETS = "1,16,128"
MEMORY_SHAPES = "Janus-Pro-7B"
NO_CUDA = "needs a CUDA GPU"
TAIL_LINES = 40


def no_cuda_message() -> str:
    built = torch.version.cuda or "none"
    return (f"error: make gpu-check {NO_CUDA}: torch {torch.__version__} (built with CUDA {built}) sees none "
            "here; run it on a machine with an NVIDIA GPU, or `python -m tools.gpu_check --dry` for its "
            "CPU parts")


def environment(dry: bool) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "bitsandbytes": _version("bitsandbytes"),
           "commit": _commit(), "device": "cpu" if dry else "cuda"}
    if not dry:
        props = torch.cuda.get_device_properties(0)
        env.update({"device_name": props.name, "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1), "device_count": torch.cuda.device_count(),
                    "cudnn": torch.backends.cudnn.version(), "bf16": torch.cuda.is_bf16_supported()})
    return env


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001 - not installed (or unreadable): reported as absent
        return None


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_process(argv: list[str], cap: float, log=print) -> dict:
    """Run argv from the repo root in its own process group, echoing its output; kill the whole group (inductor's
    compile workers too) at `cap` seconds. -> {"rc", "timed_out", "seconds", "output_tail"}."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True, env=env)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            log("  | " + lines[-1])

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(cap, 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    reader.join(timeout=5)
    return {"rc": proc.returncode, "timed_out": timed_out, "seconds": round(time.perf_counter() - t0, 1),
            "output_tail": lines[-TAIL_LINES:]}


def junit_figures(path: Path) -> dict:
    """pytest's junit XML -> counts and one row per test (outcome, seconds, the skip or failure message)."""
    if not path.is_file():
        return {}
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome, message = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind], \
                    (node.get("message") or "")[:300]
                break
        cases.append({"name": case.get("name"), "outcome": outcome, "seconds": round(float(case.get("time") or 0), 2),
                      "message": message})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    return {"tests": len(cases), **counts, "cases": cases}


def part_cuda_tests(dry: bool, cap: float, work: Path, log) -> dict:
    xml = work / "cuda_tests.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py", "-rs",
            "--junitxml", str(xml)]
    run = run_process(argv, cap, log)
    figures = junit_figures(xml)
    if run["timed_out"]:
        status = "timeout"
    elif dry:  # on the CPU every CUDA test must skip, and say why
        every_skip = figures.get("tests", 0) > 0 and figures["skipped"] == figures["tests"] and \
            all(NO_CUDA in c["message"] for c in figures["cases"])
        status = "skipped" if run["rc"] == 0 and every_skip else "fail"
    else:  # on a GPU nothing may skip
        status = "pass" if run["rc"] == 0 and figures.get("tests", 0) > 0 and figures["skipped"] == 0 else "fail"
    return {"status": status, "command": argv[2:], "figures": figures, **run}


def part_bench_gpu(dry: bool, cap: float, work: Path, log) -> dict:
    out = work / "bench_gpu.json"
    argv = [sys.executable, "-m", "tools.bench_gpu", "--json", str(out)]
    if dry:
        argv.append("--dry")
    else:  # bench_gpu's budget starts after the 7B model is built (about a minute with the first CUDA work)
        argv += ["--budget", str(int(max(30.0, cap - 80.0))), "--buckets", BENCH_BUCKETS,
                 "--lengths", BENCH_BUCKETS]
    run = run_process(argv, cap, log)
    report = json.loads(out.read_text()) if out.is_file() else {}
    modes = report.get("modes", {})
    complete = all(modes.get(m, {}).get("rows") for m in ("off", "compiled"))
    figures = {"report": report}
    if complete:
        eager, compiled = ({r["decoder"]: r for r in modes[m]["rows"]} for m in ("off", "compiled"))
        figures["summary"] = {d: {"steps": eager[d]["steps"], "ms_per_step_eager": eager[d]["ms_per_step"],
                                  "ms_per_step_compiled": compiled[d]["ms_per_step"],
                                  "speedup_compiled": round(eager[d]["wall_s"] / max(compiled[d]["wall_s"], 1e-9), 2),
                                  "peak_memory_mb": compiled[d]["peak_memory_mb"]} for d in eager if d in compiled}
    status = "timeout" if run["timed_out"] else ("pass" if run["rc"] == 0 and complete else "fail")
    return {"status": status, "command": argv[2:], "figures": figures, **run}


def part_gpu_memory(dry: bool, cap: float, work: Path, log) -> dict:
    if dry:
        return {"status": "skipped", "reason": f"measures CUDA memory: {NO_CUDA}", "figures": {}}
    wanted = ["none"]
    missing = {}
    for q in ("8-bit", "4-bit"):
        if _version("bitsandbytes") is None:
            missing[q] = "bitsandbytes is not installed"
        else:
            wanted.append(q)
    out = work / "peak_memory.json"
    argv = [sys.executable, "-m", "tools.peak_memory", "--shapes", MEMORY_SHAPES, "--quantizations",
            ",".join(wanted), "--folder", str(ROOT / ".work" / "peak"), "--json", str(out)]
    run = run_process(argv, cap, log)
    rows = json.loads(out.read_text()).get("rows", []) if out.is_file() else []
    figures = {"shapes": MEMORY_SHAPES, "rows": rows, "not_measured": missing}
    done = [r["quantization"] for r in rows] == wanted and all(r["peak_gib"] >= r["weights_gib"] > 0 for r in rows)
    status = "timeout" if run["timed_out"] else ("pass" if run["rc"] == 0 and done else "fail")
    return {"status": status, "command": argv[2:], "figures": figures, **run}


PARTS = {"cuda-tests": part_cuda_tests, "bench-gpu": part_bench_gpu, "gpu-memory": part_gpu_memory}


def verdict(parts: dict, dry: bool) -> bool:
    allowed = {"pass", "skipped"} if dry else {"pass"}
    return bool(parts) and all(p["status"] in allowed for p in parts.values()) and \
        any(p["status"] == "pass" for p in parts.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="the CPU parts only (no CUDA needed): tests skip, bench-gpu "
                   "runs its tiny CPU shape, gpu-memory is skipped")
    p.add_argument("--json", default=".work/gpu_check.json", help="the one JSON to write (default "
                   ".work/gpu_check.json)")
    p.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for the whole run (default 460)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of parts (default {','.join(PARTS)})")
    args = p.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if not args.dry and not torch.cuda.is_available():
        print(no_cuda_message(), file=sys.stderr, flush=True)
        return 2
    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"error: unknown part {unknown[0]!r}: choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report = {"pass": False, "dry": args.dry, "env": environment(args.dry), "deadline_s": args.deadline, "parts": {}}
    log(f"gpu-check{' (dry, CPU)' if args.dry else ''}: {json.dumps(report['env'])}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for name in names:
            left = args.deadline - (time.perf_counter() - t0)
            cap = min(CAPS_S[name], left - 5.0)
            if cap < MIN_PART_S:
                report["parts"][name] = {"status": "skipped", "reason": f"the run's {args.deadline:.0f} s are spent",
                                         "figures": {}}
                log(f"[{name}] skipped: the run's {args.deadline:.0f} s are spent")
                continue
            log(f"[{name}] up to {cap:.0f} s")
            result = PARTS[name](args.dry, cap, Path(tmp), log)
            report["parts"][name] = result
            log(f"[{name}] {result['status']} in {result.get('seconds', 0)} s")
            report["seconds"] = round(time.perf_counter() - t0, 1)
            report["pass"] = verdict(report["parts"], args.dry)
            Path(args.json).write_text(json.dumps(report, indent=1))
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["pass"] = verdict(report["parts"], args.dry)
    Path(args.json).write_text(json.dumps(report, indent=1))
    log(f"gpu-check {'passed' if report['pass'] else 'FAILED'} in {report['seconds']} s: " +
        ", ".join(f"{n} {p['status']}" for n, p in report["parts"].items()) + f"; wrote {args.json}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
