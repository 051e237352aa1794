"""The sampler's grid list: a short list per model, tagged with the model it is for; a size of another model is
refused naming the model the user loaded and the sizes it takes."""
import pytest

from conftest import load_pack, pack_module

load_pack()
grids = pack_module("nodes.grids")
lumina = pack_module("ssd_core.families.lumina")
emu3 = pack_module("ssd_core.families.emu3")
SSDError = pack_module("ssd_core.errors").SSDError


def test_each_bundled_model_lists_its_own_sizes():
    options = grids.choices()
    assert options[0] == "auto"
    assert "48x48 (192x192 px, 1:1) reference-48" in options and "32x32 (128x128 px, 1:1) reference-48" in options
    assert "24x24 (96x96 px, 1:1) reference" in options
    assert options.index("24x24 (96x96 px, 1:1) reference") < options.index("48x48 (192x192 px, 1:1) reference-48")
    assert len(options) == len(set(options)) and len(options) <= 44  # was 91: every Lumina-mGPT size


def test_lumina_lists_one_size_per_aspect():
    listed = lumina.LuminaModel.listed_grids()
    every = lumina.crop_size_grids(lumina.UPSTREAM_SIDE // 2)
    assert listed[0] == (48, 48) and len(listed) == 7 and set(listed) <= set(every)
    for (rw, rh), (h, w) in zip(emu3.RATIOS[1:], listed[1:]):  # each the nearest of the release's sizes
        assert abs(w / h - rw / rh) == min(abs(c / r - rw / rh) for r, c in every)


@pytest.mark.parametrize("choice, family, name, grid", [
    ("48x48 (192x192 px, 1:1) reference-48", "llama-grid", "reference-48", (48, 48)),
    ("8x8 (32x32 px, 1:1) reference-48", "llama-grid", "reference-48", (8, 8)),
    ("24x24 (384x384 px, 1:1) janus", "janus", "deepseek-community/Janus-Pro-7B", (24, 24)),
    ("auto", "emu3", "Emu3-Gen-hf", None),
    ("12x20", "llama-grid", "my-model", (12, 20)),
])
def test_a_size_of_this_model_is_taken(choice, family, name, grid):
    assert grids.parse(choice, family, name) == grid


@pytest.mark.parametrize("choice, family, name, says", [
    ("24x24 (96x96 px, 1:1) reference", "llama-grid", "reference-48",
     "is a size for reference and this model is reference-48: pick auto or one of: 48x48 (192x192 px, 1:1) reference-48, 32x32"),
    ("48x48 (192x192 px, 1:1) reference-48", "llama-grid", "my-glyphs",
     "this model is my-glyphs: pick auto (its own size)"),
    ("24x24 (384x384 px, 1:1) janus", "emu3", "Emu3-Gen-hf", "this model is Emu3-Gen-hf: pick auto or one of: 90x90"),
    ("24x24 (96x96 px, 1:1) reference", "janus", "Janus-Pro-1B", "this model is Janus-Pro-1B: pick auto or one of: 24x24 (384x384 px, 1:1) janus"),
])
def test_a_size_of_another_model_is_refused_naming_the_users_model(choice, family, name, says):
    with pytest.raises(SSDError) as err:
        grids.parse(choice, family, name)
    assert says in str(err.value) and "llama-grid" not in str(err.value)


def test_lumina2_lists_one_size_per_aspect_of_its_768px_list():
    lumina2 = pack_module("ssd_core.families.lumina2")
    listed = lumina2.Lumina2Model.listed_grids()
    every = lumina2.crop_size_grids(lumina2.UPSTREAM_SIDE // lumina2.CELLS_PER_SIZE, cells=lumina2.CELLS_PER_SIZE)
    side = lumina2.UPSTREAM_SIDE
    assert listed[0] == (side, side) and len(listed) == len(emu3.RATIOS) and set(listed) <= set(every)
    assert len(every) > 3 * len(listed)  # the release's list is long; the sampler shows one size an aspect
