"""Command line: generate, train-heads, bench, convert-vqgan, convert-movqgan, convert-ibq, check-model."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from .bench import MAX_IMAGES, NOHEADS_DECODERS, ROWS_DECODERS, check_decoders, check_images
from .decoders import DECODERS, DRAFT_ROWS, ENGINE_DECODERS, PARAMS, VERIFY_ROUNDS, DecoderParams, needs_heads, spec
from .errors import SSDError
from .images import image_extensions
from .memory import OFFLOADS, QUANTIZATIONS
from .model_files import check_path
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
    for flag in ("model", "heads"):  # a NUL or a name no file system takes: refused before the model loads
        check_path(getattr(args, flag, None), "--" + flag)
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
        check_images(args.images)
        _positive(args, "--batch", 0)
        if args.decoders is not None:  # "ssd-exact@3:noheads": that decoder at 3 rows without the loaded heads
            args.decoders = tuple(d.strip() for d in args.decoders.split(",") if d.strip())
            check_decoders(args.decoders)
        args.ssd_rounds = _whole_list(args.ssd_rounds, "--ssd-rounds", VERIFY_ROUNDS, "0,1,2")
        args.ssd_adaptive = _whole_list(args.ssd_adaptive, "--ssd-adaptive", PARAMS["adaptive_percent"], "5,15")
        args.ssd_first_row = _whole_list(args.ssd_first_row, "--ssd-first-row", PARAMS["stable_first_row"], "1,2")
        check_output(args.json, "--json", {".json"})
        check_output(args.plot, "--plot", image_extensions(), make_folder=True)
        check_output_dir(args.out_dir, "--out-dir")
    elif args.command == "train-heads":
        from .training.cli import validate as validate_train

        validate_train(args)


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


def _suffix_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-official-suffix", action="store_true",
                   help="Emu3: leave out the official suffix ' masterpiece, film grained, best quality.' that BAAI's "
                   "script appends to every prompt (on by default; other families have none)")


def _load(args):
    from . import list_bundled, load_heads, load_model
    from .api import check_negative_prompt

    model = load_model(args.model, args.dtype, args.device, quantization=args.quantization, offload=args.offload,
                       compile=args.compile)
    check_negative_prompt(model, args.negative_prompt)
    heads_name = getattr(args, "heads", "none")
    if heads_name in (None, "none"):
        return model, None
    if heads_name == "auto":  # a bundled model's own heads; none for any other model
        if args.model not in list_bundled()["heads"]:
            return model, None
        heads_name = args.model
    return model, load_heads(heads_name, model)


def cmd_generate(args) -> int:
    from . import generate
    from .images import save_image

    model, heads = _load(args)
    prompt = args.prompt if args.prompt is not None else 0
    result = generate(model, heads, prompt=prompt, negative_prompt=args.negative_prompt,
                      official_suffix=False if args.no_official_suffix else None, decoder=args.decoder,
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
    from .training.cli import command

    return command(args)


def cmd_bench(args) -> int:
    from .bench import BenchOptions, run_bench

    model, heads = _load(args)
    if args.decoders is None:  # every decoder that can run: without heads, those that need none
        decoders = tuple(d for d in ENGINE_DECODERS if heads is not None or not needs_heads(d))
    else:
        decoders = args.decoders  # checked by validate()
    options = BenchOptions(
        decoders=decoders, images=args.images,
        seed=args.seed, prompt=args.prompt, negative_prompt=args.negative_prompt,
        official_suffix=False if args.no_official_suffix else None, cfg=args.cfg,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        params=args.params, grid=args.grid, ssd_rounds=args.ssd_rounds,
        ssd_adaptive=args.ssd_adaptive,  # checked by validate(), as the lists below
        ssd_first_row=args.ssd_first_row or ((args.stable_first_row,) if args.stable_first_row is not None else ()),
        plot=args.plot,
        verify_cost=args.verify_cost, out_dir=args.out_dir, json=args.json, model_name=str(args.model),
        batch=args.batch, step_ops=args.step_ops)
    if args.difficulty:  # every decoder at several sampler settings, with how certain ar's tokens were
        from . import difficulty

        result = difficulty.sweep(model, heads, replace(options, plot=None, json=None), args.temperatures,
                                  args.weak_cfg)
        difficulty.write(result, args.json, args.plot)
        return 0
    run_bench(model, heads, options)
    return 0


def cmd_convert_vqgan(args) -> int:
    from .pixel_decoders.convert_vqgan import main as convert

    return convert([args.src, args.dst])


def cmd_convert_movqgan(args) -> int:
    """Lumina-mGPT 2.0's movqgan_270M.ckpt -> movqgan.safetensors (pixel_decoders/movqgan.py)."""
    from .pixel_decoders.movqgan import convert

    return _convert_decoder(lambda: convert(args.src, args.dst), args.dst)


