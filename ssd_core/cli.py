"""Command line: generate, train-heads, bench, convert-vqgan."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .decoders import DECODERS, NO_HEADS, PARAMS, VERIFY_ROUNDS, DecoderParams, needs_heads, spec
from .errors import SSDError
from .images import image_extensions
from .memory import OFFLOADS, QUANTIZATIONS
from .outputs import WRITTEN, check_output, check_output_dir, write_or_keep
from .static_cache import MODES
from .grid_text import parse_grid
from .trace import status_image


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line (exit code 2), without the usage block."""

    def error(self, message):
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _positive(args, flag: str, low: int = 1) -> None:
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    if value < low:
        raise SSDError(f"{flag} must be at least {low}, got {value}")


def validate(args) -> None:
    """Every command-line value checked before a model loads or any sampling starts."""
    from .api import check_device
    from .sampling import settings_from

    check_device(args.device)
    settings_from({}, args.seed, cfg=args.cfg, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                  min_p=args.min_p)
    args.params = DecoderParams.read(args, shown=lambda name: "--" + name.replace("_", "-"))
    args.grid = parse_grid(args.grid)
    if args.command == "generate":
        spec(args.decoder)
        check_output(args.out, "--out", image_extensions())
        check_output(args.status_image, "--status-image", image_extensions())
        check_output(args.trace, "--trace", {".json"})
    elif args.command == "bench":
        _positive(args, "--images")
        _positive(args, "--batch", 0)
        if args.decoders is not None:
            args.decoders = tuple(d.strip() for d in args.decoders.split(",") if d.strip())
            for name in args.decoders:  # "ssd-exact:noheads": that decoder without the loaded heads
                spec(name.removesuffix(NO_HEADS))
        args.ssd_rounds = _whole_list(args.ssd_rounds, "--ssd-rounds", VERIFY_ROUNDS, "0,1,2")
        args.ssd_adaptive = _whole_list(args.ssd_adaptive, "--ssd-adaptive", PARAMS["adaptive_percent"], "5,15")
        args.ssd_first_row = _whole_list(args.ssd_first_row, "--ssd-first-row", PARAMS["stable_first_row"], "1,2")
        check_output(args.json, "--json", {".json"})
        check_output(args.plot, "--plot", image_extensions(), make_folder=True)
        check_output_dir(args.out_dir, "--out-dir")
    elif args.command == "train-heads":
        from .train import TrainConfig, check_features_file

        check_output(args.out, "--out", {".safetensors"})
        check_features_file(args.features, "--features")
        for flag, files in (("--grids", args.grids), ("--heldout-grids", args.heldout_grids)):
            for one in (files.split(",") if files else []):
                if not Path(one).is_file():
                    raise SSDError(f"{flag} {one} is not a file: give a safetensors file with 'tokens' [N, H, W] "
                                   "and 'classes' [N]")
        samples = args.samples if args.samples is not None else (0 if args.grids else 256)
        if samples < 1 and not args.grids:
            raise SSDError(f"train-heads samples must be a whole number >= 1 (or 0 with --grids FILE), got {samples}")
        args.train_config = TrainConfig(samples=samples, heldout=args.heldout, epochs=args.epochs, lr=args.lr,
                                        ce_weight=args.ce_weight, kl_weight=args.kl_weight, tv_weight=args.tv_weight,
                                        unroll=args.unroll, vertical_intermediate=args.vertical_intermediate,
                                        seed=args.seed, batch_grids=args.batch, gen_batch=args.gen_batch,
                                        max_steps=args.max_steps, stale_share=args.stale_share,
                                        vertical_left=args.vertical_left, checkpoint_every=args.checkpoint_every,
                                        until=_clock_time(args.until), vertical_shift=args.vertical_shift,
                                        init=args.init, train=args.train)


def _whole_list(text, flag: str, param, example: str) -> tuple[int, ...]:
    """'0,1,2' -> (0, 1, 2), each value within `param`'s limits; None or '' -> ()."""
    if not text:
        return ()
    try:
        values = tuple(int(v) for v in str(text).split(","))
    except ValueError:
        raise SSDError(f"{flag} {text!r} is not a comma list of whole numbers, e.g. {example}") from None
    for value in values:
        param.check(flag, value)
    return values


def _clock_time(text):
    """'HH:MM' -> that time today as time.time() (None -> None)."""
    if text is None:
        return None
    import datetime

    try:
        hour, minute = (int(v) for v in text.split(":"))
        when = datetime.datetime.now().replace(hour=hour, minute=minute, second=0, microsecond=0)
    except ValueError:
        raise SSDError(f"--until {text!r} is not a clock time: give HH:MM, e.g. 16:50") from None
    if when <= datetime.datetime.now():
        raise SSDError(f"--until {text} has passed already: give a later time today")
    return when.timestamp()


