"""`python -m ssd_core train-heads`: its flags, their checks (before a model loads) and the command.

One process: `python -m ssd_core train-heads ...`. Several (data parallel, one per GPU):
`accelerate launch --multi_gpu --num_processes 8 -m ssd_core train-heads ...` or
`torchrun --nproc_per_node 8 -m ssd_core train-heads ...`; each process loads the model on its own GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

from ..errors import SSDError


def clock_time(text):
    """'HH:MM' -> that time today as time.time() (None -> None)."""
    if text is None:
        return None
    try:
        hour, minute = (int(v) for v in text.split(":"))
        when = datetime.datetime.now().replace(hour=hour, minute=minute, second=0, microsecond=0)
    except ValueError:
        raise SSDError(f"--until {text!r} is not a clock time: give HH:MM, e.g. 16:50") from None
    if when <= datetime.datetime.now():
        raise SSDError(f"--until {text} has passed already: give a later time today")
    return when.timestamp()


def add_flags(t: argparse.ArgumentParser) -> None:
    """The train-heads flags (the sampler and model flags are the CLI's own)."""
    t.add_argument("--out", default=None, help="the heads file to write (.safetensors); needed unless --plan")
    t.add_argument("--samples", type=int, default=None,
                   help="grids the model samples itself (default 256, or 0 with --grids: both are joined)")
    t.add_argument("--heldout", type=int, default=16, help="grids held out to score the heads on (>= 1; with "
                   "--grids and --samples 0 they are the files' last grids, so fewer than the files hold; never "
                   "reduced unsaid); --heldout-grids FILE replaces them")
    t.add_argument("--epochs", type=int, default=4)
    t.add_argument("--lr", type=float, default=2e-3, help="peak learning rate of the one-cycle schedule, > 0 and <= 1 "
                   "(default 2e-3); a run whose loss turns NaN or infinite stops there and says so")
    t.add_argument("--ce-weight", type=float, default=0.1, help="argmax cross-entropy of the drafts (0 = off)")
    t.add_argument("--kl-weight", type=float, default=1.0,
                   help="KL of the model's processed guided distribution against the draft's (0 = off)")
    t.add_argument("--tv-weight", type=float, default=0.0, help="the drafts' expected rejection 1 - sum min(p, q) "
                   "of the same distributions, what acceptance is (0 = off)")
    t.add_argument("--unroll", type=int, default=0, help="horizontal head trained on its own outputs along "
                   "rows to this chain depth (0 = the row's width - 1, 1 = teacher-forced pairs only)")
    t.add_argument("--max-steps", type=int, default=None, help="stop after this many optimiser steps")
    t.add_argument("--stale-share", type=float, default=0.0, help="train Hv on features with this share of "
                   "tokens changed, as it meets them in ssd (the last verify round changes some; 0 = true features)")
    t.add_argument("--until", default=None, help="HH:MM (this machine's clock, today): stop training then; the "
                   "one-cycle learning-rate schedule runs on the time left (--max-steps stays a cap)")
    t.add_argument("--checkpoint-every", type=int, default=0, help="every N steps: log the held-out expected "
                   "acceptance, save the heads so far beside --out and the run's state for --resume (0 = off)")
    t.add_argument("--resume", action="store_true", help="continue the run whose state is saved beside --out "
                   "(every --checkpoint-every steps, and when stopped by SIGTERM or Ctrl-C)")
    t.add_argument("--vertical-left", type=int, nargs="?", const=1, default=0, choices=[0, 1, 2], help="1 (the "
                   "value of a bare --vertical-left): Hv also reads the token drafted on the left of the cell it drafts "
                   "and the cell above-right (rows drafted left to right, one head call per cell); 2: also the token "
                   "two to the left and the cell above-left; a --init Hv that reads less starts as itself")
    t.add_argument("--vertical-shift", type=int, default=0, choices=[0, 1], help="columns to the right that Hv "
                   "reads in the row above: 0 = the cell above the predicted feature (the paper), 1 = the cell above "
                   "the drafted cell")
    t.add_argument("--vertical-intermediate", type=int, default=None, help="width of Hv's MLP (default: Hh's, or "
                   "--init's Hv; wider than --init's: its units kept, the new ones start adding nothing)")
    t.add_argument("--init", default=None, help="heads file for this model to start from (warm start)")
    t.add_argument("--train", default="both", choices=["both", "vertical", "horizontal"], help="which heads learn "
                   "(vertical / horizontal: the other stays as in --init)")
    t.add_argument("--features", default=None, help="store / reuse the training grids' features in this file "
                   "(small models; default: streamed from the model a batch at a time)")
    t.add_argument("--heldout-grids", default=None, help="score on these grids (safetensors, like --grids) "
                   "instead of the last --heldout training grids")
    t.add_argument("--batch", type=int, default=8, help="grids per optimiser step (over all processes)")
    t.add_argument("--gen-batch", type=int, default=8, help="grids generated at once")
    t.add_argument("--grids", default=None, help="train on these grids (safetensors: tokens [N,H,W], classes [N]; "
                   "comma-separated files are joined) instead of sampling the model")
    t.add_argument("--prompts", default=None, help="prompts to self-distil from: .txt (one a line), .jsonl, .csv "
                   "or .tsv (default: the shipped PartiPrompts list; class-conditional models draw class ids)")
    t.add_argument("--prompt-column", default=None, help="the prompts' column (.csv / .tsv) or key (.jsonl); "
                   "default 'prompt'")
    t.add_argument("--shards", default=None, help="folder of the self-distilled grids, one shard file per "
                   "--shard-grids grids (default: beside --out, NAME.grids/); a rerun keeps the finished shards")
    t.add_argument("--shard-grids", type=int, default=256, help="grids per shard file")
    t.add_argument("--plan", action="store_true", help="measure a few steps here and print what the run costs "
                   "(and, with --plan-model, the estimated cost for that model on --plan-gpu); trains nothing")
    t.add_argument("--plan-model", default=None, help="project the run for this model: "
                   "Janus-Pro-7B, Janus-Pro-1B, Emu3-Gen or Lumina-mGPT-7B")
    t.add_argument("--plan-gpu", default="H100", help="the GPU of the projection (H100, H100-PCIe, H200, A100, "
                   "A100-40GB, L40S, RTX4090, RTX3090)")
    t.add_argument("--plan-gpus", default="1,8", help="comma list of GPU counts to project (default 1,8)")
    t.add_argument("--push-to-hub", default=None, metavar="REPO", help="after training, upload the heads file "
                   "and a model card to this Hugging Face repo (owner/name; needs a token: huggingface-cli login). "
                   "Checked before the run, offline: the name's form, huggingface_hub installed, a token found. "
                   "Checked only at the push, after training: the token's write access to the repo (a failed push "
                   "keeps the heads and says how to upload them)")
    t.add_argument("--bench-json", default=None, help="a `bench --json` file whose figures go into the model card")


def validate(args) -> None:
    """Every train-heads value checked before a model loads or any grid is sampled."""
    from ..model_files import check_path
    from ..outputs import check_output
    from . import data, plan, publish
    from .config import TrainConfig
    from .prompts import read_prompts

    if args.out is None and not args.plan:
        raise SSDError("train-heads needs --out FILE.safetensors (the heads file to write), or --plan")
    if args.grid is not None:
        given = "x".join(map(str, args.grid)) if isinstance(args.grid, tuple) else args.grid
        raise SSDError(f"--grid {given}: train-heads trains the heads on the model's own grid "
                       "(its folder's size; --grids files must be of it too): leave --grid out")
    check_output(args.out, "--out", {".safetensors"})
    data.check_features_file(args.features, "--features")
    check_path(args.shards, "--shards")
    check_path(args.init, "--init")
    for flag, files in (("--grids", args.grids), ("--heldout-grids", args.heldout_grids)):
        for one in (files.split(",") if files else []):
            check_path(one, flag)
            if not Path(one).is_file():
                raise SSDError(f"{flag} {one} is not a file: give a safetensors file with 'tokens' [N, H, W] "
                               "and 'classes' [N]")
    samples = args.samples if args.samples is not None else (0 if args.grids else 256)
    if samples < 1 and not args.grids:
        raise SSDError(f"train-heads samples must be a whole number >= 1 (or 0 with --grids FILE), got {samples}")
    if args.prompt_column is not None and args.prompts is None:
        raise SSDError("--prompt-column names a column of --prompts FILE: give --prompts too")
    args.prompt_list = read_prompts(args.prompts, args.prompt_column) if args.prompts else None
    if args.shards is not None and Path(args.shards).is_file():
        raise SSDError(f"--shards {args.shards} is a file: give a folder for the self-distilled grids")
    args.train_config = TrainConfig(samples=samples, heldout=args.heldout, epochs=args.epochs, lr=args.lr,
                                    ce_weight=args.ce_weight, kl_weight=args.kl_weight, tv_weight=args.tv_weight,
                                    unroll=args.unroll, vertical_intermediate=args.vertical_intermediate,
                                    seed=args.seed, batch_grids=args.batch, gen_batch=args.gen_batch,
                                    max_steps=args.max_steps, stale_share=args.stale_share,
                                    vertical_left=args.vertical_left, checkpoint_every=args.checkpoint_every,
                                    until=clock_time(args.until), vertical_shift=args.vertical_shift,
                                    init=args.init, train=args.train, shard_grids=args.shard_grids)
    args.plan_counts = plan.check(args.plan_model, args.plan_gpu, args.plan_gpus) if args.plan else None
    if args.push_to_hub is not None:
        if args.plan:
            raise SSDError("--push-to-hub uploads trained heads; --plan trains none: leave one out")
        args.push_to_hub = publish.check(args.push_to_hub)
    args.bench = publish.read_bench(args.bench_json) if args.bench_json is not None else None
    if args.bench_json is not None and args.push_to_hub is None:
        raise SSDError("--bench-json goes into the model card of --push-to-hub REPO: give both, or neither")


def device_of_process(device: str) -> str:
    """Under a launcher (LOCAL_RANK set) 'cuda' means this process's own GPU."""
    local = os.environ.get("LOCAL_RANK")
    if local is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1 and device == "cuda":
        import torch

        torch.cuda.set_device(int(local))
        return f"cuda:{local}"
    return device


def command(args) -> int:
    from ..api import check_negative_prompt, load_model
    from ..sampling import settings_from
    from . import data, dist, loop

    model = load_model(args.model, args.dtype, device_of_process(args.device), quantization=args.quantization,
                       offload=args.offload, compile=args.compile)
    check_negative_prompt(model, args.negative_prompt)
    settings = settings_from(model.defaults, args.seed, cfg=args.cfg, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    cfg = args.train_config
    prompts, grids = data.read_grids(args.grids, model) if args.grids else (None, None)
    if args.plan:
        from . import plan

        print(plan.run(model, cfg, settings, args.plan_model, args.plan_gpu, args.plan_counts,
                       group=dist.from_environment(model.device.type), given=0 if grids is None else len(grids)))
        return 0
    held = data.read_grids(args.heldout_grids, model) if args.heldout_grids else None
    _, report = loop.train_heads(model, args.out, cfg, settings, grids=grids, grid_prompts=prompts,
                                 features=args.features, heldout_grids=held, prompts=args.prompt_list,
                                 shards=args.shards, resume=args.resume)
    if "expected_acceptance" not in report:  # another process of a data-parallel run: the first one reports
        return 0
    print(json.dumps(report))
    print(f"wrote {args.out}")
    if args.push_to_hub is not None:
        from . import publish

        print(f"pushed to {publish.push(args.push_to_hub, args.out, report, args.bench)}")
    return 0
