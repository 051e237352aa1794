"""reference-48's trainer (reference_recipe/r48.py): checkpoints, resume, the weights' moving average, re-warm-up.

A 2-layer LlamaForCausalLM with reference-48's vocabulary trains a few steps on random 48x48 / 32x32 grids in
r48's data layout; the run is stopped by its step budget and resumed, as a long run across sessions is.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

r48 = pytest.importorskip("reference_recipe.r48")


def tiny_model_dir(path):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=528, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2432)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return str(path)


def tiny_data(work):
    g = torch.Generator().manual_seed(1)
    out = {}
    for side, n in ((48, 6), (32, 6)):
        out[f"train{side}"] = torch.randint(512, (n, side, side), generator=g, dtype=torch.int16)
        out[f"train{side}_classes"] = torch.randint(11, (n,), generator=g)
        # held out = two of the training grids, so that training lowers the held-out NLL
        out[f"heldout{side}"] = out[f"train{side}"][:2].clone()
        out[f"heldout{side}_classes"] = out[f"train{side}_classes"][:2].clone()
    save_file(out, str(work / "data.safetensors"))


def trained_batches(monkeypatch) -> list:
    """The grids of each training batch, recorded as r48 builds its sequences (held-out evaluations run without
    grad and are left out)."""
    seen = []
    real = r48.sequences
    monkeypatch.setattr(r48, "sequences", lambda toks, labels, lay: (
        seen.append(toks.clone()) if torch.is_grad_enabled() else None) or real(toks, labels, lay))
    return seen


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_THREADS", "1")
    monkeypatch.setattr(r48, "BATCH", 1)
    monkeypatch.setattr(r48, "WARMUP", 4)
    work = tmp_path / "work"
    work.mkdir()
    tiny_data(work)
    return work, tiny_model_dir(tmp_path / "init")


def test_ema_is_evaluated_kept_and_resumed(run):
    work, init = run
    r48.train(str(work), None, False, steps=3, init=init, peak_lr=1e-2, ema_decay=0.5)
    ck = torch.load(work / "checkpoint.pt", weights_only=True)
    assert ck["state"]["step"] == 3 and ck["state"]["ema_decay"] == 0.5
    start = r48.warm_start(init).state_dict()
    name = "model.layers.0.mlp.up_proj.weight"
    # the average lies strictly between where training started and where it is now
    moved, averaged = ck["model"][name] - start[name], ck["ema"][name] - start[name]
    assert moved.abs().sum() > 0 and averaged.abs().sum() > 0
    assert not torch.equal(ck["ema"][name], ck["model"][name])
    # best.pt is the average (the held-out NLL is measured on it), not the training weights
    best = torch.load(work / "best.pt", weights_only=True)
    assert ck["state"]["best_step"] == 3 and torch.equal(best[name], ck["ema"][name])
    # resumed with a larger step budget: the step count, the average and the history go on
    r48.train(str(work), None, True, steps=5)
    ck2 = torch.load(work / "checkpoint.pt", weights_only=True)
    assert ck2["state"]["step"] == 5 and ck2["ema"] is not None
    assert not torch.equal(ck2["ema"][name], ck["ema"][name])
    steps = [h["step"] for h in json.loads((work / "history.json").read_text())]
    assert steps[0] == 0 and steps[-1] == 5


def test_new_peak_on_resume_warms_up_again(run, monkeypatch):
    work, init = run
    r48.train(str(work), None, False, steps=6, init=init, peak_lr=1e-3)
    seen = []
    real_step = torch.optim.AdamW.step

    def record(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **k)
    monkeypatch.setattr(torch.optim.AdamW, "step", record)
    r48.train(str(work), None, True, steps=60, peak_lr=2e-3)
    # from step 6 of 60 (still in the held third): 1/4, 2/4, 3/4 of the new peak, then the peak
    assert seen[:5] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3, 2e-3])
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["warm_from"] == 6


def test_class_likelihood_on_the_bundled_model():
    """ar.class_likelihood (r48's `classes` stage) on 8 held-out 24x24 grids of the bundled model: the true class's
    NLL is eval_ar's, the class token helps (null-class NLL higher), and the lowest-NLL class is right well above
    chance (1 in 11)."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from reference_recipe.ar import class_likelihood, eval_ar, layout
    held = load_file("tests/data/heldout_tokens.safetensors")
    tokens, labels = held["tokens"][:8], held["labels"][:8]
    model = LlamaForCausalLM.from_pretrained("ssd_core/reference/model", dtype=torch.float32)
    lay = layout(11, row_end=True)
    out = class_likelihood(model, tokens, labels, lay, 11)
    assert out["grids"] == 8
    assert out["nll_true"] == pytest.approx(eval_ar(model, tokens.long(), labels, lay), rel=1e-5)
    assert out["nll_null"] > out["nll_true"]
    assert out["accuracy"] >= 0.25


def test_balance_draws_every_class_equally_often():
    classes = torch.tensor([0] * 40 + [3] * 8 + [7] * 2)
    g = torch.Generator().manual_seed(0)
    plain = classes[r48.batch_indices(classes, 3000, g, balance=False)].bincount(minlength=8)
    even = classes[r48.batch_indices(classes, 3000, g, balance=True)].bincount(minlength=8)
    assert plain[0] > 2000 and plain[7] < 250  # as often as its grids: 80% / 4%
    assert all(900 < int(even[c]) < 1100 for c in (0, 3, 7)) and even.sum() == 3000
    picked = r48.batch_indices(classes, 500, g, balance=True)
    assert set(picked[classes[picked] == 7].tolist()) == {48, 49}  # a class's own grids, each of them


def test_balance_is_kept_across_a_resume_and_can_be_turned_off(run):
    work, init = run
    r48.train(str(work), None, False, steps=2, init=init, balance=True)
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["balance"] is True
    r48.train(str(work), None, True, steps=3)
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["balance"] is True
    r48.train(str(work), None, True, steps=4, balance=False)
    ck = torch.load(work / "checkpoint.pt", weights_only=True)
    assert ck["state"]["balance"] is False and ck["state"]["step"] == 4


def test_ship_takes_the_best_the_latest_average_or_the_trained_weights(run, tmp_path):
    from safetensors.torch import load_file
    work, init = run
    r48.train(str(work), None, False, steps=3, init=init, peak_lr=1e-2, ema_decay=0.5)
    ck = torch.load(work / "checkpoint.pt", weights_only=True)
    ck["state"]["best_nll48"] = -1.0  # a later step that is not the best: best.pt stays where it is
    torch.save(ck, work / "checkpoint.pt")
    r48.train(str(work), None, True, steps=5)
    name = "model.layers.0.mlp.up_proj.weight"
    latest = torch.load(work / "checkpoint.pt", weights_only=True)["ema"][name]
    best = torch.load(work / "best.pt", weights_only=True)[name]
    trained = torch.load(work / "checkpoint.pt", weights_only=True)["model"][name]
    assert not torch.equal(latest, best) and not torch.equal(trained, latest)
    for which, want in (("best", best), ("latest", latest), ("trained", trained)):
        out = tmp_path / which
        r48.ship(str(work), str(out), init, weights=which)
        got = load_file(str(out / "model.safetensors"))[name]
        assert got.dtype == torch.float16 and torch.equal(got, want.half())


def test_originals_and_mix32_pick_what_is_trained_on(run, monkeypatch):
    work, init = run
    monkeypatch.setattr(r48, "COPIES", {48: 2, 32: 2})  # 6 grids a size: 2 glyphs as rendered, then 2 copies each
    seen = trained_batches(monkeypatch)
    from safetensors.torch import load_file
    data = load_file(str(work / "data.safetensors"))
    r48.train(str(work), None, False, steps=12, init=init, originals=True, mix32=0.0)
    originals = data["train48"][:2].long()
    assert len(seen) == 12 and all(t.shape[-1] == 48 and any(torch.equal(t[0], o) for o in originals) for t in seen)
    state = torch.load(work / "checkpoint.pt", weights_only=True)["state"]
    assert state["originals"] is True and state["mix32"] == 0.0
    seen.clear()
    r48.train(str(work), None, True, steps=24, originals=False, mix32=1.0)  # both can change on a resume
    assert len(seen) == 12 and all(t.shape[-1] == 32 for t in seen)
    assert any(not any(torch.equal(t[0], o) for o in data["train32"][:2].long()) for t in seen)


def test_originals_follow_the_glyph_count_the_data_records(run, monkeypatch):
    from safetensors.torch import load_file, save_file
    work, init = run
    data = load_file(str(work / "data.safetensors"))
    data["train48_glyphs"] = torch.tensor(1)  # as `data --copies N` records it: 1 glyph, then its 5 copies
    save_file(data, str(work / "data.safetensors"))
    seen = trained_batches(monkeypatch)
    r48.train(str(work), None, False, steps=6, init=init, originals=True, mix32=0.0)
    assert len(seen) == 6 and all(torch.equal(t[0], data["train48"][0].long()) for t in seen)


def test_a_run_reads_packed_data_and_keeps_its_batch_across_a_resume(run, monkeypatch):
    from safetensors.torch import load_file
    work, init = run
    r48.pack(str(work))
    plain, packed = work / "data.safetensors", work / "data.safetensors.xz"
    assert packed.stat().st_size < plain.stat().st_size
    want = load_file(str(plain))
    plain.unlink()  # what travels to a GPU machine: the packed copy alone
    got = r48.load_data(str(work))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    seen = trained_batches(monkeypatch)
    r48.train(str(work), None, False, steps=2, init=init, batch=3)
    assert [len(t) for t in seen] == [3, 3]
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["batch"] == 3
    r48.train(str(work), None, True, steps=3)  # a resume keeps the run's batch
    r48.train(str(work), None, True, steps=4, batch=2)  # or takes a new one
    assert [len(t) for t in seen] == [3, 3, 3, 2]
    packed.unlink()
    with pytest.raises(SystemExit, match="holds no data.safetensors \\(nor data.safetensors.xz\\): build it with "
                                         "`python -m reference_recipe.r48 data --work"):
        r48.load_data(str(work))


def test_autocast_runs_the_matrix_work_in_bf16_and_keeps_the_weights_fp32(run, monkeypatch):
    # a GPU's path (AUTOCAST["cuda"]) taken here on the CPU: the model's logits in bf16, the loss, weights and
    # moments in fp32; without it the logits are fp32
    work, init = run
    seen = []
    real = r48.warm_start

    def watched(*a, **k):
        model = real(*a, **k)
        model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype) if torch.is_grad_enabled() else None)
        return model
    monkeypatch.setattr(r48, "warm_start", watched)
    r48.train(str(work), None, False, steps=2, init=init)
    assert seen == [torch.float32] * 2
    monkeypatch.setattr(r48, "AUTOCAST", {"cpu": torch.bfloat16})
    r48.train(str(work), None, True, steps=4)
    assert seen[2:] == [torch.bfloat16] * 2
    ck = torch.load(work / "checkpoint.pt", weights_only=True)
    assert ck["state"]["step"] == 4 and all(v.dtype == torch.float32 for v in ck["model"].values())
    assert all(s["exp_avg"].dtype == torch.float32 for s in ck["opt"]["state"].values())
    assert all(h["nll48"] == h["nll48"] for h in ck["state"]["history"])  # finite, measured in fp32


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a GPU")
def test_cuda_and_a_batch_under_one_are_refused_before_any_work(tmp_path, capsys):
    for flags, said in ((["--device", "cuda"], f"--device cuda: this torch ({torch.__version__}) sees no GPU; "
                                                "train on --device cpu"),
                        (["--batch", "0"], "--batch 0: give the number of sequences a step, 1 or more")):
        with pytest.raises(SystemExit):
            r48.main(["train", "--work", str(tmp_path / "w")] + flags)
        assert said in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_a_second_run_on_the_same_folder_is_refused(run):
    work, init = run
    held = r48.hold_work(str(work))  # as a run in another process holds it
    with pytest.raises(SystemExit, match=f"another training run is using {work} \\(pid \\d+\\)"):
        r48.train(str(work), None, True, steps=2, init=init)
    assert not (work / "checkpoint.pt").exists()
    held.close()
    r48.train(str(work), None, True, steps=2, init=init)  # --resume with no checkpoint yet: a fresh run
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["step"] == 2


