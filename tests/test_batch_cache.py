"""Per-image cache lengths: the rows of a batch hold different numbers of slots, and each row's features and
keys are those of its own single session (every family's positions, the dynamic and the static cache)."""
import pytest
import torch

import ssd_core
from ssd_core import exactness, static_cache
from ssd_core.session import Session, stack_prompts
from tiny import make_heads, make_llama_grid
from tiny_families import TINY_SHAPES

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

# per step, per image: (slots fed, slots kept); a fed slot past the kept ones carries a wrong token (a
# rejected draft), which the next step feeds again with the right one
SCHEDULE = [((4, 1), (2, 2)), ((3, 3), (5, 0)), ((1, 0), (4, 4)), ((5, 2), (1, 1)), ((2, 2), (3, 3))]


def _model(family: str, tmp_path):
    if family == "llama-grid":
        return ssd_core.load_model(make_llama_grid(tmp_path / "m", grid=(4, 5), row_end=True))
    from tools.random_models import random_model

    return random_model(family, TINY_SHAPES[family], device="cpu", dtype=torch.float32,
                        grid=None if family == "janus" else (4, 4))


def _prompts(model, layout):
    """Two prompts of different lengths (token ids; a class for llama-grid), each with its CFG stream."""
    given = [0, 2] if model.family == "llama-grid" else [[5, 6, 7, 8, 9], [10, 11]]
    negative = [] if model.family == "emu3" else ""
    return [model.build_prompt(p, negative, True, layout.grid) for p in given]


@pytest.mark.parametrize("mode", ["off", "static"])
@pytest.mark.parametrize("family", ["llama-grid", "janus", "emu3", "lumina"])
def test_rows_of_different_lengths_match_their_single_sessions(family, mode, tmp_path):
    model = static_cache.enable(_model(family, tmp_path), mode)
    layout = model.layout(None)
    prompts = _prompts(model, layout)
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, model.image_vocab_size, (layout.num_slots,), generator=gen) for _ in prompts]
    right = [model.code_to_id(c) for c in codes]
    batch = model.start(stack_prompts(prompts), images=2)
    singles = [Session(model, p) for p in prompts]  # DynamicCache sessions (static ones of a shape share a cache)
    rows = [torch.arange(i, batch.batch, 2) for i in range(2)]
    held = [0, 0]
    pad = int(model.code_to_id(torch.zeros(1, dtype=torch.long))[0])
    for step, plan in enumerate(SCHEDULE):
        n = max(fed for fed, _ in plan)
        ids = torch.full((batch.batch, n), pad, dtype=torch.long)
        visible = torch.zeros(batch.batch, n, dtype=torch.bool)
        feeds = []
        for i, (fed, kept) in enumerate(plan):
            feed = right[i][held[i]:held[i] + fed].clone()
            feed[kept:] = model.code_to_id((codes[i][held[i] + kept:held[i] + fed] + 1) % model.image_vocab_size)
            ids[rows[i], :fed], visible[rows[i], :fed] = feed, True
            feeds.append(feed)
        feats = batch.forward(ids, visible)
        target = batch.held.clone()
        for i, (fed, kept) in enumerate(plan):
            alone = singles[i].forward(feeds[i])
            assert torch.allclose(feats[rows[i], :fed], alone, atol=1e-5), (step, i)
            held[i] += kept
            singles[i].crop(held[i])
            target[rows[i]] = held[i]
        batch.crop(target)
        assert batch.held.tolist() == [held[0], held[1]] * 2 and batch.cached == max(held)
    for i, p in enumerate(prompts):  # each row's keys: its right prefix, in slot order from the first slot column
        fresh = Session(model, p)
        fresh.forward(right[i][:held[i]])
        for (k, v), (fk, fv) in zip(batch.cache_tensors(), fresh.cache_tensors()):
            P = k.shape[2] - batch.cached
            assert torch.allclose(k[rows[i], :, P:P + held[i]], fk[:, :, -held[i]:], atol=1e-4)
            assert torch.allclose(v[rows[i], :, P:P + held[i]], fv[:, :, -held[i]:], atol=1e-4)


