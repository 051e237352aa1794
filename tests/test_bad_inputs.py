"""Bad inputs, table by table: the files a user points the loaders at (model folders, ssd_model.json, heads files,
the families' folders) are refused with one clear SSDError line that says what is wrong and how to fix it,
before any sampling starts, without reading outside the model folder, and the loaded model stays usable. The
values given to generate, the command line and the nodes: test_bad_inputs_values.py."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssd_core
from ssd_core.families.llama_grid import LlamaGridModel, read_spec
from ssd_core.pixel_decoders import reference_vq
from bad_inputs import TINY_VQ, json_edit, make_base, one_line, save_tiny_vq, spec_edit, works
from conftest import rewrite_safetensors

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

SSDError = ssd_core.SSDError


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("bad"))


# ---- model folders ------------------------------------------------------------------------------------------
def _write(name, data):
    def edit(folder, root):
        (folder / name).write_bytes(data) if isinstance(data, bytes) else (folder / name).write_text(data)
    return edit


def _delete(name):
    return lambda folder, root: (folder / name).unlink()


def _truncate(folder, root):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:4096])


def _pickle_only(folder, root):
    torch.save({"x": torch.zeros(1)}, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _symlink_out(folder, root):
    (folder / "vq.safetensors").unlink()
    (folder / "vq.safetensors").symlink_to(root / "outside" / "vq.safetensors")


def _small_vq(folder, root):
    save_tiny_vq(folder / "vq.safetensors", codes=8)


def _huge_vq_config(folder, root):
    """Small tensors under a config that would build a huge network: refused from the shapes alone."""
    huge = json.dumps(dict(TINY_VQ, channels=[51_200, 102_400]))
    rewrite_safetensors(folder / "vq.safetensors", meta={"config": huge})


def _outside_weights(root) -> Path:
    """A valid copy of the model's weights beside the folder: loading it would succeed, so only a refusal passes."""
    outside = root / "outside" / "model.safetensors"
    if not outside.exists():
        shutil.copyfile(root / "model" / "model.safetensors", outside)
    return outside


def _index_to(shard):
    """model.safetensors replaced by an index whose weight_map names `shard(root)` for every tensor."""
    def edit(folder, root):
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            names = list(f.keys())
        (folder / "model.safetensors").unlink()
        target = str(shard(root))
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {n: target for n in names}}))
    return edit


def _link_out(name):
    """`name` in the folder replaced by a symlink to a copy of it outside the folder."""
    def edit(folder, root):
        copy = root / "outside" / f"linked-{name}"
        shutil.copyfile(folder / name, copy)
        (folder / name).unlink()
        (folder / name).symlink_to(copy)
    return edit


def _config(**changes):
    return json_edit("config.json", **changes)


def _nested(name, key, depth):
    """`key` of the JSON file `name` set to a list nested `depth` deep (written as text: json.dumps recurses)."""
    def edit(folder, root):
        data = json.loads((folder / name).read_text())
        data[key] = "@@"
        (folder / name).write_text(json.dumps(data).replace('"@@"', "[" * depth + "]" * depth))
    return edit


def _tensors(drop=(), cast=None):
    """model.safetensors re-written without the tensors `drop`, and with `cast` = (name, dtype)."""
    def edit(folder, root):
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        for k in drop:
            tensors.pop(k)
        if cast:
            tensors[cast[0]] = tensors[cast[0]].round().to(cast[1])
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return edit


