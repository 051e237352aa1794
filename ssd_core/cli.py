"""Command line: generate, train-heads, bench, convert-vqgan."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .decoders import DECODERS, PARAMS, needs_heads
from .errors import SSDError
from .memory import OFFLOADS, QUANTIZATIONS
from .static_cache import MODES
from .trace import parse_grid, status_image


def _sampler_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="reference", help="model folder, or 'reference' (the bundled model)")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.add_argument("--device", default="cpu")
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
    for name, param in PARAMS.items():  # the decoders' parameters, their limits and defaults
        limits = f"{param.low}..{param.high}" if param.high is not None else f">= {param.low}"
        p.add_argument("--" + name.replace("_", "-"), type=int, default=param.default, help=f"{param.help}; {limits}")
    p.add_argument("--grid", default=None, help="token grid as HxW (default: the model's)")


def _load(args):
    from . import load_heads, load_model

    model = load_model(args.model, args.dtype, args.device, quantization=args.quantization, offload=args.offload,
                       compile=args.compile)
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
                      top_p=args.top_p, draft_rows=args.draft_rows, verify_rounds=args.verify_rounds,
                      window=args.window, grid=parse_grid(args.grid))
    tr = result.trace
    print(f"{args.decoder}: {tr.steps} steps, {tr.to_dict()['tokens_per_step']} tokens/step, "
          f"{tr.timings['wall']:.2f} s, nll {tr.nll:.4f} (untruncated {tr.nll_full:.4f}), {tr.counts}")
    if args.out:
        if result.image is None:
            print("this model has no pixel decoder: no image written (use --trace for the tokens)")
        else:
            save_image(result.image, args.out)
            print(f"wrote {args.out}")
    if args.status_image:
        save_image(status_image(tr.to_dict()), args.status_image)
    if args.trace:
        Path(args.trace).write_text(json.dumps(tr.to_dict()))
        print(f"wrote {args.trace}")
    return 0


def cmd_train(args) -> int:
    from . import load_model
    from .sampling import SamplerSettings
    from .train import TrainConfig, train_heads

    model = load_model(args.model, args.dtype, args.device)
    d = model.defaults
    settings = SamplerSettings(args.seed, d["cfg"] if args.cfg is None else args.cfg,
                               d["temperature"] if args.temperature is None else args.temperature,
                               d["top_k"] if args.top_k is None else args.top_k,
                               d["top_p"] if args.top_p is None else args.top_p)
    cfg = TrainConfig(samples=args.samples, heldout=args.heldout, epochs=args.epochs, lr=args.lr,
                      ce_weight=args.ce_weight, seed=args.seed, batch_grids=args.batch, gen_batch=args.gen_batch)
    grids = prompts = None
    if args.grids:
        from .train import read_grids

        prompts, grids = read_grids(args.grids, model)
    _, report = train_heads(model, args.out, cfg, settings, grids=grids, grid_prompts=prompts)
    print(json.dumps(report))
    print(f"wrote {args.out}")
    return 0


def cmd_bench(args) -> int:
    from .bench import BenchOptions, run_bench

    model, heads = _load(args)
    if args.decoders is None:  # every decoder that can run: without heads, those that need none
        decoders = tuple(d for d in DECODERS if heads is not None or not needs_heads(d))
    else:
        decoders = tuple(d.strip() for d in args.decoders.split(",") if d.strip())
    options = BenchOptions(
        decoders=decoders, images=args.images,
        seed=args.seed, prompt=args.prompt, negative_prompt=args.negative_prompt, cfg=args.cfg,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, draft_rows=args.draft_rows,
        verify_rounds=args.verify_rounds, window=args.window, grid=parse_grid(args.grid),
        ssd_rounds=tuple(int(r) for r in args.ssd_rounds.split(",")) if args.ssd_rounds else (),
        verify_cost=args.verify_cost, out_dir=args.out_dir, json=args.json, model_name=str(args.model),
        batch=args.batch)
    run_bench(model, heads, options)
    return 0


def cmd_convert_vqgan(args) -> int:
    from .pixel_decoders.convert_vqgan import main as convert

    return convert([args.src, args.dst])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ssd_core", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate one image")
    _sampler_flags(g)
    g.add_argument("--heads", default="auto", help="heads file, 'reference', or 'none'")
    g.add_argument("--decoder", default="ssd-exact", choices=list(DECODERS),
                   help="ssd-exact (default): the image of ar for the seed in fewer steps, heads or not")
    g.add_argument("--out", default=None, help="PNG to write")
    g.add_argument("--status-image", default=None, help="PNG of the token-status grid")
    g.add_argument("--trace", default=None, help="trace JSON to write")
    g.set_defaults(func=cmd_generate)
    t = sub.add_parser("train-heads", help="self-distil the draft heads for a model")
    _sampler_flags(t)
    t.add_argument("--out", required=True)
    t.add_argument("--samples", type=int, default=256)
    t.add_argument("--heldout", type=int, default=16)
    t.add_argument("--epochs", type=int, default=4)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--ce-weight", type=float, default=0.1)
    t.add_argument("--batch", type=int, default=8, help="grids per optimiser step")
    t.add_argument("--gen-batch", type=int, default=8, help="grids generated at once")
    t.add_argument("--grids", default=None, help="train on these grids (safetensors: tokens [N,H,W], classes [N]) "
                   "instead of sampling the model")
    t.set_defaults(func=cmd_train)
    b = sub.add_parser("bench", help="every decoder on the same prompts and seeds")
    _sampler_flags(b)
    b.add_argument("--heads", default="auto")
    b.add_argument("--decoders", default=None, help="comma list (default: every decoder the heads allow); "
                   "NAME:noheads runs a decoder without the loaded heads, e.g. ssd-exact,ssd-exact:noheads")
    b.add_argument("--images", type=int, default=4)
    b.add_argument("--json", default=None)
    b.add_argument("--verify-cost", action="store_true", help="also time one verify forward per window length")
    b.add_argument("--ssd-rounds", default=None, help="comma list of ssd verify rounds to bench, e.g. 0,1,2")
    b.add_argument("--out-dir", default=None, help="write sample and status PNGs here")
    b.add_argument("--batch", type=int, default=0, help="also run the images in batches of N (images/s batched "
                   "vs one at a time, and identical_to_ar over both)")
    b.set_defaults(func=cmd_bench)
    c = sub.add_parser("convert-vqgan", help="Lumina-mGPT / Chameleon vqgan.ckpt -> safetensors")
    c.add_argument("src")
    c.add_argument("dst")
    c.set_defaults(func=cmd_convert_vqgan)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SSDError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
