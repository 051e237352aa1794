"""reference_recipe/gpu_r48.sh, the one command a GPU session runs for reference-48 (issue 41), run here end to end
on the CPU at a tiny scale: the same stages (train the shipped reference-48 on packed data, ship its weights of the
lowest held-out NLL beside the VQ and yardstick, judge them in processes) and the same files left for the device
tool to bring back, so that a GPU session's few minutes are not lost to the script's plumbing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

r48 = pytest.importorskip("reference_recipe.r48")
ROOT = Path(__file__).resolve().parents[1]


def packed_data(work: Path) -> None:
    """Random grids in r48's data layout (4 a size, 2 of them held out), packed as they travel, the plain file gone."""
    g = torch.Generator().manual_seed(3)
    out = {}
    for side in (48, 32):
        out[f"train{side}"] = torch.randint(512, (4, side, side), generator=g, dtype=torch.int16)
        out[f"train{side}_classes"] = torch.randint(11, (4,), generator=g)
        out[f"train{side}_glyphs"] = torch.tensor(4)
        out[f"heldout{side}"] = out[f"train{side}"][:2].clone()
        out[f"heldout{side}_classes"] = out[f"train{side}_classes"][:2].clone()
    save_file(out, str(work / "data.safetensors"))
    r48.pack(str(work))
    (work / "data.safetensors").unlink()


def test_the_gpu_script_trains_ships_and_judges_here_on_the_cpu(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    packed_data(work)
    candidate = f"candidate48-test-{os.getpid()}"
    env = dict(os.environ, WORK=str(work), DEVICE="cpu", BATCH="1", PROCS="2", CANDIDATE=candidate, JUDGE_LIMIT="1",
               JUDGE_GRID="16x16", PYTHON=sys.executable, SSD_THREADS="1", MINUTES32="0.01", NOISE="0.1",
               HEADS_EPOCHS="3")
    try:
        run = subprocess.run(["bash", "reference_recipe/gpu_r48.sh", str(out), "0.02"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    finally:
        for folder in (candidate, candidate + "p"):
            shutil.rmtree(ROOT / "ssd_core" / "reference" / folder, ignore_errors=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # what the device tool brings back: at most 8 files, at most 2 folders down
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["judge.json", "model48/config.json", "model48/generation_config.json", "model48/heads.safetensors",
                     "model48/model.safetensors", "model48/ssd_model.json", "train.log"]
    log = (out / "train.log").read_text()
    assert "gpu None" in log and "eval step 0: held-out NLL 48x48" in log and "candidate48-test" in log
    # the candidate is the run's weights of the lowest held-out NLL, in fp16, naming the bundled VQ and yardstick
    ck = torch.load(work / "checkpoint.pt", weights_only=True)
    assert ck["state"]["batch"] == 1 and ck["state"]["balance"] is True and ck["state"].get("ema_decay") is None
    assert ck["state"]["noise"] == 0.1 and ck["state"]["mix32"] == 0.3
    # the curriculum's 32x32 phase ran first, in its own folder, and the 48x48 run began from its trained weights
    phase = torch.load(work / "p32" / "checkpoint.pt", weights_only=True)
    assert phase["state"]["mix32"] == 1.0 and phase["state"]["step"] >= 1
    assert ck["state"]["init"].endswith(candidate + "p")
    assert log.count("a fresh run from") == 2
    best = torch.load(work / "best.pt", weights_only=True)
    shipped = load_file(str(out / "model48" / "model.safetensors"))
    assert shipped.keys() == best.keys() and all(torch.equal(v, best[k].half()) for k, v in shipped.items())
    spec = json.loads((out / "model48" / "ssd_model.json").read_text())
    assert spec["vq_decoder"] == "../model/vq.safetensors" and spec["grid"] == [48, 48]
    # judged on the first pair of each block, classes in turn from each block's first seed
    report = json.loads((out / "judge.json").read_text())
    assert report["pairs"] == 2 and report["grid"] == "16x16"
    assert [p[:2] for p in report["blocks"]["all"]["pairs"]] == [[16, 0], [5000, 0]]
    assert set(report["blocks"]) == {"16-63", "5000-5015", "all"}
    assert report["blocks"]["all"]["per_class"]["face"].endswith("/2")
    # the shipped heads fine-tuned on the candidate, in fp16, for its grid
    from ssd_core.heads import load_heads_file
    heads = load_file(str(out / "model48" / "heads.safetensors"))
    assert heads and all(v.dtype == torch.float16 for v in heads.values())
    assert load_heads_file(out / "model48" / "heads.safetensors").metadata()["grid"] == "48x48"
    shipped_heads = load_file(str(ROOT / "ssd_core" / "reference" / "model48" / "heads.safetensors"))
    assert heads.keys() == shipped_heads.keys() and any(not torch.equal(heads[k], shipped_heads[k]) for k in heads)


def test_the_judge_asks_the_64_pairs_of_issue_41_and_refuses_bad_counts(capsys):
    from reference_recipe import judge48
    asked = judge48.pairs()
    # seeds 16-63 then 5000-5015, the 11 classes in turn from each block's first seed (the sampler sweep's and
    # the bench's order), as every extension of reference-48 was judged
    assert [s for s, _ in asked] == list(range(16, 64)) + list(range(5000, 5016))
    assert asked[:12] == [(16 + i, i % 11) for i in range(12)] and asked[47] == (63, 3)
    assert asked[48:50] == [(5000, 0), (5001, 1)] and asked[-1] == (5015, 4)
    assert judge48.pairs(limit=2) == [(16, 0), (17, 1), (5000, 0), (5001, 1)]
    for flags, said in ((["--procs", "0"], "--procs 0: give 1 or more"),
                        (["--limit", "0"], "--limit 0: give 1 or more pairs a block"),
                        ([], "--model nowhere: no such folder")):
        with pytest.raises(SystemExit):
            judge48.main(["--model", "ssd_core/reference/model48" if flags else "nowhere"] + flags)
        assert said in capsys.readouterr().err
