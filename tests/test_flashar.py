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
import math
import shutil

import pytest
import torch

import ssd_core
from conftest import load_pack, run
from released_emu35 import FIRST_VISUAL, ReleaseEmu35
from released_flashar import VERTICAL_LAYERS, VERTICAL_START, build_flashar_released
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
    t = pack(fa, "a red cat", 5.0, seed=1, temperature=1.0)
    H, W = GRID
    assert t.steps == H + W - 1 and t.decoder == "flashar"
    assert t.step.tolist() == [[h + w + 1 for w in range(W)] for h in range(H)]
    assert t.counts["ar"] == H * W
