"""ssd-exact without heads (rows start as copies of the row above, the first row from the verifier's
latest output, Jacobi after that): the very image of ar for the seed, on every family and layout."""
import itertools

import pytest
import torch

import ssd_core
from tiny import make_llama_grid
from tiny_families import build_emu3, build_janus, build_lumina


@pytest.fixture(scope="module", params=[False, True], ids=["no-row-end", "row-end"])
def model(request, tmp_path_factory):
    return ssd_core.load_model(make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(5, 6),
                                               row_end=request.param))


SETTINGS = [dict(temperature=t, top_k=k, top_p=p, cfg=c)
            for t, (k, p), c in itertools.product([0.0, 1.0], [(0, 1.0), (5, 1.0), (0, 0.8)], [1.0, 3.0])]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "T{temperature}-k{top_k}-p{top_p}-cfg{cfg}".format(**s))
def test_matches_ar_at_every_draft_rows(model, settings):
    seed = SETTINGS.index(settings)
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=seed, score=False, **settings)
    for rows in (1, 2, 3, 4):
        ex = ssd_core.generate(model, None, prompt=1, decoder="ssd-exact", seed=seed, draft_rows=rows,
                               score=False, **settings)
        assert torch.equal(ex.tokens, ar.tokens), rows
        assert ex.trace.steps <= ar.trace.steps
        assert ex.trace.counts["accepted"] + ex.trace.counts["corrected"] + ex.trace.counts["ar"] == ar.tokens.numel()


@pytest.mark.parametrize("grid", [(1, 6), (5, 1), (4, 4), (3, 6), (5, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_matches_ar_on_every_grid_shape(model, grid):
    for temperature, cfg in [(0.0, 1.0), (1.0, 2.0)]:
        ar = ssd_core.generate(model, None, prompt=2, decoder="ar", seed=3, grid=grid, temperature=temperature,
                               cfg=cfg, score=False)
        for rows in (1, 3):
            ex = ssd_core.generate(model, None, prompt=2, decoder="ssd-exact", seed=3, grid=grid, draft_rows=rows,
                                   temperature=temperature, cfg=cfg, score=False)
            assert torch.equal(ex.tokens, ar.tokens)


def test_greedy_copies_are_accepted(model):
    """Greedy decoding of a tiny model repeats itself: copied rows are accepted and save steps."""
    ar = ssd_core.generate(model, None, prompt=0, decoder="ar", seed=0, temperature=0.0, score=False)
    ex = ssd_core.generate(model, None, prompt=0, decoder="ssd-exact", seed=0, temperature=0.0, draft_rows=3,
                           score=False)
    assert torch.equal(ex.tokens, ar.tokens)
    assert ex.trace.counts["accepted"] > 0 and ex.trace.steps < ar.trace.steps


@pytest.mark.parametrize("family, build, prompt", [("janus", build_janus, "a red cat"),
                                                   ("emu3", build_emu3, "a red cat"),
                                                   ("lumina", build_lumina, "a red cat")])
def test_matches_ar_on_the_families(family, build, prompt, tmp_path):
    """Janus (no forced tokens), Emu3 (row ends and a three-token tail), Lumina (row ends and an end token)."""
    m = ssd_core.load_model(build(tmp_path / family), dtype="fp32")
    for seed, rows in [(0, 1), (1, 2), (2, 3)]:
        ar = ssd_core.generate(m, None, prompt=prompt, decoder="ar", seed=seed, score=False, decode_pixels=False)
        ex = ssd_core.generate(m, None, prompt=prompt, decoder="ssd-exact", seed=seed, draft_rows=rows, score=False,
                               decode_pixels=False)
        assert torch.equal(ex.tokens, ar.tokens), (family, seed, rows)
        assert ex.trace.steps <= ar.trace.steps


def test_bench_rows_with_and_without_heads(tmp_path):
    """`bench --heads none` runs the decoders that need no heads; 'ssd-exact:noheads' is a row of ssd-exact
    without the loaded heads, beside the row with them; both identical to ar."""
    import json

    from ssd_core.cli import main
    from tiny import make_heads

    folder = make_llama_grid(tmp_path / "model", grid=(4, 5))
    heads = make_heads(ssd_core.load_model(folder), tmp_path / "heads.safetensors")
    out = tmp_path / "none.json"
    assert main(["bench", "--model", str(folder), "--heads", "none", "--images", "2", "--json", str(out)]) == 0
    rows = {r["decoder"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "ssd-exact", "sjd", "zipar", "scd", "sjd-pac", "gsd"}  # every decoder without heads
    assert rows["ssd-exact"]["identical_to_ar"] is True
    out = tmp_path / "both.json"
    assert main(["bench", "--model", str(folder), "--heads", str(heads), "--images", "2", "--decoders",
                 "ssd-exact,ssd-exact@3,ssd-exact@3:noheads", "--json", str(out)]) == 0  # rows given: heads used
    rows = {r["decoder"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "ssd-exact", "ssd-exact@3", "ssd-exact@3:noheads"}
    assert all(r["identical_to_ar"] is True for r in rows.values())
    assert rows["ssd-exact@3"]["params"]["draft_rows"] == 3 == rows["ssd-exact@3:noheads"]["params"]["draft_rows"]
    assert "draft_rows_picked" in rows["ssd-exact"]["params"]  # the default: picked by the calibration
    assert rows["ssd-exact@3"]["accepted_share"] != rows["ssd-exact@3:noheads"]["accepted_share"] or \
        rows["ssd-exact@3"]["steps"] != rows["ssd-exact@3:noheads"]["steps"]  # the heads drafted differently
    for bad in ("ssd-exact@x", "ssd-exact@9", "nope@2"):  # one line saying what is wrong
        assert main(["bench", "--model", str(folder), "--heads", "none", "--decoders", bad]) == 2
