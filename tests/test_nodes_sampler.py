"""The sampler and loader nodes with the bundled model and the tiny real families: outputs, errors, progress,
previews, live events and cancel (through stand-ins for ComfyUI's modules)."""
import json

import pytest
import torch

from conftest import SMALL, load_pack, pack_module, run

nodes = load_pack()
core = pack_module("ssd_core")
devices_glue = pack_module("nodes._devices")
sampler_mod = pack_module("nodes.sampler")


# ---- the bundled model through the nodes ----------------------------------------------------------------------
def test_loaders(ref):
    assert isinstance(ref, nodes.SSDModel)
    assert ref.model.family == "llama-grid" and ref.heads is not None
    (bare,) = nodes.SSDLoadHeads().load(ref, "none")
    assert bare.heads is None and ref.heads is not None, "the cached input must not change"
    with pytest.raises(core.SSDError, match="Load AR Image Model"):
        nodes.SSDLoadHeads().load("not a model", "reference")


def test_sampler_ar_and_ssd(ref):
    # at SMALL: the outputs' form does not depend on the grid; "auto" giving the model's own grid through the node is
    # test_heads_of_another_model_are_refused's (a tiny 4x5 model)
    H, W = map(int, SMALL.split("x"))
    ar = run(ref, decoder="ar", grid=SMALL)
    ssd = run(ref, decoder="ssd", grid=SMALL)
    for out in (ar, ssd):
        image, trace, stats = out["result"]
        assert image.dtype == torch.float32 and image.dim() == 4 and image.shape[0] == 1 and image.shape[3] == 3
        assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
        assert trace["grid"] == [H, W] and len(trace["status"]) == H
        small = out["ui"]["ssd_trace"][0]
        assert len(small["status"]) == H * W and small["done"] is True
        assert len(small["step"]) == H * W and len(small["round"]) == H * W
        json.dumps(out["ui"], allow_nan=False)  # browsers refuse Infinity / NaN
        assert f"{H}x{W}" in stats and "steps" in stats and "seed 7" in stats
    assert ar["result"][1]["steps"] in (H * W - 1, H * W)  # the prefill may write the first token
    assert ssd["result"][1]["steps"] < ar["result"][1]["steps"]
    assert ssd["result"][1]["counts"].get("accepted", 0) > 0
    head, detail = ssd["result"][2].split("\n")  # the headline in an artist's words, then the numbers
    assert head.startswith("ssd: ") and "x fewer model steps than one token at a time" in head
    assert detail.startswith("details: ") and "drafted right" in detail
    assert ar["result"][2].startswith("ar: one token at a time")
    assert set(ar["ui"]["ssd_trace"][0]["status"]) == {"1"}


EXACT_GRID = "8x8"  # the node's ssd-exact == ar checks (exactness on every grid: test_engine_exact)


@pytest.fixture(scope="module")
def ar_runs(ref):
    """The node's ar run at EXACT_GRID for a seed (prompt face), made once: the exactness and seed test and the
    batch test compare with the same runs."""
    runs = {}

    def of(seed):
        if seed not in runs:
            runs[seed] = run(ref, decoder="ar", seed=seed, grid=EXACT_GRID)
        return runs[seed]

    return of


def test_sampler_exact_matches_ar_and_seed_matters(ref, ar_runs):
    ar = ar_runs(11)
    exact = run(ref, decoder="ssd-exact", seed=11, draft_rows=2, grid=EXACT_GRID)
    assert exact["result"][1]["tokens"] == ar["result"][1]["tokens"]
    assert torch.equal(exact["result"][0], ar["result"][0])
    other = ar_runs(12)
    assert other["result"][1]["tokens"] != ar["result"][1]["tokens"]


@pytest.mark.parametrize("decoder", ["sjd", "zipar"])
def test_sampler_peers_without_heads(ref_model, decoder):
    out = run(ref_model, decoder=decoder, grid="6x6")  # the decoder runs without heads: any grid says so
    assert out["result"][1]["decoder"] == decoder


