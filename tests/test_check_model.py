"""`python -m ssd_core check-model`: on every tiny family folder, the bundled models and a 7B-sized folder the
report names the family and says loadable; on a damaged copy of each (a missing shard, tokenizer or VQ, fewer
layers in config.json than in the weights, a tensor of another shape) it gives the right one-line finding."""
import json
import math
import os
import re
import shutil
import struct
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

import ssd_core
from ssd_core.api import BUNDLED_MODELS
from ssd_core.check_model import check_folder, read_header
from ssd_core.check_report import format_report, key_findings
from ssd_core.cli import main
from tiny_families import HEADS, HIDDEN, LAYERS, build_emu3, build_janus, build_lumina

FAMILIES = ("janus", "emu3", "lumina", "reference")
TEXT = ("janus", "emu3", "lumina")
GIB = 2**30
SLOW = 10.0  # a generous bound on one check (measured: about 0.1 s on the tiny folders); timings are printed


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("check")
    out = {"janus": build_janus(root / "janus"), "emu3": build_emu3(root / "emu3"),
           "lumina": build_lumina(root / "lumina"), "reference": root / "reference"}
    shutil.copytree(BUNDLED_MODELS["reference"], out["reference"])
    return out


@pytest.fixture
def copy(built, tmp_path):
    """A fresh copy of a built folder to damage."""
    def make(name):
        return shutil.copytree(built[name], tmp_path / name)
    return make


def checked(folder):
    start = time.perf_counter()
    report = check_folder(folder)
    took = time.perf_counter() - start
    print(f"check-model {folder.name if hasattr(folder, 'name') else folder}: {took:.3f} s")
    assert took < SLOW, took
    screen = format_report(report)
    assert len(screen.splitlines()) <= 30, screen
    return report


def finding(report, topic, level=None):
    """The one finding of `topic` (and `level`) that is not ok, with its line."""
    found = [f for f in report.findings if f.topic == topic and (f.level == level if level else f.level != "ok")]
    assert len(found) == 1, format_report(report)
    return found[0]


def layers_key(name):
    return ("text_config", "num_hidden_layers") if name in ("janus", "emu3") else (None, "num_hidden_layers")


def edit_config(folder, change):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


def shard(folder, parts=2):
    """model.safetensors split into `parts` shards and an index, as save_pretrained writes a big model."""
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(parts):
        file = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i::parts]}
        save_file(part, folder / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def rewrite_weights(folder, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})


# ---- every fixture as built: loadable ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
def test_each_folder_names_its_family_and_is_loadable(built, name):
    report = checked(built[name])
    assert report.family == ("llama-grid" if name == "reference" else name)
    assert report.loadable and all(f.level == "ok" for f in report.findings), format_report(report)
    assert "all " in finding(report, "shapes", "ok").line
    assert report.params > 0 and report.memory["fp32"] == 2 * report.memory["bf16"] and "RAM" in report.free
    screen = format_report(report)
    assert f"family: {report.family}" in screen and screen.splitlines()[-1].startswith("loadable")


def test_the_bundled_names_are_checked_in_place():
    for name in BUNDLED_MODELS:
        report = check_folder(name)
        assert report.family == "llama-grid" and report.loadable and report.folder == str(BUNDLED_MODELS[name])


@pytest.mark.parametrize("name", FAMILIES)
def test_a_sharded_copy_is_loadable_and_a_missing_shard_is_named(copy, name):
    folder = shard(copy(name))
    report = checked(folder)
    assert report.loadable, format_report(report)
    assert "2 shards" in finding(report, "weights", "ok").line
    (folder / "model-00002-of-00002.safetensors").unlink()
    report = checked(folder)
    f = finding(report, "weights")
    assert f.level == "missing" and f.blocks and not report.loadable
    assert "names 2 shards and 1 are missing: 'model-00002-of-00002.safetensors'" in f.line
    assert "download" in f.line
    with pytest.raises(ssd_core.SSDError, match="model-00002-of-00002"):  # the load fails as the check says
        ssd_core.load_model(folder, dtype="fp32")


# ---- damaged copies ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TEXT)
def test_a_missing_tokenizer(copy, name):
    folder = copy(name)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / file).unlink()
    report = checked(folder)
    f = finding(report, "tokenizer")
    assert f.level == "missing" and f.blocks and "prompts are text" in f.line and "tokenizer.json" in f.line
    assert [g.topic for g in report.blocking()] == ["tokenizer"]


def test_the_class_model_needs_no_tokenizer(built):
    assert not [f for f in check_folder(built["reference"]).findings if f.topic == "tokenizer"]


