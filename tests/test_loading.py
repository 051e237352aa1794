"""Loading the real families from local folders: options, and an error for each way it can fail."""
import json

import pytest
import torch

import ssd_core
from ssd_core import families, model_files
from ssd_core.families.emu3 import Emu3Model
from ssd_core.families.janus import JanusModel
from ssd_core.families.lumina import LuminaModel
from tiny_families import build_emu3, build_janus, build_lumina

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    return {"janus": build_janus(root / "janus"), "emu3": build_emu3(root / "emu3"),
            "lumina": build_lumina(root / "lumina")}


@pytest.mark.parametrize("family,cls", [("janus", JanusModel), ("emu3", Emu3Model), ("lumina", LuminaModel)])
def test_detected_from_config(folders, family, cls):
    assert families.family_of_folder(folders[family]) == family
    assert isinstance(ssd_core.load_model(folders[family], dtype="fp32"), cls)


@pytest.mark.parametrize("dtype,expected", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                            ("fp32", torch.float32)])
def test_dtypes(folders, dtype, expected):
    m = ssd_core.load_model(folders["janus"], dtype=dtype, device="cpu")
    assert m.dtype == expected and m.model.model.generation_head.vision_head.weight.dtype == expected
    p = m.build_prompt("a cat", "", True, m.default_grid)
    feats = m.start(p).last_features
    assert feats.dtype == expected and m.image_logits(feats).dtype == torch.float32


def test_low_memory_and_device_map(folders):
    plain = LuminaModel.load(folders["lumina"], "fp32", "cpu", low_cpu_mem_usage=False)
    mapped = LuminaModel.load(folders["lumina"], "fp32", None, device_map="auto")  # through accelerate
    assert mapped.device.type == "cpu"
    p = plain.build_prompt("a cat", "", True, (4, 4))
    a = plain.image_logits(plain.start(p).last_features)
    b = mapped.image_logits(mapped.start(p).last_features)
    assert torch.equal(a, b)
    emu = Emu3Model.load(folders["emu3"], torch.float32, "cpu", grid=(2, 3))
    assert emu.default_grid == (2, 3) and emu.layout().grid == (2, 3)


def test_loading_options_reach_from_pretrained(folders, monkeypatch):
    from transformers import JanusForConditionalGeneration

    seen = {}
    real = JanusForConditionalGeneration.from_pretrained.__func__

    def spy(cls, path, **kw):
        seen.update(kw)
        return real(cls, path, **kw)

    monkeypatch.setattr(JanusForConditionalGeneration, "from_pretrained", classmethod(spy))
    m = JanusModel.load(folders["janus"], "bf16", None, device_map={"": "cpu"})
    assert seen["device_map"] == {"": "cpu"} and seen["low_cpu_mem_usage"] is True
    assert seen["dtype"] == torch.bfloat16 and m.dtype == torch.bfloat16
    seen.clear()
    JanusModel.load(folders["janus"], None, "cpu", low_cpu_mem_usage=False)
    assert seen["low_cpu_mem_usage"] is False and "dtype" not in seen and "device_map" not in seen


def test_missing_folder_names_repo_and_folder(tmp_path):
    missing = tmp_path / "Janus-Pro-7B"
    with pytest.raises(ssd_core.SSDError, match="does not exist"):
        ssd_core.load_model(missing)
    for cls, repo in [(JanusModel, "deepseek-community/Janus-Pro-7B"), (Emu3Model, "BAAI/Emu3-Gen-hf"),
                      (LuminaModel, "Alpha-VLLM/Lumina-mGPT-7B-768")]:
        with pytest.raises(ssd_core.SSDError) as err:
            cls.load(missing, "fp32", "cpu")
        assert repo in str(err.value) and str(missing) in str(err.value)
    with pytest.raises(ssd_core.SSDError, match="vqgan.safetensors"):
        LuminaModel.load(missing, "fp32", "cpu")
    assert not missing.exists()


def test_wrong_family(folders, tmp_path):
    with pytest.raises(ssd_core.SSDError, match="holds an 'emu3' model, not a janus model.*family 'emu3'"):
        JanusModel.load(folders["emu3"], "fp32", "cpu")
    with pytest.raises(ssd_core.SSDError, match="holds a 'janus' model, not a lumina model"):
        LuminaModel.load(folders["janus"], "fp32", "cpu")
    with pytest.raises(ssd_core.SSDError, match="'chameleon' model, not an emu3"):
        Emu3Model.load(folders["lumina"], "fp32", "cpu")
    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ssd_core.SSDError, match="not a supported AR image model"):
        ssd_core.load_model(other)
    with pytest.raises(ssd_core.SSDError, match="not a transformers model folder"):
        JanusModel.load(tmp_path, "fp32", "cpu")


