"""Emu3.5-Image-FlashAR (`emu3.5-flashar`, decoder `flashar`) on a tiny random checkpoint in the released layout
(tests/released_flashar.py).

Re-created here from the release's code (lxazjk/Emu3.5-FlashAR at 2d4a74e) and compared with the pack:
- flashar/model/modeling_emu_flashar.py: build_t2i_flashar_mask (prompt causal with its padding, image cells see
  the valid prompt and every cell of their own and earlier anti-diagonals), _build_step_id, _split_hidden_states,
  _apply_vertical_block (the step mask, positions offset by the prompt), _forward_step (horizontal / vertical /
  gated / corner logits), _build_cfg_text_batch ([uncond ; cond], right-padded with the pad id), the CFG and the
  visual_token_offset mask of _generate_with_kv_cache, _sample_logits;
- tools/generate_geneval_flashar.py make_prefix (the template + image prefix; the unconditional row is the
  template with an empty prompt);
- the decoder math of src/emu3p5/modeling_emu3.py (tests/released_emu35.py ReleaseEmu35).
The release decodes with KV caches; this re-creation runs its full-sequence step path (Emuflashar.forward with
step_positions / prev_positions) at every step, which computes the same features: it checks the pack's caches too.
"""
import json
import shutil

import pytest
import torch

import ssd_core
from conftest import load_pack, run
from released_emu35 import FIRST_VISUAL, ReleaseEmu35
from released_flashar import VERTICAL_LAYERS, build_flashar_released
from ssd_core import cli, flashar_decode
from ssd_core.families.flashar import FlashARModel
from ssd_core.sampling import SamplerSettings, gumbel

pytestmark = pytest.mark.engine457

GRID = (4, 6)
PAD = 151643
TEMPLATE = "<|extra_203|>You are a helpful assistant for t2i task. USER: {text} ASSISTANT: <|extra_100|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_flashar_released(tmp_path_factory.mktemp("ssd_models") / "Emu3.5-Image-FlashAR")


@pytest.fixture(scope="module")
def fa(folder):
    return ssd_core.load_model(folder, dtype="fp32")


