"""tools/gap_check.py, the many-image nll_full gap of the lossy rows: its figures are the bench's on the same images,
though its `ar` images are drawn by ssd-exact."""
import pytest

from ssd_core.bench import BenchOptions, run_bench
from tools import gap_check


def test_gap_check_figures_are_the_bench_figures(bundled):
    model, heads = bundled
    o = BenchOptions(decoders=("ar", "ssd"), images=3, seed=11, grid=(12, 12), ssd_rounds=(1, 2), step_ops=False)
    got = gap_check.check(model, heads, o, log=lambda *_: None)
    want = run_bench(model, heads, o, log=lambda *_: None)
    by_label = {row["decoder"]: row for row in want["rows"]}
    assert [row["decoder"] for row in got["rows"]] == ["ssd r=1", "ssd r=2"]
    assert got["ar"]["steps"] == 143  # a 12x12 grid with row ends: 156 positions, the first from the prefill
    assert got["ar"]["nll_full"] == by_label["ar"]["nll_full"]
    for row in got["rows"]:
        bench_row = by_label[row["decoder"]]
        for key in ("steps", "step_ratio", "nll_full", "nll_full_gap", "nll_full_gap_90"):
            assert row[key] == bench_row[key], key
    assert got["rows"][0]["nll_full_per_image"] != got["ar"]["nll_full_per_image"]
    for row in got["rows"]:  # the paired mean excess: row minus ar, image by image
        diffs = [f - a for f, a in zip(row["nll_full_per_image"], got["ar"]["nll_full_per_image"])]
        assert row["nll_full_excess"] == pytest.approx(sum(diffs) / len(diffs), abs=2e-4)
        low, high = row["nll_full_excess_90"]
        assert min(diffs) - 1e-4 <= low <= row["nll_full_excess"] + 1e-4 <= high + 2e-4 <= max(diffs) + 3e-4


def test_mean_interval_holds_a_known_shift_and_narrows():
    assert gap_check.mean_interval([0.25] * 10) == [0.25, 0.25]
    few = gap_check.mean_interval([0.0, 1.0] * 4)
    many = gap_check.mean_interval([0.0, 1.0] * 64)
    assert few[0] < many[0] < 0.5 < many[1] < few[1]


def test_gap_check_refuses_where_ssd_exact_is_not_ar(bundled, monkeypatch):
    """The premise is checked, not assumed: ssd-exact's first image must be ar's."""
    model, heads = bundled
    real = gap_check.ssd_core.generate

    def shifted(*a, **kw):
        result = real(*a, **kw)
        if kw.get("decoder") == "ssd-exact":
            result.tokens[0, 0] = (result.tokens[0, 0] + 1) % 512
        return result
    monkeypatch.setattr(gap_check.ssd_core, "generate", shifted)
    with pytest.raises(SystemExit, match="did not give ar's tokens"):
        gap_check.check(model, heads, BenchOptions(decoders=("ssd",), images=1, grid=(6, 6)), log=lambda *_: None)


def test_difficulty_curve_is_the_bench_sweep_without_ar_runs(bundled):
    """gap_check --difficulty gives `bench --difficulty`'s steps, ratios, gaps and ar's certainty, point by point."""
    from ssd_core import difficulty
    model, heads = bundled
    o = BenchOptions(decoders=("ar", "ssd-exact@2", "sjd-pac"), images=2, seed=21, grid=(8, 8), step_ops=False)
    got = gap_check.difficulty_curve(model, heads, o, temperatures=(1.0, 1.6), log=lambda *_: None)
    want = difficulty.sweep(model, heads, o, temperatures=(1.0, 1.6), log=lambda *_: None)
    assert [(p["temperature"], p["cfg"]) for p in got["points"]] == [(1.0, 4.0), (1.6, 4.0), (1.0, 2.5)]
    for mine, theirs in zip(got["points"], want["points"]):
        assert (mine["top1"], mine["entropy"]) == (theirs["top1"], theirs["entropy"])
        assert set(mine["rows"]) == {"ar", "ssd-exact@2", "sjd-pac"}
        for label, row in mine["rows"].items():
            for key in ("steps", "step_ratio", "nll_full", "nll_full_gap"):
                assert row[key] == theirs["rows"][label][key], (label, key)
    assert got["points"][0]["top1"] > got["points"][1]["top1"]  # hotter: less certain tokens


def test_difficulty_from_the_command_line_writes_its_points(tmp_path):
    import json
    out = tmp_path / "curve.json"
    gap_check.main(["--model", "reference", "--decoders", "ssd-exact@2", "--images", "1", "--grid", "6x6",
                    "--difficulty", "--temperatures", "1.3", "--json", str(out), "--plot", str(tmp_path / "c.png")])
    got = json.loads(out.read_text())
    assert [(p["temperature"], p["cfg"]) for p in got["points"]] == [(1.3, 4.0), (1.0, 2.5)]
    assert got["ar_by"] == "ssd-exact" and got["points"][0]["rows"]["ssd-exact@2"]["nll_full_gap"] == 0.0
    assert (tmp_path / "c.png").stat().st_size > 1000
