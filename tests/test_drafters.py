"""Drafters as objects (decoders/drafting.py): the policies hold them and never ask whether heads exist; ssd's rows
below the first, found by certified Jacobi sweeps and one host copy, are the left-to-right chain's very drafts."""
import ast
from pathlib import Path

import pytest
import torch

import ssd_core
from ssd_core.decoders import drafting, make_policy
from ssd_core.decoders.drafting import (HeadsDrafter, RowCopyDrafter, WindowDrafter, _certified_row, _chain,
                                       _forced_features, _left_steps, draft, feature, rows_end, sampled)
from ssd_core.heads import DraftHeads
from ssd_core.run import Run
from ssd_core.sampling import SamplerSettings
from tiny import tiny_model_and_heads

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

POLICIES = Path(ssd_core.__file__).parent / "decoders"


def test_no_policy_asks_whether_heads_exist():
    """Only drafting.drafter_for reads `run.heads` to choose; policy files hold drafters."""
    for path in POLICIES.glob("*.py"):
        if path.name in ("drafting.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "heads" and getattr(node.value, "id", "") == "run":
                raise AssertionError(f"{path.name}:{node.lineno} reads run.heads; a drafter should")


@pytest.fixture(scope="module", params=[(1, True), (2, True), (2, False)], ids=["left1-row-end", "left2-row-end",
                                                                                "left2-no-row-end"])
def tiny_left(request, tmp_path_factory):
    level, row_end = request.param
    folder = tmp_path_factory.mktemp("m")
    model, _ = tiny_model_and_heads(folder / "model", grid=(5, 7), row_end=row_end)
    torch.manual_seed(level)
    DraftHeads.for_model(model, vertical_left=level).save(folder / "left.safetensors")
    return model, ssd_core.load_heads(folder / "left.safetensors", model)


def _run_after_two_rows(model, heads, seed):
    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, SamplerSettings(seed=seed, cfg=2.0, top_k=6), session.last_features)
    run.session = session
    draft(run, rows_end(run, 0, 2), run.draws.gumbel_sample)  # the first two rows
    return run


@pytest.mark.parametrize("sweeps", [1, 2, 40])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_certified_sweeps_give_the_chains_drafts_q_and_features(tiny_left, sweeps, seed):
    """Whatever the sweeps leave uncertain (1 sweep: most of the row; 40: none), the drafts, the q each was drawn
    from, the features and the generator's state afterwards are the left-to-right chain's; one host copy."""
    model, heads = tiny_left
    stride, W = model.layout(None).row_stride, model.layout(None).grid[1]
    lo, hi = 2 * stride, 2 * stride + W  # the third row
    with torch.no_grad():  # as generate runs
        _compare_certified(model, heads, lo, hi, sweeps, seed)


def _compare_certified(model, heads, lo, hi, sweeps, seed):
    chain, certified = _run_after_two_rows(model, heads, seed), _run_after_two_rows(model, heads, seed)
    for run in (chain, certified):
        _forced_features(run, lo)
    a, b = chain.index.images_before[lo], chain.index.images_before[hi]
    codes = _chain(chain, feature(chain, lo - 1), lo, hi, lambda logp, i, j: sampled(chain, logp, i, j),
                   _left_steps(chain, lo, hi))
    syncs = certified.counts.syncs
    got = _certified_row(certified, lo, hi, sweeps)
    assert certified.counts.syncs == syncs + 1
    assert torch.equal(got, codes)
    # q and features: the chain's up to float rounding (a product over the whole row rounds as one over a cell may not)
    assert (certified.draws.q_at(a, b) - chain.draws.q_at(a, b)).abs().max() < 1e-6
    assert torch.allclose(certified.outputs.features[:, lo:hi], chain.outputs.features[:, lo:hi], atol=1e-5)
    assert torch.equal(certified.draws.rng.get_state(), chain.draws.rng.get_state())


def test_ssd_drafts_a_row_by_certified_sweeps_once_a_step(tiny_left, monkeypatch):
    """ssd's rows below the first go through _certified_row when the step has made no host copy yet (not in the
    step that finished the first row by the exact rule, which copied already); its images are those of the chain."""
    model, heads = tiny_left
    calls = []
    real = drafting._certified_row
    monkeypatch.setattr(drafting, "_certified_row", lambda run, lo, hi, sweeps: calls.append(lo) or
                        real(run, lo, hi, sweeps))
    kw = dict(prompt=1, seed=4, cfg=2.0, top_k=6, score=False)
    certified = ssd_core.generate(model, heads, decoder="ssd", **kw)
    H, stride = model.layout(None).grid[0], model.layout(None).row_stride
    assert 0 < len(calls) < H - 1 and all(lo >= 2 * stride for lo in calls)  # row 1: drafted in a step that copied
    monkeypatch.setattr(drafting, "CERTIFY_SWEEPS", 0)  # every row by the chain
    monkeypatch.setattr(drafting, "_certified_row", real)
    chain = ssd_core.generate(model, heads, decoder="ssd", **kw)
    assert torch.equal(certified.tokens, chain.tokens) and certified.trace.steps == chain.trace.steps


def test_policies_hold_their_drafters(tiny_left):
    """ssd-exact: the heads' drafter with heads, row copies without; ssd: an exact first-row drafter and a
    sampled one; sjd: its window of guesses."""
    model, heads = tiny_left
    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    for given, kind in ((heads, HeadsDrafter), (None, RowCopyDrafter)):
        run = Run(model, given, layout, SamplerSettings(seed=0), session.last_features)
        policy = make_policy("ssd-exact", draft_rows=2)
        policy.begin(run)
        assert type(policy.drafter) is kind and policy.drafter.uses_heads == (given is not None)
    run = Run(model, heads, layout, SamplerSettings(seed=0), session.last_features)
    policy = make_policy("ssd")
    policy.begin(run)
    assert policy.first_row.pick is drafting.coupled and policy.blocks.pick is sampled
    policy = make_policy("sjd", window=5)
    policy.begin(run)
    assert isinstance(policy.drafter, WindowDrafter) and policy.drafter.window == 5