# ---- the release's generation, re-created ------------------------------------------------------------------------
class ReleaseFlashAR:
    def __init__(self, folder):
        cfg = json.loads((folder / "config.json").read_text())
        rel = ReleaseEmu35.from_folder(folder)
        self.w, self.meta = rel.w, cfg
        self.backbone = ReleaseEmu35(cfg["backbone_config"], rel.w)
        self.vertical = ReleaseEmu35(cfg["backbone_config"], rel.w)
        self.offset = cfg["visual_token_offset"]

    def make_prefix(self, tok, prompt, grid):
        h, w = grid
        ids = tok.encode(TEMPLATE.replace("{text}", prompt))
        return ids + [tok.convert_tokens_to_ids("<|image start|>")] + tok.encode(f"{h}*{w}") + \
            [tok.convert_tokens_to_ids("<|image token|>")]

    def step_logits(self, text_ids, text_mask, grid_ids, H, W, step_positions, prev_positions):
        """Emuflashar.forward(input_ids=grid, text_input_ids, text_attention_mask, step_positions, prev_positions)."""
        B, P = text_ids.shape
        total = P + H * W
        # build_t2i_flashar_mask
        attn = torch.full((B, 1, total, total), float("-inf"))
        causal = torch.tril(torch.ones(P, P, dtype=torch.bool))
        diag = torch.eye(P, dtype=torch.bool)
        for b in range(B):
            valid = text_mask[b].bool()
            allow = causal.clone() & valid.unsqueeze(0) & valid.unsqueeze(1)
            allow |= diag
            attn[b, 0, P:, :P] = torch.where(valid.unsqueeze(0), 0.0, float("-inf"))
            attn[b, 0, :P, :P].masked_fill_(allow, 0.0)
        step_id = (torch.arange(H)[:, None] + torch.arange(W)[None, :]).reshape(-1)
        allowed = step_id[None, :] <= step_id[:, None]  # _build_proximity_allow
        attn[:, 0, P:, P:].masked_fill_(allowed, 0.0)
        full = torch.cat([text_ids, grid_ids], 1)
        positions = torch.arange(total)[None].expand(B, -1)
        hidden, captured = self.backbone.run(full, attn, positions, "backbone.", capture=self.meta["vertical_start_layer"])
        last = text_mask.long().sum(1).clamp(min=1) - 1  # _split_hidden_states
        cond_h, image_h = hidden[torch.arange(B), last][:, None], hidden[:, P:]
        cond_v, image_v = captured[torch.arange(B), last][:, None], captured[:, P:]
        # _apply_vertical_block: the step mask, positions + prefix_len
        step_mask = torch.zeros(H * W, H * W).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
        pos = (torch.arange(H * W) + P)[None].expand(B, -1)
        v = image_v
        for i in range(self.meta["vertical_layers"]):
            v = self.vertical.layer(f"vertical_block.{i}.", v, step_mask, pos)
        v = ReleaseEmu35.rms(v, self.w["vertical_norm.weight"], self.backbone.cfg["rms_norm_eps"])
        hh, vh = self.w["horizontal_head.weight"], self.w["vertical_head.weight"]
        gate = lambda x: torch.sigmoid(  # noqa: E731 -- hv_gate_mlp
            torch.nn.functional.silu(x @ self.w["hv_gate_mlp.0.weight"].T) @ self.w["hv_gate_mlp.2.weight"].T
            + self.w["hv_gate_mlp.2.bias"])
        out = torch.empty(B, len(step_positions), hh.shape[0])
        at = {int(p): i for i, p in enumerate(prev_positions)}
        h_prev, v_prev = image_h[:, prev_positions] @ hh.T, v[:, prev_positions] @ vh.T
        for j, p in enumerate(step_positions.tolist()):
            r, c = divmod(p, W)
            if r == 0 and c == 0:
                rw = torch.sigmoid(cond_h @ self.w["hv_gate_corner.weight"].T + self.w["hv_gate_corner.bias"])[:, 0]
                out[:, j] = rw * (cond_h @ hh.T)[:, 0] + (1 - rw) * (cond_v @ vh.T)[:, 0]
            elif r == 0:
                out[:, j] = h_prev[:, at[p - 1]]
            elif c == 0:
                out[:, j] = v_prev[:, at[p - W]]
            else:
                rw = gate(torch.cat([image_h[:, p - 1], v[:, p - W]], -1))
                out[:, j] = rw * h_prev[:, at[p - 1]] + (1 - rw) * v_prev[:, at[p - W]]
        return out

    def generate(self, tok, prompt, grid, cfg_scale, top_k=0, noise=None):
        H, W = grid
        cond = self.make_prefix(tok, prompt, grid)
        rows = [cond]
        use_cfg = cfg_scale > 1.0
        if use_cfg:  # _build_cfg_text_batch: [uncond, cond], right-padded with mask_token_id (the pad id)
            rows = [self.make_prefix(tok, "", grid), cond]
        P = max(len(r) for r in rows)
        text_ids = torch.tensor([r + [PAD] * (P - len(r)) for r in rows])
        text_mask = torch.tensor([[1] * len(r) + [0] * (P - len(r)) for r in rows])
        grid_ids = torch.full((len(rows), H * W), PAD)
        step_id = (torch.arange(H)[:, None] + torch.arange(W)[None, :]).reshape(-1)
        for step in range(H + W - 1):
            step_positions = (step_id == step).nonzero().view(-1)
            prev_positions = (step_id == step - 1).nonzero().view(-1)
            logits = self.step_logits(text_ids, text_mask, grid_ids, H, W, step_positions, prev_positions)
            if use_cfg:
                u, c = logits.chunk(2, dim=0)
                logits = u + cfg_scale * (c - u)
            logits[:, :, :self.offset] = float("-inf")
            preds = []
            for i, p in enumerate(step_positions.tolist()):  # _sample_logits
                one = logits[:, i, :] / max(1.0, 1e-5)
                if top_k > 0:
                    one = one.masked_fill(one < torch.topk(one, top_k)[0][..., -1, None], float("-inf"))
                probs = torch.softmax(one, dim=-1)
                preds.append(int((probs.log() + noise(p)).argmax()) if noise is not None else int(probs.argmax()))
            grid_ids[:, step_positions] = torch.tensor(preds)
        return (grid_ids[0] - self.offset).tolist()


@pytest.fixture(scope="module")
def release(folder):
    return ReleaseFlashAR(folder)


