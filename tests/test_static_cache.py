"""The static KV cache (eager, and compiled where inductor runs): the same tokens as the DynamicCache path,
ssd-exact == ar, every decoder runs, the cache is reused across generations."""
import os

import pytest
import torch

import ssd_core
from ssd_core import static_cache
from ssd_core.calibrate import MAX_ROWS
from ssd_core.errors import SSDError
from tiny import make_heads, make_llama_grid

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

SETTINGS = [dict(temperature=1.0, top_k=0, top_p=1.0, cfg=3.0), dict(temperature=0.0, top_k=5, top_p=1.0, cfg=1.0),
            dict(temperature=1.0, top_k=0, top_p=0.8, cfg=1.0)]


@pytest.fixture(scope="module", params=[False, True], ids=["no-row-end", "row-end"])
def dynamic_and_static(request, tmp_path_factory):
    """Two loads of one tiny model folder: DynamicCache, and the static cache (eager)."""
    folder = make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(5, 6), row_end=request.param)
    dynamic = ssd_core.load_model(folder)
    static = ssd_core.load_model(folder, compile="static")
    heads = ssd_core.load_heads(make_heads(dynamic, folder / "heads.safetensors"), dynamic)
    return dynamic, static, heads


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "T{temperature}-k{top_k}-p{top_p}-cfg{cfg}".format(**s))
def test_static_cache_gives_the_dynamic_tokens_and_exact_equals_ar(dynamic_and_static, settings):
    dynamic, static, heads = dynamic_and_static
    assert static_cache.mode_of(static) == "static" and static_cache.mode_of(dynamic) == "off"
    seed = SETTINGS.index(settings) + 11
    ar = ssd_core.generate(dynamic, None, prompt=1, decoder="ar", seed=seed, **settings)
    static_ar = ssd_core.generate(static, None, prompt=1, decoder="ar", seed=seed, **settings)
    assert torch.equal(static_ar.tokens, ar.tokens)
    assert static_ar.trace.nll == pytest.approx(ar.trace.nll, rel=1e-4)
    for rows in (1, 2):
        ex = ssd_core.generate(static, heads, prompt=1, decoder="ssd-exact", seed=seed, draft_rows=rows, **settings)
        assert torch.equal(ex.tokens, ar.tokens), rows
        assert ex.trace.steps < ar.trace.steps
    for decoder in ("ssd", "sjd", "zipar"):  # lossy decoders: same tokens and steps as on the DynamicCache
        a = ssd_core.generate(dynamic, heads, prompt=2, decoder=decoder, seed=seed, **settings)
        b = ssd_core.generate(static, heads, prompt=2, decoder=decoder, seed=seed, **settings)
        assert torch.equal(a.tokens, b.tokens) and a.trace.steps == b.trace.steps, decoder


def test_one_cache_serves_every_generation_and_crop_moves_the_valid_length(dynamic_and_static):
    _, static, _ = dynamic_and_static
    layout = static.layout(None)
    prompt = static.build_prompt(1, "", True, layout.grid)
    first = static.start(prompt)
    ids = static.code_to_id(torch.arange(layout.num_slots) % static.image_vocab_size)
    feats = first.forward(ids[:7])
    assert feats.shape[:2] == (2, 7) and first.cached == 7
    keys, _ = first.cache_tensors()[0]
    assert keys.shape[2] == prompt.ids.shape[1] + 7
    first.crop(3)
    assert first.cached == 3 and first.cache_tensors()[0][0].shape[2] == prompt.ids.shape[1] + 3
    again = first.forward(ids[3:7])  # re-feeding the cropped slots gives their features again
    assert torch.allclose(again, feats[:, 3:7], atol=1e-5)
    caches = len(static.static.pool)
    second = static.start(prompt)
    assert second.cache is first.cache and len(static.static.pool) == caches


def test_static_cache_on_a_family_model():
    from tiny_families import TINY_SHAPES

    from tools.random_models import random_model

    model = random_model("janus", TINY_SHAPES["janus"], device="cpu", dtype=torch.float32)
    heads = ssd_core.DraftHeads.for_model(model)
    ar = ssd_core.generate(model, None, prompt=[5, 6, 7], decoder="ar", seed=4, score=False, decode_pixels=False)
    static_cache.enable(model, "static")
    for decoder in ("ar", "ssd-exact"):
        r = ssd_core.generate(model, heads, prompt=[5, 6, 7], decoder=decoder, seed=4, score=False, decode_pixels=False)
        assert torch.equal(r.tokens, ar.tokens), decoder


def test_bad_compile_modes_are_refused(tmp_path):
    folder = make_llama_grid(tmp_path / "model", grid=(2, 3))
    with pytest.raises(SSDError, match="compile mode 'fast' is not one of off, static, compiled"):
        ssd_core.load_model(folder, compile="fast")
    model = ssd_core.load_model(folder, compile=True)
    assert static_cache.mode_of(model) == "compiled"
    assert static_cache.mode_of(static_cache.enable(model, "off")) == "off"


