"""`check-model`'s report on one screen (under 30 lines, 118 columns), and its blocking findings on one line for
the loader node's error. The checks themselves: check_model.py."""
from __future__ import annotations

import re
import textwrap

from .check_model import GIB, Report, size_text
from .memory import RESERVE_BYTES

WIDTH = 118  # the report's lines: one screen of a wide terminal


def _held_line(files: list) -> str:
    """'config.json, model-*-of-00003.safetensors (3 files, 13.8 GiB), tokenizer.json'."""
    shards: dict = {}
    names = []
    for name, size in files:
        m = re.fullmatch(r"(.*)-\d+-of-(\d+)(\.safetensors)", name)
        key = f"{m.group(1)}-*-of-{m.group(2)}{m.group(3)}" if m else name
        if key not in shards:
            names.append(key)
        n, total = shards.get(key, (0, 0))
        shards[key] = (n + 1, total + size)
    out = []
    for key in names:
        n, size = shards[key]
        big = size_text(size) if size >= 2**20 else ""  # the sizes worth knowing: weights, VQ files
        out.append(key + (f" ({n} files{', ' + big if big else ''})" if n > 1 else f" ({big})" if big else ""))
    return ", ".join(out)


def _memory_lines(report: Report) -> list:
    from importlib.util import find_spec

    devices = list(report.free)
    count = f"{report.params / 1e9:.2f} B" if report.params >= 1e8 else f"{report.params / 1e6:.1f} M"
    head = f"memory of the weights ({count} parameters); free here: " + ", ".join(
        f"{d} {report.free[d] / GIB:.1f} GiB" for d in devices)
    lines = [head]
    bnb = find_spec("bitsandbytes") is not None
    for q, size in report.memory.items():
        fits = []
        for d in devices:
            need = size + (RESERVE_BYTES if d.startswith("cuda") else 0)
            fits.append(f"{d} {'fits' if need <= report.free[d] else 'too big'}")
        extra = "" if bnb or q in ("bf16", "fp16", "fp32") else "  (needs pip install bitsandbytes)"
        lines.append(f"  {q:<6} {size_text(size):>10}   {', '.join(fits)}{extra}")
    if any(d.startswith("cuda") for d in devices):
        lines.append(f"  (a GPU fits when it has the weights and {RESERVE_BYTES // GIB} GiB for the cache free; "
                     "8-bit / 4-bit keep the image head and VQ in bf16)")
    return lines


def format_report(report: Report, memory: bool = True) -> str:
    """The report on one screen (under 30 lines)."""
    fam = f"{report.family} ({report.family_from})" if report.family else "unknown"
    lines = [f"check-model {report.folder}", f"family: {fam}"]
    lines += textwrap.wrap(f"holds: {_held_line(report.files) or 'nothing'}", WIDTH, subsequent_indent=" " * 7)
    for f in report.findings:
        lines += textwrap.wrap(f"  {f.level:<8}{f.topic}: {f.line}", WIDTH, subsequent_indent=" " * 10,
                               break_on_hyphens=False)
    if memory and report.memory:
        lines += _memory_lines(report)
    verdict = "loadable" if report.loadable else \
        f"NOT loadable: {len(report.blocking())} finding(s) above block loading"
    imported = f"; {report.import_seconds:.1f} s importing transformers' model code" \
        if report.import_seconds >= 0.1 else ""
    lines.append(f"{verdict} (checked in {report.seconds:.2f} s{imported})")
    return "\n".join(lines)


def key_findings(report: Report) -> str:
    """The blocking findings on one line (the loader node's error)."""
    fam = f"family {report.family}" if report.family else "no family known"
    found = "; ".join(f"{f.topic}: {f.line}" for f in report.blocking()[:4])
    return f"check-model ({fam}): {found}" if found else ""