def replayed_noise(model, seed):
    def at(cell: int) -> torch.Tensor:
        g = gumbel(seed, torch.tensor([cell]), model.image_vocab_size)[0]
        return torch.zeros(FIRST_VISUAL + model.image_vocab_size).index_copy_(0, model.image_ids, g)
    return at


def pack(model, prompt, cfg, seed=0, temperature=0.0, top_k=0):
    s = SamplerSettings(seed=seed, cfg=cfg, temperature=temperature, top_k=top_k)
    p = model.build_prompt(prompt, None, s.guided, GRID)
    return flashar_decode.generate(model, p, GRID, s)


@pytest.mark.parametrize("cfg", [5.0, 1.0])
def test_greedy_flashar_equals_the_release_generate(fa, release, cfg):
    for prompt in ("a red cat", "A lively comic-style illustration, two dogs, \"Relax!\""):
        ours = pack(fa, prompt, cfg).tokens.flatten().tolist()
        assert ours == release.generate(fa.tokenizer, prompt, GRID, cfg)


def test_sampled_flashar_equals_the_release_sampler_with_the_pack_noise(fa, release):
    ours = pack(fa, "a red cat", 5.0, seed=7, temperature=1.0, top_k=5).tokens.flatten().tolist()
    assert ours == release.generate(fa.tokenizer, "a red cat", GRID, 5.0, 5, replayed_noise(fa, 7))
    assert release.generate(fa.tokenizer, "a red cat", GRID, 5.0, 5, replayed_noise(fa, 8)) != ours


def test_steps_are_the_anti_diagonals(fa):
    assert isinstance(fa, FlashARModel) and fa.family == "emu3.5-flashar" and fa.default_grid == (32, 32)
    t = pack(fa, "a red cat", 5.0, seed=1, temperature=1.0)
    H, W = GRID
    assert t.steps == H + W - 1 and t.decoder == "flashar"
    assert t.step.tolist() == [[h + w + 1 for w in range(W)] for h in range(H)]
    assert t.counts["ar"] == H * W


# ---- through the api, the node and the CLI; what it refuses ----------------------------------------------------
def test_loads_and_generates_through_api_node_and_cli(folder, fa, tmp_path, monkeypatch):
    res = ssd_core.generate(fa, None, prompt="a red cat", decoder="flashar", seed=3, grid=GRID)
    assert torch.equal(res.tokens, pack(fa, "a red cat", 5.0, seed=3, temperature=1.0).tokens)
    assert tuple(res.image.shape) == (GRID[0] * 16, GRID[1] * 16, 3) and res.trace.steps == sum(GRID) - 1
    seen = []
    ssd_core.generate_batch(fa, None, prompts=["a", "b"], seeds=[1, 2], decoder="flashar", grid=GRID,
                            decode_pixels=False, on_step=lambda p: seen.append((p.image, p.step, p.final_cells)))
    assert [s for s in seen if s[0] == 1][-1] == (1, 9, 24) and len(seen) == 2 * 9
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    (loaded,) = nodes.SSDLoadModel().load(folder.name, "float32", "cpu")
    assert loaded.model.family == "emu3.5-flashar" and loaded.model.default_grid == (32, 32)
    out = run(loaded, prompt="a red cat", decoder="flashar", seed=3, grid="4x6")
    assert out["result"][1]["tokens"] == res.tokens.tolist()
    trace = tmp_path / "trace.json"
    rc = cli.main(["generate", "--model", str(folder), "--prompt", "a red cat", "--decoder", "flashar", "--seed", "3",
                   "--grid", "4x6", "--dtype", "fp32", "--heads", "none", "--trace", str(trace),
                   "--out", str(tmp_path / "x.png")])
    assert rc == 0 and json.loads(trace.read_text())["tokens"] == res.tokens.tolist()


def test_flashar_is_refused_on_other_models_and_bench_says_so(fa):
    ref = ssd_core.load_model("reference", dtype="fp32")
    with pytest.raises(ssd_core.SSDError, match=r"decoder flashar runs on a FlashAR checkpoint .* only"):
        ssd_core.generate(ref, None, prompt=1, decoder="flashar")
    from ssd_core.bench import BenchOptions, run_bench

    with pytest.raises(ssd_core.SSDError, match="runs on a FlashAR checkpoint only .* the bundled models cannot run it"):
        run_bench(ref, None, BenchOptions(decoders=("ar", "flashar"), images=1))
    with pytest.raises(ssd_core.SSDError, match="takes no negative prompt"):
        ssd_core.generate(fa, None, prompt="a cat", negative_prompt="blurry", decoder="flashar", grid=GRID)


