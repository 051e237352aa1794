"""One seed rule for every decoder: a whole number from 0 to 2^64 - 1, anything else refused in one line by
the API, the CLI and the sampler node alike (never wrapped: -1 and 2^64 + 5 used to give the images of
2^64 - 1 and 5 in ar / ssd-exact, and new ones in ssd / sjd / zipar)."""
import subprocess
import sys
from pathlib import Path

import pytest

import ssd_core
from ssd_core.errors import SSDError

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("decoder", ["ar", "ssd", "ssd-exact", "sjd", "zipar"])
@pytest.mark.parametrize("seed", [-1, 2**64, 2**64 + 5, 10**40, 1.5, "7", True, None])
def test_every_decoder_refuses_the_same_seeds(bundled, decoder, seed):
    model, heads = bundled
    with pytest.raises(SSDError, match="seed") as e:
        ssd_core.generate(model, heads if decoder.startswith("ssd") else None, prompt=1, decoder=decoder, seed=seed,
                          grid=(2, 2), decode_pixels=False, score=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("decoder", ["ar", "ssd-exact", "ssd"])
def test_the_ends_of_the_range_are_seeds(bundled, decoder):
    model, heads = bundled
    tokens = [ssd_core.generate(model, heads if decoder.startswith("ssd") else None, prompt=1, decoder=decoder,
                                seed=s, grid=(3, 3), decode_pixels=False, score=False).tokens for s in (0, 2**64 - 1)]
    assert not (tokens[0] == tokens[1]).all()


def test_a_batch_counts_on_past_the_last_seed_to_zero(bundled):
    model, _ = bundled
    batch = ssd_core.generate_batch(model, None, prompt=1, seed=2**64 - 1, batch_size=2, decoder="ar", grid=(3, 3),
                                    decode_pixels=False, score=False)
    alone = ssd_core.generate(model, None, prompt=1, seed=0, decoder="ar", grid=(3, 3), decode_pixels=False,
                              score=False)
    assert (batch[1].tokens == alone.tokens).all()


def test_the_cli_refuses_a_negative_seed_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "ssd_core", "generate", "--model", "reference", "--seed", "-1",
                          "--grid", "2x2", "--out", str(tmp_path / "x.png")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "seed must be from 0 to 2^64 - 1" in run.stderr
    assert len(run.stderr.strip().splitlines()) <= 2 and "Traceback" not in run.stderr


def test_a_batch_refuses_a_first_seed_outside_the_range(bundled):
    model, _ = bundled
    for seed in (-1, 2**64):
        with pytest.raises(SSDError, match="seed must be from 0 to 2"):
            ssd_core.generate_batch(model, None, prompt=1, seed=seed, batch_size=2, decoder="ar", grid=(2, 2),
                                    decode_pixels=False, score=False)
