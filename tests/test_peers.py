"""The 2025-26 peers as policies of the one loop (scd, sjd-pac, gsd): a whole image on tiny models (row ends or
not, alone and in a batch, the cache as a fresh forward's), the lossless ones' distribution, scd's `accept 0` keeping
ar's very tokens, and each peer's defining rule on synthetic distributions."""
import pytest
import torch

import ssd_core
from ssd_core.decoders import DECODER_SPECS, make_policy
from ssd_core.decoders.gsd import D_THR, P_THR, group, group_acceptance
from ssd_core.decoders.sjd_pac import candidates, recursive_accept, side_nodes
from ssd_core.engine import Generation, decode, decode_batch
from ssd_core.sampling import SamplerSettings, acceptance, residual
from tiny import make_llama_grid

PEERS = {"scd": {}, "scd-match": {"accept": 0}, "sjd-pac": {}, "gsd": {}}  # name -> (decoder, parameters)
LOSSLESS = {"sjd": {"window": 1}, "scd": {"window": 1}, "sjd-pac": {"window": 13}}  # windows that reach the tree
SETTINGS = dict(temperature=1.0, cfg=3.0, top_k=5)


def decoder_of(name: str) -> str:
    return name.split("-match")[0]


@pytest.fixture(scope="module", params=[False, True], ids=["no-row-end", "row-end"])
def grid_model(request, tmp_path_factory):
    return ssd_core.load_model(make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(5, 6),
                                               row_end=request.param))


def test_registered_after_the_packs_own_with_their_published_windows():
    names = list(DECODER_SPECS)
    assert names.index("scd") > names.index("ssd-exact") and names[-4:] == ["scd", "sjd-pac", "gsd", "flashar"]
    assert {n: make_policy(n).params["window"] for n in ("scd", "sjd-pac", "gsd")} == \
        {"scd": 32, "sjd-pac": 64, "gsd": 16}
    assert make_policy("scd").params["accept"] == 1  # the authors' test (speculative_jacobi)
    assert side_nodes() == 10  # K = 3, D = 3: 13 tree nodes, 3 on the main path (the root among them)


@pytest.mark.parametrize("name", PEERS)
def test_a_whole_image_alone_and_in_a_batch_with_the_cache_of_a_fresh_forward(grid_model, name):
    model = grid_model
    decoder, params = decoder_of(name), PEERS[name]
    H, W = model.default_grid
    singles = [ssd_core.generate(model, None, prompt=p, seed=s, decoder=decoder, decode_pixels=False, score=False,
                                 **params, **SETTINGS) for p, s in ((0, 5), (2, 6))]
    for r in singles:
        assert r.tokens.shape == (H, W) and bool(((r.tokens >= 0) & (r.tokens < model.image_vocab_size)).all())
        assert sum(r.trace.counts.values()) == H * W and r.trace.counts.get("pending", 0) == 0
        assert 0 < r.trace.steps < H * W  # fewer forwards than ar's
    batch = ssd_core.generate_batch(model, None, prompts=[0, 2], seeds=[5, 6], decoder=decoder, decode_pixels=False,
                                    score=False, **params, **SETTINGS)
    for b, s in zip(batch, singles):  # one forward a step for both, each image its own run (sjd-pac's trees too)
        assert torch.equal(b.tokens, s.tokens) and b.trace.steps == s.trace.steps
    settings = SamplerSettings(seed=3, **SETTINGS)
    layout = model.layout(None)
    run, _ = decode(model, None, model.build_prompt(1, "", True, layout.grid), layout, settings,
                    make_policy(decoder, **params), score=False)
    assert bool(run.tokens.final.all()) and run.session.cached == run.index.L  # no branch's key stays in the cache
    fresh = model.start(model.build_prompt(1, "", True, layout.grid))
    fresh.forward(run.tokens.ids.clone())
    for (k1, v1), (k2, v2) in zip(run.session.cache_tensors(), fresh.cache_tensors()):
        assert (k1 - k2).abs().max() <= 1e-4 and (v1 - v2).abs().max() <= 1e-4