def test_the_pack_decoders_run_on_its_raster_distribution(fa, tmp_path):
    """ar / ssd-exact / the rest on the checkpoint's raster distribution (the backbone under a causal mask, the
    horizontal head at the cell before: FlashAR's own distillation teacher): full images, ssd-exact == ar."""
    from tiny_families import check_every_decoder

    ssd_core.DraftHeads.for_model(fa).save(tmp_path / "h.safetensors")
    check_every_decoder(fa, ssd_core.load_heads(tmp_path / "h.safetensors", fa), "a red cat", GRID, 16)


def _copy(folder, tmp_path, name):
    out = tmp_path / name
    shutil.copytree(folder, out)
    return out


def test_damaged_folders_are_refused_in_one_line(folder, tmp_path):
    from released_emu35 import build_emu35_released

    cases = []
    shard = _copy(folder, tmp_path, "no-shard")
    (shard / "model-00002-of-00002.safetensors").unlink()
    cases.append((shard, "model-00002-of-00002.safetensors"))
    tok = _copy(folder, tmp_path, "no-tokenizer")
    (tok / "emu3.tiktoken").unlink()
    cases.append((tok, r"lacks Emu3.5's tokenizer files"))
    vq = _copy(folder, tmp_path, "no-ibq")
    (vq / "ibq.safetensors").unlink()
    cases.append((vq, r"has no ibq.safetensors .*convert-ibq"))
    bare = _copy(folder, tmp_path, "no-backbone-config")
    cfg = json.loads((bare / "config.json").read_text())
    del cfg["backbone_config"]
    (bare / "config.json").write_text(json.dumps(cfg))
    cases.append((bare, r"has no backbone_config .*lxazjk/Emu3.5-Image-FlashAR"))
    less = _copy(folder, tmp_path, "no-gate")
    from safetensors.torch import load_file, save_file

    index = json.loads((less / "model.safetensors.index.json").read_text())
    file = index["weight_map"].pop("hv_gate_corner.bias")
    kept = {k: v for k, v in load_file(str(less / file)).items() if k != "hv_gate_corner.bias"}
    save_file(kept, str(less / file), metadata={"format": "pt"})
    (less / "model.safetensors.index.json").write_text(json.dumps(index))
    cases.append((less, r"lack hv_gate_corner.bias: the model would run with random values there"))
    for bad, match in cases:
        with pytest.raises(ssd_core.SSDError, match=match) as err:
            ssd_core.load_model(bad, dtype="fp32")
        assert "\n" not in str(err.value), bad.name
    base = build_emu35_released(tmp_path / "Emu3.5-Image")
    with pytest.raises(ssd_core.SSDError, match=r"not an emu3.5-flashar model .* load it as family 'emu3.5'"):
        ssd_core.load_model(base, dtype="fp32", family="emu3.5-flashar")
    with pytest.raises(ssd_core.SSDError, match=r"load it as family 'emu3.5-flashar'"):
        ssd_core.load_model(folder, dtype="fp32", family="emu3.5")


