"""`make gpu-check`: every check that needs a CUDA GPU, in one run of under 8 minutes, into one JSON.

  python -m tools.gpu_check                         # on a CUDA machine (make gpu-check): .work/gpu_check.json
  python -m tools.gpu_check --dry --json dry.json   # the same run's CPU parts, in under a minute

Parts, each in its own process group with a time cap (CAPS_S, from the budget below); the parts of a phase run
at once, the phases one after the other, and the whole run ends by --deadline (460 s):
  phase 1 (neither part's figures are times, and they fit one GPU together: under 20 GB):
  cuda-tests  pytest tests/test_cuda.py: ssd-exact == ar in fp32, the static and the compiled cache give the
              DynamicCache's distributions in fp32 and bf16, bf16 runs every decoder, no host sync inside a step
              forward, no synchronize per step, peak memory figures (on the CPU every one skips, saying it
              needs a CUDA GPU)
  gpu-memory  `make gpu-memory` (tools.peak_memory): weights and peak memory of one ssd-exact generation per
              quantization on a random Janus-Pro-7B built in bf16 on the GPU (none as built; 8-bit and 4-bit,
              where bitsandbytes is installed, saved once and loaded); --dry: its tiny CPU shape, built and
              loaded
  phase 2 (alone: its figures are times):
  bench-gpu   `make bench-gpu` (tools.bench_gpu): the random Janus-Pro-7B in bf16, eager and compiled, ar and
              ssd-exact, two compiled buckets (1 and 128) so that the compiles fit the cap (--dry: its tiny
              CPU shape)

The JSON: pass (every part passed; in --dry, every part passed or skipped for want of CUDA), dry, env (python,
torch, CUDA, transformers, bitsandbytes, the device, the commit), budget (each part's estimate and cap), parts
(name -> status pending / running / pass / fail / timeout / skipped, phase, cap_s, started_s, seconds, command,
figures, output_tail), seconds. It is written before the first part and again as each part starts and ends,
so a run stopped midway keeps what it measured and says which part was running. --dry runs its parts all at
once (on the CPU no figure is a time); --serial runs one part at a time (a GPU too small for phase 1's two);
--stall and --cap exist for the tests of the caps (tests/test_gpu_check.py).
Exit code 0 when it passes, 1 when a part failed, 2 without a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import math
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

# ---- the budget on paper (docs/speed.md, "gpu-check: the budget on paper") --------------------------------------
# No GPU run has happened yet: the caps come from these assumptions for one H100 / H200 (bf16 ~990 TFLOPs dense,
# HBM 3.3-4.8 TB/s), cold: a fresh machine, no inductor or Triton cache, a cold page cache.
START_S = 15.0  # a fresh python: torch, transformers and ssd_core imported, CUDA initialised
STEPS_7B = 576  # Janus-Pro-7B's 24x24 grid: the most steps a decoder takes (random weights accept next to nothing)
EAGER_STEP_7B_S = 0.020  # one eager 7B step, 2 CFG streams: launch-bound (~600 kernels from Python); reading the
#                          weights is 14.2 GB / 4 TB/s = 3.5 ms, ssd-exact's widest window (2 x 104 tokens) 3 TFLOP
COMPILED_STEP_7B_S = 0.006  # a CUDA-graph replay: that read, plus the sampler's eager ops
COMPILE_7B_S = 50.0  # inductor + CUDA graphs of one 7B window shape, cold: 40-60 s (30 layers to trace and lower)
COMPILE_SMALL_S = 20.0  # the same for the bundled 5M-parameter model: bound by the compile workers' start and
#                         Triton's kernel builds, not by its size
BUILD_7B_S = 5.0  # random init of 14.2 GB in bf16 on the GPU (random_models.build_random): ~650 tensors
SAVE_7B_S = 25.0  # those 14.2 GB to host memory and safetensors files (the page cache takes them)
LOAD_QUANTIZED_7B_S = 30.0  # load_model of those files with bitsandbytes quantizing layer by layer
QUANTIZED_STEP_7B_S = {"8-bit": 0.045, "4-bit": 0.030}  # bitsandbytes' int8 / nf4 layers: 1.5-2.5x an eager step
CURVES_S = 5.0  # bench-gpu's two verify-cost curves (3 lengths, 7 forwards each) beside their compiles
CUDA_TESTS_S = 60.0  # tests/test_cuda.py besides its compiles: ~100 images of the bundled model at 12x12 or less
BENCH_BUCKETS = "1,128"  # bench-gpu's compiled windows: ar's 1; 128 holds ssd-exact's widest (4 rows of 24 + 8)
BENCH_DECODERS = "ar,ssd-exact"  # (make bench-gpu itself also runs ssd and sjd, with every bucket)
CUDA_TEST_COMPILES = 4  # tests/test_cuda.py: the bundled model in fp32 and in bf16, buckets 1 and 64 (WINDOWS)
ESTIMATE_S = {
    "cuda-tests": START_S + CUDA_TEST_COMPILES * COMPILE_SMALL_S + CUDA_TESTS_S,
    "gpu-memory": START_S + BUILD_7B_S + STEPS_7B * EAGER_STEP_7B_S + SAVE_7B_S +
    sum(LOAD_QUANTIZED_7B_S + STEPS_7B * step for step in QUANTIZED_STEP_7B_S.values()),
    "bench-gpu": START_S + BUILD_7B_S + 2 * STEPS_7B * (EAGER_STEP_7B_S + COMPILED_STEP_7B_S) +
    len(BENCH_BUCKETS.split(",")) * COMPILE_7B_S + CURVES_S,
}
ALLOWANCE = 1.3  # a part's cap: its estimate x 1.3, rounded up to 5 s
CAPS_S = {name: 5.0 * math.ceil(ALLOWANCE * s / 5.0) for name, s in ESTIMATE_S.items()}
PHASES = (("cuda-tests", "gpu-memory"), ("bench-gpu",))
DEADLINE_S = 460.0  # the whole run, under 8 minutes with the interpreter's start and the JSON
RUN_START_S = 10.0  # this script's own start (torch, transformers) before its first part
# `python -m tools.gpu_check --dry --serial`, each part alone on the 2-core CPU this was written on (load average
# ~5 from other jobs): mostly each process's start (torch + transformers + the Janus classes: 8.3 s of CPU
# there), which START_S stands for; bench-gpu's tiny model also traced its 2 buckets (backend "eager") in 6.2 s.
# All three at once (--dry's plan): 32.8 s
DRY_S = {"cuda-tests": 9.0, "gpu-memory": 20.9, "bench-gpu": 23.6}
MIN_PART_S = 20.0  # a part with less time than this left is skipped, not started
MEMORY_SHAPES = "Janus-Pro-7B"
NO_CUDA = "needs a CUDA GPU"
TAIL_LINES = 40


def worst_case_s(phases=PHASES, caps=CAPS_S) -> float:
    """The run's length when every part takes its whole cap: its start, then each phase's longest cap."""
    return RUN_START_S + sum(max(caps[name] for name in phase) for phase in phases)


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


def run_process(argv: list[str], cap: float, log=print, stall: float = 0.0) -> dict:
    """Run argv from the repo root in its own process group, echoing its output; kill the whole group (inductor's
    compile workers too) at `cap` seconds. stall > 0: the group first sleeps that long, then runs argv (a part
    forced past its cap, for the tests). -> {"rc", "timed_out", "seconds", "output_tail"}."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if stall > 0:
        argv = ["sh", "-c", 'sleep "$0" && exec "$@"', f"{stall:g}", *argv]
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
    """pytest's junit XML -> counts and one row per test (outcome, seconds, the skip or failure message, and
    the figures it recorded with record_property, JSON decoded)."""
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
        row = {"name": case.get("name"), "outcome": outcome, "seconds": round(float(case.get("time") or 0), 2),
               "message": message}
        recorded = {prop.get("name"): _decoded(prop.get("value")) for prop in case.iter("property")}
        cases.append({**row, "recorded": recorded} if recorded else row)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    return {"tests": len(cases), **counts, "cases": cases}


