"""What the bad-input tests share: one_line (a message is one printable line), a tiny llama-grid folder with its
model and heads (make_base), works (the model still makes an image after an error)."""
import json
from pathlib import Path

import torch

import ssd_core
from ssd_core.pixel_decoders import reference_vq
from tiny import make_heads, make_llama_grid

ROOT = Path(__file__).resolve().parent.parent
SSDError = ssd_core.SSDError
TINY_VQ = {"channels": [8, 16], "res_blocks": 1, "codebook_size": 16, "code_dim": 4, "downsample": 4}


def save_tiny_vq(path: Path, codes: int = 16) -> Path:
    torch.manual_seed(0)
    reference_vq.save_vq(reference_vq.VQModel(dict(TINY_VQ, codebook_size=codes)), str(path))
    return path


def one_line(err) -> str:
    """One line, and nothing a terminal would obey: no control or bidi characters (they come escaped)."""
    text = str(err.value if hasattr(err, "value") else err)
    assert "\n" not in text and len(text) < 600, text
    assert text.isprintable(), ascii(text)
    return text


def make_base(root: Path) -> dict:
    """A tiny llama-grid folder with a tiny VQ decoder, its loaded model and heads; an 'outside' folder beside
    it holding a valid VQ file that must never be read through the model folder."""
    folder = make_llama_grid(root / "model", grid=(3, 3), max_positions=32)
    save_tiny_vq(folder / "vq.safetensors")
    spec = json.loads((folder / "ssd_model.json").read_text())
    spec["vq_decoder"] = "vq.safetensors"
    (folder / "ssd_model.json").write_text(json.dumps(spec))
    (root / "outside").mkdir()
    save_tiny_vq(root / "outside" / "vq.safetensors")
    model = ssd_core.load_model(folder)
    heads_path = make_heads(model, root / "heads.safetensors")
    return {"root": root, "folder": folder, "spec": spec, "model": model, "heads_path": heads_path,
            "heads": ssd_core.load_heads(heads_path, model)}


def json_edit(name: str, **changes):
    """An edit of a model folder (folder, root) that writes `changes` into its JSON file `name`."""
    def edit(folder, root):
        content = json.loads((folder / name).read_text())
        content.update(changes)
        (folder / name).write_text(json.dumps(content))
    return edit


def spec_edit(**changes):
    """An edit of a model folder (folder, root) that writes `changes` into its ssd_model.json."""
    return json_edit("ssd_model.json", **changes)


def works(model, heads=None, decoder="ar", **kw):
    """The model still makes an image after an error."""
    args = dict(prompt=1, decoder=decoder, seed=0, grid=(2, 2), decode_pixels=False)
    args.update(kw)
    r = ssd_core.generate(model, heads, **args)
    assert r.tokens.shape == (2, 2) and bool((r.tokens >= 0).all())
    return r