def test_its_raster_distribution_is_not_its_decoding_distribution(fa):
    """How far the raster distribution (what ar and ssd-exact sample on this checkpoint) is from flashar's, per cell,
    on the same tokens: the measurement behind docs/decoders.md's "ssd-exact on FlashAR" (tiny random weights: it
    shows the two are different distributions, not how far apart the released model's are)."""
    H, W = GRID
    ours = pack(fa, "a red cat", 1.0, seed=2, temperature=1.0)
    prompt = fa.build_prompt("a red cat", None, False, GRID)
    ids = torch.cat([prompt.ids[0], fa.code_to_id(ours.tokens.flatten())])[None]
    with torch.no_grad():
        h = fa.model.backbone(input_ids=ids).last_hidden_state[0, prompt.ids.shape[1] - 1:-1]  # causal, raster
        raster = torch.log_softmax(fa.head_logits(h).float(), -1)  # what ar draws each cell from
        run = flashar_decode.FlashARRun(fa, prompt, 1.0)
        fused = torch.empty(H * W, fa.image_vocab_size)
        for s in range(H + W - 1):
            pos = flashar_decode.diagonal(s, H, W)
            fused[pos] = torch.log_softmax(run.logits(pos, W)[0].float(), -1)
            run.feed(pos, ours.tokens.flatten()[pos])
    tv = 0.5 * (raster.exp() - fused.exp()).abs().sum(-1)  # per cell
    row0 = torch.arange(H * W) < W
    # flashar's tokens as ssd-exact's drafts: a draft stands when the raster distribution's coupled draw (the same
    # Gumbel noise) picks it, given flashar's tokens before it
    noise = gumbel(2, torch.arange(H * W), fa.image_vocab_size)
    kept = (raster + noise).argmax(-1) == ours.tokens.flatten()
    run_length = int(kept.long().cumprod(0).sum())
    print(f"total variation, raster vs flashar: first row {tv[row0].mean():.3f}, below it {tv[~row0].mean():.3f}; "
          f"flashar's tokens the raster draw keeps: {int(kept.sum())} of {H * W}, {run_length} before the first miss")
    # the first row: the same horizontal head on the cell before; flashar sees its own diagonal, raster only the past
    assert tv[1:W].max() < tv[~row0].mean() and tv[~row0].mean() > 0.05


def test_check_model_knows_the_checkpoint_and_what_it_lacks(folder, tmp_path):
    from ssd_core.check_model import check_folder

    report = check_folder(folder)
    assert report.family == "emu3.5-flashar" and report.loadable, [f.line for f in report.blocking()]
    assert any(f.topic == "shapes" and f.level == "ok" and "all 65 tensors" in f.line for f in report.findings)
    heads_bf16 = 2 * 2 * (FIRST_VISUAL + 16) * 32  # both heads [V, d] stay bf16 (memory.KEEP_FULL)
    assert heads_bf16 < report.memory["4-bit"] < report.memory["8-bit"] < report.memory["bf16"]
    bare = _copy(folder, tmp_path, "bare")
    (bare / "ibq.safetensors").unlink()
    (bare / "emu3_vision_tokens.txt").unlink()
    lines = [f.line for f in check_folder(bare).blocking()]
    assert any("convert-ibq" in line for line in lines) and any("tokenizer_emu3_ibq" in line for line in lines)


def test_offloaded_heads_and_vertical_block_give_the_tokens_of_the_plain_model(folder, fa, tmp_path):
    """Offload (accelerate's hooks, as memory.py's offload auto on a 24 GB card): the horizontal head and the last
    vertical layer on "disk" (weights on the meta device, loaded per call), the rest on the CPU: flashar and ar give
    the plain model's tokens, and the heads' image rows are read without moving the whole head each step."""
    net = fa.model
    off = {"horizontal_head", f"vertical_block.{VERTICAL_LAYERS - 1}"}
    device_map = {name: ("disk" if name in off else "cpu") for name, _ in net.named_children()
                  if name != "vertical_block"}
    device_map.update({f"vertical_block.{i}": ("disk" if f"vertical_block.{i}" in off else "cpu")
                       for i in range(VERTICAL_LAYERS)})
    offloaded = ssd_core.load_model(folder, dtype="fp32", device_map=device_map, offload_folder=str(tmp_path / "off"))
    head = offloaded.model.horizontal_head
    assert {p.device.type for p in head.parameters()} == {"meta"} and hasattr(head, "_hf_hook")
    for decoder in ("flashar", "ar"):
        a, b = (ssd_core.generate(m, None, prompt="a red cat", decoder=decoder, seed=4, grid=GRID, score=False,
                                  decode_pixels=False).tokens for m in (fa, offloaded))
        assert torch.equal(a, b), decoder
    assert {p.device.type for p in head.parameters()} == {"meta"}  # the full head stays offloaded


