"""The image head under accelerate's offload, and its image rows read without a copy per step.

Offload (memory.py's offload auto: a device_map with cpu / disk entries) keeps a module's weights on the meta
device and loads them in accelerate's pre-forward hook, so a head read as `head.weight` instead of called
crashed (`Tensor on device cpu is not on the expected device meta`). Here the real hooks do it on the CPU: a
device_map whose head and last decoder layer are "disk" (with an offload_folder) loads those weights on the
meta device, exactly as a GPU's cpu entries do, and generation must give the very tokens of the plain model.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ssd_core
from ssd_core import static_cache
from ssd_core.families.base import ImageRowsHead, as_rows
from tiny import make_llama_grid
from tiny_families import build_emu3, build_janus, build_lumina

pytestmark = pytest.mark.engine457  # also run under transformers 4.57 (make test-engine-457)

BUILDERS = {"llama-grid": lambda f: make_llama_grid(f, grid=(3, 4), row_end=True),
            "janus": build_janus, "emu3": build_emu3, "lumina": build_lumina}
HEAD = {"llama-grid": "lm_head", "janus": "model.generation_head", "emu3": "lm_head", "lumina": "lm_head"}
PROMPT = {"llama-grid": 1, "janus": "a red cat", "emu3": "a red cat", "lumina": "a red cat"}
GRID = {"llama-grid": (3, 4), "janus": None, "emu3": (3, 4), "lumina": (4, 4)}


def offload_map(plain, family: str) -> dict:
    """A device_map of `plain`'s modules: the image head and the last decoder layer on "disk", the rest "cpu"
    (every module that holds one of those two is split into its children)."""
    layers = [n for n, m in plain.model.named_modules() if isinstance(m, torch.nn.ModuleList) and n.endswith("layers")
              and plain.backbone() is plain.model.get_submodule(n.rsplit(".", 1)[0] if "." in n else "")]
    assert len(layers) == 1, layers
    off = {HEAD[family], f"{layers[0]}.{len(plain.model.get_submodule(layers[0])) - 1}"}
    out = {}

    def place(module, prefix):
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if full in off:
                out[full] = "disk"
            elif any(t.startswith(full + ".") for t in off):
                place(child, full + ".")
            else:
                out[full] = "cpu"
        for name, _ in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            out[f"{prefix}{name}"] = "cpu"

    place(plain.model, "")
    return out


def tokens(model, decoder, family, heads=None, seed=1):
    return ssd_core.generate(model, heads, prompt=PROMPT[family], decoder=decoder, seed=seed, grid=GRID[family],
                             draft_rows=2, decode_pixels=False, score=False).tokens


def plain_and_offloaded(family, root):
    """The plain fp32 model, and the same folder loaded with its head and last layer offloaded to disk."""
    folder = BUILDERS[family](root / "model")
    plain = ssd_core.load_model(folder, dtype="fp32")
    offloaded = ssd_core.load_model(folder, dtype="fp32", device_map=offload_map(plain, family),
                                    offload_folder=str(root / "offload"))
    return plain, offloaded


@pytest.fixture(scope="module", params=list(BUILDERS))
def pair(request, tmp_path_factory):
    family = request.param
    return (family, *plain_and_offloaded(family, tmp_path_factory.mktemp(family.replace("-", "_"))))


def test_offloaded_head_generates_the_tokens_of_the_plain_model(pair):
    family, plain, offloaded = pair
    head = offloaded.model.get_submodule(HEAD[family])
    assert {p.device.type for p in head.parameters()} == {"meta"} and hasattr(head, "_hf_hook")  # loaded per call
    assert "disk" in set(offloaded.model.hf_device_map.values())
    torch.manual_seed(0)
    heads = ssd_core.DraftHeads.for_model(plain)
    ar = tokens(offloaded, "ar", family)
    assert torch.equal(ar, tokens(plain, "ar", family))
    assert torch.equal(tokens(offloaded, "ssd-exact", family, heads), ar)
    assert {p.device.type for p in head.parameters()} == {"meta"}  # the full head stays offloaded


def test_an_offloaded_model_takes_the_widest_rows_unmeasured(pair, monkeypatch):
    """ssd-exact's default (draft rows 0) times forwards to pick its rows; under offload every forward moves
    weights (flat in the window, slow to time), so it takes calibrate.MAX_ROWS with the heads, unmeasured, and
    the image is still ar's."""
    from ssd_core import calibrate

    family, plain, offloaded = pair
    monkeypatch.setattr(calibrate, "measure", lambda *a: pytest.fail("an offloaded model was timed"))
    heads = ssd_core.DraftHeads.for_model(plain)
    kw = dict(prompt=PROMPT[family], seed=1, grid=GRID[family], decode_pixels=False, score=False)
    r = ssd_core.generate(offloaded, heads, decoder="ssd-exact", **kw)
    assert r.trace.settings["calibration"] == "offload" and r.trace.settings["expected_speedup"] is None
    assert r.trace.settings["draft_rows_picked"] == calibrate.MAX_ROWS and r.trace.settings["heads_used"] is True
    assert torch.equal(r.tokens, ssd_core.generate(offloaded, None, decoder="ar", **kw).tokens)
    assert static_cache.offloaded(plain.model) is None and "disk" in static_cache.offloaded(offloaded.model)


