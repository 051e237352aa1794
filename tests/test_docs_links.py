"""Every link in the repository's Markdown (README, docs, node help, the bundled model's README) points at a file
inside the repository, and no page sends a reader to a place outside it (the project workspace's ../shared)."""
import re

from conftest import ROOT

SKIP = {".git", ".venv", ".venv457", "node_modules", ".work", "build", "demo_out", "bench_out", "out", ".host"}
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def pages():
    return [p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts)]


def test_every_relative_link_resolves_inside_the_repository():
    found, bad = 0, []
    for page in pages():
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):  # a web address or an anchor on the same page
                continue
            found += 1
            full = (page.parent / path).resolve()
            if ROOT.resolve() not in full.parents or not full.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert found >= 5 and not bad, bad


def test_no_page_points_outside_the_repository():
    bad = [str(p.relative_to(ROOT)) for p in pages() if "../shared" in p.read_text(encoding="utf-8")]
    assert not bad, bad


def test_the_test_map_marks_exactly_the_fast_tier():
    """tests/README.md's module-to-tests map stars the files of `make test-fast`: the Makefile's FAST_TESTS."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    listed = re.search(r"^FAST_TESTS :=((?:.*\\\n)*.*)$", make, re.M).group(1)
    fast = set(listed.replace("\\\n", " ").split())
    starred = set(re.findall(r"\b([a-z0-9_]+)\*", (ROOT / "tests" / "README.md").read_text(encoding="utf-8")))
    assert fast and starred - {"nodes_"} == fast  # "every nodes_* file" is a pattern, not a file
    assert all((ROOT / "tests" / f"test_{name}.py").is_file() for name in fast)
