"""Every bad input gets an SSDError that says what is wrong and how to fix it."""
import json

import pytest
import torch

import ssd_core
from ssd_core.heads import DraftHeads
from tiny import make_heads, make_llama_grid

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("m")
    folder = make_llama_grid(root / "model", grid=(4, 4))
    model = ssd_core.load_model(folder)
    return model, make_heads(model, root / "heads.safetensors"), root


@pytest.mark.parametrize("text, said", [
    ("8x8", "an 8x8"), ("11x11", "an 11x11"), ("18x18", "an 18x18"), ("80x80", "an 80x80"), ("88x88", "an 88x88"),
    ("24x24", "a 24x24"), ("1x1", "a 1x1"), ("110x110", "a 110x110"), ("emu3", "an emu3"), ("'emu3'", "an 'emu3'"),
    ("Emu3ForCausalLM", "an Emu3ForCausalLM"), ("janus", "a janus"), ("Lumina-mGPT 1", "a Lumina-mGPT 1"),
])
def test_messages_take_the_article_their_words_are_said_with(text, said):
    assert ssd_core.errors.a_or_an(text) == said


def test_messages_name_the_model_as_it_was_loaded(tmp_path):
    """A model loaded from a folder is named by that folder in messages (never by its family's code name
    'llama-grid'); the bundled ones by their names."""
    model = ssd_core.load_model(make_llama_grid(tmp_path / "my-glyphs", grid=(4, 4)))
    assert model.shown_name == "my-glyphs"
    for kwargs, says in ((dict(grid=(80, 80)), "my-glyphs cannot make an 80x80 token grid"),
                         (dict(negative_prompt="blurry"), "this model (my-glyphs) takes no negative prompt"),
                         (dict(decoder="flashar"), "this model is my-glyphs:")):
        with pytest.raises(ssd_core.SSDError) as err:
            ssd_core.generate(model, None, prompt=1, **{"decoder": "ar", **kwargs})
        assert says in str(err.value) and "llama-grid" not in str(err.value), str(err.value)


def _heads_file(path, family="llama-grid", hidden=32, vocab=16, grid=(4, 4)):
    DraftHeads(family, hidden, vocab, grid).save(path)
    return path


@pytest.mark.parametrize("kind, kwargs, words", [
    ("family", dict(family="janus"), ["family janus", "family llama-grid"]),
    ("hidden", dict(hidden=64), ["hidden size 64", "hidden size 32"]),
    ("vocab", dict(vocab=32), ["image vocabulary 32", "image vocabulary 16"]),
    ("grid", dict(grid=(24, 24)), ["grid 24x24", "grid 4x4"]),
])
def test_heads_for_another_model_are_refused(tiny, kind, kwargs, words):
    model, _, root = tiny
    path = _heads_file(root / f"other_{kind}.safetensors", **kwargs)
    with pytest.raises(ssd_core.SSDError) as err:
        ssd_core.load_heads(path, model)
    for w in words:
        assert w in str(err.value)


def test_corrupt_and_foreign_heads_files(tiny):
    model, good, root = tiny
    broken = root / "broken.safetensors"
    broken.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ssd_core.SSDError, match="not a readable safetensors"):
        ssd_core.load_heads(broken, model)
    pickle_file = root / "heads.pt"
    torch.save({"x": torch.zeros(1)}, pickle_file)
    with pytest.raises(ssd_core.SSDError, match="only read from safetensors"):
        ssd_core.load_heads(pickle_file, model)
    from safetensors.torch import save_file

    foreign = root / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(ssd_core.SSDError, match="not an SSD heads file"):
        ssd_core.load_heads(foreign, model)
    with pytest.raises(ssd_core.SSDError, match="does not exist"):
        ssd_core.load_heads(root / "missing.safetensors", model)


def test_heads_round_trip(tiny):
    model, path, _ = tiny
    heads = ssd_core.load_heads(path, model)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        assert torch.equal(f.get_tensor("horizontal.fuse.weight"), heads.horizontal.fuse.weight)
    assert meta["family"] == "llama-grid" and meta["hidden_size"] == "32" and meta["grid"] == "4x4"
    assert meta["format_version"] == "1" and meta["head_form"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(top_k=-1), "top_k must be"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(cfg=-1.0), "cfg must be"),
    (dict(draft_rows=-1), "draft_rows must be"),
    (dict(draft_rows=99), "draft_rows must be"),
    (dict(verify_rounds=-1), "verify_rounds must be"),
    (dict(verify_rounds=50), "verify_rounds must be"),
    (dict(decoder="medusa"), "unknown decoder"),
    (dict(grid=(500, 500)), "cannot make a 500x500 token grid"),
    (dict(prompt=7), "class 7 is out of range"),
    (dict(prompt="giraffe"), "not a class of this model"),
])
def test_bad_sampler_inputs(tiny, kwargs, match):
    model, path, _ = tiny
    heads = ssd_core.load_heads(path, model)
    args = dict(prompt=1, decoder="ssd", seed=0)
    args.update(kwargs)
    with pytest.raises(ssd_core.SSDError, match=match):
        ssd_core.generate(model, heads, **args)


def test_ssd_without_heads_says_what_to_do(tiny):
    model, _, _ = tiny
    with pytest.raises(ssd_core.SSDError, match="load heads"):
        ssd_core.generate(model, None, prompt=1, decoder="ssd")


def test_nan_logits_name_the_position(tmp_path):
    folder = make_llama_grid(tmp_path / "m", grid=(3, 3))
    model = ssd_core.load_model(folder)
    with torch.no_grad():  # the class token of prompt 1 poisons every logit after it
        model.model.model.embed_tokens.weight[model.spec["class_token_start"] + 1].fill_(float("nan"))
    with pytest.raises(ssd_core.SSDError, match=r"NaN or infinite logits at image sequence position\(s\) \[0\]"):
        ssd_core.generate(model, None, prompt=1, decoder="ar", seed=0)


def test_model_folder_errors(tmp_path):
    with pytest.raises(ssd_core.SSDError, match="does not exist"):
        ssd_core.load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ssd_core.SSDError, match="no config.json"):
        ssd_core.load_model(tmp_path / "empty")
    folder = make_llama_grid(tmp_path / "m", grid=(2, 2))
    spec = json.loads((folder / "ssd_model.json").read_text())
    del spec["image_vocab_size"]
    (folder / "ssd_model.json").write_text(json.dumps(spec))
    with pytest.raises(ssd_core.SSDError, match="lacks the keys"):
        ssd_core.load_model(folder)
    with pytest.raises(ssd_core.SSDError, match="dtype"):
        ssd_core.load_model(folder, dtype="int3")