def test_offloaded_head_logits_equal_the_plain_heads(pair):
    family, plain, offloaded = pair
    x = torch.randn(3, plain.hidden_size)
    ref = plain.head_logits(x)
    assert torch.equal(offloaded.head_logits(x), ref)
    assert torch.equal(offloaded.head_logits(x), ref)  # again, from the kept rows


def test_compiled_is_refused_for_an_offloaded_model_and_static_runs_it(pair, caplog):
    family, plain, offloaded = pair
    assert static_cache.unsupported_compile(plain.model) is None
    reason = static_cache.unsupported_compile(offloaded.model)
    assert reason is not None and "offload" in reason
    try:
        with caplog.at_level("WARNING", logger="ssd_core.static_cache"):
            static_cache.enable(offloaded, "compiled")
        assert static_cache.mode_of(offloaded) == "static"
        assert "offload" in caplog.text and "static" in caplog.text
        assert torch.equal(tokens(offloaded, "ar", family), tokens(plain, "ar", family))
    finally:
        static_cache.enable(offloaded, "off")


def test_real_emu3_and_lumina_shapes_put_the_head_first_off_the_gpu():
    """Why this matters: with a GPU budget that forces offload, accelerate's device map of the released Emu3 and
    Lumina-mGPT shapes (meta device, no download) sends lm_head off the GPU first (it is the last module)."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes
    import transformers

    from tools.memory_table import released_config
    from ssd_core.families import family_class

    for name, family in (("Emu3-Gen", "emu3"), ("Lumina-mGPT-7B", "lumina")):
        with torch.device("meta"):
            model = getattr(transformers, family_class(family).transformers_class)(released_config(name))
        model = model.to(torch.bfloat16)
        sizes = compute_module_sizes(model)
        dm = infer_auto_device_map(model, max_memory={0: int(sizes[""] * 0.9), "cpu": 2**40},
                                   no_split_module_classes=model._no_split_modules)
        assert dm["lm_head"] == "cpu", (name, dm.get("lm_head"))


# ---- the image rows: a view, or gathered once ------------------------------------------------------------------
class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def copies(ops):
    return [o for o in ops if o in ("aten.index", "aten.index_select", "aten.clone", "aten._to_copy", "aten.copy_")]


def test_consecutive_rows_are_a_view_of_the_head():
    assert as_rows(torch.tensor([5, 6, 7])) == slice(5, 8)
    assert isinstance(as_rows(torch.tensor([5, 7, 6])), torch.Tensor)
    head = torch.nn.Linear(64, 300)
    rows = ImageRowsHead(torch.arange(100, 132))
    w, b = rows.weights(head)
    assert w.untyped_storage().data_ptr() == head.weight.untyped_storage().data_ptr()  # no copy
    x = torch.randn(4, 64)
    with CountOps() as mode:
        out = rows(x, head)
    assert copies(mode.ops) == [], mode.ops
    assert torch.equal(out, head(x)[:, 100:132])


def test_other_rows_are_gathered_once_and_again_when_the_weight_changes():
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 300)
    ids = torch.randperm(300)[:40]
    rows = ImageRowsHead(ids)
    x = torch.randn(4, 64)
    ref = head(x)[:, ids]
    first = rows(x, head)
    kept = rows.weights(head)[0]
    with CountOps() as mode:
        second = rows(x, head)
    assert copies(mode.ops) == [], mode.ops  # the second call reads the kept rows
    assert rows.weights(head)[0] is kept
    assert torch.equal(first, ref) and torch.equal(second, ref)
    with torch.no_grad():
        head.weight.mul_(2.0)  # edited in place: the rows are gathered again
    assert torch.allclose(rows(x, head), head(x)[:, ids])
    head.double()  # moved (a new weight)
    assert rows(x.double(), head).dtype == torch.float64


@pytest.mark.parametrize("family", ["emu3", "lumina", "llama-grid"])
def test_family_head_reads_its_rows_without_a_per_step_copy(family, tmp_path):
    model = ssd_core.load_model(BUILDERS[family](tmp_path / "m"), dtype="fp32")
    x = torch.randn(2, 3, model.hidden_size)
    first = model.head_logits(x)
    with CountOps() as mode:
        second = model.head_logits(x)
    assert copies(mode.ops) == [], mode.ops
    assert torch.equal(first, second)
    head = model.model.lm_head
    ids = model.image_ids if hasattr(model, "image_ids") else torch.arange(model.image_vocab_size)
    assert torch.equal(second, head(x)[..., ids])


# ---- compile: one graph where it is allowed, and why it is not allowed under offload ---------------------------
def explain_step(model, n: int = 8, capacity: int = 64, compare: bool = True):
    """torch._dynamo.explain of the static cache's verify step (static_cache._step_function: the embedding, the mask,
    the positions, the layers and the image logits) on a window of n after a 6-token prompt (2 streams, the second
    with one padding token), 3 slots held; with `compare`, also the step run eagerly and compiled (backend eager)
    -> (explained, eager, compiled): each (features, logits)."""
    ids = model.code_to_id(torch.arange(2 * n).view(2, n) % 7)
    window = torch.ones(n, n, dtype=torch.bool).tril()[None]
    steps, held = torch.arange(n)[None], torch.full((2,), 3)
    prompt_keys = torch.zeros(2, capacity, dtype=torch.bool)
    prompt_keys[0, :6], prompt_keys[1, 1:6] = True, True
    inputs = (ids, window, steps, held, prompt_keys, torch.tensor(6), prompt_keys.sum(1))
    step = static_cache._step_function(model, static_cache._new_cache(model, capacity), None)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(step)(*inputs)
        if not compare:
            torch._dynamo.reset()
            return explained, None, None
        cache = static_cache._new_cache(model, capacity)  # the compiled step (backend eager) equals the eager one
        eager = static_cache._step_function(model, cache, None)(*inputs)
        cache = static_cache._new_cache(model, capacity)
        compiled = static_cache._step_function(model, cache, "eager")(*inputs)
    torch._dynamo.reset()
    return explained, eager, compiled


@pytest.mark.parametrize("family", list(BUILDERS))
def test_the_compiled_step_of_every_family_is_one_graph(family, tmp_path):
    model = ssd_core.load_model(BUILDERS[family](tmp_path / "m"), dtype="fp32")
    explained, eager, compiled = explain_step(model)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    assert explained.graph_count == 1
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_the_offloaded_step_breaks_its_graph_at_every_hooked_module(tmp_path):
    """What the refusal of 'compiled' under offload avoids: accelerate's compiler-disabled hooks split the graph."""
    _, offloaded = plain_and_offloaded("llama-grid", tmp_path)
    explained, _, _ = explain_step(offloaded, compare=False)  # its breaks only: a second trace adds nothing
    assert explained.graph_break_count >= 5, explained.graph_break_count
    assert any("disable" in str(r.reason) for r in explained.break_reasons)