def test_offline_download_names_repo_and_folder(tmp_path, monkeypatch):
    target = tmp_path / "emu3"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network: huggingface_hub must not be asked to go online
    with pytest.raises(ssd_core.SSDError) as err:
        Emu3Model.load(target, "fp32", "cpu", download=True)
    msg = str(err.value)
    assert "BAAI/Emu3-Gen-hf" in msg and str(target) in msg and "copy the files" in msg
    with pytest.raises(ssd_core.SSDError, match="deepseek-community/Janus-Pro-1B"):
        JanusModel.load(tmp_path / "j", "fp32", "cpu", download="deepseek-community/Janus-Pro-1B")


def test_download_failure_is_one_clear_error(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def no_network(**kw):
        calls.append(kw)
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ssd_core.SSDError) as err:
        LuminaModel.load(tmp_path / "lumina", "fp32", "cpu", download=True)
    msg = str(err.value)
    assert "Alpha-VLLM/Lumina-mGPT-7B-768" in msg and str(tmp_path / "lumina") in msg and "vqgan" in msg
    assert calls and calls[0]["local_dir"] == str(tmp_path / "lumina")  # into the given folder, not a cache


def test_download_only_when_asked(folders, monkeypatch):
    import huggingface_hub

    def forbidden(**kw):
        raise AssertionError("no download was asked for")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", forbidden)
    JanusModel.load(folders["janus"], "fp32", "cpu")
    JanusModel.load(folders["janus"], "fp32", "cpu", download=True)  # present: nothing to fetch


def test_download_into_folder(tmp_path, folders, monkeypatch):
    import shutil

    import huggingface_hub

    def fake(repo_id, local_dir, local_files_only):
        shutil.copytree(folders["janus"], local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    m = JanusModel.load(tmp_path / "fetched", "fp32", "cpu", download=True)
    assert m.family == "janus" and (tmp_path / "fetched" / "config.json").is_file()


def test_bad_dtype():
    with pytest.raises(ssd_core.SSDError, match="bf16"):
        model_files.parse_dtype("int8")


@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_pixels_follow_the_image_processor_normalization(folders, family, tmp_path):
    import shutil

    folder = tmp_path / family
    shutil.copytree(folders[family], folder)
    plain = ssd_core.load_model(folder, dtype="fp32")
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.2, 0.3, 0.4], "image_std": 0.25}))
    normed = ssd_core.load_model(folder, dtype="fp32")
    codes = torch.randint(0, 16, (4, 4) if family == "janus" else (2, 3))
    a, b = plain.decode(codes), normed.decode(codes)
    raw = a * 2 - 1  # plain: 0.5 / 0.5
    expected = (raw * 0.25 + torch.tensor([0.2, 0.3, 0.4])).clamp(0, 1)
    mid = (raw > -0.99) & (raw < 0.99)  # away from plain's clamp
    torch.testing.assert_close(b[mid], expected[mid], atol=1e-5, rtol=1e-5)


def test_lumina_release_config_loads(folders, tmp_path):
    """Lumina-mGPT's released config.json names its training subclass; model_type is still 'chameleon'."""
    import shutil

    folder = tmp_path / "lumina"
    shutil.copytree(folders["lumina"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["ChameleonXLLMXForConditionalGeneration"]
    cfg["z_loss_weight"] = 1e-5
    (folder / "config.json").write_text(json.dumps(cfg))
    assert families.family_of_folder(folder) == "lumina"
    m = LuminaModel.load(folder, "fp32", "cpu")
    assert m.family == "lumina" and m.image_vocab_size == 16
    assert ssd_core.load_model(folder, dtype="fp32").family == "lumina"  # detected through the public call


def test_load_model_names_the_repo_for_a_missing_family_folder(tmp_path):
    with pytest.raises(ssd_core.SSDError) as err:
        ssd_core.load_model(tmp_path / "Janus-Pro-7B", family="janus")
    assert "deepseek-community/Janus-Pro-7B" in str(err.value) and str(tmp_path / "Janus-Pro-7B") in str(err.value)


@pytest.mark.parametrize("family,grid", [("janus", (4, 4)), ("emu3", (3, 4)), ("lumina", (4, 4))])
def test_half_precision_generation(folders, family, grid, tmp_path):
    m = ssd_core.load_model(folders[family], dtype="bf16", **({} if family == "janus" else {"grid": grid}))
    heads = tmp_path / "h.safetensors"
    ssd_core.DraftHeads.for_model(m).save(heads)
    r = ssd_core.generate(m, ssd_core.load_heads(heads, m), prompt="a cat", negative_prompt="", decoder="ssd",
                          seed=1, score=False)
    assert r.image.shape == (grid[0] * 2, grid[1] * 2, 3) and r.image.dtype == torch.float32
