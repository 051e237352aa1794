"""Loading for consumer GPUs: quantization (bitsandbytes) and offload (accelerate) choices reach
from_pretrained, the modules the engine reads stay in full precision, and a choice that cannot work here is
a clear SSDError. Where bitsandbytes runs (>= 0.50 runs on the CPU), ssd-exact still equals ar quantized."""
import importlib.util

import pytest
import torch

import ssd_core
import tiny_families
from ssd_core import memory, static_cache
from tiny import make_llama_grid
from tiny_families import build_emu3, build_janus, build_lumina

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
BUILDERS = {"janus": build_janus, "emu3": build_emu3, "lumina": build_lumina}
# bitsandbytes quantizes in blocks of 64 inputs: the quantized tests' models are the smallest whose quantized
# layers all take a multiple of 64 (the family tests' hidden size of 32 fails under bitsandbytes)
BNB_BLOCK = 64


@pytest.fixture(scope="module")
def grid_folder(tmp_path_factory):
    return make_llama_grid(tmp_path_factory.mktemp("q") / "model", grid=(4, 5), row_end=True, hidden=BNB_BLOCK)


def janus_folder(folder, monkeypatch):
    """The tiny Janus at hidden size 64 (its vision tower and aligners too)."""
    monkeypatch.setattr(tiny_families, "HIDDEN", BNB_BLOCK)
    monkeypatch.setattr(tiny_families, "FFN", 2 * BNB_BLOCK)
    return build_janus(folder)


def quantized_linears(model, family):
    """(name, in_features) of the Linear layers bitsandbytes would quantize (all but KEEP_FULL's)."""
    keep = memory.KEEP_FULL[family]
    return [(n, m.in_features) for n, m in model.model.named_modules() if isinstance(m, torch.nn.Linear)
            and not any(n == k or n.startswith(k + ".") for k in keep)]


def test_the_quantized_tests_models_fit_bitsandbytes_blocks(grid_folder, tmp_path, monkeypatch):
    for family, folder in (("llama-grid", grid_folder), ("janus", janus_folder(tmp_path / "janus", monkeypatch))):
        layers = quantized_linears(ssd_core.load_model(folder, dtype="fp32"), family)
        assert layers and all(n % BNB_BLOCK == 0 for _, n in layers), (family, layers)


@pytest.mark.parametrize("quantization", ["8-bit", "4-bit"])
@pytest.mark.parametrize("family", ["llama-grid", "janus", "emu3", "lumina"])
def test_config_keeps_the_image_head_and_pixel_decoder_in_full_precision(family, quantization):
    cfg = memory.bnb_config(quantization, family, torch.bfloat16)
    assert cfg.load_in_8bit == (quantization == "8-bit") and cfg.load_in_4bit == (quantization == "4-bit")
    if quantization == "4-bit":
        assert cfg.bnb_4bit_quant_type == "nf4" and cfg.bnb_4bit_compute_dtype == torch.bfloat16
    assert cfg.llm_int8_skip_modules == memory.KEEP_FULL[family]


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina"])
def test_kept_module_names_exist_in_the_real_classes(family, tmp_path):
    """Every kept name is a module of the family's transformers model, and the head the engine slices is
    among the kept ones (a renamed module in a new transformers would otherwise be quantized)."""
    model = ssd_core.load_model(BUILDERS[family](tmp_path / family), dtype="fp32")
    names = {name for name, _ in model.model.named_modules()}
    kept = memory.KEEP_FULL[family]
    assert set(kept) <= names
    head = {"janus": "model.generation_head", "emu3": "lm_head", "lumina": "lm_head"}[family]
    assert head in kept


def test_bad_choices_and_offload_on_the_cpu_are_refused(grid_folder):
    with pytest.raises(ssd_core.SSDError, match="choose one of none, 8-bit, 4-bit"):
        ssd_core.load_model(grid_folder, quantization="2-bit")
    with pytest.raises(ssd_core.SSDError, match="choose one of none, auto"):
        ssd_core.load_model(grid_folder, offload="disk")
    with pytest.raises(ssd_core.SSDError, match="needs a CUDA device.*offload none"):
        ssd_core.load_model(grid_folder, offload="auto", device="cpu")


