"""tools/sampler_sweep.py, the sampler-settings sweep the reference README quotes for reference-48: its ssd-exact
figures are ar's (the same images), a setting changes the images, and a bad setting is refused in one line."""
import pytest

from tools import sampler_sweep


def test_ssd_exact_rows_equal_ar_rows_and_settings_change_the_images(bundled):
    model, heads = bundled
    settings = sampler_sweep.parse_settings("defaults; cfg=1,top_k=5")
    assert settings == [{}, {"cfg": 1.0, "top_k": 5}]
    fast = sampler_sweep.sweep(model, heads, settings, images=3, seed=11, grid=(12, 12), log=lambda *_: None)
    slow = sampler_sweep.sweep(model, None, settings[:1], images=3, seed=11, decoder="ar", grid=(12, 12),
                               log=lambda *_: None)
    assert fast[0]["called"] == slow[0]["called"] and fast[0]["fd"] == slow[0]["fd"]
    assert fast[0]["class_acc"] == slow[0]["class_acc"] and fast[0]["nll_full"] == slow[0]["nll_full"]
    assert fast[0]["fd"] != fast[1]["fd"]  # cfg 1 / top-k 5 draw other images
    assert fast[1]["setting"] == {"cfg": 1.0, "top_k": 5} and fast[0]["setting"] == "defaults"
    assert sum(int(v.split("/")[1]) for v in fast[0]["per_class"].values()) == 3


@pytest.mark.parametrize("text", ["cfg", "guidance=3", "cfg=8;top_k="])
def test_bad_settings_are_refused(text):
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        sampler_sweep.parse_settings(text)
