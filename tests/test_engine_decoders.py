"""The other decoders on real tiny models: SJD's distribution, SSD's bookkeeping, cache, cancel, ZipAR."""
import math

import pytest
import torch

import ssd_core
from ssd_core.decoders import make_policy
from ssd_core.engine import Generation, decode, decode_batch
from ssd_core.session import Layout
from ssd_core.sampling import SamplerSettings
from tiny import make_heads, make_llama_grid, tiny_model_and_heads

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_and_heads(tmp_path_factory.mktemp("m") / "model", grid=(6, 5))


def _run(model, heads, decoder, seed=0, cfg=2.0, grid=None, top_k=0, **policy):
    settings = SamplerSettings(seed=seed, cfg=cfg, temperature=1.0, top_k=top_k)
    layout = model.layout(grid)
    prompt = model.build_prompt(1, "", settings.guided, layout.grid)
    return decode(model, heads, prompt, layout, settings, make_policy(decoder, **policy), score=False)


@torch.no_grad()
def exact_joint(model, prompt_class: int, settings: SamplerSettings) -> torch.Tensor:
    """P(t0, t1) by direct computation: softmax at the prompt end, then one forward per t0."""
    from ssd_core.sampling import guide, log_probs

    layout = model.layout((1, 2))
    V = model.image_vocab_size
    joint = torch.zeros(V, V, dtype=torch.float64)
    prompt = model.build_prompt(prompt_class, "", settings.guided, layout.grid)
    for t0 in range(V):
        session = model.start(prompt)
        p0 = log_probs(guide(model.image_logits(session.last_features), settings.cfg), settings).exp()
        feats = session.forward(model.code_to_id(torch.tensor([t0])))
        p1 = log_probs(guide(model.image_logits(feats[:, 0]), settings.cfg), settings).exp()
        joint[t0] = p0[t0].double() * p1.double()
    return joint


@pytest.mark.parametrize("decoder", ["sjd", "ar", "ssd"])
def test_distribution_of_first_two_tokens(tmp_path, decoder):
    """Chi-square of the joint of the first two tokens against the exact AR probabilities.

    `ssd` with one correction round is exact on a 1x2 grid too: round 1 re-checks the second token
    against the first token's final value, so this checks its acceptance and residual arithmetic.
    The n draws (seeds 0..n-1) are made as one batch: each image gets its single run's tokens (tests/test_batch.py
    for these decoders), so the counts are those of n single decodes, at a fraction of the time."""
    from scipy.stats import chisquare

    folder = make_llama_grid(tmp_path / "m", grid=(1, 2), image_vocab=4, num_classes=2, seed=7)
    model = ssd_core.load_model(folder)
    heads = make_heads(model, tmp_path / "heads.safetensors") if decoder == "ssd" else None
    heads = ssd_core.load_heads(heads, model) if heads else None
    settings = SamplerSettings(seed=0, cfg=1.5, temperature=1.0)
    joint = exact_joint(model, 0, settings)
    n = 800 if decoder == "ar" else 2000  # ar, the control, needs fewer draws than the decoders under test
    counts = torch.zeros(4, 4)
    layout = model.layout((1, 2))
    prompt = model.build_prompt(0, "", True, layout.grid)
    done = decode_batch(model, heads, [prompt] * n, layout,
                        [SamplerSettings(seed=seed, cfg=1.5, temperature=1.0) for seed in range(n)],
                        [make_policy(decoder, verify_rounds=1) for _ in range(n)], Generation(score=False))
    for run, _ in done:
        counts[run.tokens.codes[0], run.tokens.codes[1]] += 1
    expected = joint.flatten() * n
    keep = expected > 5
    obs = counts.flatten()[keep].double()
    exp = expected[keep] * obs.sum() / expected[keep].sum()
    p = chisquare(obs.numpy(), exp.numpy()).pvalue
    assert p > 1e-3, (p, counts, joint)


