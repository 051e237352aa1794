"""SSD_CALIBRATION_FILE is only a cache (issue 39): a device, FIFO, directory or symlink is never read through nor
replaced, concurrent writers keep valid JSON and every entry, and poisoned values cost a re-measure, not a crash."""
import json
import multiprocessing
import os
import stat

import pytest

from ssd_core import calibrate
from ssd_core.calibrate import Costs


def costs(stride=24, scale=1.0):
    windows = Costs({}, 1e-5, stride).windows()
    return Costs({w: scale * (0.01 + 1e-4 * w) for w in windows}, 1e-5, stride)


def test_a_regular_file_round_trips_and_merges(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(path))
    calibrate._write_file(calibrate._path(), "a", costs())
    calibrate._write_file(calibrate._path(), "b", costs(scale=2.0))
    path = calibrate._path()
    assert calibrate._read_file(path, "a") == costs() and calibrate._read_file(path, "b") == costs(scale=2.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json", "cal.json.lock"]  # no temp file left


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_char_device_is_neither_read_nor_replaced(tmp_path, monkeypatch):
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(node))
    assert calibrate._read_file(calibrate._path(), "a") is None
    calibrate._write_file(calibrate._path(), "a", costs())
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_dev_zero_is_not_read_to_the_end(monkeypatch):
    monkeypatch.setenv("SSD_CALIBRATION_FILE", "/dev/zero")
    assert calibrate._read_file(calibrate._path(), "a") is None  # refused at once, not read until memory runs out


def test_a_fifo_does_not_hang(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(fifo))
    assert calibrate._read_file(calibrate._path(), "a") is None  # O_NONBLOCK open, then refused: no writer is waited for
    calibrate._write_file(calibrate._path(), "a", costs())
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_is_left_as_it_was(tmp_path, monkeypatch):
    folder = tmp_path / "cal"
    folder.mkdir()
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(folder))
    assert calibrate._read_file(calibrate._path(), "a") is None
    calibrate._write_file(calibrate._path(), "a", costs())
    assert folder.is_dir() and list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cal"]


def test_planted_symlinks_are_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "cal.json"
    (tmp_path / "cal.json.tmp").symlink_to(victim)  # the old fixed temp name
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(path))
    calibrate._write_file(calibrate._path(), "a", costs())
    assert victim.read_text() == "precious" and calibrate._read_file(calibrate._path(), "a") == costs()
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(link))
    assert calibrate._read_file(calibrate._path(), "a") is None
    calibrate._write_file(calibrate._path(), "a", costs())
    assert link.is_symlink() and victim.read_text() == "precious"


def test_a_file_over_the_cap_is_ignored(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"a": {"forward_s": {}, "pad": "x" * calibrate.MAX_FILE_BYTES}}))
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(path))
    assert calibrate._read_file(calibrate._path(), "a") is None
    path.write_text("[" * 100000 + "]" * 100000)  # nested past the recursion limit
    assert calibrate._read_file(calibrate._path(), "a") is None


def _writer(path, i):
    os.environ["SSD_CALIBRATION_FILE"] = path
    for j in range(5):
        calibrate._write_file(calibrate._path(), f"w{i}-{j}", costs(scale=1 + i))


def test_six_concurrent_writers_keep_valid_json_and_every_entry(tmp_path):
    path = str(tmp_path / "cal.json")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, i)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    data = json.loads(open(path).read())
    assert sorted(data) == sorted(f"w{i}-{j}" for i in range(6) for j in range(5))


@pytest.mark.parametrize("poison", [
    {"op_s": -1.0}, {"op_s": 0}, {"op_s": float("nan")}, {"op_s": True}, {"row_stride": 0}, {"row_stride": -5},
    {"row_stride": 1.5}, {"forward_s": {"1": 0.0}}, {"forward_s": "x"}, {"forward_s": {"-1": 1.0}}, "entry",
    {"forward_s": {"1": 10.0}}, {"forward_s": {"1": 1e9}},  # a 1,000x "speedup"; a forward of 30 years
])
def test_poisoned_values_are_measured_again(tmp_path, monkeypatch, poison):
    path = tmp_path / "cal.json"
    monkeypatch.setenv("SSD_CALIBRATION_FILE", str(path))
    calibrate._write_file(calibrate._path(), "a", costs())
    data = json.loads(path.read_text())
    if isinstance(poison, dict):
        entry = data["a"]
        if "forward_s" in poison and isinstance(poison["forward_s"], dict):
            entry["forward_s"].update(poison["forward_s"])
        else:
            entry.update(poison)
    else:
        data["a"] = poison
    path.write_text(json.dumps(data))  # NaN is written as NaN: json.loads reads it back
    assert calibrate._read_file(calibrate._path(), "a") is None
    calibrate._write_file(calibrate._path(), "b", costs())  # a later write drops the poisoned entry, keeps the file valid
    assert "a" not in json.loads(path.read_text()) and calibrate._read_file(calibrate._path(), "b") == costs()
