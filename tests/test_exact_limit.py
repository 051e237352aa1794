"""tools/exact_limit.py, the probe docs/speed.md's "What limits ssd-exact" quotes: it reads ssd-exact's checks
without changing them (the same steps as a plain run) and accounts for every cell once."""
import ssd_core
from tools import exact_limit


def test_the_probe_counts_every_cell_once_and_changes_no_step(bundled):
    model, heads = bundled
    out = exact_limit.main(["--rows", "3", "--images", "1", "--grid", "8x8", "--seed", "7"])
    plain = ssd_core.generate(model, heads, prompt=0, seed=7, decoder="ssd-exact", draft_rows=3, grid=(8, 8),
                              decode_pixels=False, score=False)
    assert out["steps_median"] == plain.trace.steps
    assert out["finalized"] == 64  # every cell made final by exactly one check
    assert abs(sum(out["first_mismatch_row"].values()) - 1) < 0.01
    for where in ("first", "row0", "below"):
        pair = out["overlap_vs_match"][where]
        assert pair["slots"] > 0 and 0 < pair["overlap"] <= 1 and 0 <= pair["match"] <= 1
