"""The suite's schedule (tests/costs.json, conftest.py): files handed to the xdist workers costliest first."""
import json
import types
from pathlib import Path

import conftest
from tools.test_costs import file_seconds

ROOT = Path(__file__).resolve().parents[1]


def test_file_seconds_sums_each_files_cases_classes_included(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="t1" time="1.5"/>
      <testcase classname="tests.test_b.TestThing" name="t2" time="4.0"/>
      <testcase classname="tests.test_a" name="t3" time="2.0"/>
      <testcase classname="tests.test_c" name="t4"/>
    </testsuite></testsuites>""")
    costs = file_seconds(str(report))
    assert costs == {"tests/test_b.py": 4.0, "tests/test_a.py": 3.5, "tests/test_c.py": 0.0}
    assert list(costs) == ["tests/test_b.py", "tests/test_a.py", "tests/test_c.py"]  # costliest first


def test_the_table_names_only_files_that_exist():
    costs = json.loads((ROOT / "tests" / "costs.json").read_text())
    assert costs and all((ROOT / name).is_file() for name in costs), [n for n in costs if not (ROOT / n).is_file()]


def test_collection_puts_costly_files_first_and_keeps_each_files_order():
    costly, cheap = sorted(conftest.COSTS, key=conftest.COSTS.get)[-1], sorted(conftest.COSTS, key=conftest.COSTS.get)[0]
    new = "tests/test_not_in_the_table.py"
    items = [types.SimpleNamespace(path=ROOT / name, name=f"{name}::{i}")
             for name in (cheap, new, costly) for i in range(3)]
    conftest.pytest_collection_modifyitems(None, None, items)
    assert [it.name for it in items] == [f"{costly}::{i}" for i in range(3)] + [f"{new}::{i}" for i in range(3)] + \
        [f"{cheap}::{i}" for i in range(3)]  # the file the table lacks counts NEW_FILE_COST, between the two


def test_make_test_keeps_the_collection_order():
    make = (ROOT / "Makefile").read_text()
    lines = [x for x in make.splitlines() if "--dist loadfile" in x]
    assert len(lines) == 3 and all("--no-loadscope-reorder" in x for x in lines)  # else xdist sorts by test count
