"""The shipped image-quality yardstick: it knows real held-out glyphs, it scores noise badly, its FD is right."""
import json
import os

import pytest
import torch

from ssd_core.errors import SSDError
from ssd_core.yardstick import DEFAULT_PATH, frechet_distance, gaussian, load_yardstick

MODEL = DEFAULT_PATH.parent
HELDOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "heldout_tokens.safetensors")


@pytest.fixture(scope="module")
def stick():
    return load_yardstick()


@pytest.fixture(scope="module")
def heldout_images():
    """The held-out glyphs of the shipped file as the model sees them: their VQ codes, decoded."""
    from safetensors import safe_open

    from ssd_core.pixel_decoders.reference_vq import load_vq

    with safe_open(str(HELDOUT), framework="pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    vq = load_vq(str(MODEL / "vq.safetensors"))
    with torch.no_grad():
        images = vq.decode(t["tokens"].long()).permute(0, 2, 3, 1)
    return images, t["labels"].long(), t["images"], t.get("image_labels")


def test_metadata_matches_the_model(stick):
    spec = json.loads((MODEL / "ssd_model.json").read_text())
    assert stick.class_names == spec["class_names"]
    assert stick.meta["version"] and stick.meta["data_version"] == spec.get("data_version", 1)
    assert 0.8 <= stick.meta["real_acc"] <= 1.0  # the recipe's figure on the real held-out glyphs
    assert stick.meta["real_fd"] > 0
    assert os.path.getsize(DEFAULT_PATH) < 1.5e6


def test_real_heldout_glyphs_are_recognised(stick, heldout_images):
    images, labels, raw, raw_labels = heldout_images
    acc = float((stick.classify(images) == labels).float().mean())
    assert acc >= 0.75, acc  # measured 0.84 on these grids through the shipped VQ
    if raw_labels is not None:  # the rendered glyphs themselves
        assert float((stick.classify(raw) == raw_labels.long()).float().mean()) >= 0.75
    s = stick.score(images, labels)
    assert s["class_acc"] == pytest.approx(acc, abs=1e-4)  # rounded to 4 digits
    assert s["fd"] < 4 * stick.real_fd(len(images))  # close to real glyphs, at the same sample size
    r = stick.report(images, labels)  # score's figures, with what was called per image and per class
    assert {k: r[k] for k in s} == s and r["called"] == stick.classify(images).tolist()
    right, asked = (sum(int(v.split("/")[i]) for v in r["per_class"].values()) for i in (0, 1))
    assert right == round(acc * len(labels)) and asked == len(labels)
    assert set(r["per_class"]) == {stick.class_names[k] for k in set(labels.tolist())}


def test_noise_scores_badly(stick, heldout_images):
    images, labels, _, _ = heldout_images
    g = torch.Generator().manual_seed(0)
    noise = torch.rand(len(labels), 96, 96, 3, generator=g)
    s = stick.score(noise, labels)
    assert s["class_acc"] <= 0.3, s
    real = stick.score(images, labels)
    assert s["fd"] > 10 * real["fd"], (s, real)
    flat = torch.full((len(labels), 96, 96, 3), 0.5)  # grey squares: no glyph at all
    assert stick.score(flat, labels)["fd"] > 10 * real["fd"]


def test_frechet_distance_closed_form():
    mu1, mu2 = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    a, b = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64), torch.tensor([4.0, 1.0, 9.0], dtype=torch.float64)
    expected = float(((mu1 - mu2) ** 2).sum() + ((a.sqrt() - b.sqrt()) ** 2).sum())  # diagonal covariances
    assert frechet_distance(mu1, torch.diag(a), mu2, torch.diag(b)) == pytest.approx(expected, abs=1e-9)
    x = torch.randn(200, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert frechet_distance(*gaussian(x), *gaussian(x)) == pytest.approx(0.0, abs=1e-6)
    assert frechet_distance(*gaussian(x), *gaussian(x + 1)) == pytest.approx(5.0, abs=1e-6)  # shift by 1 in 5 dims


def test_refuses_other_files(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(1)}, str(p))
    with pytest.raises(SSDError, match="not a yardstick file"):
        load_yardstick(p)
    with pytest.raises(SSDError, match="no yardstick at"):
        load_yardstick(tmp_path / "missing.safetensors")
    cut = tmp_path / "cut.safetensors"  # the shipped yardstick, cut short (an interrupted copy)
    cut.write_bytes(DEFAULT_PATH.read_bytes()[:4096])
    with pytest.raises(SSDError, match=r"cut.safetensors is not a readable safetensors file \(.+\): re-install"):
        load_yardstick(cut)
    noise = tmp_path / "noise.safetensors"
    noise.write_bytes(b"\xff" * 64)
    with pytest.raises(SSDError, match="noise.safetensors is not a readable safetensors file"):
        load_yardstick(noise)


