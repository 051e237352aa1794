"""Bad values, table by table: what is given to generate (sampler values, prompts, grids, seeds), typed on the
command line or set on the sampler node is refused with one clear SSDError line (exit code 2 on the command
line) that says what is wrong and how to fix it, before any sampling starts, and the loaded model stays usable.
The files a user points the loaders at: test_bad_inputs.py."""
import importlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssd_core
from ssd_core import cli
from ssd_core.sampling import SamplerSettings, log_probs
from bad_inputs import ROOT, make_base, one_line, spec_edit, works

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

SSDError = ssd_core.SSDError


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("bad"))


# ---- sampler values, generated -------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(cfg=st.floats(allow_nan=True, allow_infinity=True), temperature=st.one_of(st.floats(-2, 1e6), st.just(math.nan)),
       top_k=st.integers(-5, 40), top_p=st.floats(allow_nan=True, allow_infinity=True),
       min_p=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1)))
def test_any_sampler_values_work_or_say_why(cfg, temperature, top_k, top_p, min_p):
    """Settings are refused with one line, or give a proper distribution (or the guidance-overflow line)."""
    try:
        s = SamplerSettings(0, cfg, temperature, top_k, top_p, min_p)
    except SSDError as err:
        one_line(err)
        return
    torch.manual_seed(0)
    raw = torch.randn(2, 3, 16) * 5  # [streams, n, V]
    from ssd_core.sampling import guide

    try:
        logp = log_probs(guide(raw, s.cfg, s.min_p), s, raw=raw)
    except SSDError as err:
        assert "classifier-free guidance with cfg" in one_line(err) and "smaller cfg" in str(err)
        return
    p = logp.exp()
    assert torch.allclose(p.sum(-1), torch.ones(3), atol=1e-4) and bool((p >= 0).all())

# ---- generation inputs ------------------------------------------------------------------------------------
GENERATE_CASES = [
    (dict(prompt="x" * 100_000), ["is not a class of this model", "(100002 characters)"]),
    (dict(prompt="9" * 5000), ["is out of range", "classes 0..2"]),
    (dict(negative_prompt="blurry"), ["takes no negative prompt", "leave it empty"]),
    (dict(cfg=float("nan")), ["cfg must be a number >= 0"]),
    (dict(grid=(0, 3)), ["grid (0, 3)", "at most 3x3"]),
    (dict(window=0, decoder="sjd"), ["window must be a whole number >= 1"]),
]


@pytest.mark.parametrize("kw, words", GENERATE_CASES)
def test_generate_errors_before_sampling(base, monkeypatch, kw, words):
    import ssd_core.api as api

    real = api.decode_batch
    monkeypatch.setattr(api, "decode_batch", lambda *a, **k: pytest.fail("sampling started before the inputs were checked"))
    with pytest.raises(SSDError) as err:
        works(base["model"], **kw)
    text = one_line(err)
    for w in words:
        assert w in text, text
    monkeypatch.setattr(api, "decode_batch", real)
    works(base["model"])


def test_nan_messages_name_their_source(base, tmp_path):
    """The model's logits, the heads' drafts and an overflowing guidance each get their own advice."""
    model, heads = base["model"], base["heads"]
    with pytest.raises(SSDError) as err:
        works(model, cfg=1e39)
    assert "classifier-free guidance with cfg 1e+39 overflowed" in one_line(err) and "smaller cfg" in str(err.value)
    broken = ssd_core.load_heads(base["heads_path"], model)
    with torch.no_grad():
        broken.vertical.fuse.weight.fill_(float("nan"))
        broken.horizontal.fuse.weight.fill_(float("nan"))
    with pytest.raises(SSDError) as err:
        works(model, broken, decoder="ssd", grid=(3, 3))
    assert "the draft heads produced NaN" in one_line(err) and "re-train" in str(err.value)
    emb = model.model.model.embed_tokens.weight
    row = model.spec["class_token_start"] + 1
    saved = emb[row].clone()
    try:
        with torch.no_grad():
            emb[row].fill_(float("nan"))
        with pytest.raises(SSDError) as err:
            works(model, prompt=1)
        assert "the model produced NaN" in one_line(err) and "fp32" in str(err.value)
    finally:
        with torch.no_grad():
            emb[row].copy_(saved)
    works(model, heads, decoder="ssd")