@pytest.mark.skipif(HAS_BNB, reason="bitsandbytes is installed here")
@pytest.mark.parametrize("quantization", ["8-bit", "4-bit"])
def test_quantization_without_bitsandbytes_names_what_to_install(grid_folder, quantization):
    with pytest.raises(ssd_core.SSDError, match="pip install bitsandbytes.*quantization none"):
        ssd_core.load_model(grid_folder, quantization=quantization)


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed (pip install bitsandbytes>=0.50 runs on the CPU)")
@pytest.mark.parametrize("quantization", ["8-bit", "4-bit"])
def test_quantized_model_runs_ssd_exact_equal_to_ar(grid_folder, quantization):
    import bitsandbytes as bnb

    model = ssd_core.load_model(grid_folder, quantization=quantization)
    layer = model.model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, bnb.nn.Linear8bitLt if quantization == "8-bit" else bnb.nn.Linear4bit)
    assert type(model.model.lm_head) is torch.nn.Linear  # the head the engine slices
    assert memory.is_placed(model.model)
    for seed, cfg in [(0, 1.0), (1, 3.0)]:
        ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=seed, cfg=cfg, score=False)
        for rows in (1, 3):
            ex = ssd_core.generate(model, None, prompt=1, decoder="ssd-exact", seed=seed, cfg=cfg, draft_rows=rows,
                                   score=False)
            assert torch.equal(ex.tokens, ar.tokens), (seed, rows)
    static_cache.enable(model, "compiled")  # bitsandbytes' layers break a compiled graph: static, said in the log
    assert static_cache.mode_of(model) == "static"
    static_cache.enable(model, "off")


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed")
def test_quantized_janus_keeps_its_generation_head(tmp_path, monkeypatch):
    import bitsandbytes as bnb

    model = ssd_core.load_model(janus_folder(tmp_path / "janus", monkeypatch), quantization="4-bit")
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.model.model.language_model.modules())
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in model.model.model.generation_head.modules())
    ar = ssd_core.generate(model, None, prompt="a red cat", decoder="ar", seed=2, score=False)
    ex = ssd_core.generate(model, None, prompt="a red cat", decoder="ssd-exact", seed=2, draft_rows=2, score=False)
    assert torch.equal(ex.tokens, ar.tokens)


def test_weights_table_counts_the_released_shapes():
    """Meta-device counts of the released configs (no download): the parameter counts of the model cards."""
    from tools.memory_table import released_counts

    janus7 = released_counts("Janus-Pro-7B")
    assert 7.3e9 < janus7["params"] < 7.5e9
    assert janus7["none"] > janus7["8-bit"] > janus7["4-bit"] > janus7["none"] / 4
    assert 2.0e9 < released_counts("Janus-Pro-1B")["params"] < 2.2e9


@pytest.mark.parametrize("bits", [8, 4])
def test_compiled_falls_back_to_static_for_a_quantized_model(grid_folder, bits, caplog):
    """A model as transformers leaves a bitsandbytes load (its quantizer's after-loading step run on it and the
    quantizer attached; its layers stay nn.Linear when bitsandbytes is absent): compile 'compiled' runs it
    with the static cache uncompiled and says so in the log; the plain model compiles."""
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer

    model = ssd_core.load_model(grid_folder, dtype="fp32", compile="compiled")
    assert static_cache.mode_of(model) == "compiled" and static_cache.unsupported_compile(model.model) is None
    quantizer = AutoHfQuantizer.from_config(BitsAndBytesConfig(**{f"load_in_{bits}bit": True}), pre_quantized=False)
    quantizer.postprocess_model(model.model)
    model.model.hf_quantizer = quantizer
    assert getattr(model.model, f"is_loaded_in_{bits}bit")
    with caplog.at_level("WARNING", logger="ssd_core.static_cache"):
        static_cache.enable(model, "compiled")
    assert static_cache.mode_of(model) == "static"
    assert "quantized (bitsandbytes)" in caplog.text and "compile 'static'" in caplog.text
    ar = ssd_core.generate(model, None, prompt=1, decoder="ar", seed=0, score=False, decode_pixels=False)
    assert tuple(ar.tokens.shape) == (4, 5)


# ---- dtype 'auto' on the GPUs and Macs artists use -------------------------------------------------------------
NATIVE, EMULATED, NONE = "native", "emulated", "none"  # a GPU's bf16: sm80+ / only emulated (T4, V100) / none


@pytest.mark.parametrize("device, bf16, major, expected", [
    ("cuda", NATIVE, 8, torch.bfloat16),  # Ampere and newer
    ("cuda:1", EMULATED, 7, torch.float16),  # Turing / Volta: torch emulates bf16 there, slowly
    ("cuda", NONE, 7, torch.float16),
    ("cuda", EMULATED, 6, torch.float32),  # Pascal: fp16 at a fraction of fp32's speed
    ("mps", None, None, torch.float16),  # Apple GPUs, any macOS
    ("cpu", None, None, torch.float32),
])
def test_auto_dtype_fits_the_device(monkeypatch, device, bf16, major, expected):
    from ssd_core.api import resolve_dtype

    asked = []

    def is_bf16_supported(including_emulation=True):  # torch.cuda's, as each kind of GPU answers it
        asked.append(including_emulation)
        return bf16 == NATIVE or (bf16 == EMULATED and including_emulation)

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 5))
    assert resolve_dtype("auto", device) == expected and resolve_dtype(None, device) == expected
    assert len(asked) == (2 if device.startswith("cuda") else 0)
    for name, chosen in (("fp32", torch.float32), ("bf16", torch.bfloat16), (torch.float16, torch.float16)):
        assert resolve_dtype(name, device) == chosen  # a dtype the user names is kept
