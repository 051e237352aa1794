"""Bad inputs on the command line, the Python API and the trainer (issue 29): every one is refused in one
SSDError line that says what is wrong and how to fix it, before any work starts (a bad output path never
costs a run); a write that still fails after the run (here a real full disk: /dev/full) keeps its result in
the temp folder and says where; Ctrl-C ends a command with one line and exit code 130."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ssd_core
from ssd_core import cli
from ssd_core.training import TrainConfig, train_heads
from bad_inputs import one_line
from tiny import make_heads, make_llama_grid

ROOT = Path(__file__).resolve().parent.parent
SSDError = ssd_core.SSDError
FULL = Path("/dev/full")  # every write fails with ENOSPC, as on a full disk
UNWRITABLE = "/sys"  # no new file can be created there, not even by root
needs_linux = pytest.mark.skipif(not (FULL.exists() and Path(UNWRITABLE).is_dir()), reason="needs Linux /dev/full, /sys")


@pytest.fixture
def no_work(monkeypatch):
    """Sampling, grid generation, feature passes and training all fail the test: the input had to be refused
    before any of them."""
    import ssd_core.api as api
    import ssd_core.training.data as train
    import ssd_core.training.loop as loop

    stop = lambda *a, **k: pytest.fail("the work started before the input was checked")  # noqa: E731
    monkeypatch.setattr(api, "decode_batch", stop)
    for module, name in ((train, "generate_grids"), (train, "collect_features"), (loop, "train_heads")):
        monkeypatch.setattr(module, name, stop)


def _grids(path, tokens, classes):
    save_file({"tokens": tokens, "classes": classes}, str(path))
    return path


def _files(tmp: Path) -> dict:
    """Grids files for the bundled model (24x24 grids of codes 0..511, 11 classes), good and bad, and other
    files that are not features."""
    torch.manual_seed(0)
    good = torch.randint(0, 512, (4, 24, 24))
    huge, negative = good.clone(), good.clone()
    huge[1, 2, 3] = 10 ** 6
    negative[0, 5, 6] = -1
    classes = torch.tensor([0, 1, 2, 3])
    torch.save({"h": torch.zeros(2)}, tmp / "pickle.safetensors")  # a pickle under a safetensors name
    (tmp / "plain.txt").write_text("a file, not a folder")
    return {
        "tmp": tmp, "unwritable": UNWRITABLE,
        "good": _grids(tmp / "good.safetensors", good, classes),
        "huge": _grids(tmp / "huge.safetensors", huge, classes),
        "negative": _grids(tmp / "negative.safetensors", negative, classes),
        "floats": _grids(tmp / "floats.safetensors", good.float() + 0.5, classes),
        "empty": _grids(tmp / "empty.safetensors", torch.zeros(0, 24, 24, dtype=torch.long), torch.zeros(0).long()),
        "mismatch": _grids(tmp / "mismatch.safetensors", good, torch.tensor([0, 1])),
        "class99": _grids(tmp / "class99.safetensors", good, torch.tensor([0, 99, 1, 2])),
        "flat": _grids(tmp / "flat.safetensors", good.flatten(1), classes),
        "pickle": tmp / "pickle.safetensors",
        "heads": ROOT / "ssd_core" / "reference" / "model" / "heads.safetensors",
    }


def _err_lines(capsys) -> list[str]:
    """stderr's lines, without transformers' weights-loading bar."""
    return [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]


TRAIN = "train-heads --model reference --out {tmp}/h.safetensors"
BENCH = "bench --model reference --grid 4x4 --images 1"
CLI_CASES = [  # (case, argv with {names} of _files, words the one line must hold)
    # output files, checked before the work starts
    ("generate out unwritable", "generate --grid 4x4 --out {unwritable}/x.png",
     ["--out /sys/x.png: cannot write in the folder /sys", "pick a folder you can write to"]),
    ("generate trace unwritable", "generate --grid 4x4 --trace {unwritable}/t.json", ["--trace", "cannot write in the folder"]),
    ("generate status-image unwritable", "generate --grid 4x4 --status-image {unwritable}/s.png",
     ["--status-image", "cannot write in the folder"]),
    ("bench json unwritable", BENCH + " --json {unwritable}/b.json", ["--json", "cannot write in the folder /sys"]),
    ("bench plot extension", BENCH + " --plot {tmp}/p.xyz", ["--plot", "must end in one of", ".png"]),
    ("bench plot unwritable", BENCH + " --plot {unwritable}/new/p.png", ["--plot", "cannot write in the folder /sys"]),
    ("bench out-dir unwritable", BENCH + " --out-dir {unwritable}/bench_pngs", ["--out-dir", "cannot write in the folder /sys"]),
    ("bench out-dir under a file", BENCH + " --out-dir {tmp}/plain.txt/pngs", ["plain.txt is a file, not a folder"]),
    ("train out unwritable", "train-heads --out {unwritable}/h.safetensors", ["--out", "cannot write in the folder /sys"]),
    # bench's comma lists
    ("bench ssd-adaptive abc", BENCH + " --ssd-adaptive abc", ["--ssd-adaptive 'abc' is not a comma list of whole numbers"]),
    ("bench ssd-adaptive 500", BENCH + " --ssd-adaptive 5,500", ["--ssd-adaptive must be a whole number from 0 to 100"]),
    ("bench ssd-first-row x", BENCH + " --ssd-first-row x", ["--ssd-first-row 'x' is not a comma list", "e.g. 1,2"]),
    ("bench ssd-first-row 7", BENCH + " --ssd-first-row 1,7", ["--ssd-first-row must be a whole number from 0 to 2"]),
    # trainer values
    ("train unroll -3", TRAIN + " --unroll -3", ["unroll must be a whole number from 0", "got -3"]),
    ("train vertical-intermediate 1e9", TRAIN + " --vertical-intermediate 1000000000",
     ["vertical_intermediate must be a whole number from 1 to 65536", "got 1000000000"]),
    ("train kl-weight -1", TRAIN + " --kl-weight -1", ["kl_weight must be a number >= 0, got -1"]),
    ("train kl-weight nan", TRAIN + " --kl-weight nan", ["kl_weight must be a number >= 0, got nan"]),
    ("train max-steps -1", TRAIN + " --max-steps -1", ["max_steps must be a whole number", "got -1"]),
    ("train max-steps 0", TRAIN + " --max-steps 0", ["max_steps 0 trains nothing", "give at least 1"]),
    ("train samples 1e20", TRAIN + " --samples 99999999999999999999",
     ["samples must be a whole number from 0 to 1000000", "got 99999999999999999999"]),
    ("train heldout 1e20", TRAIN + " --heldout 99999999999999999999", ["heldout must be a whole number from 0 to 1000000"]),
    # grids files: every token an image code of the model, one class of the model per grid
    ("grids token 10^6", TRAIN + " --grids {huge}",
     ["token 1000000 (grid 1, row 2, column 3) is not an image code of this model (0..511)"]),
    ("grids negative token", TRAIN + " --grids {negative}", ["token -1 (grid 0, row 5, column 6) is not an image code"]),
    ("grids float tokens", TRAIN + " --grids {floats}", ["'tokens' must hold whole numbers", "float32", "int64"]),
    ("grids none", TRAIN + " --grids {empty}", ["holds no grids", "at least one grid"]),
    ("grids 4 grids 2 classes", TRAIN + " --grids {mismatch}", ["has 4 grids but 2 classes", "one class per grid"]),
    ("grids class 99", TRAIN + " --grids {class99}", ["class 99 (grid 1) is not a class of this model (0..10)"]),
    ("grids not [N, H, W]", TRAIN + " --grids {flat}", ["'tokens' must be [N, H, W]", "[4, 576]"]),
    ("heldout-grids bad", TRAIN + " --samples 4 --heldout-grids {huge}", ["token 1000000", "not an image code"]),
    ("heldout-grids missing", TRAIN + " --heldout-grids {tmp}/none.safetensors", ["--heldout-grids", "is not a file"]),
    # --features: only a features file train-heads wrote (or a new file) is read or overwritten
    ("features a grids file", TRAIN + " --grids {good} --heldout 2 --features {good}",
     ["--features", "holds [classes, tokens], not the features train-heads stores", "Give a new file name"]),
    ("features a heads file", TRAIN + " --features {heads}", ["not the features train-heads stores"]),
    ("features a pickle", TRAIN + " --features {pickle}", ["--features", "is not a safetensors file"]),
    ("features extension", TRAIN + " --features {tmp}/f.pt", ["--features", "must end in one of .safetensors"]),
]


@needs_linux
@pytest.mark.parametrize("case, argv, words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_before_the_work(tmp_path, capsys, no_work, case, argv, words):
    fill = _files(tmp_path)
    try:
        code = cli.main([a.format(**fill) for a in argv.split()])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    lines = _err_lines(capsys)
    err = "\n".join(lines)
    assert code == 2 and len(lines) == 1 and err.startswith("error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert not list(Path(UNWRITABLE).glob(".ssd-probe-*"))


# ---- the Python API: whole numbers stay whole numbers, a str is one prompt -----------------------------------
API_CASES = [  # (case, generate_batch keywords, words)
    ("grid 1.5", dict(grid=(1.5, 2)), ["grid rows must be a whole number", "got 1.5"]),
    ("grid columns a str", dict(grid=(2, "2")), ["grid columns must be a whole number", "'2'"]),
    ("grid of three", dict(grid=(2, 2, 2)), ["grid must be (rows, columns)"]),
    ("seed 1.5", dict(seed=1.5), ["seed must be a whole number", "got 1.5"]),
    ("seed abc", dict(seed="abc"), ["seed must be a whole number, got 'abc' (str)"]),
    ("seed True", dict(seed=True), ["seed must be a whole number, got 'True' (bool)"]),
    ("seed nan", dict(seed=math.nan), ["seed must be a whole number", "nan"]),
    ("seeds with 2.5", dict(prompts=[1, 2], seeds=[0, 2.5]), ["seed must be a whole number", "2.5"]),
    ("seeds a str", dict(seeds="12"), ["seed must be a whole number, got '12'"]),
    ("batch_size True", dict(batch_size=True), ["batch_size must be a whole number", "True"]),
    ("prompts a dict", dict(prompts={"a": 1}), ["prompts must be a list", "dict"]),
    ("prompts and prompt", dict(prompts="face", prompt="heart"), ["give one of prompt", "not both"]),
]


@pytest.mark.parametrize("case, kw, words", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_refuses_what_it_would_round(bundled, no_work, case, kw, words):
    args = dict(decoder="ar", grid=(2, 2), decode_pixels=False)
    args.update(kw)
    with pytest.raises(SSDError) as err:
        ssd_core.generate_batch(bundled[0], None, **args)
    text = one_line(err)
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("seed", [1.5, "3", True, None])
def test_generate_refuses_a_seed_that_is_not_whole(bundled, no_work, seed):
    with pytest.raises(SSDError, match="seed must be a whole number"):
        ssd_core.generate(bundled[0], None, prompt=1, decoder="ar", seed=seed, grid=(2, 2))


def test_a_str_of_prompts_is_one_prompt(bundled):
    """prompts="face" is the class face (it was four prompts f, a, c, e); "12" is class 12 (out of range),
    never the classes 1 and 2; a whole float seed is that seed; one seed number gives seed, seed + 1, ..."""
    one = dict(decoder="ar", grid=(2, 2), decode_pixels=False)
    alone = ssd_core.generate(bundled[0], None, prompt="face", seed=4, **one)
    out = ssd_core.generate_batch(bundled[0], None, prompts="face", seed=4, **one)
    assert len(out) == 1 and torch.equal(out[0].tokens, alone.tokens)
    two = ssd_core.generate_batch(bundled[0], None, prompts="face", seeds=4.0, batch_size=2, **one)
    assert len(two) == 2 and torch.equal(two[0].tokens, alone.tokens)
    assert two[1].trace.settings["seed"] == 5
    with pytest.raises(SSDError) as err:
        ssd_core.generate_batch(bundled[0], None, prompts="12", **one)
    assert "class 12 is out of range" in one_line(err)


# ---- the trainer's API ----------------------------------------------------------------------------------------
CONFIG_CASES = [  # (TrainConfig keywords, words)
    (dict(unroll=-3), ["unroll must be a whole number from 0"]),
    (dict(vertical_intermediate=10 ** 9), ["vertical_intermediate must be a whole number from 1 to 65536", "1024"]),
    (dict(intermediate=0), ["intermediate must be a whole number from 1 to 65536"]),
    (dict(kl_weight=-1.0), ["kl_weight must be a number >= 0"]),
    (dict(kl_weight=math.nan), ["kl_weight must be a number >= 0, got nan"]),
    (dict(kl_weight="1"), ["kl_weight must be a number, got '1'"]),
    (dict(max_steps=-1), ["max_steps must be a whole number"]),
    (dict(max_steps=0), ["max_steps 0 trains nothing"]),
    (dict(samples=10 ** 20), ["samples must be a whole number from 0 to 1000000"]),
    (dict(epochs=10 ** 20), ["epochs must be a whole number from 1 to 10000000"]),
    (dict(gen_batch=math.inf), ["gen_batch must be a whole number"]),
    (dict(seed=2.5), ["seed must be a whole number, got 2.5"]),
]


@pytest.mark.parametrize("kw, words", CONFIG_CASES, ids=[str(c[0]) for c in CONFIG_CASES])
def test_train_config_refusals(kw, words):
    with pytest.raises(SSDError) as err:
        TrainConfig(**kw)
    text = one_line(err)
    for w in words:
        assert w in text, text


def test_train_config_keeps_good_values():
    cfg = TrainConfig(samples=8.0, max_steps=0, init=__file__, unroll=3, vertical_intermediate=2048, kl_weight=0)
    assert cfg.samples == 8 and isinstance(cfg.samples, int) and cfg.max_steps == 0 and cfg.unroll == 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    folder = make_llama_grid(root / "m", grid=(4, 5))
    model = ssd_core.load_model(folder)
    torch.manual_seed(0)
    grids = _grids(root / "grids.safetensors", torch.randint(0, 16, (6, 4, 5)), torch.tensor([0, 1, 2, 0, 1, 2]))
    return {"root": root, "folder": folder, "model": model, "heads": make_heads(model, root / "heads.safetensors"),
            "grids": grids}


@needs_linux
@pytest.mark.parametrize("case", ["out unwritable", "out .pt", "features a grids file", "features a pickle",
                                  "prompts and grids differ"])
def test_train_heads_refuses_before_sampling(tiny, tmp_path, monkeypatch, case):
    import ssd_core.training.data as train

    stop = lambda *a, **k: pytest.fail("grids were sampled before the inputs were checked")  # noqa: E731
    monkeypatch.setattr(train, "generate_grids", stop)
    monkeypatch.setattr(train, "collect_features", stop)
    files = _files(tmp_path)
    kw = dict(out_path=tmp_path / "h.safetensors", cfg=TrainConfig(samples=4, heldout=2), log=lambda *_: None)
    words = {"out unwritable": ["cannot write in the folder /sys"], "out .pt": ["must end in one of .safetensors"],
             "features a grids file": ["not the features train-heads stores"],
             "features a pickle": ["is not a safetensors file"],
             "prompts and grids differ": ["got 6 grids and 2 prompts", "one prompt (class) per grid"]}[case]
    if case == "out unwritable":
        kw["out_path"] = Path(UNWRITABLE) / "h.safetensors"
    elif case == "out .pt":
        kw["out_path"] = tmp_path / "h.pt"
    elif case == "features a grids file":
        kw["features"] = files["good"]
    elif case == "features a pickle":
        kw["features"] = files["pickle"]
    else:
        prompts, codes = train.read_grids(tiny["grids"], tiny["model"])
        kw.update(grids=codes, grid_prompts=prompts[:2])
    before = files["good"].read_bytes()
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], **kw)
    text = one_line(err)
    for w in words:
        assert w in text, text
    assert files["good"].read_bytes() == before  # a grids file named as --features is never overwritten


# ---- writes that fail after the run: the result is kept --------------------------------------------------------
def _full(path: Path) -> Path:
    path.symlink_to(FULL)
    return path


@needs_linux
def test_generate_keeps_its_outputs_when_the_disk_is_full(tmp_path, keep_dir, capsys):
    """The checks pass (the folder takes files); the writes then hit a full disk: the image and the trace are
    kept in the temp folder, the status image is written, and one line says where each is."""
    out, trace = _full(tmp_path / "x.png"), _full(tmp_path / "t.json")
    code = cli.main(["generate", "--heads", "none", "--decoder", "ar", "--grid", "4x4", "--seed", "3", "--out", str(out),
                     "--trace", str(trace), "--status-image", str(tmp_path / "s.png")])
    err = _err_lines(capsys)
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    kept_png, kept_json = list(keep_dir.glob("x.kept-*.png")), list(keep_dir.glob("t.kept-*.json"))
    assert len(kept_png) == 1 and len(kept_json) == 1, list(keep_dir.iterdir())
    for flag, path, kept in (("--out", out, kept_png[0]), ("--trace", trace, kept_json[0])):
        assert f"could not write {flag} {path} (No space left on device); the result is kept in {kept}" in err[0], err
    from PIL import Image

    assert Image.open(kept_png[0]).size == (16, 16)  # 4x4 tokens of 4x4 pixels
    assert json.loads(kept_json[0].read_text())["grid"] == [4, 4]
    assert (tmp_path / "s.png").stat().st_size > 0


@needs_linux
def test_bench_keeps_its_outputs_when_the_disk_is_full(tiny, tmp_path, keep_dir, capsys):
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    _full(pngs / "status_ar.png")
    code = cli.main(["bench", "--model", str(tiny["folder"]), "--heads", "none", "--decoders", "ar", "--images", "1",
                     "--json", str(_full(tmp_path / "b.json")), "--plot", str(_full(tmp_path / "p.png")),
                     "--out-dir", str(pngs)])
    err = _err_lines(capsys)
    assert code == 2 and len(err) == 1 and "(2 more output(s) kept the same way)" in err[0], err
    kept = {p.name.split(".kept-")[0]: p for p in keep_dir.iterdir()}
    assert set(kept) == {"b", "p", "status_ar"}, kept
    assert str(kept["p"]) in err[0]  # the first failure (the plot) is named in full
    assert json.loads(kept["b"].read_text())["rows"][0]["decoder"] == "ar"


def test_train_heads_keeps_the_heads_when_the_write_fails(tiny, tmp_path, keep_dir):
    """The out path passes the check, then becomes a folder while the heads train (safetensors writes a temp
    file and renames it over the target, so /dev/full cannot stand in here): the trained heads are kept in the
    temp folder and the error says where."""
    import ssd_core.training.data as train

    out = tmp_path / "h.safetensors"

    def log(line):
        if str(line).startswith("held-out ("):  # the scores, printed just before the heads are written
            out.mkdir()

    prompts, codes = train.read_grids(tiny["grids"], tiny["model"])
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], out, TrainConfig(samples=0, heldout=2, epochs=1, batch_grids=4), grids=codes,
                    grid_prompts=prompts, log=log)
    text = one_line(err)
    kept = list(keep_dir.glob("h.kept-*.safetensors"))
    assert len(kept) == 1 and f"could not write --out {out} (" in text and f"the result is kept in {kept[0]}" in text
    assert ssd_core.load_heads(kept[0], tiny["model"]).family == "llama-grid"


@needs_linux
def test_nowhere_to_keep_says_so(tmp_path, monkeypatch):
    from ssd_core.outputs import write_or_keep

    monkeypatch.setattr(tempfile, "tempdir", UNWRITABLE)
    monkeypatch.chdir(UNWRITABLE)
    with pytest.raises(SSDError) as err:
        write_or_keep(_full(tmp_path / "t.json"), lambda p: Path(p).write_text("{}"), "--trace")
    text = one_line(err)
    assert "could not write --trace" in text and "nor a copy in /sys or /sys" in text and "free some disk space" in text


# ---- Ctrl-C: one line, exit code 130 -------------------------------------------------------------------------
def _stuck(proc) -> str:
    """Why communicate() is still waiting: the child's state and signal masks, and every process that holds
    an end of its stdout / stderr pipes (a grandchild keeps the pipe open after the child exits)."""
    code = proc.poll()
    status = Path(f"/proc/{proc.pid}/status")
    child = [x for x in status.read_text().splitlines() if x.startswith(("State", "Sig", "Shd"))] if status.exists() else []
    pipes = {os.readlink(f"/proc/self/fd/{f.fileno()}") for f in (proc.stdout, proc.stderr) if not f.closed}
    holders = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if fd_dir.parent.name != str(os.getpid()) and any(os.readlink(fd) in pipes for fd in fd_dir.iterdir()):
                holders.append(f"{fd_dir.parent.name}: {(fd_dir.parent / 'cmdline').read_bytes()[:200]!r}")
        except OSError:  # gone, or not ours to read
            continue
    proc.kill()
    return (f"no end of output 120 s after SIGINT; the child (exit code {code}): {child}; the pipes' holders: {holders}; "
            f"this process: handler {signal.getsignal(signal.SIGINT)}, blocked {signal.pthread_sigmask(signal.SIG_BLOCK, [])}, "
            f"thread {threading.current_thread().name}")


def _interrupt_after(argv, ready: str, tmp_path):
    """Run `python -m ssd_core argv`, send a real SIGINT once a stdout line starts with `ready` -> (rc, stderr
    lines without the weights-loading bar, stdout)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # the child starts with Ctrl-C on, as a terminal's foreground command does, whatever this process inherited: a
    # test run started in the background by a shell without job control ignores SIGINT (bash does that for
    # `(cmd &)`), its children inherit that, and Python keeps an ignored SIGINT ignored (the flake of sessions
    # 52-54: the child's SigIgn held SIGINT and this process's handler was SIG_IGN)
    proc = subprocess.Popen([sys.executable, "-m", "ssd_core", *map(str, argv)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    watchdog = threading.Timer(240, proc.kill)
    watchdog.start()
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(ready):
                proc.send_signal(signal.SIGINT)
                break
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(_stuck(proc)) from None
    finally:
        watchdog.cancel()
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
    return proc.returncode, lines, "".join(seen) + out


def test_ctrl_c_during_bench_is_one_line(tmp_path):
    code, err, out = _interrupt_after(["bench", "--model", "reference", "--grid", "4x4", "--images", "10000",
                                       "--decoders", "ar", "--heads", "none", "--json", tmp_path / "b.json"],
                                      "image 2/", tmp_path)
    assert "image 2/10000 done" in out
    assert code == 130 and err == ["interrupted; nothing was written"], (code, err)
    assert not (tmp_path / "b.json").exists()


def test_ctrl_c_during_training_names_the_checkpoints(tiny, tmp_path):
    """Interrupted after its third checkpoint line (the line comes before that checkpoint's file): the line
    names the checkpoints written, each a whole heads file; no --out heads."""
    code, err, out = _interrupt_after(["train-heads", "--model", tiny["folder"], "--out", tmp_path / "h.safetensors",
                                       "--grids", tiny["grids"], "--heldout", "2", "--epochs", "100000", "--batch", "1",
                                       "--checkpoint-every", "1"], "checkpoint step 3", tmp_path)
    assert code == 130 and len(err) == 1 and "Traceback" not in err[0], (code, err)
    assert err[0].startswith("interrupted; partial results written to "), err
    named = re.sub(r" and \d+ more$", "", err[0].removeprefix("interrupted; partial results written to ")).split(", ")
    assert 1 <= len(named) <= 3 and all(re.fullmatch(re.escape(str(tmp_path)) + r"/h\.(step\d+|state)\.safetensors", p)
                                        for p in named), err
    assert named[-1] == str(tmp_path / "h.state.safetensors")  # the run's state, for --resume
    for path in named[:-1]:  # the last checkpoints written, each whole
        assert ssd_core.load_heads(path, tiny["model"]).family == "llama-grid"
    assert (tmp_path / "h.step2.safetensors").is_file()
    assert not (tmp_path / "h.safetensors").exists()