def _decoded(value: str | None):
    try:
        return json.loads(value or "")
    except ValueError:
        return value


def part_cuda_tests(dry: bool, cap: float, work: Path, log, stall: float = 0.0) -> dict:
    xml = work / "cuda_tests.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py", "-rs",
            "-o", "junit_family=xunit1", "--junitxml", str(xml)]
    run = run_process(argv, cap, log, stall)
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


def part_bench_gpu(dry: bool, cap: float, work: Path, log, stall: float = 0.0) -> dict:
    out = work / "bench_gpu.json"
    decoders = BENCH_DECODERS.split(",")
    argv = [sys.executable, "-m", "tools.bench_gpu", "--json", str(out), "--decoders", BENCH_DECODERS]
    if dry:  # two buckets as on the GPU: ar's 1, and 64 for the tiny 8x8 grid's wider windows
        argv += ["--dry", "--buckets", "1,64", "--lengths", "1,16"]
    else:  # bench_gpu's budget starts after the 7B model is built (START_S + BUILD_7B_S on the paper)
        argv += ["--budget", str(int(max(30.0, cap - START_S - BUILD_7B_S - 10.0))), "--buckets", BENCH_BUCKETS,
                 "--lengths", "1,16,128"]
    run = run_process(argv, cap, log, stall)
    report = json.loads(out.read_text()) if out.is_file() else {}
    modes = report.get("modes", {})
    complete = all([r["decoder"] for r in modes.get(m, {}).get("rows", [])] == decoders for m in ("off", "compiled"))
    figures = {"report": report}
    if complete:
        eager, compiled = ({r["decoder"]: r for r in modes[m]["rows"]} for m in ("off", "compiled"))
        figures["summary"] = {d: {"steps": eager[d]["steps"], "ms_per_step_eager": eager[d]["ms_per_step"],
                                  "ms_per_step_compiled": compiled[d]["ms_per_step"],
                                  "speedup_compiled": round(eager[d]["wall_s"] / max(compiled[d]["wall_s"], 1e-9), 2),
                                  "peak_memory_mb": compiled[d]["peak_memory_mb"]} for d in eager if d in compiled}
        figures["compile_s"] = modes["compiled"].get("curve_s_with_compile")
    status = "timeout" if run["timed_out"] else ("pass" if run["rc"] == 0 and complete else "fail")
    return {"status": status, "command": argv[2:], "figures": figures, **run}