# ---- seeds: the whole integer counts ----------------------------------------------------------------------
@pytest.mark.parametrize("decoder", ["ssd", "sjd", "zipar"])
def test_seeds_differ_above_bit_32(base, decoder):
    model, heads = base["model"], base["heads"]

    def tokens(seed):
        return ssd_core.generate(model, heads if decoder == "ssd" else None, prompt=1, decoder=decoder, seed=seed,
                                 cfg=1.0, temperature=2.0, decode_pixels=False).tokens

    a = tokens(5)
    assert torch.equal(a, tokens(5))
    grids = [a, tokens(5 + 2 ** 32), tokens(0), tokens(2 ** 63), tokens(2 ** 64 - 2), tokens(2 ** 64 - 1)]
    for i in range(len(grids)):
        for j in range(i + 1, len(grids)):
            assert not torch.equal(grids[i], grids[j]), (i, j)


def test_ar_and_exact_keep_their_images(base):
    """ar and ssd-exact still draw the same image for a seed (their noise was always keyed by the whole seed)."""
    model, heads = base["model"], base["heads"]
    ar = ssd_core.generate(model, None, prompt=2, decoder="ar", seed=2 ** 40 + 3, decode_pixels=False).tokens
    exact = ssd_core.generate(model, heads, prompt=2, decoder="ssd-exact", seed=2 ** 40 + 3, decode_pixels=False).tokens
    other = ssd_core.generate(model, None, prompt=2, decoder="ar", seed=3, decode_pixels=False).tokens
    assert torch.equal(ar, exact) and not torch.equal(ar, other)


# ---- the command line ---------------------------------------------------------------------------------------
def _bad_pickle(root):
    path = root / "code.ckpt"
    import pickle

    path.write_bytes(pickle.dumps({"state_dict": os.getcwd}, protocol=2))  # a pickled function: weights_only refuses it
    return path


CLI_CASES = [  # (case, argv with {model} {heads} {tmp} {vqckpt}, words)
    ("device bogus", "generate --model {model} --device bogus", ["unknown device 'bogus'"]),
    ("device cuda", "generate --model {model} --device cuda", ["torch sees no CUDA GPU", "use device cpu"]),
    ("device cuda:7", "generate --model {model} --device cuda:7", ["cuda:7"]),
    ("top_p 0", "generate --model {model} --top-p 0", ["top_p must be in (0, 1]"]),
    ("min_p 1", "generate --model {model} --min-p 1", ["min_p must be in [0, 1)", "0 = off"]),
    ("repair 2", "generate --model {model} --decoder ssd --repair 2", ["--repair must be a whole number from 0 to 1"]),
    ("cfg negative", "generate --model {model} --cfg -2", ["cfg must be a number >= 0"]),
    ("seed not a number", "generate --model {model} --seed abc", ["--seed", "invalid int value"]),
    ("decoder unknown", "generate --model {model} --decoder medusa", ["--decoder", "invalid choice"]),
    ("grid unreadable", "generate --model {model} --grid big", ["grid 'big' is not understood"]),
    ("draft rows 9", "generate --model {model} --draft-rows 9", ["--draft-rows must be a whole number from 0 to 8"]),
    ("bench batch negative", "bench --model {model} --heads {heads} --batch -1", ["--batch must be at least 0"]),
    ("out folder missing", "generate --model {model} --out {tmp}/no/such/x.png", ["folder", "does not exist", "create it"]),
    ("out extension", "generate --model {model} --out {tmp}/x.xyz", ["must end in one of", ".png"]),
    ("trace folder missing", "generate --model {model} --trace {tmp}/no/t.json", ["does not exist"]),
    ("model missing", "generate --model {tmp}/nope", ["does not exist"]),
    ("heads a folder", "generate --model {model} --heads {tmp}", ["is a folder"]),
    ("negative prompt", "generate --model {model} --heads none --decoder ar --negative-prompt blurry",
     ["takes no negative prompt"]),
    ("class out of range", "generate --model {model} --heads none --decoder ar --class 99", ["class 99 is out of range"]),
    ("bench images 0", "bench --model {model} --heads {heads} --images 0", ["--images must be a whole number from 1 to 10000"]),
    ("bench rounds a", "bench --model {model} --heads {heads} --ssd-rounds a", ["--ssd-rounds 'a' is not a comma list"]),
    ("bench rounds 9", "bench --model {model} --heads {heads} --ssd-rounds 0,9", ["--ssd-rounds must be a whole number from 0 to 8"]),
    ("bench decoders", "bench --model {model} --heads {heads} --decoders ar,medusa", ["unknown decoder 'medusa'"]),
    ("bench json folder", "bench --model {model} --heads {heads} --json {tmp}/no/b.json", ["does not exist"]),
    ("bench out-dir a file", "bench --model {model} --heads {heads} --out-dir {heads}", ["is a file"]),
    ("bench negative prompt", "bench --model {model} --heads {heads} --negative-prompt x", ["takes no negative prompt"]),
    ("train samples 0", "train-heads --model {model} --out {tmp}/h.safetensors --samples 0", ["samples must be a whole number >= 1"]),
    ("train epochs 0", "train-heads --model {model} --out {tmp}/h.safetensors --epochs 0", ["epochs must be"]),
    ("train batch 0", "train-heads --model {model} --out {tmp}/h.safetensors --batch 0", ["batch_grids must be"]),
    ("train lr nan", "train-heads --model {model} --out {tmp}/h.safetensors --lr nan", ["lr must be a number > 0"]),
    ("train out .pt", "train-heads --model {model} --out {tmp}/h.pt", ["must end in one of .safetensors"]),
    ("train grids missing", "train-heads --model {model} --out {tmp}/h.safetensors --grids {tmp}/g.safetensors",
     ["--grids", "is not a file"]),
    ("convert missing", "convert-vqgan {tmp}/none.ckpt {tmp}/v.safetensors", ["checkpoint not found"]),
    ("convert a folder", "convert-vqgan {tmp} {tmp}/v.safetensors", ["is a folder"]),
    ("convert pickled code", "convert-vqgan {vqckpt} {tmp}/v.safetensors", ["weights_only", "If you trust the file"]),
    ("convert bad out", "convert-vqgan {vqckpt} {tmp}/v.bin", ["must end in .safetensors"]),
]


