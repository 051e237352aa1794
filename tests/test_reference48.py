"""The bundled 48x48 model (`reference-48`): it loads by name, samples its two grids, its heads fit it, and
ssd-exact gives ar's very tokens on it in fewer steps (at 48x48 through row 24 here; the whole 32x32 image in
test_bench_sizes)."""
import pytest
import torch

import ssd_core
from conftest import ar_through
from ssd_core.api import BUNDLED_HEADS, BUNDLED_MODELS

pytestmark = pytest.mark.skipif(not BUNDLED_HEADS.get("reference-48", BUNDLED_MODELS["reference"]).is_file(),
                                reason="reference-48 not present")


@pytest.fixture(scope="module")
def bundled48():
    model = ssd_core.load_model("reference-48", dtype="fp32")
    return model, ssd_core.load_heads("reference-48", model)


def test_listed_beside_reference_and_made_for_48x48(bundled48):
    model, heads = bundled48
    assert ssd_core.list_bundled() == {"models": ["reference", "reference-48"], "heads": ["reference", "reference-48"]}
    assert model.grid_options() == [(48, 48), (32, 32)]
    assert list(model.class_names) == list(ssd_core.load_model("reference").class_names)
    meta = heads.metadata()
    assert meta["family"] == "llama-grid" and meta["grid"] == "48x48"
    assert int(meta["hidden_size"]) == model.hidden_size
    assert heads.vertical_left == 2 and heads.vertical_shift == 1


def test_ssd_exact_is_ar_at_48x48_in_far_fewer_steps(bundled48):
    """ssd-exact's whole image in under a fifth of ar's steps, and ar's very tokens through row 24: past the 32x32
    grid's last key (the whole 32x32 image on this model, with heads at 2 rows: test_bench_sizes; every cell at 48x48,
    16 images: docs/bench.md's bench of record). A whole 48x48 ar run is ~2,300 steps (~60 s here); half is ~30 s."""
    model, heads = bundled48
    # one draft row: the cheapest window here (356 steps; 3 rows: 269 steps at 1.8x the wall)
    ex = ssd_core.generate(model, heads, prompt="face", decoder="ssd-exact", seed=0, draft_rows=1)
    ar = ar_through(model, (24, 47), prompt="face", seed=0)  # rows 0-24, -1 after them
    assert tuple(ex.image.shape) == (192, 192, 3) and float(ex.image.std()) > 0.05
    assert torch.equal(ar[:25], ex.tokens[:25]) and bool((ar[25:] == -1).all())
    assert ex.trace.steps < 48 * 48 / 5  # ar: one token a step, 48 * 48 - 1 (the prefill gives its first)


def test_it_ships_no_second_copy_of_references_vq_and_yardstick(bundled48, tmp_path):
    """The two bundled models share one VQ decoder and one yardstick (the pack ships each once): reference-48 names
    reference's, and decodes and is judged with them; a copy of its folder outside the pack is refused with the
    fix, like any name that leaves its folder."""
    import json
    import shutil

    from ssd_core import yardstick

    model, _ = bundled48
    folder = BUNDLED_MODELS["reference-48"]
    assert not (folder / "vq.safetensors").exists() and not (folder / "yardstick.safetensors").exists()
    spec = json.loads((folder / "ssd_model.json").read_text())
    assert (spec["vq_decoder"], spec["yardstick"]) == ("../model/vq.safetensors", "../model/yardstick.safetensors")
    assert yardstick.for_model(model) is not None and model.decode(torch.zeros(2, 2, dtype=torch.long)).shape == (8, 8, 3)
    copy = tmp_path / "my48"
    shutil.copytree(folder, copy)
    with pytest.raises(ssd_core.SSDError, match="lies outside the model folder .*put the file inside that folder"):
        ssd_core.load_model(str(copy))