def _sampler_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="reference", help="model folder, or 'reference' (the bundled model)")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (Apple GPUs; an op torch lacks "
                   "there stops with how to go on: PYTORCH_ENABLE_MPS_FALLBACK=1 or --device cpu); default cpu")
    p.add_argument("--quantization", default="none", choices=list(QUANTIZATIONS),
                   help="8-bit / 4-bit (NF4) weights through bitsandbytes; the image head stays full precision")
    p.add_argument("--offload", default="none", choices=list(OFFLOADS),
                   help="auto: the layers that do not fit in the GPU's free memory wait on the CPU (accelerate)")
    p.add_argument("--compile", nargs="?", const="compiled", default="off", choices=MODES,
                   help="static KV cache (static) and torch.compile of the verify forward (compiled, the value "
                   "of a bare --compile; CUDA graphs on a GPU); default off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--class", dest="prompt", default=None, help="class id or name (class-conditional models)")
    p.add_argument("--prompt", dest="prompt", help="text prompt (text-to-image models)")
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--cfg", type=float, default=None, help="classifier-free guidance scale (1 = off)")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="0 = off")
    p.add_argument("--top-p", type=float, default=None, help="1 = off")
    p.add_argument("--min-p", type=float, default=None,
                   help="keep codes the prompt gives at least this share of its top code's probability (0 = off)")
    for name, param in PARAMS.items():  # the decoders' parameters, their limits and defaults
        limits = f"{param.low}..{param.high}" if param.high is not None else f">= {param.low}"
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"{param.help}; {limits}; default: the decoder's ({param.default})")
    p.add_argument("--grid", default=None, help="token grid as HxW (default: the model's)")


def _load(args):
    from . import load_heads, load_model
    from .api import check_negative_prompt

    model = load_model(args.model, args.dtype, args.device, quantization=args.quantization, offload=args.offload,
                       compile=args.compile)
    check_negative_prompt(model, args.negative_prompt)
    heads_name = getattr(args, "heads", "none")
    if heads_name in (None, "none"):
        return model, None
    if heads_name == "auto":
        heads_name = "reference" if args.model == "reference" else "none"
        if heads_name == "none":
            return model, None
    return model, load_heads(heads_name, model)


def cmd_generate(args) -> int:
    from . import generate
    from .images import save_image

    model, heads = _load(args)
    prompt = args.prompt if args.prompt is not None else 0
    result = generate(model, heads, prompt=prompt, negative_prompt=args.negative_prompt, decoder=args.decoder,
                      seed=args.seed, cfg=args.cfg, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, min_p=args.min_p, params=args.params, grid=args.grid)
    tr = result.trace
    print(f"{args.decoder}: {tr.steps} steps, {tr.to_dict()['tokens_per_step']} tokens/step, "
          f"{tr.timings['wall']:.2f} s, nll {tr.nll:.4f} (untruncated {tr.nll_full:.4f}), {tr.counts}")
    writes = []  # (flag, path, write): every one is tried, a failed one kept beside (outputs.write_or_keep)
    if args.out:
        if result.image is None:
            print("this model has no pixel decoder: no image written (use --trace for the tokens)")
        else:
            writes.append(("--out", args.out, lambda p: save_image(result.image, p)))
    if args.status_image:
        writes.append(("--status-image", args.status_image, lambda p: save_image(status_image(tr.to_dict()), p)))
    if args.trace:
        writes.append(("--trace", args.trace, lambda p: Path(p).write_text(json.dumps(tr.to_dict()))))
    failed = []
    for flag, path, write in writes:
        try:
            print(f"wrote {write_or_keep(path, write, flag)}")
        except SSDError as err:
            failed.append(str(err))
    if failed:
        raise SSDError("; ".join(failed))
    return 0