def test_on_the_static_cache_the_dynamic_tokens_alone_and_in_a_batch(tmp_path):
    """The static cache (eager) masks a tree's branches by its own window mask: the tokens and steps of the
    DynamicCache path, for one image and for a batch (sjd-pac's trees padded beside each other)."""
    folder = make_llama_grid(tmp_path / "m", grid=(4, 5), row_end=True)
    dynamic, static = ssd_core.load_model(folder), ssd_core.load_model(folder, compile="static")
    for name, params in PEERS.items():
        kw = dict(decoder=decoder_of(name), decode_pixels=False, score=False, **params, **SETTINGS)
        a = ssd_core.generate(dynamic, None, prompt=1, seed=4, **kw)
        b = ssd_core.generate(static, None, prompt=1, seed=4, **kw)
        assert torch.equal(a.tokens, b.tokens) and a.trace.steps == b.trace.steps, name
    kw = dict(decoder="sjd-pac", decode_pixels=False, score=False, **SETTINGS)
    batch = ssd_core.generate_batch(static, None, prompts=[0, 2], seeds=[5, 6], **kw)
    for r, (p, s) in zip(batch, ((0, 5), (2, 6))):
        assert torch.equal(r.tokens, ssd_core.generate(dynamic, None, prompt=p, seed=s, **kw).tokens)


@pytest.mark.parametrize("settings", [SETTINGS, dict(temperature=0.7, cfg=1.0, top_k=0)], ids=["cfg3-k5", "t0.7"])
def test_scd_match_keeps_ars_very_tokens(grid_model, settings):
    """accept 0: a token is final while the draft equals the verifier's Gumbel pick with the slot's own noise, the
    pick ar makes: fp32, the very tokens of ar for the seed (and fewer steps)."""
    for seed in range(3):
        ar = ssd_core.generate(grid_model, None, prompt=seed, seed=seed, decoder="ar", decode_pixels=False,
                               score=False, **settings)
        scd = ssd_core.generate(grid_model, None, prompt=seed, seed=seed, decoder="scd", accept=0, window=8,
                                decode_pixels=False, score=False, **settings)
        assert torch.equal(ar.tokens, scd.tokens) and scd.trace.steps < ar.trace.steps


