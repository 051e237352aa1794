"""Paths no file system takes and outputs that must survive (issue 39): a name over 255 bytes or a NUL in a model,
heads or output path is refused in one SSDError line before any work; a rewrite that fails midway (a full disk)
leaves the old file as it was and no temp file; the trace JSON is strict (no Infinity / NaN, which a browser's
JSON.parse refuses)."""
import errno
import json
import math
import os
import stat
from pathlib import Path

import pytest
import torch

import ssd_core
from ssd_core import cli, outputs
from ssd_core.hub import hub_file
from ssd_core.trace import Trace
from ssd_core.training import TrainConfig, train_heads
from bad_inputs import one_line

SSDError = ssd_core.SSDError
LONG = "n" * 300  # one name of 300 bytes: ENAMETOOLONG on every common file system
TOO_LONG = ["bytes long; a file or folder name takes at most 255 bytes"]


@pytest.fixture
def no_work(monkeypatch):
    """Model loading, sampling and grid generation all fail the test: the input had to be refused first."""
    import ssd_core.api as api
    import ssd_core.training.data as train

    stop = lambda *a, **k: pytest.fail("the work started before the path was checked")  # noqa: E731
    monkeypatch.setattr(api, "decode_batch", stop)
    monkeypatch.setattr(api, "detect_family", stop)
    monkeypatch.setattr(train, "generate_grids", stop)


def _err_lines(capsys) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]


def _strict(text: str):
    """json.loads that refuses Infinity, -Infinity and NaN, as JSON.parse does."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


# ---- 1. a name over 255 bytes, a NUL: one line before the work ------------------------------------------------
CLI_CASES = [  # (case, argv, words)
    ("out name", "generate --out {tmp}/" + LONG + ".png", ["--out", *TOO_LONG]),
    ("out folder", "generate --out {tmp}/" + LONG + "/x.png", ["--out", *TOO_LONG]),
    ("trace name", "generate --trace {tmp}/" + LONG + ".json", ["--trace", *TOO_LONG]),
    ("model folder", "generate --model {tmp}/" + LONG, ["--model", *TOO_LONG]),
    ("heads file", "generate --heads {tmp}/" + LONG + ".safetensors", ["--heads", *TOO_LONG]),
    ("out-dir", "bench --model reference --out-dir {tmp}/" + LONG, ["--out-dir", *TOO_LONG]),
    ("out NUL", "generate --out {tmp}/a\0b.png", ["--out", "holds a NUL character (\\x00)"]),
]


@pytest.mark.parametrize("case, argv, words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_a_path_no_file_system_takes(tmp_path, capsys, no_work, case, argv, words):
    code = cli.main([a.format(tmp=tmp_path) for a in argv.split()])
    lines = _err_lines(capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    one_line(lines[0])
    for w in words:
        assert w in lines[0], lines[0]


def test_cli_refuses_a_long_heads_path_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ssd_core, "load_model", lambda *a, **k: pytest.fail("the model loaded before --heads was checked"))
    code = cli.main(["generate", "--grid", "4x4", "--heads", str(tmp_path / (LONG + ".safetensors"))])
    lines = _err_lines(capsys)
    assert code == 2 and len(lines) == 1 and "--heads" in lines[0] and "at most 255 bytes" in lines[0], lines


@pytest.mark.parametrize("call", ["load_model", "load_model NUL", "load_model download", "load_heads", "load_heads NUL",
                                  "check_output_dir", "hub_file", "whole path"])
def test_api_refuses_a_path_no_file_system_takes(bundled, tmp_path, no_work, call):
    long = tmp_path / LONG / "m"
    calls = {
        "load_model": lambda: ssd_core.load_model(long),
        "load_model NUL": lambda: ssd_core.load_model(str(tmp_path / "a\0b")),
        "load_model download": lambda: ssd_core.load_model(long, family="janus", download=True),
        "load_heads": lambda: ssd_core.load_heads(str(long) + ".safetensors", bundled[0]),
        "load_heads NUL": lambda: ssd_core.load_heads(str(tmp_path / "h\0.safetensors"), bundled[0]),
        "check_output_dir": lambda: outputs.check_output_dir(long, "--out-dir"),
        "hub_file": lambda: hub_file("owner/name", "heads.safetensors", long, download=True),
        "whole path": lambda: ssd_core.load_model("/".join(["d" * 200] * 25)),
    }
    with pytest.raises(SSDError) as err:
        calls[call]()
    text = one_line(err)
    want = ("holds a NUL character" if "NUL" in call else "is 5,024 bytes long; a path takes at most 4,095 bytes"
            if call == "whole path" else "at most 255 bytes")
    assert want in text, text


def test_train_heads_refuses_a_nul_in_its_out_path_before_the_run(bundled, tmp_path, no_work):
    """The API's own output path (train_heads out): the NUL used to pass the check and end the run raw."""
    with pytest.raises(SSDError) as err:
        train_heads(bundled[0], str(tmp_path / "h\0.safetensors"), TrainConfig(samples=2, heldout=1))
    assert "train-heads out" in one_line(err) and "NUL" in str(err.value)


