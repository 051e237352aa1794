"""The step loop runs on every device artists use: no float64 op (Apple's mps has none), and the Gumbel noise
that makes ar / ssd-exact a function of the seed is the same as the float64 formula it replaced (today's
seeds keep their images)."""
import pytest
import torch

import ssd_core
from ssd_core import run_state
from ssd_core.opcount import count_ops
from ssd_core.sampling import _mix, _mix_int, _signed, gumbel, shr53

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


def float64_gumbel(seed, slots, vocab):
    """The noise as the pack made it before (float64: -log(-log(u)))."""
    key = _mix_int(_signed(seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019))
    base = _mix(key ^ (slots.long() * _signed(0xD1B54A32D192ED03)))
    codes = torch.arange(vocab, dtype=torch.long, device=slots.device)
    bits = _mix(base[:, None] + codes[None, :] * _signed(0x9E3779B97F4A7C15))
    return float64_gumbel_of(shr53(bits))


def float64_gumbel_of(m):
    """sampling.gumbel_of as the pack computed it before: in float64."""
    u = (m.double() + 0.5) / float(1 << 53)
    return (-torch.log(-torch.log(u))).float()


def test_noise_is_float32_and_within_two_ulps_of_the_float64_formula():
    slots = torch.arange(3000)
    new, old = gumbel(11, slots, 512), float64_gumbel(11, slots, 512)
    assert new.dtype == torch.float32
    ulp = torch.finfo(torch.float32).eps * old.abs().clamp(min=1.0)
    assert ((new - old).abs() <= 2 * ulp).all()  # 9 of 1.5M values differ by more than one ulp, none by two


@pytest.mark.parametrize("decoder", ["ar", "ssd", "ssd-exact", "ssd-exact:noheads", "sjd", "zipar"])
def test_no_float64_op_in_any_decoder_step(bundled, decoder):
    model, heads = bundled
    name, _, noheads = decoder.partition(":")
    with count_ops() as ops:
        r = ssd_core.generate(model, None if noheads or name in ("ar", "sjd", "zipar") else heads, prompt=2,
                              decoder=name, seed=4, grid=(6, 6), decode_pixels=False, score=False)
    assert ops.steps >= r.trace.steps > 4 and ops.total > 0
    assert not ops.float64, f"float64 ops in {decoder}'s steps: {dict(ops.float64)}"


def test_todays_seeds_keep_their_images(bundled, monkeypatch):
    model, heads = bundled
    # the top half of the default 24x24 picture (ar's cells there are the whole picture's: the prompt names no grid),
    # 288 cells an image in half the time
    kw = dict(prompt=5, grid=(12, 24), decode_pixels=False, score=False)
    # seeds 0 and 1 as one batch (one forward a step for both; each image its single run's tokens: test_batch)
    now = [r.tokens for r in ssd_core.generate_batch(model, None, decoder="ar", seeds=[0, 1], **kw)]
    monkeypatch.setattr(run_state, "gumbel_of", float64_gumbel_of)  # the runs' noise (Draws), as before
    before = [r.tokens for r in ssd_core.generate_batch(model, None, decoder="ar", seeds=[0, 1], **kw)]
    exact = ssd_core.generate(model, heads, decoder="ssd-exact", seed=0, **kw).tokens
    for a, b in zip(now, before):
        assert torch.equal(a, b)
    assert torch.equal(exact, before[0])
