"""What only a CUDA GPU can show (`make gpu-check` runs this file there; every test skips elsewhere):

- ssd-exact gives ar's very tokens in fp32 on CUDA (bundled model, one image and a batch);
- the static cache, eager and compiled (inductor, CUDA graphs), gives ar's tokens in fp32;
- bf16 runs every decoder;
- inside a step forward nothing waits for the GPU: torch's own sync checker (set_sync_debug_mode "error")
  is on around Session / StaticSession.forward, off inside the base model's forward;
- no torch.cuda.synchronize per step (the engine's phase clock reads CUDA events once per trace);
- the trace's peak memory is the GPU's, and above the weights.
"""
import math

import pytest
import torch

import ssd_core
from ssd_core import static_cache
from ssd_core.session import Session
from ssd_core.static_cache import StaticSession

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: torch sees none here (make gpu-check runs it on one)")

GRID = (12, 12)  # the bundled model's full 24x24 costs more steps than these checks need
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def fp32():
    model = ssd_core.load_model("reference", dtype="fp32", device="cuda")
    return model, ssd_core.load_heads("reference", model)


def _tokens(model, heads, decoder, seed, **kw):
    return ssd_core.generate(model, heads, prompt=seed % 11, decoder=decoder, seed=seed, grid=GRID,
                             decode_pixels=False, score=False, **kw).tokens


def test_ssd_exact_equals_ar_in_fp32_on_cuda(fp32):
    model, heads = fp32
    assert model.device.type == "cuda" and model.dtype == torch.float32
    for seed in SEEDS:
        ar = _tokens(model, None, "ar", seed)
        assert torch.equal(_tokens(model, heads, "ssd-exact", seed), ar), seed
        assert torch.equal(_tokens(model, None, "ssd-exact", seed), ar), seed  # without heads too
    singles = [_tokens(model, None, "ar", s) for s in SEEDS]
    batch = ssd_core.generate_batch(model, heads, prompts=[s % 11 for s in SEEDS], seeds=list(SEEDS),
                                    decoder="ssd-exact", grid=GRID, decode_pixels=False, score=False)
    assert all(torch.equal(r.tokens, s) for r, s in zip(batch, singles))


@pytest.mark.parametrize("mode", ["static", "compiled"])
def test_static_and_compiled_cache_give_ar_tokens_in_fp32_on_cuda(fp32, mode):
    dynamic, heads = fp32
    model = ssd_core.load_model("reference", dtype="fp32", device="cuda")
    static_cache.enable(model, mode, buckets=(1, 8, 64))  # three shapes to compile (ssd-exact's windows fit 64)
    assert static_cache.mode_of(model) == mode
    for seed in SEEDS[:2]:
        ar = _tokens(dynamic, None, "ar", seed)
        assert torch.equal(_tokens(model, None, "ar", seed), ar), (mode, seed)
        assert torch.equal(_tokens(model, heads, "ssd-exact", seed), ar), (mode, seed)


def test_bf16_runs_every_decoder(fp32):
    model = ssd_core.load_model("reference", dtype="bf16", device="cuda")
    heads = ssd_core.load_heads("reference", model)
    assert model.dtype == torch.bfloat16
    for decoder in ssd_core.DECODERS:
        r = ssd_core.generate(model, heads, prompt=3, decoder=decoder, seed=4, grid=(8, 8), score=True)
        assert tuple(r.tokens.shape) == (8, 8), decoder
        assert 0 <= int(r.tokens.min()) and int(r.tokens.max()) < model.image_vocab_size, decoder
        assert r.trace.steps >= 1 and math.isfinite(r.trace.nll_full), decoder
        assert r.image is not None and bool(torch.isfinite(r.image).all()), decoder