def test_bench_and_the_cli_run_the_peers_and_say_which_keep_ars_tokens(tmp_path):
    """`bench --decoders` runs each peer; identical_to_ar is reported for scd with accept 0 (True), not for the others
    (None); `generate --decoder` makes an image with each."""
    import json

    from ssd_core.cli import main

    folder = make_llama_grid(tmp_path / "model", grid=(3, 4))
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(folder), "--heads", "none", "--images", "1", "--decoders",
                 "scd,sjd-pac,gsd", "--json", str(out)]) == 0
    rows = {r["decoder"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "scd", "sjd-pac", "gsd"} and rows["scd"]["params"] == {"window": 32, "accept": 1}
    assert [rows[d]["identical_to_ar"] for d in ("scd", "sjd-pac", "gsd")] == [None, None, None]
    assert main(["bench", "--model", str(folder), "--heads", "none", "--images", "1", "--decoders", "scd",
                 "--accept", "0", "--json", str(out)]) == 0
    assert {r["decoder"]: r for r in json.loads(out.read_text())["rows"]}["scd"]["identical_to_ar"] is True
    for decoder in ("scd", "sjd-pac", "gsd"):
        trace = tmp_path / f"{decoder}.json"
        assert main(["generate", "--model", str(folder), "--decoder", decoder, "--trace", str(trace)]) == 0
        assert json.loads(trace.read_text())["decoder"] == decoder


def _joint(model, decoder, params, grid, n, settings):
    """Counts of the n images' token tuples (seeds 0..n-1), made as one batch (each image its single run's tokens:
    tests/test_batch.py, and the batch test above for the peers)."""
    layout = model.layout(grid)
    prompt = model.build_prompt(0, "", True, layout.grid)
    V = model.image_vocab_size
    done = decode_batch(model, None, [prompt] * n, layout,
                        [SamplerSettings(seed=seed, cfg=settings.cfg, temperature=settings.temperature)
                         for seed in range(n)], [make_policy(decoder, **params) for _ in range(n)],
                        Generation(score=False))
    codes = torch.stack([run.tokens.codes for run, _ in done])  # [n, slots]
    index = (codes * V ** torch.arange(codes.shape[1] - 1, -1, -1)).sum(1)
    return torch.bincount(index, minlength=V ** codes.shape[1]).float()


@torch.no_grad()
def _exact_joint3(model, settings):
    """P(t0, t1, t2) on a 1x3 grid, one forward per prefix."""
    from ssd_core.sampling import guide, log_probs

    layout = model.layout((1, 3))
    V = model.image_vocab_size
    prompt = model.build_prompt(0, "", settings.guided, layout.grid)
    session = model.start(prompt)
    p0 = log_probs(guide(model.image_logits(session.last_features), settings.cfg), settings).exp().double()
    joint = torch.zeros(V, V, V, dtype=torch.float64)
    for t0 in range(V):
        for t1 in range(V):
            s = model.start(prompt)
            feats = s.forward(model.code_to_id(torch.tensor([t0, t1])))
            p = log_probs(guide(model.image_logits(feats), settings.cfg), settings).exp().double()  # [2, V]
            joint[t0, t1] = p0[t0] * p[0, t1] * p[1]
    return joint.flatten()


@pytest.mark.parametrize("decoder", LOSSLESS)
def test_lossless_peers_keep_the_ar_distribution(tmp_path, decoder):
    """Chi-square of the joint of a 1x3 grid's tokens against the exact AR probabilities (sjd-pac: a 2-layer K-ary
    tree with its side branches, then continuation; scd: the coupled redraws). A window of 1 makes a rejection of the
    last open slot common: the token after it must then wait for a forward that saw the fixed token (sjd drew it from
    the rejected draft's context before: TV 0.11 from the AR joint here, chi-square p 1e-44 over 3,000 images)."""
    from scipy.stats import chisquare

    folder = make_llama_grid(tmp_path / "m", grid=(1, 3), image_vocab=3, num_classes=2, seed=11)
    model = ssd_core.load_model(folder)
    settings = SamplerSettings(seed=0, cfg=1.5, temperature=1.0)
    expected = _exact_joint3(model, settings)
    counts = _joint(model, decoder, LOSSLESS[decoder], (1, 3), 800, settings)
    keep = expected * counts.sum() > 5
    p = chisquare(counts[keep].double().numpy(), (expected[keep] / expected[keep].sum() * counts[keep].sum()).numpy())
    assert p.pvalue > 1e-3, (decoder, p, counts)


# ---- the defining rules on synthetic distributions ----------------------------------------------------------------
def _tv_and_chi2(samples: torch.Tensor, p: torch.Tensor):
    from scipy.stats import chisquare

    counts = torch.bincount(samples, minlength=p.numel()).double()
    keep = p > 0
    return 0.5 * (counts / counts.sum() - p).abs().sum().item(), \
        chisquare(counts[keep].numpy(), (p[keep] / p[keep].sum() * counts[keep].sum()).numpy()).pvalue, \
        counts[~keep].sum().item()


def test_sjd_pac_recursive_test_of_k_candidates_gives_the_target_distribution():
    """Candidate 0 a draw of q, candidates 1..K-1 draws of q without replacement: the first that passes u < p_k/q_k
    (q_k: q without the earlier ones; p_k: the residual left by them), else a draw of the last residual, is a draw of
    p (as vLLM's rejection-sampler test: many draws against the target, TV and chi-square). K = 1, 3 and more
    candidates than q has codes."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.30, 0.05, 0.25, 0.0, 0.15, 0.25]).double()
    for q, K in ((torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.10]), 3), (torch.full((6,), 1 / 6), 1),
                 (torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0]), 4)):
        N = 200_000
        qs = q.double().expand(N, -1)
        first = torch.multinomial(qs, 1, generator=g)[:, 0]
        cand, valid = candidates(qs, first, K, g)
        kept, rest = recursive_accept(p.expand(N, -1), qs, cand, valid, torch.rand(N, K, generator=g, dtype=torch.double))
        out = torch.where(kept < K, cand.gather(1, kept.clamp(max=K - 1)[:, None])[:, 0],
                          torch.multinomial(rest, 1, generator=g)[:, 0])
        tv, pvalue, impossible = _tv_and_chi2(out, p)
        assert tv < 0.005 and pvalue > 1e-3 and impossible == 0, (K, tv, pvalue)
        assert bool((cand[valid] >= 0).all()) and bool((qs.gather(1, cand)[valid] > 0).all())


def test_sjd_pac_continuation_redraws_a_draft_of_q_as_a_draw_of_p():
    """Adaptive continuation: a later draft x ~ q checked against its stale p is kept when u < min(1, p/q), else
    redrawn from norm(max(0, p - q)): a draw of p (maximal coupling), so p becomes its q."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.1, 0.6, 0.0, 0.3]).double()
    q = torch.tensor([0.4, 0.1, 0.4, 0.1]).double()
    N = 200_000
    x = torch.multinomial(q.expand(N, -1), 1, replacement=True, generator=g)[:, 0]
    keep = torch.rand(N, generator=g, dtype=torch.double) < acceptance(p.expand(N, -1), q.expand(N, -1), x)
    out = torch.where(keep, x, torch.multinomial(residual(p.expand(N, -1), q.expand(N, -1)), 1, generator=g)[:, 0])
    tv, pvalue, impossible = _tv_and_chi2(out, p)
    assert tv < 0.005 and pvalue > 1e-3 and impossible == 0


def _gsd_case():
    """32 codes whose processed logits rise with the code (rank = code): codes 20..31 share p (1/12 each), codes below
    20 have p = 0 (top-k). Embeddings on a line 0.1 apart (squared distance < 0.5 within 7 codes), code 28 far."""
    logits = torch.full((32,), float("-inf"))
    logits[20:] = torch.arange(12) * 1e-4
    logp = logits.log_softmax(-1)[None]
    line = torch.zeros(32, 4)
    line[:, 0] = torch.arange(32) * 0.1
    line[28, 1] = 10.0
    return logp, (lambda codes: line[codes])


def test_gsd_group_is_its_logit_rank_neighbours_of_close_probability_and_embedding():
    logp, embed = _gsd_case()
    x = torch.tensor([26])
    members, inside = group(logp, x, embed)
    assert members[0].tolist() == list(range(19, 32)) + [31]  # ranks 19..32, clipped at the top (not counted)
    assert set(members[0][inside[0]].tolist()) == set(range(19, 32)) - {28}  # 28: far embedding
    p = logp.exp()[0]
    assert (p[19] - p[26]).abs() < P_THR and ((embed(torch.tensor(19)) - embed(x)) ** 2).sum() < D_THR
    onehot = torch.nn.functional.one_hot(x, 32).float()  # a random draft's q (one-hot on it, as GSD's)
    assert group_acceptance(logp, onehot, x, embed).item() == pytest.approx(11 / 12, abs=1e-3)
    assert acceptance(p[None], onehot, x).item() == pytest.approx(1 / 12, abs=1e-3)  # SJD's own test: 1/12


def test_gsd_accepts_a_token_inside_a_likely_group_and_rejects_one_outside():
    logp, embed = _gsd_case()
    onehot = lambda c: torch.nn.functional.one_hot(torch.tensor([c]), 32).float()  # noqa: E731
    # 19 has p = 0 (SJD rejects it always), but its ranks 12..25 hold 20..25 at p 1/12, close in p and embedding
    assert group_acceptance(logp, onehot(19), torch.tensor([19]), embed).item() == pytest.approx(6 / 12, abs=1e-3)
    # 12's group, ranks 5..18, has no probability: rejected, as by SJD
    assert group_acceptance(logp, onehot(12), torch.tensor([12]), embed).item() == 0.0
    # 13 sees 20 at rank 20 = 13 + 7, just outside its group
    assert group_acceptance(logp, onehot(13), torch.tensor([13]), embed).item() == 0.0
    assert group_acceptance(logp, onehot(14), torch.tensor([14]), embed).item() == pytest.approx(1 / 12, abs=1e-3)
    # a likelier neighbour than P_THR away in p is outside: code 31 made likely
    logits = logp[0].clone()
    logits[31] = logits[30] + 3.0
    sharp = logits.log_softmax(-1)[None]
    members, inside = group(sharp, torch.tensor([26]), embed)
    assert 31 not in members[0][inside[0]].tolist() and 30 in members[0][inside[0]].tolist()


def test_the_distribution_tool_scores_each_peers_own_images_against_ars(bundled):
    """tools/peer_distribution.py (docs/bench.md's check that the peers' nll_full spread is ar's): its values are the
    traces' own nll_full for the seeds it names, and each peer gets its tests against ar's values."""
    from tools import peer_distribution

    model, _ = bundled
    out = peer_distribution.main(["--decoders", "scd", "--images", "3", "--grid", "4x4", "--seed", "11"])
    alone = ssd_core.generate(model, None, prompt=0, seed=12, decoder="scd", grid=(4, 4), decode_pixels=False)
    assert out["rows"]["scd"]["values"][1] == round(alone.trace.nll_full, 5)
    assert list(out["rows"]) == ["ar", "scd"] and "ks_p" not in out["rows"]["ar"]
    assert all(0 <= out["rows"]["scd"][k] <= 1 for k in ("ks_p", "mann_whitney_p", "levene_p"))