@pytest.mark.parametrize("mode", ["off", "static"])
def test_a_finished_image_leaves_and_the_cache_shrinks_to_the_rest(mode, tmp_path):
    model = static_cache.enable(_model("llama-grid", tmp_path), mode)
    layout = model.layout(None)
    prompts = _prompts(model, layout)
    ids = model.code_to_id(torch.arange(layout.num_slots) % model.image_vocab_size)
    batch = model.start(stack_prompts(prompts), images=2)
    batch.forward(ids[:6])
    batch.crop(torch.tensor([6, 2, 6, 2]))  # image 0 (rows 0, 2) holds 6 slots, image 1 (rows 1, 3) holds 2
    batch.select(torch.tensor([1, 3]))  # image 0 is done
    assert batch.held.tolist() == [2, 2] and batch.cached == 2 and batch.batch == 2
    assert batch.cache_tensors()[0][0].shape[:3] == (2, 2, 1 + 2)  # rows, kv heads, prompt + slots
    single = Session(model, prompts[1])
    single.forward(ids[:2])
    assert torch.allclose(batch.forward(ids[2:5]), single.forward(ids[2:5]), atol=1e-5)


def _same(batch, singles):
    for b, s in zip(batch, singles):
        assert torch.equal(b.tokens, s.tokens)
        assert torch.equal(b.trace.status, s.trace.status)
        assert b.trace.steps == s.trace.steps


@pytest.mark.parametrize("decoder", ["ssd-exact", "sjd"])
@pytest.mark.parametrize("family", ["llama-grid", "janus", "lumina"])
def test_images_that_drift_apart_get_their_single_runs(family, decoder, tmp_path):
    """Different prompts and seeds: the images accept at different rates, hold different cache lengths and
    one finishes while the others go on; each still gets the tokens, statuses and steps of its single run."""
    model = _model(family, tmp_path)
    heads = ssd_core.load_heads(make_heads(model, tmp_path / "heads.safetensors"), model) if decoder == "ssd-exact" \
        else None
    prompts = [0, 2, 1] if family == "llama-grid" else [[5, 6, 7, 8, 9], [10, 11], [12]]
    seeds = [3, 40, 500]
    kw = dict(decoder=decoder, cfg=3.0, temperature=1.0, top_k=5, draft_rows=2, decode_pixels=False, score=False)
    batch = ssd_core.generate_batch(model, heads, prompts=prompts, seeds=seeds, **kw)
    singles = [ssd_core.generate(model, heads, prompt=p, seed=s, **kw) for p, s in zip(prompts, seeds)]
    _same(batch, singles)
    assert len({r.trace.steps for r in batch}) > 1  # one finished first: the batch went on without it


@pytest.mark.parametrize("decoder", ["ar", "ssd-exact", "sjd", "zipar"])
def test_batches_on_the_static_cache_give_the_single_runs(decoder, tmp_path):
    folder = make_llama_grid(tmp_path / "m", grid=(5, 6), row_end=True)
    model = ssd_core.load_model(folder, compile="static")
    heads = ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model) if decoder == "ssd-exact" \
        else None
    prompts, seeds = [0, 1, 2], [7, 8, 9]
    kw = dict(decoder=decoder, cfg=3.0, temperature=1.0, top_k=5, draft_rows=2, decode_pixels=False, score=False)
    batch = ssd_core.generate_batch(model, heads, prompts=prompts, seeds=seeds, **kw)
    plain = ssd_core.load_model(folder)
    singles = [ssd_core.generate(plain, heads, prompt=p, seed=s, **kw) for p, s in zip(prompts, seeds)]
    _same(batch, singles)