@pytest.fixture
def sync_checker(monkeypatch):
    """torch's sync checker raises at any synchronizing CUDA call made inside a step forward but outside the base
    model's forward (whatever the base model does is transformers' business)."""
    def checked(forward, mode):
        def wrapper(*args, **kwargs):
            before = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(mode)
            try:
                return forward(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(before)
        return wrapper

    def watch(model):
        backbone = type(model.backbone())
        monkeypatch.setattr(backbone, "forward", checked(backbone.forward, "default"))
        for cls in (Session, StaticSession):
            monkeypatch.setattr(cls, "forward", checked(cls.forward, "error"))

    yield watch
    torch.cuda.set_sync_debug_mode("default")


def test_the_sync_checker_catches_a_device_read_in_the_forward(fp32, sync_checker, monkeypatch):
    model, _ = fp32
    sync_checker(model)
    embed = model.embed
    monkeypatch.setattr(model, "embed", lambda ids: embed(ids) * float(ids.float().mean() * 0 + 1))
    session = model.start(model.build_prompt(0, "", True, GRID))
    with pytest.raises(RuntimeError, match="synchroniz"):
        session.forward(torch.zeros(1, dtype=torch.long, device="cuda"))


@pytest.mark.parametrize("mode", ["off", "static"])
def test_no_host_sync_inside_a_step_forward_on_cuda(sync_checker, mode):
    from tiny_families import TINY_SHAPES

    from tools.random_models import random_model

    bundled = ssd_core.load_model("reference", dtype="fp32", device="cuda", compile=mode)
    janus = static_cache.enable(random_model("janus", TINY_SHAPES["janus"], device="cuda", dtype=torch.float32),
                                mode)
    cases = ((bundled, ssd_core.load_heads("reference", bundled), 1, GRID), (janus, None, [5, 6, 7], None))
    for model, heads, prompt, grid in cases:
        sync_checker(model)
        for decoder in ("ar", "ssd-exact", "ssd", "sjd"):
            drafter = heads if decoder.startswith("ssd") else None
            one = ssd_core.generate(model, drafter, prompt=prompt, decoder=decoder, seed=1, grid=grid,
                                    decode_pixels=False, score=False)
            two = ssd_core.generate_batch(model, drafter, prompts=[prompt, prompt], seeds=[1, 2], decoder=decoder,
                                          grid=grid, decode_pixels=False, score=False)
            assert one.trace.steps >= 1 and len(two) == 2, decoder


def test_no_synchronize_per_step(fp32, monkeypatch):
    model, heads = fp32
    calls = {"device": 0}
    real = torch.cuda.synchronize

    def counted(*args, **kwargs):
        calls["device"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "synchronize", counted)
    per_grid = {}
    for grid in ((6, 6), (16, 16)):
        calls["device"] = 0
        r = ssd_core.generate(model, heads, prompt=2, decoder="ar", seed=3, grid=grid, decode_pixels=False,
                              score=False)
        per_grid[grid] = (calls["device"], r.trace.steps)
    (few, short), (many, long) = per_grid.values()
    assert long > 4 * short and few == many <= 8, per_grid  # the same handful, whatever the number of steps
    t = r.trace.timings
    assert t["forward"] > 0 and t["policy"] > 0 and t["forward"] + t["policy"] <= t["wall"] * 1.01


def test_peak_memory_figures_on_cuda(fp32):
    model, heads = fp32
    weights_mb = sum(p.numel() * p.element_size() for p in model.model.parameters()) / 2**20
    r = ssd_core.generate(model, heads, prompt=5, decoder="ssd-exact", seed=0, grid=GRID, decode_pixels=False,
                          score=False)
    peak = r.trace.peak_memory_mb
    assert weights_mb < peak <= torch.cuda.max_memory_allocated() / 2**20 + 1e-6
    assert peak < weights_mb + 512  # a 12x12 image of the bundled model needs far less than 512 MB beside it
    print(f"\nweights {weights_mb:.1f} MB, peak {peak:.1f} MB (ssd-exact, {GRID[0]}x{GRID[1]}, fp32)")
