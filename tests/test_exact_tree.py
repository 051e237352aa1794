"""tools/exact_tree.py, the draft-tree measurement docs/bench.md quotes (sjd-pac's runner-up branches tried on
ssd-exact's rule): its branches are used (a runner-up that is ar's pick finalizes tokens from its branch's outputs)
and every image is still ar's."""
from tools import exact_tree


def test_the_tree_finalizes_tokens_from_its_branches_and_keeps_ar_s_image(bundled):
    out = exact_tree.main(["--rows", "3", "--images", "2", "--grid", "12x12", "--seed", "7", "--depth", "2"])
    assert out["same_as_ar"] == 2
    record = out["record"]
    assert record["hit at depth 0"] > 0 and record["tokens from branches"] >= record["hit at depth 0"]
    assert record["miss at depth 0"] < record["checks with a tree"]