def test_sampler_passes_settings_and_class_names(ref_model, monkeypatch):
    ref = ref_model
    seen = []
    real = core.generate

    class Seen(Exception):
        pass

    def spy(*a, **kw):
        seen.append(kw)
        if kw["decoder"] == "sjd":  # only what the node passes on is read: the run itself is not made
            raise Seen
        return real(*a, **kw)

    monkeypatch.setattr(sampler_mod.ssd_core, "generate", spy)
    # 8x8: at seed 7 heart's image differs from each other class's in 60+ of its 64 cells
    by_name = run(ref, prompt="heart", cfg=-1, temperature=-1, top_k=-1, top_p=-1, grid="8x8", decoder="ar")
    with pytest.raises(Seen):
        run(ref, decoder="sjd", prompt="1", cfg=2.5, temperature=0.0, top_k=5, top_p=0.9, draft_rows=2,
            verify_rounds=0, grid="8x8", min_p=0.05)
    by_index = run(ref, prompt=" 1 ", grid="8x8", decoder="ar")
    a, b, _ = seen
    # the text goes on as typed; the family reads a class name or index from it (heart is class 1)
    assert a["prompt"] == "heart" and b["prompt"] == "1"
    assert by_name["result"][1]["tokens"] == by_index["result"][1]["tokens"]
    assert (a["cfg"], a["temperature"], a["top_k"], a["top_p"], a["min_p"]) == (None,) * 5
    assert a["grid"] == b["grid"] == (8, 8)
    assert (b["cfg"], b["temperature"], b["top_k"], b["top_p"], b["min_p"]) == (2.5, 0.0, 5, 0.9, 0.05)
    assert (b["params"].draft_rows, b["params"].verify_rounds) == (2, 0)
    assert callable(a["on_step"]) and callable(a["should_cancel"])
    big = run(ref, decoder="ar", grid="4x4", seed=0xFFFFFFFFFFFFFFFF)  # the widget's largest seed
    assert big["result"][1]["seed"] == 0xFFFFFFFFFFFFFFFF


def test_verify_rounds_auto_runs_the_models_own_rounds():
    """verify_rounds -1 (the widget's default, shown as auto) runs ssd at the model's own decoder_defaults: the
    bundled 48x48 model's 3 rounds and adaptive 10%; a number set on the widget wins, the rest stays the model's."""
    from conftest import heads_missing
    if heads_missing():
        pytest.skip(heads_missing())
    (bare,) = nodes.SSDLoadModel().load("reference-48", "auto", "cpu")
    (m,) = nodes.SSDLoadHeads().load(bare, "reference-48")
    assert m.model.decoder_defaults["ssd"] == {"verify_rounds": 3, "adaptive_percent": 10}
    auto = run(m, decoder="ssd", grid="4x4")["result"][1]["settings"]
    assert (auto["verify_rounds"], auto["adaptive_percent"]) == (3, 10)
    two = run(m, decoder="ssd", grid="4x4", verify_rounds=2)["result"][1]["settings"]
    assert (two["verify_rounds"], two["adaptive_percent"]) == (2, 10)
    with pytest.raises(core.SSDError, match="verify_rounds must be a whole number from 0 to 8, got -2"):
        run(m, decoder="ssd", grid="4x4", verify_rounds=-2)  # only -1 means auto


def test_sampler_grid_option(ref_model):
    small = run(ref_model, decoder="zipar", grid="8x8")
    wide = run(ref_model, decoder="zipar", grid="8x12")
    assert small["result"][1]["grid"] == [8, 8] and wide["result"][1]["grid"] == [8, 12]
    assert small["result"][0].shape[1] == wide["result"][0].shape[1]
    assert small["result"][0].shape[2] * 12 == wide["result"][0].shape[2] * 8


@pytest.mark.parametrize("kw, match", [
    (dict(prompt="unicorn-class-that-does-not-exist"), "not a class"),
    (dict(prompt="999"), "out of range"),
    (dict(negative_prompt="blurry"), "no negative prompt"),
    (dict(decoder="beam"), "unknown decoder"),
    (dict(grid="huge"), "grid"),
    (dict(grid="4096x4096"), "grid"),
])
def test_sampler_errors_say_what_to_do(ref_model, kw, match):
    with pytest.raises(ValueError, match=match):
        run(ref_model, **{"decoder": "ar", **kw})


