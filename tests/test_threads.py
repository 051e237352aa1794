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


def test_threads_bench_runs_at_the_count_it_names_beside_busy_loops_and_restores_the_rule(capsys, two_threads):
    from tools import threads_bench

    rule = threads.sampling_threads
    counts = []
    real = threads_bench.wall_of_one_image

    def spy(model, heads, decoder, n, seed, grid):
        wall = real(model, heads, decoder, n, seed, grid)
        counts.append((n, torch.get_num_threads()))
        return wall

    threads_bench.wall_of_one_image = spy
    try:
        assert threads_bench.main(["--decoders", "ar", "--loads", "0,1", "--threads", "1", "--repeats", "1",
                                   "--grid", "2x3"]) == 0
    finally:
        threads_bench.wall_of_one_image = real
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("0", "ar", "1"), ("1", "ar", "1")]
    assert all(float(r[3]) > 0 for r in rows) and rows[0][6] == "1.00"
    assert all(asked == used for asked, used in counts) and {a for a, _ in counts} == {1}
    assert torch.get_num_threads() == 2  # two_threads set 2 before the bench
    assert threads.sampling_threads is rule  # the rule is back after the bench


# ---- several generations at once on one loaded model (API users: a web service, a thread pool) ----------------
@pytest.mark.parametrize("decoder, static", [(d, False) for d in ("ar", "ssd", "ssd-exact", "sjd", "zipar")] +
                         [("ssd-exact", True)], ids=["ar", "ssd", "ssd-exact", "sjd", "zipar", "ssd-exact-static"])
def test_threads_on_one_model_get_their_sequential_tokens(bundled, decoder, static):
    from concurrent.futures import ThreadPoolExecutor

    from ssd_core import static_cache

    model, heads = bundled
    static_cache.enable(model, "static" if static else "off")
    try:
        drafter = heads if decoder.startswith("ssd") else None
        jobs = [(prompt, seed) for prompt in range(4) for seed in (1, 2)]  # 4 threads x 2 seeds

        def run(job):
            return ssd_core.generate(model, drafter, prompt=job[0], decoder=decoder, seed=job[1], grid=(4, 4),
                                     decode_pixels=False, score=False).tokens

        sequential = [run(job) for job in jobs]
        with ThreadPoolExecutor(4) as pool:
            concurrent = list(pool.map(run, jobs))
    finally:
        static_cache.enable(model, "off")
    for job, a, b in zip(jobs, sequential, concurrent):
        assert torch.equal(a, b), f"{decoder} prompt {job[0]} seed {job[1]}: another thread changed the tokens"
