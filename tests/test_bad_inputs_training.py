"""Bad inputs of the heads trainer (issue 39): hostile JSON in its readers (prompts, --bench-json, grid shards,
run states), damaged shards and run states, absurd settings, a run whose loss turns NaN, its own files written
through unique temp files, and paths no file system takes. Each is one SSDError line before the heads train
(or, for a diverged run, at the step it diverges), never a traceback, never a silently changed run."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import ssd_core
from ssd_core import cli
from ssd_core.training import TrainConfig, read_prompts, train_heads
from ssd_core.training import data as train_data
from ssd_core.training import features as feature_files
from ssd_core.training import loop
from ssd_core.training.shards import Shards
from conftest import rewrite_safetensors
from bad_inputs import one_line
from tiny import make_llama_grid

SSDError = ssd_core.SSDError
QUIET = lambda *a: None  # noqa: E731
DEEP = "[" * 100_000  # nested past Python's recursion limit: json.loads raises RecursionError
LONG = "x" * 300  # a file or folder name longer than the 255 bytes file systems take


def _stop(what):
    return lambda *a, **k: pytest.fail(f"{what} before the input was refused")


@pytest.fixture
def no_work(monkeypatch):
    """Grid sampling, feature passes, training steps, the trainer itself and pushing all fail the test."""
    for module, name in ((train_data, "generate_grids"), (train_data, "collect_features"), (loop, "train_heads"),
                         (loop, "head_losses")):
        monkeypatch.setattr(module, name, _stop(f"{name} ran"))
    from ssd_core.training import publish

    monkeypatch.setattr(publish, "push", _stop("a push started"))  # never the network
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_never_sent")


@pytest.fixture
def no_training(monkeypatch):
    """No optimiser step and no grid generated: what a rerun on damaged files must refuse before."""
    monkeypatch.setattr(loop, "head_losses", _stop("the heads trained"))
    monkeypatch.setattr(train_data, "generate_grids", _stop("grids were generated"))


def _refused(argv, capsys) -> str:
    """`python -m ssd_core ARGV` in this process: exit code 2 and one `error:` line on stderr (its text)."""
    code = cli.main([str(a) for a in argv])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    assert lines[0].isprintable() and len(lines[0]) < 600, lines
    return lines[0]


# ---- a tiny model, and a run interrupted after its first epoch (its shard and its saved state) ---------------
CFG = dict(samples=4, heldout=2, epochs=3, batch_grids=2, gen_batch=6, checkpoint_every=2, shard_grids=6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    folder = make_llama_grid(root / "m", grid=(4, 5))
    model = ssd_core.load_model(folder)
    run = root / "run"
    run.mkdir()

    def log(line):
        if str(line).startswith("epoch 2/"):  # after the checkpoint of step 2: its state is on disk
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_heads(model, run / "h.safetensors", TrainConfig(**CFG), log=log)
    assert (run / "h.state.safetensors").is_file() and (run / "h.grids" / "shard-00000.safetensors").is_file()
    return {"root": root, "folder": folder, "model": model, "run": run}


def _copy_run(tiny, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny["run"], run)
    return run


def _tensor(path: Path, key: str) -> torch.Tensor:
    with safe_open(str(path), "pt") as f:
        return f.get_tensor(key)


def test_the_interrupted_run_resumes(tiny, tmp_path):
    """The files the damaged cases start from are good: the run resumes at step 2 and finishes its 6 steps."""
    run = _copy_run(tiny, tmp_path)
    lines = []
    _, report = train_heads(tiny["model"], run / "h.safetensors", TrainConfig(**CFG), resume=True, log=lines.append)
    assert "resumed at step 2 of 6" in "\n".join(lines) and report["steps"] == 6


# ---- 1. hostile JSON in the readers ---------------------------------------------------------------------------
def test_prompts_jsonl_nested_too_deep(tmp_path):
    (tmp_path / "deep.jsonl").write_text('{"prompt": "a cat"}\n' + DEEP + "\n")
    with pytest.raises(SSDError) as err:
        read_prompts(tmp_path / "deep.jsonl")
    assert "--prompts" in one_line(err) and "line 2: nests JSON too deeply" in one_line(err)
    (tmp_path / "deep2.jsonl").write_text(json.dumps({"prompt": "a cat", "tags": [[[[[[[[[[]]]]]]]]]] * 1}) + "\n"
                                          + '{"prompt": "x", "t": ' + "[" * 40 + "]" * 40 + "}\n")
    with pytest.raises(SSDError) as err:
        read_prompts(tmp_path / "deep2.jsonl")
    assert "line 2: nests JSON more than 32 levels deep" in one_line(err)


BENCH = ["train-heads", "--model", "reference", "--push-to-hub", "someone/heads", "--bench-json"]


@pytest.mark.parametrize("case, text, words", [
    ("nested too deep", DEEP, ["--bench-json", "nests JSON too deeply"]),
    ("rows of numbers", json.dumps({"rows": [1, 2]}), ["row 0 is 1, not an object"]),
    ("rows an object", json.dumps({"rows": {"decoder": "ar"}}), ["has no 'rows' list"]),
    ("a list", json.dumps([{"rows": []}]), ["holds a JSON list, not an object"]),
    ("not UTF-8", b"\xff\xfe{}", ["is not UTF-8 text"]),
])
def test_bench_json_refused_before_the_run(tmp_path, capsys, no_work, case, text, words):
    path = tmp_path / "b.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    err = _refused(BENCH + [path, "--out", tmp_path / "h.safetensors"], capsys)
    for w in words:
        assert w in err, err


def test_bench_json_too_large(tmp_path, capsys, no_work):
    path = tmp_path / "b.json"
    with open(path, "wb") as f:  # sparse: 65 MB of size, no disk
        f.truncate(65 << 20)
    err = _refused(BENCH + [path, "--out", tmp_path / "h.safetensors"], capsys)
    assert "--bench-json" in err and "more than the 67,108,864 it may have" in err


# ---- 2. damaged grid shards: refused by name before a grid is generated or trained on -------------------------
SHARD_CASES = [  # (case, metadata changed, tensors changed, words)
    ("settings not JSON", {"settings": "{"}, {}, ["its settings: not JSON"]),
    ("settings nested too deep", {"settings": DEEP}, {}, ["its settings: nests JSON too deeply"]),
    ("model a list", {"model": "[1]"}, {}, ["its model is [1], not an object"]),
    ("prompt_count a text", {"prompt_count": '"3"'}, {}, ["its prompt_count is '3', not a whole number"]),
    ("first not a number", {"first": "abc"}, {}, ["its first is 'abc', not a whole number"]),
    ("grids negative", {"grids": "-1"}, {}, ["its grids is '-1', not a whole number"]),
    ("tokens float", {}, {"tokens": "float"}, ["its tokens are F32, not whole numbers"]),
    ("tokens negative", {}, {"tokens": -3}, ["its tokens hold -3", "outside 0..15"]),
    ("tokens past the vocabulary", {}, {"tokens": 99}, ["its tokens hold 99", "outside 0..15"]),
    ("tokens of another grid", {}, {"tokens": "shape"}, ["its tokens have shape [6, 4, 4], not [6, 4, 5]"]),
    ("prompt index past the classes", {}, {"prompt_index": 7}, ["its prompt_index hold 7", "outside 0..2"]),
    ("no tokens", {}, {"tokens": None}, ["has no 'tokens' tensor"]),
]


@pytest.mark.parametrize("case, meta, change, words", SHARD_CASES, ids=[c[0] for c in SHARD_CASES])
def test_damaged_shard_refused_before_training(tiny, tmp_path, no_training, case, meta, change, words):
    run = _copy_run(tiny, tmp_path)
    shard = run / "h.grids" / "shard-00000.safetensors"
    tokens = _tensor(shard, "tokens")
    tensors = {}
    for key, how in change.items():
        if how is None:
            tensors[key] = None
        elif how == "float":
            tensors[key] = tokens.float() + 0.5
        elif how == "shape":
            tensors[key] = tokens[:, :, :4].contiguous()
        else:
            value = _tensor(shard, key).clone()
            value.view(-1)[1] = how
            tensors[key] = value
    rewrite_safetensors(shard, meta=meta, tensors=tensors)
    (run / "h.state.safetensors").unlink()
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], run / "h.safetensors", TrainConfig(**CFG), log=QUIET)
    text = one_line(err)
    assert str(shard) in text and "delete it (it is made again)" in text, text
    for w in words:
        assert w in text, text


# ---- 2, 3. damaged run states: refused by name before a step -------------------------------------------------
def _heads_key(run: Path) -> str:
    with safe_open(str(run / "h.state.safetensors"), "pt") as f:
        return sorted(k for k in f.keys() if k.startswith("heads."))[0]


STATE_CASES = [  # (case, metadata changed, tensors changed (a function of the old value), words)
    ("step past the run", {"step": "99999999"}, {}, ["says step 99,999,999, past the 6 steps of this run"]),
    ("step negative", {"step": "-5"}, {}, ["its step is '-5', not a whole number >= 0"]),
    ("step not a number", {"step": "2.5"}, {}, ["its step is '2.5', not a whole number"]),
    ("identity not JSON", {"identity": '{"config": '}, {}, ["its identity: not JSON"]),
    ("identity nested too deep", {"identity": DEEP}, {}, ["its identity: nests JSON too deeply"]),
    ("identity part a list", {"identity": '{"config": [1]}'}, {}, ["its identity's 'config' is [1], not an object"]),
    ("heads of another shape", {}, {"HEADS": lambda v: v[:, :-1].contiguous()}, ["not a float tensor"]),
    ("heads NaN", {}, {"HEADS": lambda v: v * float("nan")}, ["holds NaN, infinite or negative values"]),
    ("moment of another shape", {}, {"opt.0.exp_avg": lambda v: v.flatten()[:3].contiguous()}, ["opt.0.exp_avg is F32"]),
    ("moment negative", {}, {"opt.0.exp_avg_sq": lambda v: v - 1.0}, ["opt.0.exp_avg_sq holds NaN, infinite or negative"]),
    ("a moment missing", {}, {"opt.1.exp_avg": None}, ["Adam's state of parameter 1 has step, exp_avg_sq only"]),
    ("a strange name", {}, {"opt.x": lambda v: torch.zeros(1)}, ["holds an unknown tensor 'opt.x'"]),
    ("heads tensor missing", {}, {"HEADS": None}, ["lacks 'heads."]),
]


@pytest.mark.parametrize("case, meta, change, words", STATE_CASES, ids=[c[0] for c in STATE_CASES])
def test_damaged_state_refused_before_training(tiny, tmp_path, no_training, monkeypatch, case, meta, change, words):
    run = _copy_run(tiny, tmp_path)
    state = run / "h.state.safetensors"
    tensors = {}
    for key, how in change.items():
        key = _heads_key(run) if key == "HEADS" else key
        tensors[key] = None if how is None else how(_tensor(state, key) if key != "opt.x" else None)
    rewrite_safetensors(state, meta=meta, tensors=tensors)
    monkeypatch.setattr(train_data, "collect_features", _stop("features were computed"))
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], run / "h.safetensors", TrainConfig(**CFG), resume=True, log=QUIET)
    text = one_line(err)
    assert text.startswith(f"--resume: {state}") and "run without --resume to start again" in text, text
    for w in words:
        assert w in text, text
    assert not (run / "h.safetensors").exists()


# ---- 4, 5. absurd settings on the command line ------------------------------------------------------------------
TRAIN = ["train-heads", "--model", "reference"]


@pytest.mark.parametrize("argv, words", [
    (["--lr", "1e308"], ["lr must be a number > 0 and <= 1", "got 1e+308"]),
    (["--lr", "2"], ["lr must be a number > 0 and <= 1", "got 2.0"]),
    (["--lr", "inf"], ["lr must be a number > 0 and <= 1", "got inf"]),
    (["--grid", "3x3"], ["--grid 3x3: train-heads trains the heads on the model's own grid", "leave --grid out"]),
], ids=["lr 1e308", "lr 2", "lr inf", "grid 3x3"])
def test_cli_settings_refused_before_the_run(tmp_path, capsys, no_work, argv, words):
    err = _refused(TRAIN + ["--out", tmp_path / "h.safetensors"] + argv, capsys)
    for w in words:
        assert w in err, err


# ---- 6. held-out grids: as many as asked, or refused ------------------------------------------------------------
@pytest.mark.parametrize("heldout, words", [
    (16, ["heldout 16: the --grids files hold 6 grid(s)", "give --heldout 5 or less"]),
    (6, ["heldout 6: the --grids files hold 6 grid(s)", "give --heldout 5 or less"]),
])
def test_heldout_never_silently_reduced(tiny, tmp_path, no_training, monkeypatch, heldout, words):
    monkeypatch.setattr(train_data, "collect_features", _stop("features were computed"))
    torch.manual_seed(0)
    path = tmp_path / "g.safetensors"
    save_file({"tokens": torch.randint(0, 16, (6, 4, 5)), "classes": torch.tensor([0, 1, 2, 0, 1, 2])}, str(path))
    prompts, codes = train_data.read_grids(path, tiny["model"])
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], tmp_path / "h.safetensors", TrainConfig(samples=0, heldout=heldout, epochs=1),
                    grids=codes, grid_prompts=prompts, log=QUIET)
    for w in words:
        assert w in one_line(err), one_line(err)


def test_heldout_zero_refused(tiny, tmp_path, no_training):
    """heldout 0 held one grid out (of the self-distilled ones) unsaid; now it is refused."""
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], tmp_path / "h.safetensors", TrainConfig(samples=4, heldout=0), log=QUIET)
    assert "heldout 0: the heads are scored on held-out grids" in one_line(err) and "--heldout 1 or more" in one_line(err)


def test_heldout_of_grids_files_on_the_command_line(tiny, tmp_path, capsys):
    torch.manual_seed(0)
    path = tmp_path / "g.safetensors"
    save_file({"tokens": torch.randint(0, 16, (6, 4, 5)), "classes": torch.tensor([0, 1, 2, 0, 1, 2])}, str(path))
    err = _refused(["train-heads", "--model", tiny["folder"], "--out", tmp_path / "h.safetensors", "--grids", path],
                   capsys)  # --heldout 16, the default
    assert "heldout 16: the --grids files hold 6 grid(s)" in err and not (tmp_path / "h.safetensors").exists()


# ---- 7. a run whose loss turns NaN stops at that step --------------------------------------------------------
def test_diverged_run_stops_at_the_first_nan_loss(tiny, tmp_path, monkeypatch):
    cfg = TrainConfig(samples=4, heldout=2, epochs=50, batch_grids=2, gen_batch=6)
    cfg.lr = 1e10  # past the checks: a run that diverges at once
    steps, real = [], loop.head_losses

    def counted(*a, **k):
        steps.append(1)
        return real(*a, **k)

    monkeypatch.setattr(loop, "head_losses", counted)
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], tmp_path / "h.safetensors", cfg, log=QUIET)
    text = one_line(err)
    assert text.startswith(f"training diverged at step {len(steps)} of 100: the "), text
    assert "loss is nan" in text or "loss is inf" in text, text
    assert "train again with a lower --lr, e.g. 1e+09" in text and "no heads were written" in text, text
    assert len(steps) <= 3 and not (tmp_path / "h.safetensors").exists()


def test_diverged_run_keeps_the_last_good_checkpoint(tiny, tmp_path, monkeypatch):
    """A schedule that jumps to a huge learning rate after step 2: the run stops at the first NaN loss, names
    the heads of its checkpoint at step 2 (kept, whole) and keeps the state saved there."""
    real = loop.one_cycle
    monkeypatch.setattr(loop, "one_cycle", lambda step, total, lr: real(step, total, lr) if step < 2 else (1e12, 0.9))
    out = tmp_path / "h.safetensors"
    cfg = TrainConfig(samples=4, heldout=2, epochs=50, batch_grids=2, gen_batch=6, checkpoint_every=2)
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], out, cfg, log=QUIET)
    text = one_line(err)
    assert "diverged" in text and "lower --lr" in text, text
    kept = tmp_path / "h.step2.safetensors"
    assert text.endswith(f"the last checkpoint's heads are kept in {kept}"), text
    heads = ssd_core.load_heads(kept, tiny["model"])
    assert all(bool(torch.isfinite(p).all()) for p in heads.parameters())
    with safe_open(str(tmp_path / "h.state.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "2"
    assert not out.exists() and not list(tmp_path.glob("h.step4*"))


# ---- 8. --push-to-hub says what it checks before the run ----------------------------------------------------
def test_push_to_hub_help_says_what_is_checked_before_the_run(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train-heads", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Checked before the run, offline: the name's form, huggingface_hub installed, a token found" in text
    assert "Checked only at the push, after training: the token's write access to the repo" in text


# ---- 9. shards and features files written through unique temp files -----------------------------------------
def test_interrupted_shard_write_leaves_nothing(tiny, tmp_path, monkeypatch):
    import safetensors.torch

    def half_then_ctrl_c(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a shard")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        train_heads(tiny["model"], tmp_path / "h.safetensors", TrainConfig(samples=4, heldout=2, epochs=1), log=QUIET)
    assert list((tmp_path / "h.grids").iterdir()) == []


def _features_inputs(model):
    from ssd_core.sampling import SamplerSettings

    layout = model.layout(None)
    settings = SamplerSettings(seed=0, cfg=model.defaults["cfg"])
    prompts = [0, 1, 2, 0]
    codes = train_data.generate_grids(model, prompts, settings, layout, log=QUIET)
    return prompts, codes, settings, layout


def test_interrupted_features_write_leaves_nothing(tiny, tmp_path, monkeypatch):
    prompts, codes, settings, layout = _features_inputs(tiny["model"])
    real, calls = train_data.collect_features, []

    def ctrl_c_on_the_second_batch(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(train_data, "collect_features", ctrl_c_on_the_second_batch)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / f".f.safetensors.part-{os.getpid()}").symlink_to(victim)
    with pytest.raises(KeyboardInterrupt):
        feature_files.build(tmp_path / "f.safetensors", tiny["model"], prompts, codes, settings, layout, 2, log=QUIET)
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink()) == ["victim.txt"]


def test_features_file_of_other_shapes_is_made_again(tiny, tmp_path):
    """A features file whose codes are these grids' but whose features have another width is made again, never
    read into a batch (the batch's shapes would not fit the model)."""
    model = tiny["model"]
    prompts, codes, settings, layout = _features_inputs(model)
    path = tmp_path / "f.safetensors"
    feature_files.build(path, model, prompts, codes, settings, layout, 2, log=QUIET)
    rewrite_safetensors(path, tensors={"h": _tensor(path, "h")[..., :-1].contiguous()})
    lines = []
    source, n = feature_files.features_file(path, model, prompts, codes, settings, layout, 2, log=lines.append)
    assert any("holds the features of other grids: made again" in x for x in lines), lines
    assert n == 4 and source.batch([0, 1])[0].shape[-1] == model.hidden_size


# ---- 10. a name longer than file systems take, in any train-heads path ------------------------------------------
@pytest.mark.parametrize("flag", ["--shards", "--grids", "--heldout-grids", "--prompts", "--init", "--bench-json",
                                  "--features", "--out"])
def test_name_too_long_refused_before_the_run(tmp_path, capsys, no_work, flag):
    ext = {"--prompts": ".txt", "--bench-json": ".json", "--shards": ""}.get(flag, ".safetensors")
    argv = TRAIN + ["--out", tmp_path / "h.safetensors", flag, tmp_path / (LONG + ext)]
    if flag == "--bench-json":
        argv += ["--push-to-hub", "someone/heads"]
    err = _refused(argv, capsys)
    assert flag in err and "is 3" in err and "bytes long; a file or folder name takes at most 255 bytes" in err, err


def test_shards_folder_name_too_long_in_the_api(tiny, tmp_path, no_training):
    with pytest.raises(SSDError) as err:
        train_heads(tiny["model"], tmp_path / "h.safetensors", TrainConfig(samples=4, heldout=2), shards=tmp_path / LONG,
                    log=QUIET)
    assert "--shards: the name" in one_line(err) and "at most 255 bytes" in one_line(err)


def test_shards_class_checks_its_folder_name(tiny, tmp_path):
    shards = Shards(tmp_path / LONG, tiny["model"], _settings(tiny["model"]), [0, 1, 2], "ids", 6)
    with pytest.raises(SSDError, match="at most 255 bytes"):
        shards.check_folder()


def _settings(model):
    from ssd_core.sampling import SamplerSettings

    return SamplerSettings(seed=0, cfg=model.defaults["cfg"])