@pytest.mark.parametrize("kw, says", [
    (dict(negative_prompt="blurry"), "this model (reference) takes no negative prompt"),
    (dict(grid="88x88"), "reference cannot make an 88x88 token grid"),
    (dict(decoder="flashar"), "this model is reference:"),
])
def test_errors_name_the_model_as_the_user_picked_it(ref_model, kw, says):
    """The bundled model is 'reference' in every message (issue 41: 'this model is llama-grid'), with the article
    its words take."""
    with pytest.raises(core.SSDError) as err:
        run(ref_model, **{"decoder": "ar", **kw})
    assert says in str(err.value) and "llama-grid" not in str(err.value), str(err.value)


def test_sampler_needs_heads_for_ssd(ref_model):
    (bare,) = nodes.SSDLoadHeads().load(ref_model, "none")
    with pytest.raises(core.SSDError, match="Load SSD Heads"):
        run(bare, decoder="ssd")
    with pytest.raises(core.SSDError, match="Load AR Image Model"):
        run("nothing")


def test_bad_heads_file_is_refused(ref_model, tmp_path, monkeypatch):
    ref = ref_model
    (tmp_path / "broken.safetensors").write_bytes(b"this is not a safetensors file" * 10)
    monkeypatch.setenv("SSD_HEADS_DIR", str(tmp_path))
    with pytest.raises(ValueError):
        nodes.SSDLoadHeads().load(ref, "broken.safetensors")
    assert run(ref, decoder="ar", grid="4x4")["result"][1]["steps"] > 0  # nothing else broke (any grid shows it)


def test_heads_of_another_model_are_refused(ref, tmp_path, monkeypatch):
    make_llama_grid = pytest.importorskip("tiny", reason="tests/tiny.py (the engine's tiny-model builders) is absent").make_llama_grid

    folder = make_llama_grid(tmp_path / "models" / "tiny", grid=(4, 5))
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path / "models"))
    (tiny,) = nodes.SSDLoadModel().load("tiny", "float32", "cpu")
    assert tiny.model.family == "llama-grid" and tiny.name == "tiny"
    with pytest.raises(core.SSDError):
        nodes.SSDLoadHeads().load(tiny, "reference")
    out = run(nodes.SSDLoadHeads().load(tiny, "none")[0], prompt="class1", decoder="ar")
    assert out["result"][1]["grid"] == [4, 5]
    # no pixel decoder in this model: the IMAGE is the token grid, and the stats say so
    assert out["result"][0].shape == (1, 4 * 102, 5 * 102, 3) and "no pixel decoder" in out["result"][2]
    assert folder.is_dir()


def test_progress_previews_and_live_events(ref_model, fake_comfy, monkeypatch):
    ref = ref_model
    monkeypatch.setattr(sampler_mod, "PREVIEW_INTERVAL_S", 0.0)
    H, W = 12, 12
    # as ComfyUI runs a V3 node: execute on a class whose hidden inputs hold the node id
    node = nodes.SSDSampler.PREPARE_CLASS_CLONE({"UNIQUE_ID": "12"})
    result = node.execute(ref, prompt="face", seed=7, decoder="zipar", grid=SMALL)
    assert isinstance(result, nodes.io.NodeOutput)
    out = {"result": result.args, "ui": result.ui}
    values = [v for v, _ in fake_comfy.progress]
    assert values == sorted(values) and values[-1] == H * W
    assert all(t == H * W for _, t in fake_comfy.progress)
    assert fake_comfy.previews, "no preview image"
    kind, img, size = fake_comfy.previews[-1]
    final_img = out["result"][0]
    assert img.size == (final_img.shape[2], final_img.shape[1])
    assert kind == "JPEG" and size == max(img.size)  # ComfyUI fits a preview to `size`: it shows the real size
    grid_events = [d for e, d, sid in fake_comfy.events if e == "ssd.grid"]
    assert all(sid == "client-1" for _, _, sid in fake_comfy.events)
    assert len(grid_events) >= 2 and all(d["node"] == "12" for d in grid_events)
    assert grid_events[0]["done"] is False and len(grid_events[0]["status"]) == H * W
    assert grid_events[-1]["done"] is True and grid_events[-1] == {**out["ui"]["ssd_trace"][0], "node": "12"}


