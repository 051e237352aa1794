"""The README's results table, made from the committed bench of record (docs/bench_reference.json).

    python tools/readme_results.py            # print the table
    python tools/readme_results.py --write    # put it into README.md between its markers
tests/test_readme.py fails when README.md and the JSON disagree."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench_reference.json"
START, END = "<!-- results:start (tools/readme_results.py) -->", "<!-- results:end -->"
ROWS = {  # bench row -> what the README calls it ("{picked}": what ssd-exact's default picked on the bench's device)
    "ar": "`ar` (plain AR, the reference)",
    "ssd-exact": "`ssd-exact` (the default; here it picked {picked})",
    "ssd-exact@3": "`ssd-exact`, 3 rows with heads (the fewest steps)",
    "ssd-exact@3:noheads": "`ssd-exact`, 3 rows without heads",
    "ssd f=2": "`ssd`",
    "sjd": "`sjd` (peer)",
    "zipar": "`zipar` (peer)",
}


def table(report: dict) -> str:
    rows = {r["decoder"]: r for r in report["rows"]}
    out = ["| decoder | model steps | fewer steps than `ar` | less time than `ar` (CPU) | quality: NLL vs `ar` | "
           "class accuracy | same image as `ar` |", "|---|---:|---:|---:|---:|---:|---|"]
    for key, name in ROWS.items():
        r = rows[key]
        p = r.get("params", {})
        if "draft_rows_picked" in p:
            n = p["draft_rows_picked"]
            name = name.format(picked=f"{n} row{'s' if n > 1 else ''} {'with' if p['heads_used'] else 'without'} heads")
        same = "yes" if r["identical_to_ar"] else f"no ({r['same_cells_as_ar'] * 100:.0f}% of cells)"
        out.append(f"| {name} | {r['steps']:g} | {r['step_ratio']:.1f}x | {r['wall_ratio']:.2f}x | "
                   f"{'-' if r['nll_full_gap'] is None else format(r['nll_full_gap'] * 100, '+.1f') + '%'} | {r['class_acc'] * 100:.0f}% | {same} |")
    grid = "x".join(str(v) for v in report["grid"])
    out.append("")
    out.append(f"The bundled model, {report['images']} images of {grid} tokens, medians (`make bench`; "
               "docs/bench.md has every column and how to reproduce it).")
    return "\n".join(out)


def current() -> str:
    return table(json.loads(BENCH.read_text()))


def in_readme(text: str) -> str:
    return text[text.index(START) + len(START):text.index(END)].strip()


if __name__ == "__main__":
    made = current()
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = readme.read_text()
        readme.write_text(text[:text.index(START) + len(START)] + "\n" + made + "\n" + text[text.index(END):])
    print(made)
