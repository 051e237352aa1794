"""The bundled reference model (ssd_core/reference/model): files load, figures hold."""
import json
import os

import pytest
import torch

REF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ssd_core", "reference")
MODEL = os.path.join(REF, "model")
HELDOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "heldout_tokens.safetensors")

KEYS = {"family", "grid", "image_token_start", "image_vocab_size", "row_end_token", "num_classes",
        "class_token_start", "null_class_token", "vq_decoder", "class_names", "default_cfg",
        "default_temperature", "default_top_k", "default_min_p"}


@pytest.fixture(scope="module")
def meta():
    with open(os.path.join(MODEL, "ssd_model.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def vq(meta):
    from ssd_core.pixel_decoders.reference_vq import load_vq
    return load_vq(os.path.join(MODEL, meta["vq_decoder"]))


@pytest.fixture(scope="module")
def heldout():
    from safetensors import safe_open
    with safe_open(HELDOUT, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def test_ssd_model_json(meta, model):
    assert KEYS <= set(meta)
    assert meta["family"] == "llama-grid"
    assert meta["grid"] == [24, 24]
    C = meta["num_classes"]
    assert meta["data_version"] == 2 and C == 11 and meta["class_names"][:3] == ["face", "heart", "hand"]
    assert len(meta["class_names"]) == C
    assert meta["image_token_start"] == 0
    assert meta["class_token_start"] == meta["image_vocab_size"]
    assert meta["null_class_token"] == meta["image_vocab_size"] + C
    assert meta["row_end_token"] == meta["null_class_token"] + 1  # v2: one after every row (no stripes)
    assert model.config.vocab_size >= meta["row_end_token"] + 1
    assert model.config.max_position_embeddings >= 1 + 24 * 25
    assert model.config.model_type == "llama"


def test_sizes_and_fp16():
    from safetensors import safe_open
    total = sum(os.path.getsize(os.path.join(MODEL, f)) for f in os.listdir(MODEL))
    assert total < 25e6, total
    for name in ("model.safetensors", "vq.safetensors", "yardstick.safetensors", "heads.safetensors"):
        with safe_open(os.path.join(MODEL, name), framework="pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert "F32" not in dtypes or name == "heads.safetensors", (name, dtypes)
    assert os.path.getsize(HELDOUT) < 1e6


def test_vq_decode_shape(vq, meta):
    codes = torch.randint(0, meta["image_vocab_size"], (2, 24, 24))
    img = vq.decode(codes)
    assert img.shape == (2, 3, 96, 96)
    assert float(img.min()) >= 0 and float(img.max()) <= 1
    assert vq.decode(codes[:, :8, :12]).shape == (2, 3, 32, 48)  # fully convolutional


def test_vq_refuses_foreign_file(tmp_path):
    from safetensors.torch import save_file
    from ssd_core.pixel_decoders.reference_vq import load_vq
    p = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(1)}, str(p))
    with pytest.raises(ValueError, match="not a reference VQ file"):
        load_vq(str(p))


def test_vq_reconstruction(vq, heldout):
    t, md = heldout
    x = t["images"].permute(0, 3, 1, 2).float() / 255
    rec = vq.decode(vq.encode(x))
    mse = float(((rec - x) ** 2).mean())
    assert mse <= float(md["vq_mse"]) * 1.1 + 1e-4, (mse, md["vq_mse"])


def test_heldout_nll(model, meta, heldout):
    t, md = heldout
    toks, labs = t["tokens"].long(), t["labels"].long()
    N, H, W = toks.shape
    rows = torch.cat([toks, torch.full((N, H, 1), meta["row_end_token"])], dim=2).view(N, -1)  # row-end after each row
    seq = torch.cat([(meta["class_token_start"] + labs)[:, None], rows], dim=1)
    with torch.no_grad():
        logits = model(input_ids=seq[:, :-1]).logits.float()
    is_image = seq[0, 1:] < meta["image_vocab_size"]  # the row-end tokens are forced, no targets
    assert int(is_image.sum()) == H * W
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1), reduction="none")
    nll = float(ce.view(N, -1)[:, is_image].mean())
    assert nll <= float(md["nll"]) + 0.02, (nll, md["nll"])
    assert nll < 0.8 * torch.log(torch.tensor(float(meta["image_vocab_size"]))).item()  # far below uniform