# ---- 3. a rewrite that fails midway keeps the old file ---------------------------------------------------------
def _half_then_full_disk(fail_times: int):
    """A write callback that writes half its content, then fails with ENOSPC (the first `fail_times` calls)."""
    calls = []

    def write(path):
        calls.append(Path(path))
        with open(path, "w") as f:
            f.write("new ")
            if len(calls) <= fail_times:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            f.write("content")
    return write, calls


def test_a_failed_rewrite_keeps_the_old_file(tmp_path, keep_dir):
    folder = tmp_path / "out"
    folder.mkdir()
    old = folder / "t.json"
    old.write_text("old content")
    write, calls = _half_then_full_disk(1)
    with pytest.raises(SSDError) as err:
        outputs.write_or_keep(old, write, "--trace")
    text = one_line(err)
    assert old.read_text() == "old content"  # it was cut to "new " before
    assert sorted(p.name for p in folder.iterdir()) == ["t.json"]  # no temp file left
    kept = list(keep_dir.glob("t.kept-*.json"))
    assert len(kept) == 1 and kept[0].read_text() == "new content" and str(kept[0]) in text, text
    assert calls[0].parent == folder and calls[0] != old  # written beside, never over the old file


def test_a_failed_rewrite_with_no_room_anywhere_keeps_the_old_file(tmp_path, keep_dir):
    old = tmp_path / "h.safetensors"
    old.write_bytes(b"old")
    write, _ = _half_then_full_disk(3)
    with pytest.raises(SSDError, match="nor a copy"):
        outputs.write_or_keep(old, write, "--out")
    assert old.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.safetensors", "kept"] and not list(keep_dir.iterdir())


def test_a_rewrite_keeps_the_mode_and_writes_through_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert outputs.write_or_keep(link, lambda p: Path(p).write_text("new")) == link
    assert link.is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


# ---- 4. the trace JSON is strict --------------------------------------------------------------------------------
def _trace(**kw) -> Trace:
    grid = torch.zeros(2, 2, dtype=torch.int32)
    return Trace("ar", (2, 2), grid.long(), grid.to(torch.int8) + 1, grid, grid, 4,
                 settings={"seed": 0, "cfg": math.inf}, **kw)


def test_the_trace_dict_is_strict_json():
    d = _trace(nll=math.inf, nll_full=math.inf, out_of_support=math.nan, timings={"wall": math.inf},
               peak_memory_mb=math.nan, exact={"error_bound": math.inf}).to_dict()
    _strict(json.dumps(d, allow_nan=False))
    assert d["nll_full"] is None and d["out_of_support"] is None and d["settings"]["cfg"] is None
    assert d["timings"]["wall"] is None and d["exact"]["error_bound"] is None
    assert _trace(nll_full=2.5).to_dict()["nll_full"] == 2.5  # a finite figure is kept


def test_the_cli_trace_file_is_strict_json(tmp_path, capsys, monkeypatch):
    """A run whose untruncated NLL is infinite: --trace writes null, never Infinity."""
    real = ssd_core.generate

    def infinite(*a, **k):
        result = real(*a, **k)
        result.trace.nll_full = math.inf
        return result
    monkeypatch.setattr(ssd_core, "generate", infinite)
    path = tmp_path / "t.json"
    code = cli.main(["generate", "--heads", "none", "--decoder", "ar", "--grid", "4x4", "--trace", str(path)])
    assert code == 0, _err_lines(capsys)
    assert _strict(path.read_text())["nll_full"] is None