def test_a_missing_vqgan_for_lumina(copy):
    folder = copy("lumina")
    (folder / "vqgan.safetensors").unlink()
    report = checked(folder)
    f = finding(report, "vq")
    assert f.level == "missing" and not f.blocks and report.loadable  # it loads: pictures are the token grid
    assert "python -m ssd_core convert-vqgan vqgan.ckpt" in f.line and "vqgan.safetensors" in f.line


@pytest.mark.parametrize("name", ("janus", "emu3"))
def test_a_missing_vq_model_in_the_weights(copy, name):
    folder = copy(name)
    rewrite_weights(folder, lambda t: [t.pop(k) for k in [k for k in t if "vqmodel." in k]])
    report = checked(folder)
    f = finding(report, "vq")
    assert f.blocks and "the weights lack the VQ model, model.vqmodel.* (" in f.line
    assert [g.topic for g in report.blocking()] == ["vq"]


def test_a_missing_vq_decoder_for_the_reference_model(copy):
    folder = copy("reference")
    (folder / "vq.safetensors").unlink()
    f = finding(checked(folder), "vq")
    assert f.level == "error" and f.blocks and "vq.safetensors" in f.line and "set vq_decoder to null" in f.line


@pytest.mark.parametrize("name", FAMILIES)
def test_fewer_layers_in_config_than_in_the_weights_is_refused(copy, name):
    folder = copy(name)
    sub, key = layers_key(name)
    layers = json.loads((folder / "config.json").read_text())
    held = (layers[sub] if sub else layers)[key]
    edit_config(folder, lambda c: (c[sub] if sub else c).__setitem__(key, held - 1))
    report = checked(folder)
    f = finding(report, "shapes")
    stack = {"janus": "model.language_model.layers", "emu3": "text_model.model.layers",
             "lumina": "model.layers", "reference": "model.layers"}[name]
    fix = f"{sub}.{key}" if sub else key
    declared = f"{held - 1} layer{'s' if held - 1 != 1 else ''}"
    assert f.line == (f"config.json declares {declared}, the weights hold {held} ({stack}.0-{held - 1}): "
                      f"fix {fix} to {held}, or use the config.json that came with these weights"), f.line
    assert f.blocks and not report.loadable and len(report.blocking()) == 1
    assert key_findings(report).endswith(f.line)


def test_more_layers_in_config_than_in_the_weights(copy):
    folder = copy("lumina")
    edit_config(folder, lambda c: c.__setitem__("num_hidden_layers", LAYERS + 1))
    f = finding(checked(folder), "shapes")
    assert f"declares {LAYERS + 1} layers, the weights hold {LAYERS}" in f.line and "num_hidden_layers" in f.line


@pytest.mark.parametrize("name", FAMILIES)
def test_a_tensor_of_another_shape(copy, name):
    folder = copy(name)
    names = sorted(load_file(folder / "model.safetensors"))
    target = next(n for n in names if "layers.0." in n and "q_proj.weight" in n)

    def widen(t):
        t[target] = torch.zeros(t[target].shape[0] + 8, t[target].shape[1], dtype=t[target].dtype)
    rewrite_weights(folder, widen)
    report = checked(folder)
    f = finding(report, "shapes")
    assert f.line.startswith(f"1 tensors have another shape than config.json's model wants, e.g. {target} is")
    assert f.blocks


def test_a_cut_short_shard_and_a_non_model_folder(copy, tmp_path):
    folder = copy("janus")
    path = folder / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    f = finding(checked(folder), "weights")
    assert "is cut short" in f.line and "the download is incomplete" in f.line
    (tmp_path / "empty").mkdir()
    f = finding(checked(tmp_path / "empty"), "family")
    assert f.line.startswith("not a model folder this pack knows (it looked for ssd_model.json's family, then "
                             "config.json's architectures and model_type)") and "no config.json" in f.line


def test_a_folder_name_no_file_system_takes(tmp_path):
    for folder, words in ((tmp_path / ("n" * 300), "is 300 bytes long; a file or folder name takes at most 255"),
                          (f"{tmp_path}/a\0b", "holds a NUL character")):
        f = finding(checked(folder), "family")
        assert f.line.startswith("model folder") and words in f.line, f.line