def test_ssd_finalizes_every_cell_once_and_bounds_steps(tiny):
    model, heads = tiny
    H, W = model.default_grid
    for rounds in (0, 1, 2):
        seen = {}

        def on_step(progress):
            for y in range(H):
                for x in range(W):
                    tok = int(progress.tokens[y, x])
                    if tok >= 0:
                        st = progress.status[y][x]
                        assert seen.setdefault((y, x), (tok, st)) == (tok, st), "a final cell changed"

        r = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=rounds, verify_rounds=rounds,
                              on_step=on_step, score=False, repair=0)  # the paper's rule: final is final
        assert len(seen) == H * W
        counts = r.trace.counts
        assert counts["accepted"] + counts["corrected"] + counts["ar"] == H * W
        assert r.trace.steps <= (1 + rounds) * H + W
        assert int(r.trace.round[1:].max()) <= rounds  # row 0: verified until a round changes nothing
        assert int(r.trace.round[0].max()) <= W


def test_ssd_more_rows_fewer_steps(tiny):
    model, heads = tiny
    one = ssd_core.generate(model, heads, prompt=0, decoder="ssd", seed=0, verify_rounds=1, score=False)
    three = ssd_core.generate(model, heads, prompt=0, decoder="ssd", seed=0, verify_rounds=1, draft_rows=3, score=False)
    assert three.trace.steps < one.trace.steps


@pytest.mark.parametrize("decoder", ["ar", "ssd", "ssd-exact", "sjd", "zipar"])
def test_cache_equals_fresh_forward(tiny, decoder):
    model, heads = tiny
    run, trace = _run(model, heads if "ssd" in decoder else None, decoder, draft_rows=2)
    assert bool(run.tokens.final.all())
    assert run.session.cached == run.index.L
    fresh = model.start(run.session.__dict__.get("prompt") or model.build_prompt(1, "", True, model.default_grid))
    fresh.forward(run.tokens.ids.clone())
    for (k1, v1), (k2, v2) in zip(run.session.cache_tensors(), fresh.cache_tensors()):
        assert k1.shape == k2.shape
        assert (k1 - k2).abs().max() <= 1e-4
        assert (v1 - v2).abs().max() <= 1e-4


def test_zipar_writes_rows_in_parallel(tiny):
    model, _ = tiny
    H, W = model.default_grid
    r = ssd_core.generate(model, None, prompt=1, decoder="zipar", seed=0, window=2, score=False)
    assert r.trace.counts["ar"] == H * W
    assert r.trace.steps < H * W - 1
    steps = r.trace.step
    assert int(steps[1, 0]) < int(steps[0, W - 1])  # row 1 started before row 0 ended


def test_sjd_finishes_and_counts(tiny):
    model, _ = tiny
    r = ssd_core.generate(model, None, prompt=1, decoder="sjd", seed=0, score=False)
    assert sum(r.trace.counts.values()) == r.tokens.numel()
    assert r.trace.steps <= r.tokens.numel()


def test_cancel_midway_then_model_still_works(tiny):
    model, heads = tiny
    calls = {"n": 0}

    def should_cancel():
        calls["n"] += 1
        return calls["n"] > 3

    with pytest.raises(ssd_core.Cancelled):
        ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=0, should_cancel=should_cancel)
    assert calls["n"] == 4
    a = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=4)
    b = ssd_core.generate(model, heads, prompt=1, decoder="ssd-exact", seed=4)
    assert torch.equal(a.tokens, b.tokens)
    assert math.isfinite(a.trace.nll)


def test_trace_json_keys(tiny):
    model, heads = tiny
    d = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=0).trace.to_dict()
    H, W = model.default_grid
    for key in ("decoder", "grid", "tokens", "status", "steps", "wall_s", "nll"):
        assert key in d
    assert d["grid"] == [H, W] and len(d["tokens"]) == H and len(d["status"][0]) == W
    assert set(s for row in d["status"] for s in row) <= {"ar", "accepted", "corrected", "forced"}
    assert d["nll"] > 0 and d["nll_full"] > 0 and 0 <= d["out_of_support"] <= 1