def test_windows_pad_to_buckets():
    assert [static_cache.bucket(n, (1, 8, 16)) for n in (1, 2, 8, 9, 16, 17)] == [1, 8, 8, 16, 16, None]


def _inductor_problem() -> str | None:
    """Why torch.compile's CPU backend cannot run here (None when it can)."""
    try:
        torch.compile(lambda x: x * 2 + 1, dynamic=False)(torch.ones(3))
    except Exception as err:  # noqa: BLE001 - any toolchain failure is a reason to skip, quoted
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return None


@pytest.mark.skipif(os.environ.get("SSD_SKIP_COMPILE") == "1", reason="SSD_SKIP_COMPILE=1 set by the caller")
def test_compiled_forward_on_cpu_gives_ar_tokens(tmp_path):
    problem = _inductor_problem()
    if problem is not None:
        pytest.skip(f"torch.compile (inductor) cannot build CPU kernels here: {problem}")
    folder = make_llama_grid(tmp_path / "model", grid=(4, 5), row_end=True)
    plain = ssd_core.load_model(folder)
    heads = ssd_core.load_heads(make_heads(plain, folder / "heads.safetensors"), plain)
    ar = ssd_core.generate(plain, None, prompt=1, decoder="ar", seed=5, cfg=3.0, score=False)
    compiled = static_cache.enable(ssd_core.load_model(folder), "compiled", buckets=(8,))  # one shape to compile
    car = ssd_core.generate(compiled, None, prompt=1, decoder="ar", seed=5, cfg=3.0, score=False)
    cex = ssd_core.generate(compiled, heads, prompt=1, decoder="ssd-exact", seed=5, cfg=3.0, score=False)
    assert torch.equal(car.tokens, ar.tokens) and torch.equal(cex.tokens, ar.tokens)
    assert cex.trace.steps < car.trace.steps


