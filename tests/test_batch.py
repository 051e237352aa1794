"""Batches: N images share one base forward per step, and each gets exactly the tokens of its own run."""
import pytest
import torch

import ssd_core
from tiny import make_heads, make_llama_grid
from tiny_families import build_emu3

DECODERS = ["ar", "ssd-exact", "ssd", "sjd", "zipar"]
SETTINGS = {"T1-cfg3-k5": dict(temperature=1.0, cfg=3.0, top_k=5), "greedy-nocfg": dict(temperature=0.0, cfg=1.0)}


@pytest.fixture(scope="module", params=[False, True], ids=["no-row-end", "row-end"])
def grid_model(request, tmp_path_factory):
    folder = make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(5, 6), row_end=request.param)
    model = ssd_core.load_model(folder)
    return model, ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)


def _singles(model, heads, prompts, seeds, **kw):
    return [ssd_core.generate(model, heads, prompt=p, seed=s, decode_pixels=False, score=False, **kw)
            for p, s in zip(prompts, seeds)]


def _same(batch, singles):
    for b, s in zip(batch, singles):
        assert torch.equal(b.tokens, s.tokens)
        assert torch.equal(b.trace.status, s.trace.status)  # the same per-image statistics
        assert b.trace.steps == s.trace.steps
        assert torch.equal(b.trace.step, s.trace.step)


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("decoder", DECODERS)
def test_batch_gives_every_image_its_single_run(grid_model, decoder, settings):
    model, heads = grid_model
    heads = heads if decoder.startswith("ssd") else None
    prompts, seeds = [0, 1, 2, 1], [5, 6, 7, 8]
    batch = ssd_core.generate_batch(model, heads, prompts=prompts, seeds=seeds, decoder=decoder, draft_rows=2,
                                    decode_pixels=False, score=False, **settings)
    singles = _singles(model, heads, prompts, seeds, decoder=decoder, draft_rows=2, **settings)
    _same(batch, singles)
    if decoder == "ssd-exact":  # images finish at different steps: the batch went on without the early ones
        assert len({r.trace.steps for r in batch}) > 1 or settings["temperature"] == 0


def test_text_prompts_of_different_lengths_and_cfg(tmp_path):
    model = ssd_core.load_model(build_emu3(tmp_path / "emu3"), dtype="fp32")
    heads = ssd_core.load_heads(make_heads(model, tmp_path / "heads.safetensors"), model)
    prompts = ["a red cat", "a small dog running on a long sandy beach at dusk", "x"]
    lengths = {int(model.build_prompt(p, "blurry", True, (3, 4)).mask[0].sum()) for p in prompts}
    assert len(lengths) == 3  # left padding inside the batch's prompt block
    for decoder in ("ar", "ssd-exact"):
        kw = dict(decoder=decoder, grid=(3, 4), cfg=3.0, negative_prompt="blurry")
        if decoder == "ssd-exact":  # rows fixed: picked rows follow what the model's runs observed (calibrate.Tuner)
            kw["draft_rows"] = 2
        h = heads if decoder == "ssd-exact" else None
        batch = ssd_core.generate_batch(model, h, prompts=prompts, seeds=[1, 2, 3], decode_pixels=False, **kw)
        singles = [ssd_core.generate(model, h, prompt=p, seed=s, decode_pixels=False, **kw)
                   for p, s in zip(prompts, [1, 2, 3])]
        _same(batch, singles)
        for b, s in zip(batch, singles):
            assert b.trace.nll == pytest.approx(s.trace.nll, rel=1e-4)


def test_seeds_follow_the_first_and_progress_names_the_image(grid_model):
    model, _ = grid_model
    seen = set()
    batch = ssd_core.generate_batch(model, None, prompt=1, seed=10, batch_size=3, decoder="ar",
                                    on_step=lambda p: seen.add(p.image), decode_pixels=False, score=False)
    assert [r.trace.settings["seed"] for r in batch] == [10, 11, 12]
    assert seen == {0, 1, 2}
    assert not torch.equal(batch[0].tokens, batch[1].tokens)


@pytest.mark.parametrize("kwargs, words", [
    (dict(batch_size=0), "batch_size"), (dict(batch_size=2.5), "batch_size"),
    (dict(prompts=[0, 1], seeds=[1]), "2 prompts and 2 seeds"), (dict(prompts=[0], batch_size=2), "2 prompts"),
])
def test_bad_batches_say_what_is_wrong(grid_model, kwargs, words):
    model, _ = grid_model
    with pytest.raises(ssd_core.SSDError, match=words):
        ssd_core.generate_batch(model, None, decoder="ar", **kwargs)