# ---- fitting it on users' cards; the loader's words; the template; the widget ---------------------------------
def test_memory_row_counts_the_released_wrapper():
    """The weights of the released checkpoint at its real sizes, counted on the meta device (tools/memory_table.py:
    config.json in the released layout, Emu3.5-Image's backbone, 2 vertical layers, start -1 = the last two),
    against the formula of the wrapper's modules; the row docs/models-and-memory.md and the README show."""
    from conftest import ROOT
    from ssd_core.families.flashar import build_net
    from tools.memory_table import released_config, released_counts

    d, vocab, layers, ffn, heads, kv_heads, head_dim = 5120, 282926, 64, 27648, 40, 8, 128
    layer = (d * heads * head_dim + 2 * d * kv_heads * head_dim + heads * head_dim * d + 2 * head_dim  # attention
             + 3 * d * ffn + 2 * d)  # MLP, the two norms
    gate = max(64, d // 8)  # Emuflashar.__init__: gate_proj_dim
    expected = {"backbone": vocab * d + layers * layer + d,  # embed_tokens, the layers, norm; no lm_head
                "horizontal_head": vocab * d, "vertical_head": vocab * d, "vertical_block": 2 * layer,
                "vertical_norm": d, "hv_gate_mlp": 2 * d * gate + gate + 1, "hv_gate_corner": d + 1}
    c = released_counts("Emu3.5-Image-FlashAR")
    assert c["parts"] == expected and c["params"] == sum(expected.values()) == 36_533_803_138
    # Emu3.5-Image less its lm_head, plus the second head, the vertical block, its norm and the gates
    base = released_counts("Emu3.5-Image")["params"]
    assert c["params"] - base == vocab * d + 2 * layer + d + expected["hv_gate_mlp"] + expected["hv_gate_corner"]
    assert build_net(released_config("Emu3.5-Image-FlashAR")).vertical_start_layer == 62
    assert round(c["none"], 1) == 68.0 and round(2 * c["params"] / 1e9, 1) == 73.1  # GiB; GB
    # 8-bit and 4-bit keep embed_tokens, both heads and the gates in bf16 (memory.KEEP_FULL): 8.1 GiB of them
    kept = 2 * (3 * vocab * d + expected["hv_gate_mlp"] + expected["hv_gate_corner"])
    assert round(kept / 2**30, 1) == 8.1 and kept / 2**30 < c["4-bit"] < c["8-bit"] < c["none"]
    row = f"| {c['none']:.1f} GiB | {c['8-bit']:.1f} GiB | {c['4-bit']:.1f} GiB |"
    assert row == "| 68.0 GiB | 38.1 GiB | 23.6 GiB |"
    assert f"| Emu3.5-Image-FlashAR | 36.53 B {row}" in (ROOT / "docs" / "models-and-memory.md").read_text()
    assert row in (ROOT / "README.md").read_text().split("| Emu3.5-Image-FlashAR |")[1].splitlines()[0]


def test_template_and_the_loaders_error_say_what_to_download(folder, tmp_path, monkeypatch):
    """The template "SSD Emu3.5 FlashAR - flashar vs ssd-exact": flashar and ssd-exact on one loaded
    Emu3.5-Image-FlashAR at the model's defaults (grid auto: 32x32), its note and the loader's error on a missing
    folder saying what to download; its flashar sampler run through the nodes on the tiny checkpoint."""
    from conftest import ROOT

    name = "SSD Emu3.5 FlashAR - flashar vs ssd-exact"
    root = json.loads((ROOT / "tests" / "workflows_api" / f"{name}.json").read_text())
    (load,) = [n["inputs"] for n in root.values() if n["class_type"] == "SSDLoadModel"]
    assert load["model"] == "Emu3.5-Image-FlashAR" and (load["quantization"], load["offload"]) == ("none", "none")
    samplers = {n["inputs"]["decoder"]: (nid, n["inputs"]) for nid, n in root.items() if n["class_type"] == "SSDSampler"}
    assert sorted(samplers) == ["flashar", "ssd-exact"]
    for _, s in samplers.values():  # the release's grid and sampler defaults
        assert s["grid"] == "auto" and [s[k] for k in ("cfg", "temperature", "top_k", "top_p", "min_p")] == [-1] * 5
        assert s["negative_prompt"] == ""  # its unconditional row is its template with an empty prompt
    (grid,) = [n["inputs"] for n in root.values() if n["class_type"] == "SSDTraceToImage"]
    assert grid["trace"] == [samplers["flashar"][0], 1] and grid["color_by"] == "step"  # one shade per diagonal
    ui = json.loads((ROOT / "example_workflows" / f"{name}.json").read_text())
    note = next(n["widgets_values"][0] for n in ui["nodes"] if n["type"] == "MarkdownNote")
    for needed in ("ssd_models/Emu3.5-Image-FlashAR", "lxazjk/Emu3.5-Image-FlashAR", "baaivision/Emu3.5",
                   "src/tokenizer_emu3_ibq/", "emu3.tiktoken", "emu3_vision_tokens.txt", "BAAI/Emu3.5-VisionTokenizer",
                   "convert-ibq", "68.0 GiB", "23.6 GiB", "80 GB", "offload auto", "63 steps"):
        assert needed in note, needed
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        nodes.SSDLoadModel().load("Emu3.5-Image-FlashAR", "auto", "cpu")
    line, target = str(err.value), tmp_path / "Emu3.5-Image-FlashAR"
    assert "\n" not in line and f"download lxazjk/Emu3.5-Image-FlashAR from the Hugging Face Hub into {target}" in line
    assert "emu3.tiktoken and emu3_vision_tokens.txt (baaivision/Emu3.5 src/tokenizer_emu3_ibq/ on GitHub)" in line
    assert "BAAI/Emu3.5-VisionTokenizer's model.ckpt and config.yaml" in line
    assert f"`python -m ssd_core convert-ibq model.ckpt config.yaml {target}/ibq.safetensors`" in line
    # the template's loader and flashar sampler on the tiny checkpoint, listed under the template's folder name
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    assert "Emu3.5-Image-FlashAR" in nodes.SSDLoadModel.INPUT_TYPES()["required"]["model"][1]["options"]
    (loaded,) = nodes.SSDLoadModel().load(load["model"], load["dtype"], "cpu", load["quantization"], load["offload"],
                                          load["compile"])
    (with_heads,) = nodes.SSDLoadHeads().load(loaded, root["2"]["inputs"]["heads"])
    nid, inputs = samplers["flashar"]
    out = nodes.SSDSampler().sample(with_heads, unique_id=nid, **{k: v for k, v in inputs.items()
                                                                  if not isinstance(v, list)})
    trace = out["result"][1]
    assert trace["grid"] == [32, 32] and trace["steps"] == 63 and trace["settings"]["cfg"] == 5.0
    assert out["result"][2].startswith("flashar: 16.2x fewer model steps than one token at a time (63 instead of 1023)")


def test_the_widget_gets_one_event_per_anti_diagonal(folder, fake_comfy, monkeypatch):
    """The sampler node's live `ssd.grid` events under decoder flashar (their throttle off): one per anti-diagonal,
    H + W - 1 of them, each adding exactly the cells of the next diagonal (status "ar": drawn from the model); the
    final event's per-cell step grid is h + w + 1. The widget needs nothing new: cells arrive with their statuses."""
    from conftest import pack_module

    monkeypatch.setattr(pack_module("nodes._progress").Progress, "due", lambda self: True)
    nodes = load_pack()
    monkeypatch.setenv("SSD_MODELS_DIR", str(folder.parent))
    (loaded,) = nodes.SSDLoadModel().load(folder.name, "float32", "cpu")
    H, W = GRID
    out = run(loaded, prompt="a red cat", decoder="flashar", seed=5, grid=f"{H}x{W}", unique_id="21")
    events = [d for e, d, _ in fake_comfy.events if e == "ssd.grid"]
    live, final = [d for d in events if not d["done"]], events[-1]
    assert len(live) == H + W - 1 and len(events) == H + W and all(d["node"] == "21" for d in events)
    pending, ar = "0", "1"  # nodes/trace.py STATUS_CODE
    written = set()
    for s, event in enumerate(live):
        assert event["decoder"] == "flashar" and event["grid"] == [H, W] and event["steps"] == s + 1
        cells = {i for i, c in enumerate(event["status"]) if c != pending}
        assert cells - written == set(flashar_decode.diagonal(s, H, W)) and written <= cells
        assert {event["status"][i] for i in cells} == {ar} and event["final"] == len(cells)
        written = cells
    assert written == set(range(H * W))
    assert final["done"] is True and final["steps"] == H + W - 1 and final["status"] == ar * (H * W)
    assert final["step"] == [h + w + 1 for h in range(H) for w in range(W)]
    assert final == {**out["ui"]["ssd_trace"][0], "node": "21"}