def cmd_convert_ibq(args) -> int:
    """Emu3.5's BAAI/Emu3.5-VisionTokenizer model.ckpt + config.yaml -> ibq.safetensors (pixel_decoders/ibq.py)."""
    from .pixel_decoders.ibq import convert

    return _convert_decoder(lambda: convert(args.src, args.config, args.dst), args.dst)


def _convert_decoder(convert, dst) -> int:
    """Run a pixel decoder's conversion: its config in one line, or its error in one line and exit 2."""
    from .pixel_decoders.convert_vqgan import ConversionError

    try:
        cfg = convert()
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {dst}: {cfg.n_embed} codes, embed_dim {cfg.embed_dim}, ch {cfg.ch}, ch_mult {cfg.ch_mult}, "
          f"f={cfg.factor}")
    return 0


def cmd_check_model(args) -> int:
    """The folder's report on stdout (JSON with --json); exit 2 with one error line when a finding blocks loading."""
    from .check_model import check_folder
    from .check_report import format_report, key_findings

    report = check_folder(args.folder)
    print(json.dumps(report.to_dict(), indent=1) if args.json else format_report(report))
    if report.loadable:
        return 0
    print(f"error: {report.folder} does not load: {key_findings(report)}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m ssd_core", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_generate_parser, _train_parser, _bench_parser, _convert_parser, _check_model_parser):
        add(sub)
    return parser


HEADS_HELP = ("heads file, a bundled model's name ('reference', 'reference-48') or 'none'; auto (default): "
              "a bundled model's own heads, none for any other model")


def _generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate one image")
    _sampler_flags(g)
    g.add_argument("--heads", default="auto", help=HEADS_HELP)
    _suffix_flag(g)
    g.add_argument("--decoder", default="ssd-exact", choices=list(DECODERS),
                   help="ssd-exact (default): the image of ar for the seed in fewer steps, heads or not (fp32: "
                        "1,407 of 1,410 tests equal; the trace's exact.first_near_tie names where it may differ)")
    g.add_argument("--out", default=None, help="PNG to write")
    g.add_argument("--status-image", default=None, help="PNG of the token-status grid")
    g.add_argument("--trace", default=None, help="trace JSON to write")
    g.set_defaults(func=cmd_generate)


def _train_parser(sub) -> None:
    from .training.cli import add_flags

    t = sub.add_parser("train-heads", help="self-distil the draft heads for a model (docs/heads.md)")
    _sampler_flags(t)
    add_flags(t)
    t.set_defaults(func=cmd_train)