def test_top_k_fidelity_figures(tiny):
    """With top-k, ar never writes a token outside the kept set; nll_full is finite for every decoder."""
    model, heads = tiny
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=2, top_k=3).trace
    assert ar.out_of_support == 0.0 and math.isfinite(ar.nll) and ar.nll_full >= ar.nll - 1e-6
    for decoder in ("ssd", "zipar"):
        tr = ssd_core.generate(model, heads, prompt=1, decoder=decoder, seed=2, top_k=3, verify_rounds=0).trace
        assert math.isfinite(tr.nll_full)
        assert (tr.out_of_support > 0) == math.isinf(tr.nll)


def test_ssd_repair_redraws_committed_tokens_their_final_context_rules_out(tiny):
    """repair (the default) takes the lossy tokens outside the top-k set of their final context out, in the
    forwards that happen anyway: the same steps, fewer such tokens, a cache equal to a fresh forward; only
    the last block, never fed again, can keep one."""
    model, heads = tiny
    H, W = model.default_grid
    fewer = 0
    for seed in range(6):
        off = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=seed, top_k=3, verify_rounds=0, repair=0)
        on = ssd_core.generate(model, heads, prompt=1, decoder="ssd", seed=seed, top_k=3, verify_rounds=0)
        assert on.trace.settings["repair"] == 1 and off.trace.settings["repair"] == 0
        assert on.trace.steps == off.trace.steps and math.isfinite(on.trace.nll_full)
        assert on.trace.out_of_support <= off.trace.out_of_support
        fewer += on.trace.out_of_support < off.trace.out_of_support
        assert round(on.trace.out_of_support * H * W) <= W  # what is left sits at the end (the last block is never fed again)
    assert fewer >= 3  # the tiny model writes such tokens without repair, so the test can fail
    run, _ = _run(model, heads, "ssd", seed=4, top_k=3, verify_rounds=0)  # repairs re-feed: the cache stays right
    fresh = model.start(model.build_prompt(1, "", True, model.default_grid))
    fresh.forward(run.tokens.ids.clone())
    for (k1, v1), (k2, v2) in zip(run.session.cache_tensors(), fresh.cache_tensors()):
        assert (k1 - k2).abs().max() <= 1e-4 and (v1 - v2).abs().max() <= 1e-4


def test_layout_row_end_positions():
    layout = Layout.build((2, 3), row_end=99, tail=(7, 8))
    assert layout.forced.tolist() == [-1, -1, -1, 99, -1, -1, -1, 99, 7, 8]
    assert layout.slot_of_cell.tolist() == [0, 1, 2, 4, 5, 6]
    assert layout.row_stride == 4


def test_a_batch_runs_one_decoder_with_one_prompt_settings_and_policy_an_image(tiny):
    from ssd_core.engine import decode_batch

    model, heads = tiny
    layout = model.layout(None)
    s = SamplerSettings(seed=0, cfg=2.0)
    prompt = model.build_prompt(1, "", True, layout.grid)
    with pytest.raises(ssd_core.SSDError, match="a batch runs one decoder, got policies of ar, sjd"):
        decode_batch(model, heads, [prompt, prompt], layout, [s, s], [make_policy("ar"), make_policy("sjd")])
    with pytest.raises(ssd_core.SSDError, match="got 2 prompts, 2 settings and 1 policies"):
        decode_batch(model, heads, [prompt, prompt], layout, [s, s], [make_policy("ar")])
    (run, trace), = decode_batch(model, None, [prompt], layout, [s], [make_policy("zipar", window=2)])
    assert trace.decoder == "zipar" and bool(run.tokens.final.all())  # the trace names the policy's decoder