def test_mix32_outside_0_to_1_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        r48.main(["train", "--work", str(tmp_path / "w"), "--mix32", "30"])
    assert "--mix32 30.0 is a share of the steps: give a number from 0 to 1" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_deepen_grows_the_layers_and_keeps_what_the_model_computes(tmp_path):
    init = tiny_model_dir(tmp_path / "init")
    model = r48.warm_start(init)
    x = torch.randint(512, (2, 60))
    with torch.no_grad():
        want = model(input_ids=x).logits
    for layers in (3, 4):
        grown = r48.warm_start(init, layers)
        assert grown.config.num_hidden_layers == layers == len(grown.model.layers)
        assert [layer.self_attn.layer_idx for layer in grown.model.layers] == list(range(layers))
        with torch.no_grad():
            assert torch.equal(grown(input_ids=x).logits, want)
    grown = r48.warm_start(init, 4).state_dict()
    old = model.state_dict()
    # 2 -> 4: each layer followed by its copy, whose output projections start at zero
    for new, was in ((0, 0), (1, 0), (2, 1), (3, 1)):
        for part in ("self_attn.q_proj.weight", "mlp.up_proj.weight", "input_layernorm.weight"):
            assert torch.equal(grown[f"model.layers.{new}.{part}"], old[f"model.layers.{was}.{part}"])
        for part in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            copy = grown[f"model.layers.{new}.{part}"]
            want = torch.zeros_like(copy) if new % 2 else old[f"model.layers.{was}.{part}"]
            assert torch.equal(copy, want)
    for bad in (1, 5):
        with pytest.raises(SystemExit, match=f"--layers {bad}: give more than the model's 2 layers and at most twice"):
            r48.warm_start(init, bad)


