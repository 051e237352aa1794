"""Re-anchoring after a correction (decoders.drafting.reanchor_row, used by ssd-exact's rule): the cells
after a corrected token are re-drafted by an Hh chain through it; exactness holds."""
import pytest
import torch

import ssd_core
from ssd_core.decoders.drafting import _embed, feature, reanchor_row
from tiny import drafted_rows, tiny_model_and_heads

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module", params=[True, False], ids=["row-end", "no-row-end"])
def tiny(request, tmp_path_factory):
    return tiny_model_and_heads(tmp_path_factory.mktemp("m") / "model", grid=(4, 5), row_end=request.param)


@pytest.mark.parametrize("row,k,cells", [(0, 1, 5), (0, 2, 1), (1, 0, 1), (1, 1, 2)])
def test_reanchor_redrafts_cells_after_the_corrected_token(tiny, row, k, cells):
    model, heads = tiny
    layout = model.layout(None)
    W, stride = layout.grid[1], layout.row_stride
    run, _ = drafted_rows(model, heads, rows=3)  # the first rows drafted, the window's end after them
    slot = row * stride + k
    corrected = (run.tokens.codes[slot] + 1) % model.image_vocab_size
    run.tokens.write(run.index.slots(slot, slot + 1), corrected[None], draft=False)
    before, features_before = run.tokens.codes.clone(), run.outputs.features.clone()
    reanchor_row(run, slot, cells)
    last = min(row * stride + W, slot + 1 + cells)  # the re-drafted cells stay in the row
    with torch.no_grad():
        f = heads.horizontal(feature(run, slot - 1), _embed(run, run.index.id_of_code[corrected[None]])[0])
        for t in range(slot + 1, last):  # each: the Gumbel pick of q from the chain through the corrected token
            q = run.logp(model.image_logits(f[:, None]), run.index.slots(t, t + 1), "heads")
            r = run.index.images_before[t]
            assert int(run.tokens.codes[t]) == int(run.draws.gumbel_sample(q, r, r + 1)[0])
            f = heads.horizontal(f, _embed(run, run.tokens.ids[t:t + 1])[0])
            if t < last - 1:  # the last re-drafted cell's feature is not needed (nothing drafts from it)
                assert torch.allclose(run.outputs.features[:, t], f)
    assert torch.equal(run.outputs.features[:, last - 1], features_before[:, last - 1])
    assert torch.equal(run.tokens.codes[:slot + 1], before[:slot + 1])  # the rest is left as it was
    assert torch.equal(run.tokens.codes[last:], before[last:])
    if last - 1 > slot + 1:
        # through the new token
        assert not torch.allclose(run.outputs.features[:, slot + 1], features_before[:, slot + 1])


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_exact_rule_with_reanchoring_is_still_ar(tiny, seed):
    model, heads = tiny
    kw = dict(prompt=seed % 3, seed=seed, cfg=3.0, top_k=8, score=False)
    ar = ssd_core.generate(model, None, decoder="ar", **kw)
    for draft_rows in (1, 3):
        exact = ssd_core.generate(model, heads, decoder="ssd-exact", draft_rows=draft_rows, **kw)
        assert torch.equal(exact.tokens, ar.tokens) and exact.trace.steps < ar.trace.steps
    lossy = ssd_core.generate(model, heads, decoder="ssd", **kw)
    assert torch.equal(lossy.tokens[0], ar.tokens[0])  # its first row by the exact rule


def test_exact_rule_reanchors_after_each_correction(tiny, monkeypatch):
    """Every correction that leaves open window slots re-anchors: FIRST_ROW_REDRAFT cells in the first row,
    one cell below it."""
    from ssd_core.decoders import drafting, exact

    model, heads = tiny
    layout = model.layout(None)
    calls = []
    monkeypatch.setattr(drafting, "reanchor_row", lambda run, k, cells, **kw: calls.append((k, cells)) or reanchor_row(run, k, cells, **kw))
    ssd_core.generate(model, heads, decoder="ssd-exact", draft_rows=3, prompt=1, seed=2, cfg=3.0, top_k=8,
                      score=False)  # rows given: the heads draft (draft rows 0 may find they do not pay here)
    assert any(k < layout.row_stride for k, _ in calls) and any(k >= layout.row_stride for k, _ in calls)
    assert all(cells == (exact.FIRST_ROW_REDRAFT if k < layout.row_stride else 1) for k, cells in calls)
    calls.clear()
    ssd_core.generate(model, None, decoder="ssd-exact", prompt=1, seed=2, cfg=3.0, top_k=8, score=False)
    assert calls == []  # without heads: the verifier's outputs only