def _float_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers, e.g. 0.8,1.0,1.3") from None
    if not values or not all(0 < v <= 10 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give temperatures above 0 and at most 10, e.g. 0.8,1.0,1.3")
    return values


def _bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="every decoder on the same prompts and seeds")
    _sampler_flags(b)
    b.add_argument("--heads", default="auto", help=HEADS_HELP)
    _suffix_flag(b)
    b.add_argument("--decoders", default=None, help="comma list, each decoder once (default: every decoder the "
                   f"heads allow); NAME@N runs {' or '.join(ROWS_DECODERS)} at N draft rows ({DRAFT_ROWS.low}.."
                   f"{DRAFT_ROWS.high}), NAME:noheads {' or '.join(NOHEADS_DECODERS)} without the loaded heads, e.g. "
                   "ssd-exact,ssd-exact@3,ssd-exact@3:noheads")
    b.add_argument("--images", type=int, default=4, help=f"images per decoder, 1 to {MAX_IMAGES} (every result "
                   "stays in memory until the report); default 4")
    b.add_argument("--json", default=None)
    b.add_argument("--verify-cost", action="store_true", help="also time one verify forward per window length")
    b.add_argument("--no-step-ops", dest="step_ops", action="store_false", help="leave out the ops/st column "
                   "(its count runs the first image once more per row, untimed)")
    b.add_argument("--ssd-rounds", default=None, help="comma list of ssd verify rounds to bench, e.g. 0,1,2")
    b.add_argument("--ssd-adaptive", default=None, help="comma list of adaptive percents to bench beside the "
                   "fixed schedule, e.g. 5,15 (per --ssd-rounds value: the cap)")
    b.add_argument("--ssd-first-row", default=None, help="comma list of stable_first_row values to bench, e.g. 1,2")
    b.add_argument("--plot", default=None, help="PNG: steps ratio against the nll_full gap (and class accuracy)")
    b.add_argument("--out-dir", default=None, help="write sample and status PNGs here")
    b.add_argument("--batch", type=int, default=0, help="also run the images in batches of N (images/s batched "
                   "vs one at a time, and identical_to_ar over both)")
    b.add_argument("--difficulty", action="store_true", help="the difficulty curve: the bench at each of "
                   "--temperatures (and a weaker cfg), with the mean top-1 probability and entropy of ar's tokens "
                   "beside each; --json and --plot (step ratio against that probability) take the sweep")
    b.add_argument("--temperatures", type=_float_list, default=(0.8, 1.0, 1.3, 1.6),
                   help="--difficulty's temperatures, comma list (default 0.8,1.0,1.3,1.6)")
    b.add_argument("--weak-cfg", type=float, default=None, help="--difficulty's weaker cfg, at temperature 1 "
                   "(default: half way from the model's cfg to 1)")
    b.set_defaults(func=cmd_bench)


def _convert_parser(sub) -> None:
    c = sub.add_parser("convert-vqgan", help="Lumina-mGPT / Chameleon vqgan.ckpt -> safetensors")
    c.add_argument("src")
    c.add_argument("dst")
    c.set_defaults(func=cmd_convert_vqgan)
    m = sub.add_parser("convert-movqgan", help="Lumina-mGPT 2.0's movqgan_270M.ckpt -> movqgan.safetensors")
    m.add_argument("src")
    m.add_argument("dst")
    m.set_defaults(func=cmd_convert_movqgan)
    i = sub.add_parser("convert-ibq", help="Emu3.5's BAAI/Emu3.5-VisionTokenizer model.ckpt + config.yaml -> "
                       "ibq.safetensors")
    i.add_argument("src", help="model.ckpt (read with weights_only=True)")
    i.add_argument("config", help="config.yaml beside it")
    i.add_argument("dst", help="<Emu3.5 folder>/ibq.safetensors")
    i.set_defaults(func=cmd_convert_ibq)


def _check_model_parser(sub) -> None:
    c = sub.add_parser("check-model", help="what a model folder holds and lacks, and the memory it needs, "
                       "from its headers (no weights loaded)")
    c.add_argument("folder", help="model folder, or 'reference' / 'reference-48' (the bundled models)")
    c.add_argument("--json", action="store_true", help="the report as JSON")
    c.set_defaults(func=cmd_check_model)


def main(argv=None) -> int:
    """Exit codes: 0 done, 2 a bad input or a failed write (one line on stderr), 130 interrupted (Ctrl-C)."""
    start = len(WRITTEN)
    try:
        args = build_parser().parse_args(argv)
        if args.command not in ("convert-vqgan", "convert-movqgan", "convert-ibq", "check-model"):
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