def cmd_train(args) -> int:
    from .sampling import settings_from
    from .train import train_heads

    model, _ = _load(args)
    settings = settings_from(model.defaults, args.seed, cfg=args.cfg, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    cfg = args.train_config
    from .train import read_grids

    prompts, grids = read_grids(args.grids, model) if args.grids else (None, None)
    held = read_grids(args.heldout_grids, model) if args.heldout_grids else None
    _, report = train_heads(model, args.out, cfg, settings, grids=grids, grid_prompts=prompts,
                            features=args.features, heldout_grids=held)
    print(json.dumps(report))
    print(f"wrote {args.out}")
    return 0


def cmd_bench(args) -> int:
    from .bench import BenchOptions, run_bench

    model, heads = _load(args)
    if args.decoders is None:  # every decoder that can run: without heads, those that need none
        decoders = tuple(d for d in DECODERS if heads is not None or not needs_heads(d))
    else:
        decoders = args.decoders  # checked by validate()
    options = BenchOptions(
        decoders=decoders, images=args.images,
        seed=args.seed, prompt=args.prompt, negative_prompt=args.negative_prompt, cfg=args.cfg,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        params=args.params, grid=args.grid, ssd_rounds=args.ssd_rounds,
        ssd_adaptive=args.ssd_adaptive,  # checked by validate(), as the lists below
        ssd_first_row=args.ssd_first_row or ((args.stable_first_row,) if args.stable_first_row is not None else ()),
        plot=args.plot,
        verify_cost=args.verify_cost, out_dir=args.out_dir, json=args.json, model_name=str(args.model),
        batch=args.batch)
    run_bench(model, heads, options)
    return 0


def cmd_convert_vqgan(args) -> int:
    from .pixel_decoders.convert_vqgan import main as convert

    return convert([args.src, args.dst])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m ssd_core", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_generate_parser, _train_parser, _bench_parser, _convert_parser):
        add(sub)
    return parser


def _generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate one image")
    _sampler_flags(g)
    g.add_argument("--heads", default="auto", help="heads file, 'reference', or 'none'")
    g.add_argument("--decoder", default="ssd-exact", choices=list(DECODERS),
                   help="ssd-exact (default): the image of ar for the seed in fewer steps, heads or not")
    g.add_argument("--out", default=None, help="PNG to write")
    g.add_argument("--status-image", default=None, help="PNG of the token-status grid")
    g.add_argument("--trace", default=None, help="trace JSON to write")
    g.set_defaults(func=cmd_generate)


def _train_parser(sub) -> None:
    t = sub.add_parser("train-heads", help="self-distil the draft heads for a model")
    _sampler_flags(t)
    t.add_argument("--out", required=True)
    t.add_argument("--samples", type=int, default=None,
                   help="grids the model samples itself (default 256, or 0 with --grids: both are joined)")
    t.add_argument("--heldout", type=int, default=16)
    t.add_argument("--epochs", type=int, default=4)
    t.add_argument("--lr", type=float, default=2e-3)
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
                   "acceptance and save the heads so far beside --out (0 = off)")
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
    t.add_argument("--features", default=None, help="store / reuse the training grids' features in this file")
    t.add_argument("--heldout-grids", default=None, help="score on these grids (safetensors, like --grids) "
                   "instead of the last --heldout training grids")
    t.add_argument("--batch", type=int, default=8, help="grids per optimiser step")
    t.add_argument("--gen-batch", type=int, default=8, help="grids generated at once")
    t.add_argument("--grids", default=None, help="train on these grids (safetensors: tokens [N,H,W], classes [N]; "
                   "comma-separated files are joined) instead of sampling the model")
    t.set_defaults(func=cmd_train)


def _bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="every decoder on the same prompts and seeds")
    _sampler_flags(b)
    b.add_argument("--heads", default="auto")
    b.add_argument("--decoders", default=None, help="comma list (default: every decoder the heads allow); "
                   "NAME:noheads runs a decoder without the loaded heads, e.g. ssd-exact,ssd-exact:noheads")
    b.add_argument("--images", type=int, default=4)
    b.add_argument("--json", default=None)
    b.add_argument("--verify-cost", action="store_true", help="also time one verify forward per window length")
    b.add_argument("--ssd-rounds", default=None, help="comma list of ssd verify rounds to bench, e.g. 0,1,2")
    b.add_argument("--ssd-adaptive", default=None, help="comma list of adaptive percents to bench beside the "
                   "fixed schedule, e.g. 5,15 (per --ssd-rounds value: the cap)")
    b.add_argument("--ssd-first-row", default=None, help="comma list of stable_first_row values to bench, e.g. 1,2")
    b.add_argument("--plot", default=None, help="PNG: steps ratio against the nll_full gap (and class accuracy)")
    b.add_argument("--out-dir", default=None, help="write sample and status PNGs here")
    b.add_argument("--batch", type=int, default=0, help="also run the images in batches of N (images/s batched "
                   "vs one at a time, and identical_to_ar over both)")
    b.set_defaults(func=cmd_bench)


def _convert_parser(sub) -> None:
    c = sub.add_parser("convert-vqgan", help="Lumina-mGPT / Chameleon vqgan.ckpt -> safetensors")
    c.add_argument("src")
    c.add_argument("dst")
    c.set_defaults(func=cmd_convert_vqgan)


def main(argv=None) -> int:
    """Exit codes: 0 done, 2 a bad input or a failed write (one line on stderr), 130 interrupted (Ctrl-C)."""
    start = len(WRITTEN)
    try:
        args = build_parser().parse_args(argv)
        if args.command != "convert-vqgan":
            validate(args)
        return args.func(args)
    except SSDError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_line(WRITTEN[start:]), file=sys.stderr)
        return 130


def interrupted_line(written) -> str:
    """The one line a Ctrl-C leaves: what was written before it, if anything."""
    if not written:
        return "interrupted; nothing was written"
    shown = ", ".join(written[-3:])
    more = f" and {len(written) - 3} more" if len(written) > 3 else ""
    return f"interrupted; partial results written to {shown}{more}"
