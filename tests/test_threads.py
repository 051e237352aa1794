"""The intra-op thread rule: a small CPU model samples on one thread; the caller's count comes back after,
also when the run is cancelled; an explicit OMP_NUM_THREADS is left alone."""
import pytest
import torch

import ssd_core
from ssd_core import threads
from tiny import make_llama_grid


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return ssd_core.load_model(make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(3, 4)))


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_model_samples_on_one_thread_and_restores_the_callers(model, two_threads):
    seen = []
    ssd_core.generate(model, None, prompt=1, decoder="ar", on_step=lambda p: seen.append(torch.get_num_threads()))
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2


def test_restored_after_a_cancelled_run(model, two_threads):
    with pytest.raises(ssd_core.Cancelled):
        ssd_core.generate(model, None, prompt=1, decoder="ar", should_cancel=lambda: True)
    assert torch.get_num_threads() == 2


def test_explicit_omp_num_threads_is_left_alone(model, two_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.sampling_threads(model) is None
    seen = []
    ssd_core.generate(model, None, prompt=1, decoder="ar", on_step=lambda p: seen.append(torch.get_num_threads()))
    assert set(seen) == {2}


def test_the_bundled_model_is_small(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.sampling_threads(ssd_core.load_model("reference")) == 1
