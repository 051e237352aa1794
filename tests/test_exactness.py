"""Why ssd-exact's picture can differ from ar's, and how the trace says when it may (ssd_core/exactness.py).

The issue's failure (bundled reference, class 1 "heart", seed 5001, its default sampler, 24x24): ssd-exact at 4
draft rows with heads differed from ar first at row 9, column 2 (ar's 247, ssd-exact's 373) on the reporter's
CPU. Here it does not differ, but the cause is measurable: that cell is a near-tie whose margin is smaller than
the rounding difference between a window forward and a one-slot forward."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

import ssd_core
from conftest import ar_through
from ssd_core import exactness
from ssd_core.sampling import SamplerSettings, gumbel, guide, log_probs, settings_from
from ssd_core.session import Session

CLASS, SEED, CELL = 1, 5001, (9, 2)


@pytest.fixture(scope="module")
def reference():
    model = ssd_core.load_model("reference")
    return model, ssd_core.load_heads("reference", model)


def _raw(model, prompt, ids, slot, widths):
    """The raw logits [B, V] at `slot` from a session fed ids[:slot] in windows of `widths`."""
    session, i = Session(model, prompt), 0
    with torch.no_grad():
        for w in widths:
            feats = session.forward(ids[i:i + w])
            i += w
        return model.image_logits(feats)[:, -1]


def _decide(model, raw, slot, settings, shift=None):
    """The Gumbel decision at `slot` from raw logits [B, V] -> (code, margin); `shift` [B, V] is added to them
    first."""
    if shift is not None:
        raw = raw + shift
    lp = log_probs(guide(raw[:, None], settings.cfg, settings.min_p), settings)[0]
    z = lp + gumbel(settings.seed, torch.tensor([slot]), model.image_vocab_size)[0]
    top = z.topk(2)
    return int(top.indices[0]), float(top.values[0] - top.values[1])


@pytest.fixture(scope="module")
def issue(reference):
    """The issue's image by ar (24x24, the one ar run both tests below read, up to the near-tie's cell: all they
    read), its near-tie's slot, and the raw logits there from ar's context fed one slot at a time (ar's kernel
    width; 227 one-slot forwards, made once)."""
    model, _ = reference
    ar = ar_through(model, CELL, prompt=CLASS, seed=SEED)
    layout = model.layout()
    r, c = CELL
    slot = int(layout.slot_of_cell[r * layout.grid[1] + c])
    prompt = model.build_prompt(CLASS, "", True, layout.grid)
    ids = layout.forced.clone()
    made = ar.flatten() >= 0  # every cell up to the near-tie's: the context fed below is ids[:slot]
    ids[layout.slot_of_cell[made]] = model.code_to_id(ar.flatten()[made])
    s = settings_from(model.defaults, seed=SEED)
    one_raw = _raw(model, prompt, ids, slot, [1] * slot)
    return SimpleNamespace(ar=ar, layout=layout, slot=slot, prompt=prompt, ids=ids, settings=s, one_raw=one_raw)


def test_the_issues_cell_is_a_near_tie_that_rounding_decides(reference, issue):
    model, heads = reference
    ar, slot, prompt, ids, s = issue.ar, issue.slot, issue.prompt, issue.ids, issue.settings
    r, c = CELL
    # which of the two codes wins is the CPU's rounding: 247 on the machine of the report, 373 on some (an AMD
    # EPYC here, where even the test's own one-slot replay of ar may land on the other one)
    assert int(ar[r, c]) in (247, 373)
    assert (s.cfg, s.top_k, s.min_p, s.temperature) == (4.0, 40, 0.01, 1.0)
    # the same context fed one slot at a time (ar) and in windows (ssd-exact): the raw logits differ in their
    # last bits, and the decision's margin (best minus second perturbed score, codes 247 and 373) moves with them
    one_raw = issue.one_raw
    win_raw = _raw(model, prompt, ids, slot, [slot])
    (one_code, one_margin), (win_code, win_margin) = _decide(model, one_raw, slot, s), _decide(model, win_raw, slot, s)
    assert {one_code, win_code} <= {247, 373}
    other = 373 if one_code == 247 else 247
    raw_gap = float((one_raw - win_raw).abs().max())
    assert 0 < raw_gap < 1e-4  # rounding, not a bug: a few ulps of the logits
    assert one_margin != win_margin and max(one_margin, win_margin) < 2e-5
    # a raw-logit change no larger than the one the window made here flips it to the other code (how much
    # smaller depends on the CPU's kernels: 6x on one of this project's machines, 2x on another); added to the
    # one-slot logits above (that path is deterministic: test_re_deciding_on_a_one_slot_forward_cannot_close_the_gap)
    shift = torch.zeros_like(one_raw)
    shift[0, other] = raw_gap
    assert _decide(model, one_raw, slot, s, shift)[0] == other
    # ssd-exact names that cell as its first near-tie: its picture may differ from ar's from there
    ex = ssd_core.generate(model, heads, prompt=CLASS, seed=SEED, decoder="ssd-exact", draft_rows=4,
                           decode_pixels=False, score=False)
    assert ex.trace.exact["first_near_tie"] == list(CELL)
    assert ex.trace.exact["error_bound"] >= raw_gap


def test_re_deciding_on_a_one_slot_forward_cannot_close_the_gap(reference, issue):
    """Why the fix is a record, not a re-decision: deciding the near-tie's slot on a one-slot forward (ar's kernel
    width) after a windowed context still differs from ar, because the context's keys and values were made in
    windows. Only feeding every slot one at a time, which is ar, gives ar's logits."""
    model, _ = reference
    layout, slot, prompt, ids = issue.layout, issue.slot, issue.prompt, issue.ids
    rows = 4 * layout.grid[1]  # ssd-exact's windows at 4 draft rows
    windows = [rows] * (slot // rows) + [slot % rows] * bool(slot % rows)
    re_decided = windows[:-1] + [windows[-1] - 1] * (windows[-1] > 1) + [1]
    one = issue.one_raw
    win = _raw(model, prompt, ids, slot, windows)
    last_alone = _raw(model, prompt, ids, slot, re_decided)
    assert torch.equal(_raw(model, prompt, ids, slot, [1] * slot), one)  # each path is deterministic
    window_gap, re_decided_gap = float((one - win).abs().max()), float((one - last_alone).abs().max())
    assert 0 < re_decided_gap < window_gap


def test_probe_measures_the_window_rounding(reference):
    model, _ = reference
    layout = model.layout((8, 8))
    prompt = model.build_prompt(0, "", True, layout.grid)
    model.__dict__.pop("_exact_error", None)
    diff = float(exactness.probe(model, prompt, layout.forced))
    assert 0 < diff < 1e-4
    assert float(exactness.error_bound(model, prompt, layout.forced)) == pytest.approx(exactness.SAFETY * diff)
    bf16 = ssd_core.load_model("reference", dtype="bf16")
    assert float(exactness.probe(bf16, bf16.build_prompt(0, "", True, layout.grid), layout.forced)) > 100 * diff


def _tie_case(gap, settings, cfg_streams=2, V=8):
    """Raw logits [B, 1, V] whose two best guided codes are `gap` apart (no noise: greedy or noise 0)."""
    raw = torch.zeros(cfg_streams, 1, V)
    raw[0, 0, :2] = torch.tensor([1.0, 1.0 - gap])
    guided = guide(raw, settings.cfg, settings.min_p)
    return raw, guided[0][None], log_probs(guided, settings, check=False)[0][None]


@pytest.mark.parametrize("cfg", [1.0, 4.0])
def test_near_ties_follow_the_derived_bound(cfg):
    s = SamplerSettings(cfg=cfg, temperature=0.5)
    e = torch.tensor(1e-5)
    bound = 2 * (abs(1 - cfg) + cfg) * 1e-5 / 0.5  # 2 e_x: the guided gap the error can close
    noise = torch.zeros(1, 8)
    for gap_x, want in ((0.5 * bound, True), (2 * bound, False)):
        gap = gap_x * 0.5 / cfg  # raw gap of the conditional stream giving this guided, tempered gap
        raw, guided, lp = _tie_case(gap, s)
        assert bool(exactness.near_ties(raw, guided, lp, noise, s, e)[0]) is want, (cfg, gap_x)


def test_a_code_at_the_min_p_cut_that_could_win_is_a_near_tie():
    s = SamplerSettings(cfg=1.0, temperature=1.0, min_p=0.5)
    e = torch.tensor(1e-5)
    raw = torch.zeros(1, 1, 4)
    raw[0, 0] = torch.tensor([1.0, 0.0, math.log(0.5) + 1.0 - 1e-6, -5.0])  # code 2 just under the floor
    guided = guide(raw, s.cfg, s.min_p)[0][None]
    lp = log_probs(guided, s, check=False)
    assert lp[0, 2] == -math.inf  # cut
    far = torch.zeros(1, 4)
    wins = torch.tensor([[0.0, 0.0, 5.0, 0.0]])  # with this noise code 2 would beat code 0 if it were kept
    assert not bool(exactness.near_ties(raw, guided, lp, far, s, e)[0])
    assert bool(exactness.near_ties(raw, guided, lp, wins, s, e)[0])
    # top-k: the 2nd and 3rd codes within the error of each other, the 3rd would win with its noise
    s = SamplerSettings(cfg=1.0, temperature=1.0, top_k=2)
    raw[0, 0] = torch.tensor([1.0, 0.5, 0.5 - 1e-6, -5.0])
    guided = guide(raw, s.cfg, s.min_p)[0][None]
    lp = log_probs(guided, s, check=False)
    assert lp[0, 2] == -math.inf
    assert bool(exactness.near_ties(raw, guided, lp, wins, s, e)[0])
    assert not bool(exactness.near_ties(raw, guided, lp, far, s, e)[0])


def test_ar_and_the_other_decoders_make_no_exactness_record(reference):
    model, heads = reference
    for decoder in ("ar", "ssd", "sjd"):
        r = ssd_core.generate(model, heads, prompt=0, decoder=decoder, grid=(4, 4), decode_pixels=False, score=False)
        assert r.trace.exact is None and r.trace.to_dict()["exact"] is None


def test_sweep_flags_every_difference_in_bf16(tmp_path):
    """A small part of the sweep: tools/exact_sweep.py on one group in bf16, where window rounding changes many
    cells: every image that differs from ar's was flagged at or before its first differing cell. At 6x6 (under
    half of 8x8's time): 9 of the 15 images differed here, 15% of the cells, and not every cell is a near-tie
    (at 8x8 every one was)."""
    from tools import exact_sweep

    out = tmp_path / "sweep.json"
    assert exact_sweep.main(["--pairs", "1", "--dtype", "bf16", "--models", "reference", "--grid", "6x6",
                             "--json", str(out)]) == 0  # in this process: no second torch import
    data = json.loads(out.read_text())
    pairs = data["pairs"]
    assert len(pairs) >= 15 and data["dtype"] == "bf16"
    assert any(not p["equal"] for p in pairs)
    assert data["summary"]["all"]["unflagged_differences"] == 0
    assert all(p["flagged"] for p in pairs if not p["equal"])


def test_the_sweeps_top_p_difference_is_flagged(reference):
    """The one difference of docs/exactness_sweep.json the first detector missed: seed 1669738692, cfg 5.5, top-p
    0.9, 2 draft rows without heads; ar keeps code 454 (mass ahead of it 0.8999985), the window's rounding puts
    it at 0.9000002 and cuts it. The top-p edge is now measured on the distribution top-p sees."""
    model, _ = reference
    kw = dict(prompt=0, seed=1669738692, cfg=5.5, temperature=1.0, top_k=0, top_p=0.9, min_p=0.0)
    ex = ssd_core.generate(model, None, decoder="ssd-exact", draft_rows=2, decode_pixels=False, score=False, **kw)
    tie = ex.trace.exact["first_near_tie"]
    assert tie is not None and tuple(tie) <= (16, 18)
    # ar through (16, 18) only: a first difference after it is after the near-tie too
    ar = ar_through(model, (16, 18), **kw)
    diff = ((ar != ex.tokens) & (ar >= 0)).nonzero()
    if len(diff):  # on this project's CPU it differs from (16, 18) on
        assert tuple(tie) <= tuple(int(v) for v in diff[0])
