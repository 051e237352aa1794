"""The `flashar` decoder: FlashAR's anti-diagonal decoding (lxazjk/Emu3.5-FlashAR) on its own checkpoint.

Emuflashar._generate_with_kv_cache (flashar/model/modeling_emu_flashar.py), step for step:
- prefill the [uncond ; cond] prompts (right-padded) once; the prompt's last feature gives the first cell (the
  corner gate mixes the horizontal head on the final feature and the vertical head on the feature before
  `vertical_start_layer`);
- step s writes the cells of anti-diagonal h + w = s (H + W - 1 steps): each cell's logits come from the step
  before, the horizontal head on its left neighbour, the vertical head on the one above, mixed by the hv gate
  where it has both (_compute_step_logits_from_prev); guidance u + cfg (c - u) on these logits when cfg > 1;
  codes only (ids below visual_token_offset at -inf); temperature, top-k, top-p, one draw a cell;
- the step's codes are fed at positions prefix + raster index, seeing the whole prompt (its padding masked), every
  earlier diagonal and their own diagonal (the all-zero step mask of _build_kv_attention_mask); the feature before
  `vertical_start_layer` of each fed cell runs through the vertical block with a cache of its own (no prompt).
The draw is the pack's: argmax(log p + g(seed, cell)), so a seed gives the same picture everywhere.
Not the engine's loop (engine.py): FlashAR is a post-trained model with a second KV cache and a mid-layer read,
not a drafting policy over the base model's raster distribution.
"""
from __future__ import annotations

import contextlib
import time

import torch

from . import trace as T
from .errors import Cancelled, SSDError
from .sampling import SamplerSettings, guide, gumbel, gumbel_argmax, log_probs
from .session import Prompt, cache_kwarg


@contextlib.contextmanager
def captured_input(module: torch.nn.Module):
    """The input hidden state of `module` (a decoder layer) in the forwards inside the block."""
    box: dict[str, torch.Tensor] = {}

    def hook(_mod, args, kwargs):
        box["x"] = args[0] if args else kwargs["hidden_states"]

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield box
    finally:
        handle.remove()