def part_gpu_memory(dry: bool, cap: float, work: Path, log, stall: float = 0.0) -> dict:
    out = work / "peak_memory.json"
    missing = {}
    if dry:  # the tiny shape on the CPU, as built and saved + loaded (quantization none)
        wanted = [("none", "built"), ("none", "loaded")]
        argv = [sys.executable, "-m", "tools.peak_memory", "--dry", "--json", str(out)]
    else:
        wanted = [("none", "built")]
        for q in ("8-bit", "4-bit"):
            if _version("bitsandbytes") is None:
                missing[q] = "bitsandbytes is not installed"
            else:
                wanted.append((q, "loaded"))
        argv = [sys.executable, "-m", "tools.peak_memory", "--shapes", MEMORY_SHAPES, "--quantizations",
                ",".join(q for q, _ in wanted), "--folder", str(ROOT / ".work" / "peak"), "--json", str(out)]
    run = run_process(argv, cap, log, stall)
    rows = json.loads(out.read_text()).get("rows", []) if out.is_file() else []
    figures = {"shapes": "tiny" if dry else MEMORY_SHAPES, "rows": rows, "not_measured": missing}
    done = [(r.get("quantization"), r.get("source")) for r in rows] == wanted and \
        all(r["peak_gib"] >= r["weights_gib"] > 0 for r in rows)
    status = "timeout" if run["timed_out"] else ("pass" if run["rc"] == 0 and done else "fail")
    return {"status": status, "command": argv[2:], "figures": figures, **run}


PARTS = {"cuda-tests": part_cuda_tests, "gpu-memory": part_gpu_memory, "bench-gpu": part_bench_gpu}


def verdict(parts: dict, dry: bool) -> bool:
    allowed = {"pass", "skipped"} if dry else {"pass"}
    return bool(parts) and all(p["status"] in allowed for p in parts.values()) and \
        any(p["status"] == "pass" for p in parts.values())