def test_sampler_batch_gives_an_image_batch_and_a_trace_per_image(ref, ar_runs, fake_comfy):
    out = run(ref, decoder="ssd-exact", grid=EXACT_GRID, seed=11, batch_size=3)
    live = [d for e, d, _ in fake_comfy.events if e == "ssd.grid" and not d["done"]]
    assert live and all(d["images"] == 3 for d in live) and {d["image"] for d in live} == {0, 1, 2}
    values = [v for v, _ in fake_comfy.progress]
    assert values == sorted(values) and values[-1] == 3 * 8 * 8
    images, traces, stats = out["result"]
    assert images.shape[0] == 3 and isinstance(traces, list) and len(traces) == 3
    assert [t["seed"] for t in traces] == [11, 12, 13]
    lines = stats.splitlines()  # the batch's time once, then each image's headline (no time) and details
    assert len(lines) == 7 and lines[0].startswith("batch of 3 images: ") and "for all of them" in lines[0]
    assert [ln.split(":")[0] for ln in lines[1::2]] == ["image 1", "image 2", "image 3"]
    assert all("same image as plain AR" in ln for ln in lines[1::2]) and "seed 13" in lines[6]
    for i, t in enumerate(traces):  # every image is its own single run (ssd-exact = ar for its seed)
        alone = ar_runs(11 + i)
        assert t["tokens"] == alone["result"][1]["tokens"]
        assert torch.equal(images[i:i + 1], alone["result"][0])
    small = out["ui"]["ssd_trace"]
    assert [s["image"] for s in small] == [0, 1, 2] and all(s["images"] == 3 for s in small)
    (all_grids,) = nodes.SSDTraceToImage().render(traces, 4, "status", True, -1)
    (one,) = nodes.SSDTraceToImage().render(traces, 4, "status", True, 1)
    assert all_grids.shape == (3, 32, 32, 3) and torch.equal(one[0], all_grids[1])
    with pytest.raises(ValueError, match="past the batch of 3"):
        nodes.SSDTraceToImage().render(traces, 4, "status", True, 3)
    with pytest.raises(core.SSDError, match="batch_size"):
        run(ref, decoder="ar", grid=EXACT_GRID, batch_size=pack_module("ssd_core.api").MAX_BATCH + 1)


def test_cancel_raises_comfy_interrupt_and_model_stays_usable(ref_model, fake_comfy):
    ref = ref_model
    fake_comfy.interrupt_after = 3
    with pytest.raises(fake_comfy.InterruptProcessingException):
        run(ref, decoder="ar")
    fake_comfy.interrupt_after = None
    assert run(ref, decoder="ar", grid="4x4")["result"][1]["steps"] > 0  # usable again (any grid shows it)


def test_cancel_outside_comfyui(ref_model, monkeypatch):
    ref = ref_model
    monkeypatch.setattr(devices_glue, "processing_interrupted", lambda: True)
    with pytest.raises(InterruptedError):
        run(ref, decoder="ar")



# ---- the real families (tiny random models built like the real ones) ----------------------------------------------
@pytest.mark.parametrize("family", ["janus", "emu3", "lumina"])
def test_text_families_through_the_nodes(family, tmp_path, monkeypatch):
    tf = pytest.importorskip("tiny_families", reason="tests/tiny_families.py (the engine's builders) is absent")

    folder = tmp_path / "ssd_models" / f"tiny-{family}"
    {"janus": tf.build_janus, "emu3": tf.build_emu3, "lumina": tf.build_lumina}[family](folder)
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path / "ssd_models"))
    assert f"tiny-{family}" in nodes.SSDLoadModel.INPUT_TYPES()["required"]["model"][1]["options"]
    (m,) = nodes.SSDLoadModel().load(f"tiny-{family}", "float32", "cpu")
    assert m.model.family == family and m.model.text_prompts and m.model.class_names is None
    negative = "blurry" if m.model.negative_prompts else ""
    # zipar: no heads needed and few steps (these tiny models are slow enough on a busy CPU)
    out = run(m, prompt="a red fox in the snow", negative_prompt=negative, decoder="zipar", seed=3)
    image, trace, stats = out["result"]
    H, W = trace["grid"]
    assert trace["decoder"] == "zipar" and f"{H}x{W}" in stats
    assert image.shape[0] == 1 and image.shape[3] == 3 and image.dtype == torch.float32
    assert len(out["ui"]["ssd_trace"][0]["status"]) == H * W
    if not m.model.negative_prompts:
        with pytest.raises(core.SSDError, match="no negative prompt"):
            run(m, prompt="a fox", negative_prompt="blurry", decoder="zipar")