def release_batch(prompt: Prompt, cfg: float, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pack's prompt rows (cond, uncond; left-padded) as Emuflashar batches them: [uncond ; cond] padded on the
    right with the pad id (_build_cfg_text_batch), the unconditional row only with cfg > 1 (generate's use_cfg)."""
    rows = [prompt.ids[i][prompt.mask[i]] for i in range(prompt.ids.shape[0])]
    rows = rows[::-1] if len(rows) == 2 and cfg > 1 else rows[:1]
    width = max(r.numel() for r in rows)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :r.numel()], mask[i, :r.numel()] = r, True
    return ids, mask


def diagonal(s: int, H: int, W: int) -> list[int]:
    """Raster indices of the cells with h + w == s, by row (_build_step_id's order)."""
    return [h * W + (s - h) for h in range(max(0, s - W + 1), min(H, s + 1))]


class FlashARRun:
    """The state of one FlashAR generation: the two caches, the prompt's last features and the last diagonal."""

    def __init__(self, model, prompt: Prompt, cfg: float):
        from transformers import DynamicCache

        self.model, self.net = model, model.model
        dev = model.device
        ids, mask = release_batch(prompt, cfg, model.pad_id)
        ids, mask = ids.to(dev), mask.to(dev)
        self.guided = ids.shape[0] == 2
        self.rows, self.prefix = ids.shape
        self.pad = ~mask  # [B, P] the right padding
        self.cache, self.vcache = DynamicCache(), DynamicCache()
        self.key = cache_kwarg(self.net.backbone)
        layer = self.net.backbone.layers[self.net.vertical_start_layer]
        with captured_input(layer) as box:
            out = self.net.backbone(input_ids=ids, attention_mask=mask.long(), use_cache=True,
                                    **{self.key: self.cache})
        last = mask.long().sum(1) - 1
        rows = torch.arange(self.rows, device=dev)
        self.cond_h = out.last_hidden_state[rows, last][:, None]  # [B, 1, d] final-normed
        self.cond_v = box["x"][rows, last][:, None]  # [B, 1, d] before the vertical start layer
        self.prev_h = self.prev_v = None  # [B, n, d] the last diagonal's horizontal / vertical features
        self.prev_pos: list[int] = []
        self.fed = 0  # image tokens in the caches

    def image_logits(self, head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """Logits over the codes of one of the two heads (its rows of the vocabulary, FlashARModel.head_rows)."""
        which = "horizontal" if head is self.net.horizontal_head else "vertical"
        return self.model.head_rows[which](x, head)

    def logits(self, pos: list[int], W: int) -> torch.Tensor:
        """[B, n, V_img] fused logits of the cells `pos` (_compute_step_logits_from_prev)."""
        net = self.net
        if not self.prev_pos:  # the corner
            rw = torch.sigmoid(net.hv_gate_corner(self.cond_h))
            return rw * self.image_logits(net.horizontal_head, self.cond_h) + \
                (1 - rw) * self.image_logits(net.vertical_head, self.cond_v)
        at = {p: i for i, p in enumerate(self.prev_pos)}
        h_all = self.image_logits(net.horizontal_head, self.prev_h)  # [B, n_prev, V]
        v_all = self.image_logits(net.vertical_head, self.prev_v)
        out = []
        for p in pos:
            left, up = (at[p - 1] if p % W else None), (at[p - W] if p >= W else None)
            if up is None:
                out.append(h_all[:, left])
            elif left is None:
                out.append(v_all[:, up])
            else:
                rw = torch.sigmoid(net.hv_gate_mlp(torch.cat([self.prev_h[:, left], self.prev_v[:, up]], -1)))
                out.append(rw * h_all[:, left] + (1 - rw) * v_all[:, up])
        return torch.stack(out, 1)

    def feed(self, pos: list[int], codes: torch.Tensor) -> None:
        """Append the diagonal's codes to both caches; its features predict the next diagonal."""
        net, dev, n = self.net, self.model.device, len(pos)
        ids = self.model.code_to_id(codes.to(dev))[None].expand(self.rows, n)
        positions = (torch.tensor(pos, device=dev) + self.prefix)[None].expand(self.rows, n)
        dtype = self.model.dtype
        blocked = torch.finfo(dtype).min
        mask = torch.zeros(self.rows, 1, n, self.prefix + self.fed + n, device=dev, dtype=dtype)
        mask[:, 0, :, :self.prefix] = mask[:, 0, :, :self.prefix].masked_fill(self.pad[:, None, :], blocked)
        layer = net.backbone.layers[net.vertical_start_layer]
        with captured_input(layer) as box:
            out = net.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                               **{self.key: self.cache})
        vmask = torch.zeros(self.rows, 1, n, self.fed + n, device=dev, dtype=dtype)
        vout = net.vertical(inputs_embeds=box["x"], attention_mask=vmask, position_ids=positions, use_cache=True,
                            **{self.key: self.vcache})
        self.prev_h, self.prev_v, self.prev_pos = out.last_hidden_state, vout.last_hidden_state, pos
        self.fed += n


def generate(model, prompt: Prompt, grid, settings: SamplerSettings, on_step=None, should_cancel=None) -> T.Trace:
    """One FlashAR image -> its Trace (every cell's status "ar": a draw from the model's own distribution; its step
    the anti-diagonal's number + 1)."""
    H, W = grid
    start = time.perf_counter()
    run = FlashARRun(model, prompt, settings.cfg)
    prefill = time.perf_counter() - start
    V = model.image_vocab_size
    tokens = torch.full((H * W,), -1, dtype=torch.long)
    step_of = torch.zeros(H * W, dtype=torch.int32)
    status = torch.zeros(H * W, dtype=torch.int8)
    for s in range(H + W - 1):
        if should_cancel is not None and should_cancel():
            raise Cancelled(f"generation cancelled after {s} steps")
        pos = diagonal(s, H, W)
        logits = run.logits(pos, W).float()  # [B, n, V]
        stacked = logits.flip(0) if run.guided else logits  # [cond, uncond], as guide() reads them
        guided = guide(stacked, settings.cfg, settings.min_p) if run.guided else logits[0]
        lp = log_probs(guided, settings, source="model")
        slots = torch.tensor(pos, device=lp.device)
        codes = gumbel_argmax(lp, gumbel(settings.seed, slots, V).to(lp.device)).cpu()
        tokens[pos] = codes
        step_of[pos] = s + 1
        status[pos] = T.AR
        if s < H + W - 2:
            run.feed(pos, codes)
        if on_step is not None:
            on_step(T.Progress(s + 1, (H, W), tokens.view(H, W).clone(), status.view(H, W).clone(),
                               int((tokens >= 0).sum())))
    if bool((tokens < 0).any()):
        raise SSDError("FlashAR left cells unwritten: the grid is too small for its schedule")
    s = settings
    wall = time.perf_counter() - start
    return T.Trace("flashar", (H, W), tokens.view(H, W), status.view(H, W), step_of.view(H, W),
                   torch.zeros(H, W, dtype=torch.int32), H + W - 1,
                   settings={"seed": s.seed, "cfg": s.cfg, "temperature": s.temperature, "top_k": s.top_k,
                             "top_p": s.top_p, "min_p": s.min_p},
                   timings={"wall": wall, "prefill": prefill, "policy": 0.0, "forward": wall - prefill})


def score(model, prompt: Prompt, layout, trace: T.Trace, settings: SamplerSettings) -> None:
    """The trace's nll / nll_full / out_of_support: its picture under the checkpoint's raster distribution (the one
    ar samples on it, engine.sequence_nll), so that flashar's figures sit beside ar's."""
    from .engine import sequence_nll

    cells = layout.slot_of_cell
    codes = torch.full((layout.num_slots,), -1, dtype=torch.long)
    codes[cells] = trace.tokens.flatten()
    ids = layout.forced.clone()
    ids[cells] = model.code_to_id(trace.tokens.flatten()).cpu()
    start = time.perf_counter()
    fidelity = sequence_nll(model, prompt, layout, ids.to(model.device), codes, settings)
    trace.nll, trace.nll_full, trace.out_of_support = fidelity["nll"], fidelity["nll_full"], fidelity["out_of_support"]
    trace.timings["score"] = time.perf_counter() - start