def test_a_deepened_run_trains_its_new_layers_resumes_and_ships_deep(run, tmp_path):
    from transformers import LlamaForCausalLM
    work, init = run
    r48.train(str(work), None, False, steps=2, init=init, peak_lr=1e-2, layers=3)
    ck = torch.load(work / "checkpoint.pt", weights_only=True)
    assert r48.layer_count(ck["model"]) == 3 and "model.layers.2.mlp.down_proj.weight" in ck["model"]
    assert ck["model"]["model.layers.1.mlp.down_proj.weight"].abs().sum() > 0  # the inserted layer has learnt
    r48.train(str(work), None, True, steps=3)  # the resume rebuilds the 3 layers from the 2-layer init
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["step"] == 3
    with pytest.raises(SystemExit, match="--layers 4: the run in .* began with 3 layers and a resume keeps them"):
        r48.train(str(work), None, True, steps=4, layers=4)
    out = tmp_path / "shipped"
    r48.ship(str(work), str(out), init, weights="trained")
    shipped = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert shipped.config.num_hidden_layers == 3
    trained = torch.load(work / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(v, trained[k].half().float()) for k, v in shipped.state_dict().items())


def test_corrupt_swaps_image_codes_for_the_grids_own_and_keeps_class_and_row_ends():
    from reference_recipe.ar import layout, sequences
    lay = layout(11, row_end=True)
    grids = torch.randint(512, (3, 48, 48), generator=torch.Generator().manual_seed(2))
    seq = sequences(grids, torch.tensor([0, 5, 10]), lay)
    inputs = r48.corrupt(seq, 0.2, torch.Generator().manual_seed(3))
    assert inputs.shape == seq[:, :-1].shape
    fixed = seq[:, :-1] >= 512  # the class token and the row ends
    assert torch.equal(inputs[fixed], seq[:, :-1][fixed])
    changed = inputs != seq[:, :-1]
    assert 0.17 < changed[~fixed].float().mean().item() < 0.21
    for b in range(3):  # every swapped code is one of its own grid's
        assert set(inputs[b][changed[b]].tolist()) <= set(grids[b].flatten().tolist())
    assert torch.equal(r48.corrupt(seq, 0.0, torch.Generator().manual_seed(3)), seq[:, :-1])