@pytest.mark.parametrize("damage, said", [
    ("no config", "no 'config'"),
    ("config not JSON", "Expecting property name"),
    ("no reference features", "no 'ref_features'"),
    ("a network tensor of another shape", "size mismatch"),
])
def test_refuses_a_damaged_yardstick_file(tmp_path, damage, said):
    """A yardstick file of the right format with a part missing or wrong: one SSDError line, not a KeyError."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(DEFAULT_PATH), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    if damage == "no config":
        del meta["config"]
    elif damage == "config not JSON":
        meta["config"] = "{widths"
    elif damage == "no reference features":
        del tensors["ref_features"]
    else:
        name = next(k for k in tensors if k.startswith("net.") and tensors[k].ndim == 2)
        tensors[name] = tensors[name][:, :-1].contiguous()
    path = tmp_path / "damaged.safetensors"
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(SSDError, match=f"damaged.safetensors is a damaged yardstick file \\(.*{said}") as err:
        load_yardstick(path)
    assert "\n" not in str(err.value) and "re-install the pack" in str(err.value)


def test_bench_reports_class_accuracy_and_fd(tmp_path):
    """A model folder that ships a yardstick gets class_acc and fd in every bench row (tiny model, tiny VQ)."""
    from tiny import make_heads, make_llama_grid

    import ssd_core
    from ssd_core.cli import main
    from ssd_core.pixel_decoders.reference_vq import VQModel, save_vq
    from ssd_core.yardstick import Classifier, save_yardstick

    folder = make_llama_grid(tmp_path / "m", grid=(4, 5), image_vocab=16)
    torch.manual_seed(0)
    save_vq(VQModel({"channels": [8, 16], "codebook_size": 16, "code_dim": 4}), str(folder / "vq.safetensors"))
    spec = json.loads((folder / "ssd_model.json").read_text())
    spec["vq_decoder"] = "vq.safetensors"
    (folder / "ssd_model.json").write_text(json.dumps(spec))
    net = Classifier(3)
    feats = torch.randn(40, 32, generator=torch.Generator().manual_seed(2))
    save_yardstick(net, folder / "yardstick.safetensors", {"version": "t.1", "data_version": 0, "class_names": spec["class_names"],
                   "real_acc": 0.9, "real_fd": 1.0}, feats[:20], feats[20:])
    heads = make_heads(ssd_core.load_model(folder), tmp_path / "h.safetensors")
    out = tmp_path / "b.json"
    assert main(["bench", "--model", str(folder), "--dtype", "fp32", "--heads", str(heads), "--decoders", "ar,ssd,ssd-exact",
                 "--images", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["yardstick"]["real_acc"] == 0.9 and "real_fd_at_3" in report["yardstick"]
    for row in report["rows"]:
        assert 0.0 <= row["class_acc"] <= 1.0 and row["fd"] >= 0.0
    rows = {r["decoder"]: r for r in report["rows"]}
    assert rows["ssd-exact"]["class_acc"] == rows["ar"]["class_acc"] and rows["ssd-exact"]["fd"] == rows["ar"]["fd"]


def test_the_recipe_stage_trains_a_yardstick_that_tells_classes_apart(tmp_path):
    """Recipe stage 5 (reference_recipe.yardstick_train) learns: red squares against blue ones, 40 steps, and the
    file it writes loads and calls its held-out images right. (A no_grad decorator once sat on it by mistake, and
    the stage stopped at its first backward.)"""
    import numpy as np

    from ssd_core.pixel_decoders.reference_vq import load_vq
    from reference_recipe.yardstick_train import train_yardstick

    rng = np.random.default_rng(0)
    images, labels = [], []
    for i in range(24):
        img = np.full((96, 96, 3), 255, np.uint8)
        side, y, x = rng.integers(40, 70), rng.integers(0, 20), rng.integers(0, 20)
        img[y:y + side, x:x + side] = (220, 30, 30) if i % 2 == 0 else (30, 60, 220)
        images.append(img)
        labels.append(i % 2)
    ds = {"images": np.stack(images), "labels": np.array(labels, np.int64), "class_names": ["red", "blue"],
          "heldout": np.arange(24) >= 20}
    out = tmp_path / "yardstick.safetensors"
    meta = train_yardstick(ds, load_vq(str(MODEL / "vq.safetensors")), str(out), data_version=2, steps=40, batch=8,
                           ref_copies=1)
    assert meta["steps"] == 40 and meta["real_acc"] == 1.0 and meta["real_acc_vq"] == 1.0, meta
    trained = load_yardstick(out)
    assert trained.classify(ds["images"][ds["heldout"]]).tolist() == [0, 1, 0, 1]