FOLDER_CASES = [  # (case, edit of a good folder, words the message must hold)
    ("no config.json", _delete("config.json"), ["no config.json", "transformers model folder"]),
    ("config.json not JSON", _write("config.json", "{oops"), ["config.json is not valid JSON", "re-download"]),
    ("config.json a list", _write("config.json", "[1]"), ["holds a JSON list, not an object"]),
    ("neither ssd_model.json nor a known class", _delete("ssd_model.json"),
     ["LlamaForCausalLM: not a supported AR image model", "ssd_model.json (llama-grid)"]),
    ("no ssd_model.json, config.json not JSON",
     lambda f, r: (_delete("ssd_model.json")(f, r), _write("config.json", "{")(f, r)), ["config.json is not valid JSON"]),
    ("no weights", _delete("model.safetensors"), ["no model weights", "model.safetensors"]),
    ("truncated weights", _truncate, ["could not load the model", "re-download"]),
    ("pickle weights only", _pickle_only, ["pytorch_model.bin", "never", "safetensors"]),
    ("ssd_model.json not JSON", _write("ssd_model.json", "[1,"), ["is not valid JSON", "docs/models-and-memory.md"]),
    ("ssd_model.json a list", _write("ssd_model.json", "[1, 2]"), ["JSON list, not an object", "docs/models-and-memory.md"]),
    ("missing key", _write("ssd_model.json", json.dumps({"family": "llama-grid"})), ["lacks the keys", "docs/models-and-memory.md"]),
    ("grid of strings", spec_edit(grid=["a", "b"]), ["grid must be [rows, columns]", "'a'"]),
    ("grid of one number", spec_edit(grid=[3]), ["grid must be [rows, columns]"]),
    ("grids not a list", spec_edit(grids="4x4"), ["grids must be a list"]),
    ("negative image_token_start", spec_edit(image_token_start=-5),
     ["image_token_start must be a whole number >= 0", "-5"]),
    ("image_vocab_size 0", spec_edit(image_vocab_size=0), ["image_vocab_size must be a whole number >= 1"]),
    ("num_classes a bool", spec_edit(num_classes=True), ["num_classes must be a whole number"]),
    ("image range past the vocabulary", spec_edit(image_vocab_size=400),
     ["image_token_start + image_vocab_size reaches token id 399", "vocabulary has only 20"]),
    ("row_end_token past the vocabulary", spec_edit(row_end_token=10 ** 6), ["row_end_token reaches token id 1000000"]),
    ("class tokens past the vocabulary", spec_edit(num_classes=50, class_names=[]),
     ["class_token_start + num_classes reaches token id", "fix class_token_start"]),
    ("null class past the vocabulary", spec_edit(null_class_token=20), ["null_class_token reaches token id 20"]),
    ("class_names too short", spec_edit(class_names=["a"]), ["class_names must be a list of num_classes (3)"]),
    ("bad default grid", spec_edit(grid=[9, 9]), ["9x9", "needs 83 positions", "smaller grid in ssd_model.json"]),
    ("bad extra grid", spec_edit(grids=[[3, 3], [20, 20]]), ["20x20", "smaller grid in ssd_model.json"]),
    ("bad default cfg", spec_edit(default_cfg=-3), ["default_* sampler value", "cfg must be"]),
    ("default top_p a string", spec_edit(default_top_p="high"), ["default_*", "top_p"]),
    ("default min_p of 1", spec_edit(default_min_p=1.0), ["default_* sampler value", "min_p must be in [0, 1)"]),
    ("family of another kind", spec_edit(family="janus-ish"), ["unknown model family"]),
    ("vq_decoder outside the folder", spec_edit(vq_decoder="../outside/vq.safetensors"),
     ["lies outside the model folder", "relative to it"]),
    ("vq_decoder /etc/passwd", spec_edit(vq_decoder="/etc/passwd"), ["'/etc/passwd' lies outside the model folder"]),
    ("vq_decoder symlink escaping", _symlink_out, ["'vq.safetensors' lies outside the model folder"]),
    ("vq_decoder missing", spec_edit(vq_decoder="gone.safetensors"), ["is not a file in the model folder", "null"]),
    ("vq_decoder a number", spec_edit(vq_decoder=7), ["vq_decoder must be a file name"]),
    ("vq_decoder garbage", _write("vq.safetensors", b"not a safetensors file at all"),
     ["not a readable reference VQ file", "re-download"]),
    ("vq_decoder of the wrong size", _small_vq, ["has 8 codes", "image_vocab_size is 16"]),
    ("vq_decoder config huge, tensors small", _huge_vq_config, ["VQ weights do not match its config"]),
    # files read from outside the folder: an index naming other shards, links out (issue 29)
    ("index names a shard by ../", _index_to(lambda root: Path("..") / "outside" / "model.safetensors"),
     ["model.safetensors.index.json's shard for", "'../outside/model.safetensors' lies outside the model folder"]),
    ("index names a shard by absolute path", _index_to(_outside_weights),
     ["lies outside the model folder", "outside/model.safetensors"]),
    ("index names a pickle", _index_to(lambda root: "pytorch_model.bin"), ["must be a .safetensors file name"]),
    ("index names a missing shard", _index_to(lambda root: "model-00001-of-00002.safetensors"),
     ["is not a file in", "download is incomplete"]),
    ("index without weight_map", lambda f, r: (_index_to(lambda root: "x.safetensors")(f, r),
                                               _write("model.safetensors.index.json", "{}")(f, r)),
     ["has no weight_map object"]),
    ("index a link out", lambda f, r: (_index_to(lambda root: "model.safetensors")(f, r), shutil.copyfile(
        r / "model" / "model.safetensors", f / "model.safetensors"), _link_out("model.safetensors.index.json")(f, r)),
     ["'model.safetensors.index.json' lies outside the model folder", "cp -L"]),
    ("model.safetensors a link out", _link_out("model.safetensors"),
     ["'model.safetensors' lies outside the model folder", "cp -L"]),
    ("config.json a link out", _link_out("config.json"), ["'config.json' lies outside the model folder"]),
    ("ssd_model.json a link out", _link_out("ssd_model.json"), ["'ssd_model.json' lies outside the model folder"]),
    # names that are not names, nesting, NUL
    ("family a list", spec_edit(family=["llama-grid"]), ["family must be a name", "['llama-grid']"]),
    ("family a dict", spec_edit(family={"name": "llama-grid"}), ["family must be a name", "{'name': 'llama-grid'}"]),
    ("family with control characters", spec_edit(family="llama\u202egrid\n\x1b[31m"),
     ["unknown model family", "\\u202e", "\\n", "\\x1b[31m"]),
    ("config model_type a list", lambda f, r: (_delete("ssd_model.json")(f, r), _config(model_type=["llama"])(f, r)),
     ["model_type must be a name", "['llama']"]),
    ("config model_type a dict (with ssd_model.json)", _config(model_type={"a": 1}), ["model_type must be a name"]),
    ("config architectures a dict", lambda f, r: (_delete("ssd_model.json")(f, r),
                                                  _config(architectures={"LlamaForCausalLM": 1})(f, r)),
     ["architectures must be a list of class names"]),
    ("config architectures of lists", _config(architectures=[["LlamaForCausalLM"]]),
     ["architectures must be a list of class names"]),
    ("ssd_model.json nested 100000 deep", _nested("ssd_model.json", "grids", 100_000),
     ["nests JSON too deeply to read", "docs/models-and-memory.md"]),
    ("ssd_model.json nested 100 deep", _nested("ssd_model.json", "grids", 100), ["nests JSON more than 32 levels"]),
    ("config.json nested 100000 deep", _nested("config.json", "rope_scaling", 100_000), ["nests JSON too deeply"]),
    ("config.json nested 100 deep", _nested("config.json", "rope_scaling", 100), ["nests JSON more than 32 levels"]),
    ("config.json a number of 5000 digits", _write("config.json", '{"vocab_size": ' + "9" * 5000 + "}"),
     ["config.json is not valid JSON"]),
    ("vq_decoder with a NUL", spec_edit(vq_decoder="vq.safetensors\x00.png"),
     ["vq_decoder 'vq.safetensors\\x00.png' is not a usable file name", "control character"]),
    ("vq_decoder with a newline", spec_edit(vq_decoder="vq\n.safetensors"), ["is not a usable file name"]),
    ("vq_decoder of 5000 characters", spec_edit(vq_decoder="v" * 5000), ["cannot be resolved", "characters)"]),
    # weights accepted silently before
    ("lm_head.weight missing", _tensors(drop=["lm_head.weight"]), ["lack lm_head.weight", "random values"]),
    ("two tensors missing", _tensors(drop=["lm_head.weight", "model.norm.weight"]),
     ["lack lm_head.weight, model.norm.weight"]),
    ("int8 weights", _tensors(cast=("model.layers.0.mlp.up_proj.weight", torch.int8)),
     ["'model.layers.0.mlp.up_proj.weight' as I8", "unquantized weights", "8-bit / 4-bit quantization"]),
    ("bool weights", _tensors(cast=("lm_head.weight", torch.bool)), ["'lm_head.weight' as BOOL"]),
    # absurd sizes, refused before anything is built
    ("a million layers", _config(num_hidden_layers=1_000_000),
     ["num_hidden_layers is 1000000", "from 1 to 1,024"]),
    ("hidden size 10^7", _config(hidden_size=10 ** 7), ["hidden_size is 10000000", "65,536"]),
    ("vocabulary 10^9", _config(vocab_size=10 ** 9), ["vocab_size is 1000000000", "4,194,304"]),
    ("positions 2^40", _config(max_position_embeddings=2 ** 40), ["max_position_embeddings is 1099511627776"]),
    ("layers a string", _config(num_hidden_layers="32"), ["num_hidden_layers is '32'", "whole numbers"]),
    ("layers negative", _config(num_hidden_layers=-1), ["num_hidden_layers is -1"]),
    ("num_classes 10^9, no names", spec_edit(num_classes=10 ** 9, class_names=[]),
     ["class_token_start + num_classes reaches token id 1000000015"]),
    ("grid 10^9", spec_edit(grid=[10 ** 9, 10 ** 9]), ["1000000000x1000000000", "smaller grid"]),
]


