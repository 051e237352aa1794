"""The README's results tables, made from the committed benches of record (docs/bench_reference.json at 24x24,
docs/bench_reference48.json at 48x48).

    python tools/readme_results.py            # print the tables
    python tools/readme_results.py --write    # put them into README.md between its markers
tests/test_readme.py fails when README.md and the JSON disagree."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench_reference.json"
BENCH48 = ROOT / "docs" / "bench_reference48.json"
START, END = "<!-- results:start (tools/readme_results.py) -->", "<!-- results:end -->"
ROWS = {  # bench row -> what the README calls it ("{picked}": what ssd-exact's default picked on the bench's device)
    "ar": "`ar` (plain AR, the reference)",
    "ssd-exact": "`ssd-exact` (the default; here it picked {picked})",
    "ssd-exact@3": "`ssd-exact`, 3 rows with heads",
    "ssd-exact@4": "`ssd-exact`, 4 rows with heads",
    "ssd-exact@3:noheads": "`ssd-exact`, 3 rows without heads",
    "ssd f=2": "`ssd`",
    "ssd": "`ssd`",
    "ssd r=3 a=10": "`ssd` (reference-48's defaults: 3 verify rounds, adaptive 10%)",
    "ssd r=2": "`ssd`, 2 verify rounds (the decoder's default)",
    "sjd-pac": "`sjd-pac` (peer, lossless)",
    "scd": "`scd` (peer, lossless)",
    "sjd": "`sjd` (peer, lossless)",
    "gsd": "`gsd` (peer, lossy)",
    "zipar": "`zipar` (peer, lossy)",
}


def table(report: dict) -> str:
    """One row per decoder of ROWS the report has, in ROWS' order."""
    rows = {r["decoder"]: r for r in report["rows"]}
    out = ["| decoder | model steps | fewer steps than `ar` | less time than `ar` (CPU) | quality: NLL vs `ar` | "
           "class accuracy | same image as `ar` |", "|---|---:|---:|---:|---:|---:|---|"]
    names = [key for key in ROWS if key in rows and not (key == "ssd" and "ssd f=2" in rows)]
    for key in names:
        r, name = rows[key], ROWS[key]
        p = r.get("params", {})
        if "draft_rows_picked" in p:
            n = p["draft_rows_picked"]
            name = name.format(picked=f"{n} row{'s' if n > 1 else ''} {'with' if p['heads_used'] else 'without'} heads")
        same = "yes" if r["identical_to_ar"] else f"no ({r['same_cells_as_ar'] * 100:.0f}% of cells)"
        out.append(f"| {name} | {r['steps']:g} | {r['step_ratio']:.1f}x | {r['wall_ratio']:.2f}x | "
                   f"{'-' if r['nll_full_gap'] is None else format(r['nll_full_gap'] * 100, '+.1f') + '%'} | {r['class_acc'] * 100:.0f}% | {same} |")
    return "\n".join(out)


def note(report: dict, model: str, make: str) -> str:
    grid = "x".join(str(v) for v in report["grid"])
    seed = report.get("settings", {}).get("seed", 0)
    return (f"{model}, {report['images']} images of {grid} tokens (seeds {seed}-{seed + report['images'] - 1}), "
            f"medians (`{make}`; docs/bench.md has every column and how to reproduce it).")


def current() -> str:
    small = json.loads(BENCH.read_text())
    parts = [table(small), "", note(small, "The bundled model", "make bench")]
    if BENCH48.is_file():
        big = json.loads(BENCH48.read_text())
        parts += ["", table(big), "", note(big, "The bundled 48x48 model (`reference-48`)", "make bench-48")]
    return "\n".join(parts)


def in_readme(text: str) -> str:
    return text[text.index(START) + len(START):text.index(END)].strip()


if __name__ == "__main__":
    made = current()
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = readme.read_text()
        readme.write_text(text[:text.index(START) + len(START)] + "\n" + made + "\n" + text[text.index(END):])
    print(made)