def _rows_per_forward(model):
    """A recorder of the rows each forward of the base model's first layer runs (the batch it computes)."""
    sizes = []

    def record(_module, args, kwargs):
        sizes.append((args[0] if args else kwargs["hidden_states"]).shape[0])

    return sizes, model.backbone().layers[0].register_forward_pre_hook(record, with_kwargs=True)


@pytest.mark.parametrize("decoder", ["ssd-exact", "sjd"])
def test_finished_images_leave_a_static_cache_batch(decoder, tmp_path):
    """On the static cache too, an image that finishes leaves the batch: the forwards after it run on the other
    images' rows alone, and every image keeps the tokens, statuses and steps of its single run."""
    folder = make_llama_grid(tmp_path / "m", grid=(5, 6), row_end=True)
    model = ssd_core.load_model(folder, compile="static")
    heads = ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model) if decoder == "ssd-exact" \
        else None
    prompts, seeds = [0, 2, 1], [3, 40, 500]
    kw = dict(decoder=decoder, cfg=3.0, temperature=1.0, top_k=5, draft_rows=2, decode_pixels=False, score=False)
    # ssd-exact's rounding probe (exactness.py: once per model, its own 2-row forwards) before the rows are counted
    exactness.error_bound(model, model.build_prompt(0, "", True, (5, 6)), model.layout((5, 6)).forced)
    sizes, hook = _rows_per_forward(model)
    try:
        batch = ssd_core.generate_batch(model, heads, prompts=prompts, seeds=seeds, **kw)
    finally:
        hook.remove()
    plain = ssd_core.load_model(folder)
    _same(batch, [ssd_core.generate(plain, heads, prompt=p, seed=s, **kw) for p, s in zip(prompts, seeds)])
    steps = sorted(r.trace.steps for r in batch)
    assert steps[0] < steps[-1]  # the images finished at different steps
    assert sizes[0] == 6 and sizes == sorted(sizes, reverse=True) and sizes[-1] < 6, sizes  # 3 images x 2 streams
    assert sizes.count(6) == steps[0] + 1  # the prefill and the steps of the first image to finish
    _same(ssd_core.generate_batch(model, heads, prompts=prompts, seeds=seeds, **kw), batch)  # its cache, whole again


def test_a_compiled_step_keeps_its_shape_when_images_leave(tmp_path):
    """With compile 'compiled' the batch shrinks too, but the compiled step keeps the rows it was compiled for
    (the spare ones repeat row 0): one graph for the whole run, no recompile mid-generation, and every image
    gets its single run's tokens (backend 'eager': dynamo's graph capture, no compiler toolchain needed)."""
    from torch._dynamo.utils import counters

    folder = make_llama_grid(tmp_path / "m", grid=(5, 6), row_end=True)
    model = static_cache.enable(ssd_core.load_model(folder), "compiled", buckets=(8,), backend="eager")
    heads = ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)
    prompts, seeds = [0, 2, 1], [3, 40, 500]
    kw = dict(decoder="ssd-exact", cfg=3.0, temperature=1.0, top_k=5, draft_rows=2, decode_pixels=False, score=False)
    from test_compile_bounded import region_graphs, sampler_graphs

    graphs = counters["stats"]["unique_graphs"]
    samplers, regions = sampler_graphs(), sum(region_graphs().values())
    batch = ssd_core.generate_batch(model, heads, prompts=prompts, seeds=seeds, **kw)
    # one step graph for the whole run; the rest are the guided sampling's (static_cache.sampler_graph) and the
    # policy's regions' (static_cache.region)
    made = counters["stats"]["unique_graphs"] - graphs
    assert made == 1 + sampler_graphs() - samplers + sum(region_graphs().values()) - regions
    assert len({r.trace.steps for r in batch}) > 1  # images left while the others went on
    plain = ssd_core.load_model(folder)
    _same(batch, [ssd_core.generate(plain, heads, prompt=p, seed=s, **kw) for p, s in zip(prompts, seeds)])