def test_lumina_s_released_layout_is_accepted(copy):
    """Released Lumina-mGPT: q_norm / k_norm as [1, head_dim] (read as they are), no model.vqmodel.*."""
    folder = copy("lumina")

    def released(t):
        for k in [k for k in t if k.startswith("model.vqmodel.")]:
            del t[k]
        for k in [k for k in t if ".q_norm." in k or ".k_norm." in k]:
            t[k] = t[k][:1].clone()
    rewrite_weights(folder, released)
    assert read_header(folder / "model.safetensors")["model.layers.0.self_attn.q_norm.weight"][1] == \
        [1, HIDDEN // HEADS]
    report = checked(folder)
    line = finding(report, "shapes", "ok").line
    assert report.loadable and "q/k norms as [1, head_dim], Lumina-mGPT's released layout, read as they are" in line
    assert "model.vqmodel.* (" in line and "not needed" in line


# ---- the command line and the loader node ------------------------------------------------------------------------
def test_the_command_line(built, copy, capsys):
    assert main(["check-model", str(built["emu3"])]) == 0
    out = capsys.readouterr()
    assert "family: emu3" in out.out and out.out.strip().splitlines()[-1].startswith("loadable") and not out.err
    assert main(["check-model", "reference", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["family"] == "llama-grid" and data["loadable"] is True and data["memory"]["bf16"] > 0
    folder = copy("janus")
    (folder / "tokenizer.json").unlink()
    assert main(["check-model", str(folder)]) == 2
    out = capsys.readouterr()
    assert "NOT loadable" in out.out
    assert out.err.startswith(f"error: {folder} does not load: check-model (family janus): tokenizer: no tokenizer")
    assert len(out.err.strip().splitlines()) == 1


def test_the_loader_node_error_carries_the_finding(copy, monkeypatch):
    from conftest import load_pack

    nodes = load_pack()
    folder = shard(copy("emu3"))
    (folder / "model-00001-of-00002.safetensors").unlink()
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    with pytest.raises(ValueError) as err:
        nodes.SSDLoadModel().load("emu3", "float32", "cpu")
    text = str(err.value)
    assert "check-model (family emu3): weights: model.safetensors.index.json names 2 shards and 1 are missing" in text
    assert f"python -m ssd_core check-model {folder}" in text and "\n" not in text


# ---- a folder of Janus-Pro-7B's size -----------------------------------------------------------------------------
def write_sparse_safetensors(path, shapes: dict):
    """A real safetensors file of bf16 tensors of these shapes whose data are zeros left as a sparse hole: the
    header and file size of a real checkpoint, almost no disk blocks."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def build_janus_7b(folder):
    """Janus-Pro-7B's config.json (tools.memory_table's released config), two shards of its real tensor shapes
    (sparse), an index, its generation ids and a small tokenizer."""
    from transformers import GenerationConfig, JanusForConditionalGeneration

    from tiny_families import JANUS_SPECIALS, byte_tokenizer
    from tools.memory_table import released_config
    from tools.random_models import JANUS_BOI_ID, JANUS_BOS_ID, JANUS_PAD_ID

    folder.mkdir()
    cfg = released_config("Janus-Pro-7B")
    cfg.save_pretrained(folder)
    with torch.device("meta"):
        model = JanusForConditionalGeneration(cfg)
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    names = list(shapes)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        write_sparse_safetensors(folder / file, {n: shapes[n] for n in part})
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    GenerationConfig(bos_token_id=JANUS_BOS_ID, pad_token_id=JANUS_PAD_ID,
                     generation_kwargs={"boi_token_id": JANUS_BOI_ID}).save_pretrained(folder)
    byte_tokenizer(JANUS_SPECIALS, bos=JANUS_SPECIALS[0], eos=JANUS_SPECIALS[1], pad=JANUS_SPECIALS[2])[0] \
        .save_pretrained(folder)
    return folder


def test_a_7b_folder_is_checked_from_its_headers(tmp_path):
    if os.name == "nt":
        pytest.skip("the 7B-sized shards are sparse files, which NTFS does not make by default")
    from tools.memory_table import released_counts

    folder = build_janus_7b(tmp_path / "Janus-Pro-7B")
    shards = sorted(folder.glob("model-*.safetensors"))
    try:
        check_7b(folder, shards, released_counts("Janus-Pro-7B"))
    finally:  # 13.8 GiB apparent size: nothing a later look at the temporary folders should meet
        for p in shards:
            p.unlink()


def check_7b(folder, shards, want):
    on_disk = sum(p.stat().st_blocks * 512 for p in shards if hasattr(p.stat(), "st_blocks"))
    if on_disk > 256 << 20:
        pytest.skip(f"this file system does not keep sparse files ({on_disk:,} bytes written)")
    assert sum(p.stat().st_size for p in shards) > 13 * GIB
    report = checked(folder)
    print(f"Janus-Pro-7B-sized folder ({sum(p.stat().st_size for p in shards) / GIB:.1f} GiB of shards): "
          f"{report.seconds:.3f} s\n{format_report(report)}")
    assert report.family == "janus" and report.loadable, format_report(report)
    assert "2 shards" in finding(report, "weights", "ok").line and "BF16" in finding(report, "weights", "ok").line
    assert report.params == want["params"] and 7.3e9 < report.params < 7.5e9
    assert abs(report.memory["bf16"] / GIB - want["none"]) < 1e-9
    assert abs(report.memory["4-bit"] / GIB - want["4-bit"]) < 1e-9
    edit_config(folder, lambda c: c["text_config"].__setitem__("num_hidden_layers", 29))
    f = finding(checked(folder), "shapes")
    assert f.line.startswith("config.json declares 29 layers, the weights hold 30 (model.language_model.layers.0-29)")


# ---- the released layouts (tests/released_layouts.py, tests/released_lumina.py), when they are there -------------
def released_builders() -> dict:
    out = {}
    try:
        from released_layouts import build_emu3_gen_hf_released, build_janus_pro_released
    except ImportError:
        pass
    else:
        out["Janus-Pro-1B"] = lambda f: build_janus_pro_released(f, "1B")
        out["Janus-Pro-7B"] = lambda f: build_janus_pro_released(f, "7B")
        out["Emu3-Gen-hf"] = build_emu3_gen_hf_released
    try:
        from released_lumina import build_lumina_released
    except ImportError:
        pass
    else:
        out["Lumina-mGPT-7B-768"] = lambda f: build_lumina_released(f, 768)
    return out


RELEASED = released_builders()


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("released")
    return {name: build(root / name) or root / name for name, build in RELEASED.items()}


def released_copy(released, tmp_path, name):
    return shutil.copytree(released[name], tmp_path / name)


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_layouts_are_loadable_and_their_damage_is_named(released, tmp_path, name):
    family = {"Janus": "janus", "Emu3": "emu3", "Lumina": "lumina"}[name.split("-")[0]]
    report = checked(released[name])
    assert report.family == family and report.loadable, format_report(report)
    # a missing shard (or the one weights file)
    folder = released_copy(released, tmp_path, name)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        last = sorted(set(json.loads(index.read_text())["weight_map"].values()))[-1]
        (folder / last).unlink()
        report = checked(folder)
        f = finding(report, "weights")
        assert f.level == "missing" and f"are missing: {last!r}" in f.line
        # the one finding that blocks: the shards there still fit (Lumina's released norms read from them)
        assert [g.topic for g in report.findings if g.blocks] == ["weights"], format_report(report)
    else:
        (folder / "model.safetensors").unlink()
        assert "has no model weights" in finding(checked(folder), "weights").line
    shutil.rmtree(folder)
    # a missing tokenizer
    folder = released_copy(released, tmp_path, name)
    for file in ("tokenizer.json", "tokenizer.model"):
        if (folder / file).is_file():
            (folder / file).unlink()
    f = finding(checked(folder), "tokenizer")
    assert f.blocks and "prompts are text" in f.line
    shutil.rmtree(folder)
    # fewer layers in config.json than in the weights
    folder = released_copy(released, tmp_path, name)
    cfg = json.loads((folder / "config.json").read_text())
    sub = cfg["text_config"] if "text_config" in cfg else cfg
    held = sub["num_hidden_layers"]
    sub["num_hidden_layers"] = held - 1
    (folder / "config.json").write_text(json.dumps(cfg))
    f = finding(checked(folder), "shapes")
    assert f.line.startswith(f"config.json declares {held - 1} layer") and f"the weights hold {held} (" in f.line


def test_released_lumina_without_its_vqgan_or_tokenizer(tmp_path):
    if "Lumina-mGPT-7B-768" not in RELEASED:
        pytest.skip("tests/released_lumina.py is not there")
    from released_lumina import build_lumina_released

    folder = build_lumina_released(tmp_path / "Lumina-mGPT-7B-512", 512, vqgan=False)
    report = checked(folder)
    assert "convert-vqgan" in finding(report, "vq").line
    assert "from Alpha-VLLM/Lumina-mGPT-7B-768" in finding(report, "tokenizer").line  # the 512 release has none
    assert [f.topic for f in report.blocking()] == ["tokenizer"]


def test_a_link_out_of_the_folder_and_a_config_of_other_sizes(copy, tmp_path):
    folder = copy("emu3")
    (tmp_path / "outside.model").write_text("not the model's")
    try:
        (folder / "tokenizer.model").symlink_to(tmp_path / "outside.model")
    except OSError:
        pytest.skip("this system makes no symlinks")
    report = checked(folder)
    assert "lies outside the model folder" in finding(report, "files").line
    assert finding(report, "weights", "ok")  # the rest is still checked
    folder = copy("janus")
    edit_config(folder, lambda c: c["text_config"].__setitem__("hidden_size", 48))
    f = finding(checked(folder), "shapes")
    assert "tensors have another shape than config.json's model wants" in f.line
    assert re.search(r"is \[\d+, 32\] in the weights, \[\d+, 48\] for config.json", f.line), f.line
