"""tests/costs.json: each test file's summed test seconds, from a pytest JUnit XML report, so that conftest.py can
hand the costliest files to the xdist workers first (the longest file then never starts last and ends alone).

    .venv/bin/python -m pytest -n 2 --dist loadfile tests --junitxml=report.xml
    .venv/bin/python tools/test_costs.py report.xml            # rewrites tests/costs.json
"""
from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

COSTS = Path(__file__).resolve().parents[1] / "tests" / "costs.json"


def file_seconds(junit_xml: str) -> dict[str, float]:
    """{"tests/test_x.py": summed seconds of its test cases (setup and teardown included)}, costliest first."""
    seconds: Counter = Counter()
    for case in ET.parse(junit_xml).iter("testcase"):
        parts = case.get("classname").split(".")  # tests.test_x, or tests.test_x.TestClass
        module = next(p for p in parts if p.startswith("test_"))
        seconds["/".join(parts[:parts.index(module) + 1]) + ".py"] += float(case.get("time") or 0)
    return {name: round(s, 1) for name, s in seconds.most_common()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit_xml")
    ap.add_argument("--out", default=str(COSTS))
    args = ap.parse_args(argv)
    costs = file_seconds(args.junit_xml)
    Path(args.out).write_text(json.dumps(costs, indent=1) + "\n")
    print(f"wrote {args.out}: {len(costs)} files, {sum(costs.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