@pytest.fixture
def read_log(monkeypatch, base):
    """Real paths the VQ loader, safetensors (as transformers and the pack call it) and torch.load are asked to
    read while a folder loads; Python's own open() calls are in _OPENED (an audit hook)."""
    import safetensors
    import safetensors.torch
    import transformers.modeling_utils

    seen = []

    def spy(module, name):
        real = getattr(module, name)

        def call(path, *a, **k):
            seen.append(str(Path(os.fsdecode(path)).resolve()))
            return real(path, *a, **k)
        monkeypatch.setattr(module, name, call)

    spy(reference_vq, "load_vq")
    for module in (safetensors, transformers.modeling_utils):
        if hasattr(module, "safe_open"):
            spy(module, "safe_open")
    spy(safetensors.torch, "load_file")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail(f"torch.load was called on {a[:1]}"))
    return seen


_OPENED = []
_WATCH = [False]


def _audit(event, args):
    if _WATCH[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@pytest.mark.parametrize("case, edit, words", FOLDER_CASES, ids=[c[0] for c in FOLDER_CASES])
def test_model_folder_errors(base, tmp_path, read_log, case, edit, words):
    folder = shutil.copytree(base["folder"], tmp_path / "model")
    edit(folder, base["root"])
    read_log.clear()  # what the edit itself read
    _OPENED.clear()
    _WATCH[0] = True
    try:
        with pytest.raises(SSDError) as err:
            ssd_core.load_model(folder)
    finally:
        _WATCH[0] = False
    text = one_line(err)
    for w in words:
        assert w in text, text
    outside = [str((base["root"] / "outside").resolve()), "/etc/passwd"]
    touched = read_log + [str(Path(p).resolve()) for p in _OPENED]
    assert not [p for p in touched if any(p.startswith(o) for o in outside)], touched
    works(base["model"])  # a loaded model is untouched by another folder's error


def test_sharded_folder_loads_and_reads_only_its_own_files(base, tmp_path, read_log):
    """A folder saved in shards (an index and its shards, all inside) loads, and every weights file safetensors
    opens is one of its shards: the checks refuse what escapes, not what is sharded."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(base["folder"]).save_pretrained(folder, max_shard_size="20KB")
    shutil.copyfile(base["folder"] / "ssd_model.json", folder / "ssd_model.json")
    shutil.copyfile(base["folder"] / "vq.safetensors", folder / "vq.safetensors")
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    read_log.clear()
    model = ssd_core.load_model(folder)
    opened = {Path(p).name for p in read_log if Path(p).parent != folder.resolve() or p.endswith(".safetensors")}
    assert {Path(p).parent for p in read_log} == {folder.resolve()}, read_log
    assert set(shards) <= opened, opened
    assert torch.equal(model.model.lm_head.weight, base["model"].model.lm_head.weight)
    works(model)


def test_good_folder_variants_load(base, tmp_path):
    """The same folder with class_names [] and no vq_decoder loads; its classes are named by index."""
    folder = shutil.copytree(base["folder"], tmp_path / "model")
    spec_edit(class_names=[], vq_decoder=None)(folder, base["root"])
    model = ssd_core.load_model(folder)
    assert model.class_names == ["0", "1", "2"] and model.decode(torch.zeros(3, 3, dtype=torch.long)) is None
    assert base["model"].decode(torch.zeros(3, 3, dtype=torch.long)).shape == (12, 12, 3)  # opened at load


# ---- ssd_model.json, generated --------------------------------------------------------------------------
class Deep(str):
    """A list nested `depth` deep, written into the JSON text as is (json.dumps itself recurses)."""


CONTROL = st.lists(st.sampled_from(["\x00", "\n", "\r", "\x1b", "[31m", "\u202e", "\u2028", "\t", "vq", ".", "/",
                                    "é"]), max_size=6).map("".join)
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.integers(-3, 40),
                        st.sampled_from([10 ** 6, 10 ** 9, 2 ** 31, 2 ** 63]), st.floats(allow_nan=True),
                        st.text(max_size=8), CONTROL,
                        st.lists(st.integers(-2, 40), max_size=3), st.lists(st.text(max_size=3), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                        st.lists(st.lists(st.integers(0, 10 ** 9), max_size=2), max_size=2),
                        st.integers(1, 3000).map(lambda d: Deep("[" * d + "]" * d)),
                        st.sampled_from(["../x", "/etc/passwd", "vq.safetensors", "", ".", "sub/../vq.safetensors",
                                         "llama-grid", ["llama-grid"], {"family": "llama-grid"}, "janus"]))
SPEC_KEYS = ["family", "grid", "grids", "image_token_start", "image_vocab_size", "row_end_token", "num_classes",
             "class_token_start", "null_class_token", "class_names", "vq_decoder", "default_cfg",
             "default_temperature", "default_top_k", "default_top_p", "default_min_p", "decoder_defaults"]


def _dump(spec: dict) -> str:
    deep = {f"@deep{i}@": v for i, v in enumerate(v for v in spec.values() if isinstance(v, Deep))}
    names = {v: k for k, v in deep.items()}
    text = json.dumps({k: names.get(v, v) if isinstance(v, Deep) else v for k, v in spec.items()})
    for key, value in deep.items():
        text = text.replace(json.dumps(key), value)
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(SPEC_KEYS), JSON_VALUES, min_size=1, max_size=3))
def test_any_ssd_model_json_loads_or_says_why(base, tmp_path_factory, changes):
    """Whatever ssd_model.json holds (family a list or a dict, lists nested thousands deep, NUL and control
    characters, huge sizes), detecting the family, reading it and building the model either works (and the model
    then lays out its grid and builds a prompt) or raises one SSDError line with no raw control characters;
    nothing outside the folder is opened."""
    from ssd_core.families import detect_family

    folder = base["root"] / "fuzz"
    if not folder.exists():
        shutil.copytree(base["folder"], folder)
    spec = dict(base["spec"], **changes)
    (folder / "ssd_model.json").write_text(_dump(spec))
    vocab = base["model"].model.config.vocab_size
    try:
        assert isinstance(detect_family(folder), str)
        model = LlamaGridModel(base["model"].model, read_spec(folder, vocab), folder)
    except SSDError as err:
        one_line(err)
        return
    layout = model.layout(None)
    assert layout.grid == model.default_grid
    model.build_prompt(model.class_names[0], "", True, layout.grid)
    if model._vq is not None:
        assert (folder.resolve() / spec["vq_decoder"]).resolve().parent == folder.resolve()


# ---- heads files ----------------------------------------------------------------------------------------------
def _heads_with(path, base, meta_changes=None, tensor_changes=None):
    return rewrite_safetensors(base["heads_path"], path, meta=meta_changes, tensors=tensor_changes)


HEADS_CASES = [
    ("a folder", lambda p, b: p.mkdir() or p, ["is a folder", "heads.safetensors"]),
    ("missing", lambda p, b: p / "nope.safetensors", ["does not exist"]),
    ("huge metadata, small tensors", lambda p, b: _heads_with(p, b, {"hidden_size": str(10 ** 6)}),
     ["horizontal.fuse.weight of shape [32, 64]", "hidden_size 1000000", "needs [1000000, 2000000]"]),
    ("a tensor of the wrong shape", lambda p, b: _heads_with(p, b, tensor_changes={"vertical.up.weight": torch.zeros(3, 3)}),
     ["vertical.up.weight of shape [3, 3]", "re-train"]),
    ("a tensor missing", lambda p, b: _heads_with(p, b, tensor_changes={"vertical.norm.weight": None}),
     ["lacks ['vertical.norm.weight']"]),
    ("metadata not numbers", lambda p, b: _heads_with(p, b, {"grid": "axb"}), ["damaged heads metadata"]),
    ("family with control characters", lambda p, b: _heads_with(p, b, {"family": "llama-grid\u202e\n\x1b[31m"}),
     ["has family 'llama-grid\\u202e\\n\\x1b[31m' in its metadata, not a family name"]),
    ("format version with control characters", lambda p, b: _heads_with(p, b, {"format_version": "\x1b[2J\r1"}),
     ["heads format version '\\x1b[2J\\r1'"]),
    ("bool tensor",
     lambda p, b: _heads_with(p, b, tensor_changes={"vertical.norm.weight": torch.ones(32, dtype=torch.bool)}),
     ["'vertical.norm.weight' as torch.bool", "floating point"]),
    ("int64 tensor",
     lambda p, b: _heads_with(p, b, tensor_changes={"horizontal.up.weight": torch.ones(32, 32, dtype=torch.int64)}),
     ["'horizontal.up.weight' as torch.int64", "floating point"]),
]


@pytest.mark.parametrize("case, make, words", HEADS_CASES, ids=[c[0] for c in HEADS_CASES])
def test_heads_file_errors(base, tmp_path, case, make, words):
    path = make(tmp_path / "h.safetensors", base)
    with pytest.raises(SSDError) as err:
        ssd_core.load_heads(path, base["model"])
    text = one_line(err)
    for w in words:
        assert w in text, text
    works(base["model"], base["heads"], decoder="ssd")


def test_messages_escape_control_and_bidi_characters():
    """SSDError writes every character that is not printable as its escape (one helper: errors.printable), and
    errors.shown quotes a value repr-style and cut: a message is one line a terminal shows as it is."""
    from ssd_core.errors import printable, shown

    raw = "name\u202e\n\x1b[31mred\x00\u2028\t end \u00e9\u00d7"
    text = str(SSDError(f"bad {raw}"))
    assert text == "bad name\\u202e\\n\\x1b[31mred\\x00\\u2028\\t end \u00e9\u00d7", text
    assert text.isprintable() and printable(raw) == text[4:]
    assert shown(raw) == "'name\\u202e\\n\\x1b[31mred\\x00\\u2028\\t end \u00e9\u00d7'"
    assert shown("x" * 100).endswith("... (102 characters)") and len(shown("x" * 100)) < 90


# ---- family folders (janus, emu3, lumina: transformers' own classes) --------------------------------------
@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    from tiny_families import build_emu3, build_janus, build_lumina

    root = tmp_path_factory.mktemp("families")
    (root / "outside").mkdir()
    return {"root": root, "janus": build_janus(root / "janus"), "emu3": build_emu3(root / "emu3"),
            "lumina": build_lumina(root / "lumina")}


def _pickle_weights(folder, root):
    """The weights as a pickle only (torch.save of the state dict, as older repos ship them)."""
    from safetensors.torch import load_file

    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _sub_config(key, **changes):
    def edit(folder, root):
        cfg = json.loads((folder / "config.json").read_text())
        cfg[key].update(changes)
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def _family_index_out(folder, root):
    """An index whose weight_map points at a valid copy of the weights outside the folder."""
    from safetensors import safe_open

    outside = root / "outside" / f"{folder.name}.safetensors"
    shutil.copyfile(folder / "model.safetensors", outside)
    with safe_open(str(outside), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: str(outside) for n in names}}))


FAMILY_CASES = [  # (family, case, edit, words)
    *[(fam, "pytorch_model.bin only", _pickle_weights, ["pytorch_model.bin", "never loads", "model.safetensors"])
      for fam in ("janus", "emu3", "lumina")],
    *[(fam, "index names a shard outside", _family_index_out, ["lies outside the model folder"])
      for fam in ("janus", "emu3", "lumina")],
    ("janus", "tokenizer.json a link out", _link_out("tokenizer.json"),
     ["'tokenizer.json' lies outside the model folder"]),
    ("emu3", "generation_config.json a link out", _link_out("generation_config.json"),
     ["'generation_config.json' lies outside the model folder"]),
    ("lumina", "vqgan.safetensors a link out", _link_out("vqgan.safetensors"),
     ["'vqgan.safetensors' lies outside the model folder"]),
    ("janus", "text_config.model_type a dict", _sub_config("text_config", model_type={"llama": 1}),
     ["text_config.model_type must be a name"]),
    ("janus", "text_config with a million layers", _sub_config("text_config", num_hidden_layers=10 ** 6),
     ["text_config.num_hidden_layers is 1000000"]),
    ("emu3", "text_config vocabulary 10^9", _sub_config("text_config", vocab_size=10 ** 9),
     ["text_config.vocab_size is 1000000000"]),
    ("lumina", "a million layers", _config(num_hidden_layers=10 ** 6), ["num_hidden_layers is 1000000"]),
    ("emu3", "lm_head missing", _tensors(drop=["text_model.lm_head.weight"]), ["lack", "lm_head.weight"]),
    ("janus", "image_std a word", _write("preprocessor_config.json", '{"image_std": "wide"}'),
     ["image_std is 'wide'", "3 numbers"]),
    ("janus", "image_std of zeros", _write("preprocessor_config.json", '{"image_std": [0, 0, 0]}'),
     ["image_std is [0, 0, 0]"]),
]


@pytest.mark.parametrize("family, case, edit, words", FAMILY_CASES, ids=[f"{c[0]}: {c[1]}" for c in FAMILY_CASES])
def test_family_folder_errors(family_folders, tmp_path, read_log, family, case, edit, words):
    """The text families' folders get the same checks: one line, torch.load never called (read_log makes it fail
    the test), nothing outside the folder opened."""
    folder = shutil.copytree(family_folders[family], tmp_path / family)
    edit(folder, family_folders["root"])
    read_log.clear()  # what the edit itself read
    _OPENED.clear()
    _WATCH[0] = True
    try:
        with pytest.raises(SSDError) as err:
            ssd_core.load_model(folder, dtype="fp32")
    finally:
        _WATCH[0] = False
    text = one_line(err)
    for w in words:
        assert w in text, text
    outside = str((family_folders["root"] / "outside").resolve())
    touched = read_log + [str(Path(p).resolve()) for p in _OPENED]
    assert not [p for p in touched if p.startswith(outside)], touched


def _vqgan_config(raw=None, **changes):
    """vqgan.safetensors with its tensors kept and its config metadata changed (or replaced by the text `raw`)."""
    def edit(folder):
        from safetensors import safe_open
        from safetensors.torch import save_file

        from ssd_core.pixel_decoders.chameleon_vqgan import METADATA_KEY

        with safe_open(str(folder / "vqgan.safetensors"), "pt") as f:
            meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
        meta[METADATA_KEY] = raw or json.dumps(dict(json.loads(meta[METADATA_KEY]), **changes))
        save_file(tensors, str(folder / "vqgan.safetensors"), metadata=meta)
    return edit


@pytest.mark.parametrize("case, edit, words", [
    ("garbage", lambda f: (f / "vqgan.safetensors").write_bytes(b"not a safetensors file"),
     ["is not a usable converted Chameleon VQGAN", "convert-vqgan"]),
    ("config wider than its tensors", _vqgan_config(ch=1024),
     ["do not match the config in its metadata", "the config needs [2048, 32, 3, 3]", "convert-vqgan"]),
    ("config nested 100000 deep", _vqgan_config('{"ch_mult": ' + "[" * 100_000 + "]" * 100_000 + "}"),
     ["is not a usable converted Chameleon VQGAN", "convert-vqgan"]),
])
def test_lumina_vqgan_errors(family_folders, tmp_path, case, edit, words):
    """Lumina's VQGAN, read when the first image is decoded: a bad file is one line, and a config asking for a
    network larger than its tensors is refused from the shapes (on the meta device) before anything is built."""
    folder = shutil.copytree(family_folders["lumina"], tmp_path / "lumina")
    edit(folder)
    model = ssd_core.load_model(folder, dtype="fp32")
    with pytest.raises(SSDError) as err:
        model.decode(torch.zeros(4, 4, dtype=torch.long))
    text = one_line(err)
    for w in words:
        assert w in text, text