@pytest.fixture
def no_sampling(monkeypatch):
    import ssd_core.api as api
    import ssd_core.training.data as train

    stop = lambda *a, **k: pytest.fail("sampling started before the command line was checked")  # noqa: E731
    monkeypatch.setattr(api, "decode_batch", stop)
    monkeypatch.setattr(train, "generate_grids", stop)


@pytest.mark.parametrize("case, argv, words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_errors(base, tmp_path, capsys, no_sampling, case, argv, words):
    if (case == "device cuda:7" and torch.cuda.device_count() > 7) or (case == "device cuda" and torch.cuda.is_available()):
        pytest.skip("this machine has that GPU")
    fill = dict(model=base["folder"], heads=base["heads_path"], tmp=tmp_path, vqckpt=_bad_pickle(tmp_path))
    try:
        code = cli.main([a.format(**fill) for a in argv.split()])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    lines = [x for x in capsys.readouterr().err.strip().splitlines() if "Loading weights" not in x]  # transformers' bar
    err = "\n".join(lines)
    assert code == 2, err
    assert len(lines) == 1 and err.startswith("error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_cli_errors_from_the_real_entry_point(base, tmp_path):
    """As a user runs it: no traceback, one line, exit code 2."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for argv in (["bench", "--model", base["folder"], "--images", "0"],):
        out = subprocess.run([sys.executable, "-m", "ssd_core", *map(str, argv)], cwd=ROOT, capture_output=True,
                             text=True, env=env, timeout=300)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error:"), out.stderr


def test_cli_and_api_agree_on_class_names_empty(base, tmp_path, capsys):
    folder = shutil.copytree(base["folder"], tmp_path / "model")
    spec_edit(class_names=[])(folder, base["root"])
    assert cli.main(["generate", "--model", str(folder), "--heads", "none", "--decoder", "ar", "--class", "2",
                     "--grid", "2x2"]) == 0
    assert cli.main(["generate", "--model", str(folder), "--heads", "none", "--decoder", "ar", "--class", "cat"]) == 2
    assert "prompt 'cat' is not a class of this model" in capsys.readouterr().err


# ---- the nodes ------------------------------------------------------------------------------------------------
PACK = "comfyui_ssd_pack"


@pytest.fixture(scope="module")
def pack(base, tmp_path_factory):
    """The pack imported as ComfyUI does, with the tiny model (and a class_names [] twin) on SSD_MODEL links."""
    if PACK not in sys.modules:
        spec = importlib.util.spec_from_file_location(PACK, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[PACK] = mod
        spec.loader.exec_module(mod)
    core = importlib.import_module(PACK + ".ssd_core")
    loaders = importlib.import_module(PACK + ".nodes.loaders")
    sampler = importlib.import_module(PACK + ".nodes.sampler")
    model = core.load_model(base["folder"])
    heads = core.load_heads(base["heads_path"], model)
    unnamed = tmp_path_factory.mktemp("unnamed") / "model"
    shutil.copytree(base["folder"], unnamed)
    spec_edit(class_names=[])(unnamed, base["root"])
    return {"core": core, "sampler": sampler.SSDSampler(),
            "model": loaders.SSDModel(model, heads, "tiny", "tiny-heads"),
            "unnamed": loaders.SSDModel(core.load_model(unnamed), None, "unnamed", "none")}


def node_sample(pack, which="model", **kw):
    args = dict(prompt="1", decoder="ar", grid="2x2", seed=0)
    args.update(kw)
    return pack["sampler"].sample(pack[which], **args)


NODE_CASES = [
    (dict(cfg=-0.5), ["cfg -0.5 is negative", "-1 for the model's default"]),
    (dict(temperature=-2.0), ["temperature -2.0 is negative"]),
    (dict(top_k=-3), ["top_k -3 is negative"]),
    (dict(top_p=-0.25), ["top_p -0.25 is negative"]),
    (dict(top_p=0.0), ["top_p must be in (0, 1]"]),
    (dict(min_p=-0.5), ["min_p -0.5 is negative"]),
    (dict(min_p=1.5), ["min_p must be in [0, 1)"]),
    (dict(negative_prompt="blurry"), ["takes no negative prompt"]),
    (dict(decoder="medusa"), ["unknown decoder 'medusa'"]),
    (dict(grid="huge"), ["grid 'huge' is not understood"]),
    (dict(grid="9x9"), ["9x9", "at most 3x3"]),
    (dict(prompt="z" * 100_000), ["is not a class of this model", "characters)"]),
    (dict(prompt="7"), ["class 7 is out of range"]),
]


@pytest.mark.parametrize("kw, words", NODE_CASES)
def test_node_input_errors(pack, kw, words):
    with pytest.raises(pack["core"].SSDError) as err:
        node_sample(pack, **kw)
    text = one_line(err)
    for w in words:
        assert w in text, text
    node_sample(pack)  # the model stays usable


def test_node_minus_one_means_the_model_default(pack):
    out = node_sample(pack, cfg=-1, temperature=-1, top_k=-1, top_p=-1, min_p=-1)
    settings = out["result"][1]["settings"]
    d = pack["model"].model.defaults
    assert settings["cfg"] == d["cfg"] and settings["top_k"] == d["top_k"] and math.isclose(settings["top_p"], d["top_p"])
    assert settings["min_p"] == d["min_p"]


def test_node_class_names_empty_behaves_like_the_cli(pack):
    out = node_sample(pack, "unnamed", prompt="2")
    assert out["result"][1]["grid"] == [2, 2]
    with pytest.raises(pack["core"].SSDError, match="prompt 'cat' is not a class of this model"):
        node_sample(pack, "unnamed", prompt="cat")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=st.one_of(st.just(-1.0), st.floats(-5, 20)), top_k=st.integers(-4, 30),
       top_p=st.one_of(st.just(-1.0), st.floats(-2, 1.5)))
def test_node_sampler_values_work_or_say_why(pack, cfg, top_k, top_p):
    """Random widget values: a run, or one line; a negative other than -1 is never silently replaced."""
    try:
        out = node_sample(pack, cfg=cfg, top_k=top_k, top_p=top_p)
    except pack["core"].SSDError as err:
        one_line(err)
        assert (cfg < 0 and cfg != -1) or (top_k < 0 and top_k != -1) or (top_p < 0 and top_p != -1) or \
            top_p == 0 or top_p > 1
        return
    s = out["result"][1]["settings"]
    assert s["cfg"] == (pack["model"].model.defaults["cfg"] if cfg == -1 else cfg)
