"""`train-heads --plan`: what a run costs before anything heavy starts.

Measured here: one generation batch and a few optimiser steps of the loaded model (features streamed), the
peak memory, and from them this run's generation and training time and disk. Projected (ESTIMATES, never
measured): the same run for a named released model on a named GPU, 1..N of them, from the datasheet figures
below and assumed efficiencies: generation is one token a forward, bound by reading the weights and the KV
cache (memory bandwidth) or by a per-layer launch floor of eager PyTorch; the teacher-forced features forward
and the heads' steps are bound by FLOPs.
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass

import torch

from ..errors import SSDError

# ESTIMATES: vendor datasheet peaks (dense bf16 tensor FLOP/s, memory bandwidth B/s, memory GB) and an
# all-reduce bandwidth between GPUs of one machine (NVLink for SXM parts, PCIe otherwise)
GPUS = {
    "H100": ("H100 SXM 80GB", 989e12, 3.35e12, 80, 350e9),
    "H100-PCIe": ("H100 PCIe 80GB", 756e12, 2.0e12, 80, 25e9),
    "H200": ("H200 SXM 141GB", 989e12, 4.8e12, 141, 350e9),
    "A100": ("A100 SXM 80GB", 312e12, 2.039e12, 80, 230e9),
    "A100-40GB": ("A100 SXM 40GB", 312e12, 1.555e12, 40, 230e9),
    "L40S": ("L40S 48GB", 362e12, 0.864e12, 48, 25e9),
    "RTX4090": ("RTX 4090 24GB", 165e12, 1.008e12, 24, 25e9),
    "RTX3090": ("RTX 3090 24GB", 71e12, 0.936e12, 24, 25e9),
}
FLOP_SHARE = 0.40  # assumed share of peak FLOP/s reached by the features forward and the heads' steps
BANDWIDTH_SHARE = 0.60  # assumed share of peak bandwidth reached by a generation step
LAYER_FLOOR_S = 0.35e-3  # assumed eager-PyTorch launch floor per decoder layer and forward


@dataclass(frozen=True)
class Shape:
    """A released model's sizes (language model and image head; the parts generation does not use left out)."""
    family: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    codes: int
    slots: int  # sequence slots of one image (rows x (columns + row end) where the family has row ends)
    image_cells: int
    prompt: int  # tokens of a typical prompt with its template
    image_head_extra: int = 0  # parameters of an image head besides hidden x codes (Janus: an MLP)
    paper_samples: int = 0  # self-distilled samples in the SSD paper

    @property
    def kv_dim(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def layer_params(self) -> int:
        return self.layers * (2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim + 3 * self.hidden * self.ffn)

    @property
    def image_head(self) -> int:
        return self.hidden * self.codes + self.image_head_extra

    @property
    def params(self) -> int:
        return self.layer_params + 2 * self.vocab * self.hidden + self.image_head


MODELS = {
    "Janus-Pro-7B": Shape("janus", 4096, 30, 11008, 32, 32, 102400, 16384, 576, 576, 64, 4096 * 4096, 60000),
    "Janus-Pro-1B": Shape("janus", 2048, 24, 5632, 16, 16, 102400, 16384, 576, 576, 64, 2048 * 2048, 60000),
    "Emu3-Gen": Shape("emu3", 4096, 32, 14336, 32, 8, 184622, 32768, 90 * 91, 8100, 64, 0, 5000),
    "Lumina-mGPT-7B": Shape("lumina", 4096, 32, 11008, 32, 32, 65536, 8192, 48 * 49, 2304, 64, 0, 20000),
    # Lumina-mGPT 2.0 at its README's 768 px: 96 x 97 slots (row ends), 16,384 MoVQGAN codes; vocab assumed
    "Lumina-mGPT-2.0": Shape("lumina2", 4096, 32, 11008, 32, 32, 172032, 16384, 96 * 97, 9216, 64, 0, 0),
    # Emu3.5-Image at its default 1024 px: 64 x 65 slots (row ends, the last one the image end), 131,072 IBQ codes;
    # the stack inferred from the published 34.1B (tools/random_models.py SHAPES)
    "Emu3.5-Image": Shape("emu3.5", 5120, 64, 27648, 40, 8, 282926, 131072, 64 * 65, 4096, 64, 0, 0),
}


def check(plan_model, gpu, counts) -> list[int]:
    """--plan-model / --plan-gpu / --plan-gpus checked; the GPU counts."""
    if plan_model is not None and plan_model not in MODELS:
        raise SSDError(f"--plan-model {plan_model!r} is not a model the plan knows: {', '.join(MODELS)}")
    if gpu not in GPUS:
        raise SSDError(f"--plan-gpu {gpu!r} is not a GPU the plan knows: {', '.join(GPUS)}")
    try:
        out = [int(v) for v in str(counts).split(",") if v.strip()]
    except ValueError:
        raise SSDError(f"--plan-gpus {counts!r} is not a comma list of GPU counts, e.g. 1,8") from None
    if not out or any(n < 1 or n > 1024 for n in out):
        raise SSDError(f"--plan-gpus {counts!r}: GPU counts from 1 to 1024, e.g. 1,8")
    return out


def _hours(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n < 1e11 else f"{n / 1e12:.2f} TB"


def run_size(cfg, given: int = 0) -> dict:
    """Grids and steps of the run cfg describes (given: grids from --grids files)."""
    generated = cfg.samples + cfg.heldout if cfg.samples else 0
    train = given + cfg.samples
    per_epoch = max(1, math.ceil(train / cfg.batch_grids))
    steps = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)
    return {"generated": generated, "train": train, "steps": steps}


def heads_params(shape: Shape, cfg) -> tuple[int, int]:
    """(Hh, Hv) parameters at cfg's widths and inputs."""
    from ..heads import VERTICAL_INPUTS

    d = shape.hidden
    inter = cfg.intermediate or d
    v_inter = cfg.vertical_intermediate or inter
    return 2 * d * d + 3 * d * inter + d, VERTICAL_INPUTS[cfg.vertical_left] * d * d + 3 * d * v_inter + d


def project(shape: Shape, gpu: str, n_gpus: int, cfg, guided: bool = True) -> dict:
    """The run cfg describes for `shape` on n_gpus of `gpu`: ESTIMATES (seconds, bytes)."""
    _, flops, bandwidth, memory_gb, link = GPUS[gpu]
    size = run_size(cfg)
    streams = 2 if guided else 1
    dtype_bytes = 2  # bf16
    weights = shape.params * dtype_bytes
    active = shape.layer_params + shape.image_head  # what a forward multiplies by (embeddings are a lookup)
    seqs = streams * cfg.gen_batch
    kv_token = 2 * shape.layers * shape.kv_dim * dtype_bytes  # bytes of one token's keys and values
    step_bytes = weights + kv_token * (shape.prompt + shape.slots / 2) * seqs
    gen_step = max(step_bytes / (bandwidth * BANDWIDTH_SHARE), 2 * active * seqs / (flops * FLOP_SHARE),
                   shape.layers * LAYER_FLOOR_S)
    gen_batches = math.ceil(size["generated"] / (cfg.gen_batch * n_gpus)) if size["generated"] else 0
    generation = gen_batches * shape.slots * gen_step
    hh, hv = heads_params(shape, cfg)
    trained = {"both": 2 * hh + hv, "vertical": hv, "horizontal": 2 * hh}[cfg.train]  # Hh: teacher-forced + chain
    per_grid = (2 * active * streams * (shape.prompt + shape.slots) * (2 if cfg.stale_share else 1)
                + 6 * trained * streams * shape.slots + 12 * shape.image_head * streams * shape.image_cells)
    share = math.ceil(cfg.batch_grids / n_gpus)
    heads_bytes = (hh + hv) * dtype_bytes
    allreduce = 2 * (n_gpus - 1) / n_gpus * heads_bytes / link if n_gpus > 1 else 0.0
    step = share * per_grid / (flops * FLOP_SHARE) + allreduce
    training = size["steps"] * step
    kv_cache = kv_token * (shape.prompt + shape.slots) * seqs
    activations = share * (streams * (shape.slots + 1) * shape.hidden * 4
                           + 6 * streams * shape.image_cells * shape.codes * 4)
    peak = weights + max(kv_cache, 4 * (hh + hv) * dtype_bytes + activations)
    return {"generation_s": generation, "training_s": training, "total_s": generation + training,
            "gen_step_s": gen_step, "train_step_s": step, "peak_bytes": peak, "fits": peak < memory_gb * 1e9 * 0.95,
            "shard_bytes": size["generated"] * (shape.image_cells * 8 + 16),
            "features_file_bytes": size["train"] * streams * (shape.slots + 1) * shape.hidden * 2,
            "steps": size["steps"], "generated": size["generated"]}


def _peak_bytes(device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "GPU memory allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS"


def measure(model, cfg, settings, steps: int = 3) -> dict:
    """One generation batch (cfg.gen_batch grids) and `steps` optimiser steps of cfg.batch_grids grids after
    one warm-up step, timed on the loaded model."""
    from . import data, features
    from .loop import head_losses, start_heads
    from .prompts import prompt_order, prompt_source

    layout = model.layout(None)
    texts, _ = prompt_source(model, None)
    prompts = [texts[i] for i in prompt_order(len(texts), cfg.gen_batch, cfg.seed)]
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(model.device)
    t0 = time.perf_counter()
    codes = data.generate_grids(model, prompts, settings, layout, cfg.gen_batch, log=lambda *a: None,
                                seeds=[settings.seed + i for i in range(len(prompts))])
    _sync(model)
    t_gen = time.perf_counter() - t0
    for p in model.model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed % 2**63)
    heads = start_heads(model, cfg).to(model.device, model.dtype)
    opt = torch.optim.AdamW([p for p in heads.parameters()], lr=cfg.lr)
    source = features.Streamed(model, prompts, codes, settings, layout)
    times = []
    for s in range(steps + 1):
        idx = [(s * cfg.batch_grids + i) % len(prompts) for i in range(cfg.batch_grids)]
        t0 = time.perf_counter()
        h, ids = source.batch(idx)
        stale = None
        if cfg.stale_share > 0:
            stale = data.stale_features(model, [prompts[i] for i in idx], h, ids, settings, layout, cfg.stale_share,
                                        len(idx), s)[0]
        opt.zero_grad()
        sum(head_losses(model, heads, h, ids, layout, cfg, settings, stale).values()).backward()
        opt.step()
        _sync(model)
        times.append(time.perf_counter() - t0)
    peak, what = _peak_bytes(model.device)
    return {"gen_batch_s": t_gen, "step_s": sum(times[1:]) / max(1, len(times) - 1), "peak_bytes": peak,
            "peak_what": what, "slots": layout.num_slots, "cells": layout.grid[0] * layout.grid[1]}


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def run(model, cfg, settings, plan_model=None, gpu: str = "H100", counts=(1, 8), group=None, given: int = 0,
        steps: int = 3) -> str:
    """The --plan text: measured here, then the ESTIMATES table for plan_model on gpu."""
    world = group.world if group is not None else 1
    m = measure(model, cfg, settings, steps)
    size = run_size(cfg, given)
    gen = math.ceil(size["generated"] / (cfg.gen_batch * world)) * m["gen_batch_s"] if size["generated"] else 0.0
    train = size["steps"] * m["step_s"] / world
    streams = 2 if settings.guided else 1
    shards = size["generated"] * (m["cells"] * 8 + 16)
    file = size["train"] * streams * (m["slots"] + 1) * model.hidden_size * 2
    lines = [f"train-heads --plan: {model.family} model ({model.hidden_size} wide, {str(model.dtype).replace('torch.', '')}, "
             f"{model.device}), {size['generated']} grids to self-distil + {given} given, {size['steps']} steps of "
             f"{cfg.batch_grids} grids, {world} process(es)",
             f"measured here (one generation batch, {steps} optimiser steps after a warm-up):",
             f"  generation   {cfg.gen_batch} grids in {m['gen_batch_s']:.2f} s ({m['gen_batch_s'] / cfg.gen_batch:.3f} s a grid)",
             f"  training     {m['step_s']:.3f} s a step of {cfg.batch_grids} grids (features streamed from the model)",
             f"  peak memory  {_gb(m['peak_bytes'])} ({m['peak_what']})",
             f"this run here: generation {_hours(gen)}, training {_hours(train)}, total {_hours(gen + train)}; "
             f"disk {_gb(shards)} of grid shards (a --features file would add {_gb(file)})"]
    if plan_model is None:
        return "\n".join(lines)
    shape = MODELS[plan_model]
    name, flops, bandwidth, memory_gb, _ = GPUS[gpu]
    lines += ["",
              f"ESTIMATES, not measured: {plan_model} ({shape.params / 1e9:.1f} B parameters, bf16, {shape.slots} slots, "
              f"{streams} CFG stream(s); " + (f"the paper self-distils {shape.paper_samples:,} samples" if shape.paper_samples
              else "not in the SSD paper") + f") on {name}",
              f"  from datasheet peaks ({flops / 1e12:.0f} TFLOP/s bf16 dense, {bandwidth / 1e12:.2f} TB/s, {memory_gb} GB) at "
              f"assumed {FLOP_SHARE:.0%} of the FLOPs, {BANDWIDTH_SHARE:.0%} of the bandwidth and a "
              f"{LAYER_FLOOR_S * 1e3:.2f} ms launch floor per layer and forward",
              f"  this run: {size['generated']} grids generated {cfg.gen_batch} at a time, {size['steps']} steps of "
              f"{cfg.batch_grids} grids, train {cfg.train}",
              "  GPUs | generation | training | total   | a gen step | a train step | peak memory/GPU | fits",
              "  -----|------------|----------|---------|------------|--------------|-----------------|-----"]
    for n in counts:
        p = project(shape, gpu, n, cfg, settings.guided)
        lines.append(f"  {n:>4} | {_hours(p['generation_s']):>10} | {_hours(p['training_s']):>8} | "
                     f"{_hours(p['total_s']):>7} | {p['gen_step_s'] * 1e3:>7.1f} ms | {p['train_step_s']:>10.2f} s | "
                     f"{_gb(p['peak_bytes']):>15} | {'yes' if p['fits'] else 'NO'}")
    p = project(shape, gpu, 1, cfg, settings.guided)
    lines.append(f"  disk: {_gb(p['shard_bytes'])} of grid shards; features are streamed (a --features file of every "
                 f"grid would take {_gb(p['features_file_bytes'])})")
    return "\n".join(lines)