def test_cli_compile_flag(tmp_path, capsys):
    import json

    from ssd_core import cli

    folder = make_llama_grid(tmp_path / "model", grid=(3, 4))
    traces = []
    for flags in ([], ["--compile", "static"]):
        out = tmp_path / f"trace{len(flags)}.json"
        assert cli.main(["generate", "--model", str(folder), "--heads", "none", "--decoder", "ar", "--seed", "3",
                         "--trace", str(out), *flags]) == 0
        traces.append(json.loads(out.read_text()))
    assert traces[0]["tokens"] == traces[1]["tokens"]
    assert cli.build_parser().parse_args(["generate", "--compile"]).compile == "compiled"
    with pytest.raises(SystemExit):  # argparse refuses a mode outside its choices
        cli.build_parser().parse_args(["generate", "--compile", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_a_batch_on_the_static_cache_gives_each_image_its_single_run_tokens(dynamic_and_static):
    dynamic, static, heads = dynamic_and_static
    seeds = [21, 22, 23]
    singles = [ssd_core.generate(dynamic, None, prompt=1, decoder="ar", seed=s, score=False) for s in seeds]
    for decoder in ("ar", "ssd-exact"):
        batch = ssd_core.generate_batch(static, heads if decoder != "ar" else None, prompt=1, seeds=seeds,
                                        decoder=decoder, score=False)
        assert all(torch.equal(b.tokens, s.tokens) for b, s in zip(batch, singles)), decoder


# ---- buckets from the layout: every family's largest window at the defaults is compiled ----------------------
def _windows(model, heads, decoder, seeds=(0, 1), **kw):
    """The window lengths the steps of these runs feed (the base model's forward sizes)."""
    from ssd_core.session import Session

    sizes, forward = [], Session.forward

    def recording(self, slot_ids, visible=None, positions=None, logits=False):
        sizes.append(slot_ids.shape[-1])
        return forward(self, slot_ids, visible, positions, logits)

    Session.forward = recording
    try:
        for seed in seeds:
            ssd_core.generate(model, heads, prompt=1, decoder=decoder, seed=seed, decode_pixels=False, score=False, **kw)
    finally:
        Session.forward = forward
    return sizes


@pytest.mark.parametrize("family, width, row_end", [("janus", 24, False), ("reference", 24, True),
                                                    ("lumina", 48, True), ("emu3", 90, True)])
def test_the_largest_window_of_each_family_layout_fits_its_buckets(tmp_path, family, width, row_end):
    """The rows of each family's real grid (Janus 24, the bundled model 24 + a row end, Lumina-mGPT 48 + 1,
    Emu3 90 + 1), six of them, on a tiny model: ssd-exact and ssd at their defaults never feed a window
    longer than the largest bucket (the old fixed buckets stopped at 128: Lumina's and Emu3's windows ran
    eagerly, never as CUDA graphs)."""
    folder = make_llama_grid(tmp_path / "model", grid=(6, width), row_end=row_end, max_positions=1024)
    model = ssd_core.load_model(folder)
    heads = ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)
    buckets = static_cache.buckets_for(model.layout(None).row_stride)
    widest = {"ssd-exact": {"draft_rows": MAX_ROWS}, "ssd": {}}  # the most rows ssd-exact's calibration picks
    largest = max(n for decoder in ("ssd-exact", "ssd") for d in (heads, None)[:1 if decoder == "ssd" else 2]
                  for n in _windows(model, d, decoder, seeds=(0,), **widest[decoder]))
    assert largest <= max(buckets), (family, largest, buckets)
    assert len(buckets) <= 12  # one compiled graph each (made when a window of that size first runs)


def test_padding_wastes_under_a_quarter_on_the_bundled_model():
    model = ssd_core.load_model("reference")
    heads = ssd_core.load_heads("reference", model)
    buckets = static_cache.enable(ssd_core.load_model("reference"), "static").static.buckets
    for decoder, drafter in (("ssd-exact", heads), ("ssd", heads), ("ssd-exact", None)):
        # ssd-exact at 3 rows, as before its default picked rows per device (1 on this CPU: windows of ~18 slots).
        # One image each, 24x24 (76-135 windows): seeds 0, 1, 2 wasted 10.7/11.1/10.1%, 16.9/21.2/18.1% (ssd) and
        # 11.5/9.8/11.2% apart, and seed 0 feeds each decoder's widest window of the three (77, 67, 77). Its top
        # half (12x24, the same windows in half the time): 10.4%, 16.6%, 11.3%, widest 77, 67, 75
        sizes = _windows(model, drafter, decoder, seeds=(0,), grid=(12, 24),
                         **({"draft_rows": 3} if decoder == "ssd-exact" else {}))
        padded = [static_cache.bucket(n, buckets) for n in sizes]
        assert None not in padded, (decoder, max(sizes), buckets)
        waste = 1 - sum(sizes) / sum(padded)
        assert waste < 0.25, (decoder, waste)
        old = [static_cache.bucket(n, static_cache.BUCKETS) for n in sizes]
        print(f"{decoder} {'heads' if drafter else 'no heads'}: windows mean {sum(sizes) / len(sizes):.1f} max "
              f"{max(sizes)}; padding waste {waste:.1%} (fixed buckets: {1 - sum(sizes) / sum(old):.1%})")


def test_the_pool_keeps_two_caches_frees_the_oldest_and_counts_its_bytes(tmp_path):
    """A model kept its static caches for ever, one more per batch size / prompt length, and ComfyUI did not
    count them (Emu3 at 90x90: ~2.3 GB each). Now at most POOL_ENTRIES, the least recently used freed first;
    cache_bytes says what one costs, release frees them all."""
    folder = make_llama_grid(tmp_path / "model", grid=(3, 4))
    model = static_cache.enable(ssd_core.load_model(folder), "static")
    kw = dict(prompt=1, decoder="ar", seed=1, decode_pixels=False, score=False)
    ssd_core.generate(model, None, cfg=3.0, **kw)  # 2 streams
    pool = model.static.pool
    (streams, capacity), = pool
    prompt_len = model.start(model.build_prompt(1, "", True, model.default_grid)).prompt_len
    assert static_cache.pool_bytes(model) == static_cache.cache_bytes(model, streams=2, prompt_len=prompt_len) > 0
    ssd_core.generate(model, None, cfg=1.0, **kw)  # 1 stream: a second cache
    ssd_core.generate_batch(model, None, prompts=[1, 2], seeds=[1, 2], decoder="ar", cfg=3.0, decode_pixels=False,
                            score=False)  # 4 streams: the first (2 streams) is the least recently used
    assert len(pool) == static_cache.POOL_ENTRIES == 2 and (2, capacity) not in pool
    static_cache.release(model)
    assert not pool and static_cache.pool_bytes(model) == 0
    assert ssd_core.generate(model, None, cfg=3.0, **kw).tokens.numel() == 12  # a new cache is made


def test_comfyui_counts_the_static_cache_and_frees_it_when_it_moves_the_model(tmp_path):
    from conftest import pack_module

    comfy = pack_module("nodes._patcher")
    folder = make_llama_grid(tmp_path / "model", grid=(3, 4))
    model = static_cache.enable(ssd_core.load_model(folder), "static")
    ssd_core.generate(model, None, prompt=1, decoder="ar", seed=1, decode_pixels=False, score=False)
    assert static_cache.pool_bytes(model) > 0
    holder = comfy._holder_class()(model.model, torch.device("cpu"), model)
    holder.to("cpu")  # ComfyUI offloading (or loading) the model
    assert static_cache.pool_bytes(model) == 0
