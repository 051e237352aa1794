"""What the base model is asked to draw when it self-distils its grids.

Text-to-image models: the prompts of a file (`train-heads --prompts FILE`): plain text, one prompt a line;
JSON Lines (one object a line, the prompt under a named key, or one JSON string a line); CSV or TSV with a
header row and a named column. Without a file, the shipped list: PartiPrompts (1,632 English prompts in 12
categories, Apache-2.0; ssd_core/data/prompts/NOTICE says where it came from). Class-conditional models draw
their class ids. Grid i gets prompt `order[i]`: the list shuffled once per pass (by the seed), so every prompt
is used about as often, and the first N grids of a longer run are the N grids of a shorter one.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from pathlib import Path

from ..errors import SSDError, shown
from ..model_files import check_path
from .data import parse_json

DATA = Path(__file__).resolve().parent.parent / "data" / "prompts"
DEFAULT_PROMPTS = DATA / "PartiPrompts.tsv"
DEFAULT_COLUMN = "Prompt"
MAX_PROMPT_CHARS = 4000  # a prompt longer than this is a wrong column or a wrong file
MAX_FILE_BYTES = 1 << 30
FORMATS = {".txt": "text", ".text": "text", ".prompts": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".csv": "csv", ".tsv": "tsv"}


def read_prompts(path, column: str | None = None) -> list[str]:
    """The prompts of a file, by its extension: .txt (one a line; blank lines skipped), .jsonl (one JSON
    object a line, the prompt under `column`, default 'prompt'; or one JSON string a line), .csv / .tsv (a
    header row; the prompts in `column`, default 'prompt', matched without regard to case)."""
    check_path(path, "--prompts")
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise SSDError(f"--prompts {path}: unknown file type {path.suffix or '(none)'}: give a .txt (one prompt a "
                       "line), .jsonl, .csv or .tsv file")
    if not path.is_file():
        raise SSDError(f"--prompts {path} is not a file: give a prompts file (.txt, .jsonl, .csv or .tsv)")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise SSDError(f"--prompts {path} is {path.stat().st_size >> 20} MB: a prompts file is at most 1 GB")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SSDError(f"--prompts {path} is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    if kind == "text":
        if column is not None:
            raise SSDError(f"--prompt-column {column}: {path.name} is plain text (one prompt a line) and has no "
                           "columns; leave --prompt-column out, or give a .jsonl / .csv / .tsv file")
        prompts = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    elif kind == "jsonl":
        prompts = _jsonl(path, text, column or "prompt")
    else:
        prompts = _table(path, text, column, "\t" if kind == "tsv" else ",")
    out = []
    for n, prompt in prompts:
        if not prompt:
            if kind == "text":
                continue
            raise SSDError(f"--prompts {path}, line {n}: the prompt is empty; remove the line or fill it in")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise SSDError(f"--prompts {path}, line {n}: a prompt of {len(prompt)} characters (at most "
                           f"{MAX_PROMPT_CHARS}); is it the right column or file?")
        out.append(prompt)
    if not out:
        raise SSDError(f"--prompts {path} holds no prompts: give at least one")
    return out


def _jsonl(path: Path, text: str, column: str) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value = parse_json(line, f"--prompts {path}, line {n}", "a .jsonl file holds one JSON object (or string) a "
                           "line")
        if isinstance(value, dict):
            if column not in value:
                keys = ", ".join(shown(k, 30) for k in list(value)[:6])
                raise SSDError(f"--prompts {path}, line {n}: no key {column!r} (it has {keys}): name the prompts' key "
                               "with --prompt-column")
            value = value[column]
        if not isinstance(value, str):
            raise SSDError(f"--prompts {path}, line {n}: the prompt is a {type(value).__name__}, not text")
        out.append((n, value.strip()))
    return out


def _table(path: Path, text: str, column: str | None, delimiter: str) -> list[tuple[int, str]]:
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    except csv.Error as err:
        raise SSDError(f"--prompts {path}: not a readable {'TSV' if delimiter == chr(9) else 'CSV'} file ({err})") \
            from None
    if not rows:
        raise SSDError(f"--prompts {path} is empty: a CSV / TSV file needs a header row and one prompt a row")
    header = [h.strip() for h in rows[0]]
    want = column or "prompt"
    found = [i for i, h in enumerate(header) if h == want] or [i for i, h in enumerate(header)
                                                               if h.lower() == want.lower()]
    if len(found) != 1:
        shown = ", ".join(repr(h) for h in header[:8])
        what = "no" if not found else "more than one"
        raise SSDError(f"--prompts {path}: {what} column {want!r} in the header ({shown}): name the prompts' column "
                       "with --prompt-column")
    col = found[0]
    out = []
    for n, row in enumerate(rows[1:], 2):
        if not any(cell.strip() for cell in row):
            continue
        if col >= len(row):
            raise SSDError(f"--prompts {path}, row {n}: {len(row)} cells, no {header[col]!r} column")
        out.append((n, row[col].strip()))
    return out


def default_prompts() -> list[str]:
    """The shipped prompt list (PartiPrompts, Apache-2.0)."""
    return read_prompts(DEFAULT_PROMPTS, DEFAULT_COLUMN)


def prompt_source(model, prompts=None) -> tuple[list, str]:
    """(what grid i may be asked for, its name): class ids for a class-conditional model, else the given
    prompts (a list) or the shipped list."""
    if getattr(model, "class_names", None) is not None or hasattr(model, "class_id"):
        if prompts is not None:
            raise SSDError(f"--prompts: this {model.family} model is class-conditional: its grids are drawn for its "
                           "class ids in turn; leave --prompts out")
        num = int(model.spec["num_classes"]) if hasattr(model, "spec") else len(model.class_names)
        return list(range(num)), f"class ids 0..{num - 1}"
    if prompts is None:
        return default_prompts(), "PartiPrompts (the shipped list)"
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise SSDError("train-heads prompts must be a non-empty list of non-empty texts")
    return prompts, f"{len(prompts)} prompts given"


def prompt_order(count: int, n: int, seed: int) -> list[int]:
    """Prompt index of each of n grids: passes over range(count), each shuffled by (seed, pass)."""
    out: list[int] = []
    round_ = 0
    while len(out) < n:
        one = list(range(count))
        random.Random(f"ssd-prompts-{seed}-{round_}").shuffle(one)
        out += one
        round_ += 1
    return out[:n]


def digest(prompts: list) -> str:
    """A short fingerprint of a prompt list (shards made from another list are refused)."""
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()[:16]