def test_noise_corrupts_what_the_model_reads_never_its_targets_and_is_kept_on_resume(run, monkeypatch):
    work, init = run
    calls = []
    real = r48.ar_loss
    monkeypatch.setattr(r48, "ar_loss", lambda model, seq, **kw: (
        calls.append((seq.clone(), kw.get("inputs"))) if torch.is_grad_enabled() else None) or real(model, seq, **kw))
    seen = trained_batches(monkeypatch)
    r48.train(str(work), None, False, steps=4, init=init, noise=0.3, mix32=0.0)
    assert len(calls) == 4
    for (seq, inputs), grid in zip(calls, seen):
        assert torch.equal(seq[0, 1:].view(48, 49)[:, :48], grid[0])  # the targets: the grid itself
        image = seq[:, :-1] < 512
        share = (inputs != seq[:, :-1])[image].float().mean().item()
        assert 0.2 < share < 0.4
    assert torch.load(work / "checkpoint.pt", weights_only=True)["state"]["noise"] == 0.3
    calls.clear()
    r48.train(str(work), None, True, steps=6)  # a resume keeps it
    assert len(calls) == 2 and all(inputs is not None for _, inputs in calls)
    calls.clear()
    r48.train(str(work), None, True, steps=8, noise=0.0)  # and can turn it off
    assert len(calls) == 2 and all(inputs is None for _, inputs in calls)


def test_noise_outside_0_to_1_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        r48.main(["train", "--work", str(tmp_path / "w"), "--noise", "1"])
    assert "--noise 1.0 is a share of the codes read: give a number from 0 up to (not) 1" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