def _seconds_by_part(pairs: list[str] | None, what: str) -> dict[str, float]:
    """["NAME=SECONDS", ...] -> {name: seconds}; an unknown part or a bad number is an error naming it."""
    out = {}
    for pair in pairs or []:
        name, _, value = pair.partition("=")
        if name not in PARTS:
            raise SystemExit(f"error: --{what} {pair!r}: unknown part {name!r}; choose from {', '.join(PARTS)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"error: --{what} {pair!r}: {value!r} is not a number of seconds") from None
    return out


def plan(names: list[str], serial: bool = False, dry: bool = False) -> list[list[str]]:
    """The phases to run: PHASES cut down to `names` (in its order); serial: `names` one at a time; dry (no
    figure is a time on the CPU): `names` all at once."""
    if serial:
        return [[n] for n in names]
    if dry:
        return [list(names)]
    return [[n for n in phase if n in names] for phase in PHASES if any(n in names for n in phase)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="the CPU parts only (no CUDA needed): tests skip, bench-gpu "
                   "and gpu-memory run their tiny CPU shapes")
    p.add_argument("--json", default=".work/gpu_check.json", help="the one JSON to write (default "
                   ".work/gpu_check.json)")
    p.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for the whole run (default 460)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of parts (default {','.join(PARTS)})")
    p.add_argument("--serial", action="store_true", help="one part at a time, in --parts order (a GPU that "
                   "cannot hold phase 1's two parts at once)")
    p.add_argument("--cap", action="append", metavar="PART=SECONDS", help="a part's cap instead of CAPS_S's")
    p.add_argument("--stall", action="append", metavar="PART=SECONDS", help="the part's command first sleeps "
                   "this long (for the tests of the caps)")
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
    caps = {**CAPS_S, **_seconds_by_part(args.cap, "cap")}
    stalls = _seconds_by_part(args.stall, "stall")
    phases = plan(names, args.serial, args.dry)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report = {"pass": False, "dry": args.dry, "env": environment(args.dry), "deadline_s": args.deadline,
              "budget": {n: {"estimate_s": round(ESTIMATE_S[n], 1), "cap_s": caps[n], "dry_s": DRY_S[n]}
                         for n in names},
              "parts": {n: {"status": "pending", "phase": i + 1} for i, phase in enumerate(phases) for n in phase}}
    lock = threading.Lock()

    def write():
        with lock:
            report["seconds"] = round(time.perf_counter() - t0, 1)
            report["pass"] = verdict(report["parts"], args.dry)
            out.write_text(json.dumps(report, indent=1))

    def run_part(name: str, cap: float, tmp: Path) -> None:
        part_log = lambda s: log(f"[{name}] {s}")  # noqa: E731
        try:
            result = PARTS[name](args.dry, cap, tmp, part_log, stalls.get(name, 0.0))
        except Exception as e:  # noqa: BLE001 - a part's own bug is its failure, never the others'
            result = {"status": "fail", "error": f"{type(e).__name__}: {e}", "figures": {}}
        with lock:
            report["parts"][name].update(result)
        part_log(f"{result['status']} in {result.get('seconds', 0)} s")
        write()

    log(f"gpu-check{' (dry, CPU)' if args.dry else ''}: {json.dumps(report['env'])}")
    write()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for phase in phases:
            threads = []
            for name in phase:
                left = args.deadline - (time.perf_counter() - t0)
                cap = min(caps[name], left - 5.0)
                entry = report["parts"][name]
                if cap < min(MIN_PART_S, caps[name]):
                    entry.update({"status": "skipped", "reason": f"the run's {args.deadline:.0f} s are spent",
                                  "figures": {}})
                    log(f"[{name}] skipped: the run's {args.deadline:.0f} s are spent")
                    continue
                entry.update({"status": "running", "cap_s": round(cap, 1),
                              "started_s": round(time.perf_counter() - t0, 1)})
                log(f"[{name}] up to {cap:.0f} s")
                threads.append(threading.Thread(target=run_part, args=(name, cap, Path(tmp) / name)))
                (Path(tmp) / name).mkdir()
            write()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    write()
    log(f"gpu-check {'passed' if report['pass'] else 'FAILED'} in {report['seconds']} s: " +
        ", ".join(f"{n} {p['status']}" for n, p in report["parts"].items()) + f"; wrote {args.json}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
