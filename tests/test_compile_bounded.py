"""A session compiles a bounded set of graphs whatever its prompts and batches (issue 38): cache shapes come from a
few classes (static_cache.PROMPT_CLASSES, power-of-two stream rows), every window pads to one of the model's
buckets, and the recompile limit holds them all, so dynamo never falls back to eager. Counted on the CPU inductor
backend with dynamo's own counters; tokens equal the uncompiled run's."""
import os

import pytest
import torch
from torch._dynamo.utils import counters

import ssd_core
from ssd_core import static_cache
from test_static_cache import _inductor_problem
from tiny import make_heads
from tiny_families import build_janus

pytestmark = pytest.mark.engine457

WORDS = "a red cat sits on the mat while the old dog barks at a pale moon over the hill".split()
# 12 prompts of 12 lengths (the tiny tokenizer reads bytes: 1 to ~190 tokens, one prompt class)
PROMPTS = [" ".join((WORDS * 4)[:1 + 3 * i]) for i in range(12)]


def test_prompt_and_stream_classes():
    opts = static_cache.StaticOptions(True, slots=16, buckets=(1, 8, 32))
    assert {static_cache.capacity(opts, n) for n in (1, 37, 200, 256)} == {static_cache.capacity(opts, 256)}
    assert static_cache.capacity(opts, 257) == static_cache.capacity(opts, 1024) > static_cache.capacity(opts, 256)
    assert static_cache.prompt_class(5000) == 8192
    assert [static_cache.stream_rows(opts, s) for s in (1, 2, 3, 4, 6, 8, 10)] == [1, 2, 4, 4, 8, 8, 16]
    eager = static_cache.StaticOptions(False, slots=16)
    assert static_cache.stream_rows(eager, 6) == 6  # uncompiled: no spare rows (they would only take memory)


@pytest.mark.skipif(os.environ.get("SSD_SKIP_COMPILE") == "1", reason="SSD_SKIP_COMPILE=1 set by the caller")
def test_twelve_prompt_lengths_and_two_batch_sizes_compile_a_fixed_few_graphs(tmp_path, monkeypatch):
    problem = _inductor_problem()
    if problem is not None:
        pytest.skip(f"torch.compile (inductor) cannot build CPU kernels here: {problem}")
    folder = build_janus(tmp_path / "janus")
    plain = ssd_core.load_model(folder)
    heads = ssd_core.load_heads(make_heads(plain, tmp_path / "heads.safetensors"), plain)
    model = ssd_core.load_model(folder, compile="compiled")
    # (cache rows, capacity, padded window, rows of its window mask and positions: 1 shared by every stream, or one
    # per stream) of every compiled step that ran: a graph each
    fed = set()
    step = static_cache.StaticSession._step

    def recording(self, ids, window, steps, held, compiled):
        if compiled:
            fed.add((self.rows, self.capacity, ids.shape[1], window.shape[0], steps.shape[0]))
        return step(self, ids, window, steps, held, compiled)

    monkeypatch.setattr(static_cache.StaticSession, "_step", recording)
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # a fallback to eager would raise, not pass silently
    torch._dynamo.reset()  # graphs compiled by earlier tests of this process (same code object, same shapes) go
    counters.clear()
    options = dict(decoder="ssd-exact", draft_rows=2, score=False, decode_pixels=False)
    try:
        for seed, prompt in enumerate(PROMPTS):  # batch 1, each prompt a new length; ar too (its own window, 1)
            for decoder in ("ssd-exact", "ar") if seed % 4 == 0 else ("ssd-exact",):
                got = ssd_core.generate(model, heads, prompt=prompt, seed=seed, **{**options, "decoder": decoder})
                want = ssd_core.generate(plain, heads, prompt=prompt, seed=seed, **{**options, "decoder": decoder})
                assert torch.equal(got.tokens, want.tokens), (decoder, prompt)
        for batch in (PROMPTS[:4], PROMPTS[4:8]):  # batch 4 (8 streams)
            got = ssd_core.generate_batch(model, heads, prompts=batch, seeds=[0, 1, 2, 3], **options)
            want = ssd_core.generate_batch(plain, heads, prompts=batch, seeds=[0, 1, 2, 3], **options)
            assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(got, want))
        shapes_once = set(model.static.shapes)
        for seed, prompt in enumerate(PROMPTS[::3]):  # the same shapes again: no new shape
            ssd_core.generate(model, heads, prompt=prompt, seed=seed + 50, **options)
        ssd_core.generate_batch(model, heads, prompts=PROMPTS[8:], seeds=[4, 5, 6, 7], **options)
    finally:
        torch._dynamo.config.fail_on_recompile_limit_hit = False
    shapes = sorted(model.static.shapes)
    assert shapes == [(2, static_cache.capacity(model.static, 256)), (8, static_cache.capacity(model.static, 256, 4))]
    buckets = len(model.static.buckets)
    # one graph per (shape, bucket) a step met and nothing else (no recompile for a prompt length, a step's start or
    # a cache re-made); two shapes whatever the 12 lengths (before the classes: one shape per 64-rounded capacity,
    # 6 graphs for these prompts at 1 row)
    assert {(rows, cap) for rows, cap, *_ in fed} == set(shapes)
    graphs = counters["stats"]["unique_graphs"]
    # and the guided sampling's graphs (static_cache.sampler_graph: one set of sampler values here, the window's
    # length dynamic): a few, whatever the prompts and batches
    samplers = sampler_graphs()
    # and the policies' regions (static_cache.region: the heads' networks, the token writes, the acceptance, ...):
    # a few graphs each (shapes dynamic; a flag's values or an argument count apart), whatever the prompts
    regions = region_graphs()
    assert set(shapes) == shapes_once and len(fed) <= 2 * buckets * len(shapes)
    assert graphs == len(fed) + samplers + sum(regions.values()), (graphs, len(fed), samplers, regions)
    assert 1 <= samplers <= 8, samplers
    assert len(regions) >= 8 and max(regions.values()) <= 12, sorted(regions.items())
    assert sum(counters["graph_break"].values()) == 0
    print(f"\ncompiled graphs: {graphs} ({samplers} of the sampling, {sum(regions.values())} of {len(regions)} regions) "
          f"for {len(PROMPTS)} prompt lengths x batch 1 and 4 ({buckets} buckets, shapes {shapes}); regions: {regions}")


def sampler_graphs() -> int:
    """The graphs dynamo holds for the compiled guided sampling (static_cache.sampler_graph's one code object: every
    model and set of sampler values of this process)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = next(c for c in static_cache.sampler_graph.__code__.co_consts if getattr(c, "co_name", "") == "process")
    return len(_debug_get_cache_entry_list(code))


def region_graphs() -> dict[str, int]:
    """The graphs dynamo holds for each compiled region (static_cache.region's functions: every model of this
    process), by function name."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return {fn.__name__: len(_debug_get_cache_entry_list(fn.__code__)) for fn in static_cache.REGIONS}
