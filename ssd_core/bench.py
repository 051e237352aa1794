"""`bench`: every decoder on the same prompts and seeds; medians, ratios against `ar`, a table, JSON."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from .api import generate
from .errors import SSDError
from .trace import finite_or_none
from .yardstick import bench_rows, for_model


def _variants(args) -> list[tuple[str, str, int]]:
    """(row label, decoder, verify rounds); `--ssd-rounds 0,1,2` gives one ssd row per round count."""
    out = []
    for name in [d.strip() for d in args.decoders.split(",") if d.strip()]:
        if name == "ssd" and args.ssd_rounds:
            out += [(f"ssd r={r}", "ssd", int(r)) for r in args.ssd_rounds.split(",")]
        else:
            out.append((name, name, args.verify_rounds))
    if "ar" not in [v[1] for v in out]:
        out.insert(0, ("ar", "ar", args.verify_rounds))
    return out


def prompts_for(model, n: int, given) -> list:
    if given is not None:
        return [given] * n
    if model.class_names:
        return [i % len(model.class_names) for i in range(n)]
    texts = getattr(model, "training_prompts", ["a photo of a cat"])
    return [texts[i % len(texts)] for i in range(n)]


def run_bench(model, heads, args, log=print) -> dict:
    from .cli import _grid

    variants = _variants(args)
    prompts = prompts_for(model, args.images, args.prompt)
    seeds = [args.seed + i for i in range(args.images)]
    results: dict[str, list] = {label: [] for label, _, _ in variants}
    out_dir = Path(args.out_dir) if getattr(args, "out_dir", None) else None
    stick = for_model(model)  # the image-quality yardstick (class accuracy, FD), bundled model only
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        for label, decoder, rounds in variants:
            if decoder in ("ssd", "ssd-exact") and heads is None:
                raise SSDError(f"bench of {decoder} needs heads: pass --heads FILE (or drop it from --decoders)")
            r = generate(model, heads if decoder in ("ssd", "ssd-exact") else None, prompt=prompt,
                         negative_prompt=args.negative_prompt, decoder=decoder, seed=seed, cfg=args.cfg,
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                         draft_rows=args.draft_rows, verify_rounds=rounds, window=args.window,
                         grid=_grid(args.grid), decode_pixels=out_dir is not None or stick is not None)
            results[label].append(r)
        log(f"image {i + 1}/{len(prompts)} done")
    ar = results["ar"]
    ar_nll = statistics.median([a.trace.nll for a in ar])
    ar_full = statistics.median([a.trace.nll_full for a in ar])
    rows = []
    for label, decoder, _ in variants:
        runs = results[label]
        steps = [r.trace.steps for r in runs]
        walls = [r.trace.timings["wall"] - r.trace.timings["prefill"] for r in runs]
        nlls = [r.trace.nll for r in runs]
        fulls = [r.trace.nll_full for r in runs]
        ar_steps = [a.trace.steps for a in ar]
        ar_walls = [a.trace.timings["wall"] - a.trace.timings["prefill"] for a in ar]
        exactness = None
        if decoder in ("ar", "ssd-exact"):
            exactness = all(bool(torch.equal(r.tokens, a.tokens)) for r, a in zip(runs, ar))
        rows.append({
            "decoder": label, "steps": statistics.median(steps),
            "step_ratio": round(statistics.median([a / max(s, 1) for a, s in zip(ar_steps, steps)]), 3),
            "wall_ratio": round(statistics.median([a / max(w, 1e-9) for a, w in zip(ar_walls, walls)]), 3),
            "wall_s": round(statistics.median(walls), 4), "nll": finite_or_none(round(statistics.median(nlls), 4)),
            "nll_gap": finite_or_none(round((statistics.median(nlls) - ar_nll) / ar_nll, 4)),  # of the medians
            "identical_to_ar": exactness,
            "nll_full": round(statistics.median(fulls), 4),
            "nll_full_gap": round((statistics.median(fulls) - ar_full) / ar_full, 4),
            "out_of_support": round(statistics.mean([r.trace.out_of_support for r in runs]), 4),
            "accepted_share": round(statistics.median([r.trace.counts["accepted"] / r.tokens.numel() for r in runs]), 3),
        })
    report = {"model": str(args.model), "images": len(prompts), "grid": list(ar[0].tokens.shape),
              "settings": ar[0].trace.settings, "rows": rows}
    if stick is not None:
        quality, report["yardstick"] = bench_rows(stick, model, prompts, {k: [r.image for r in v] for k, v in results.items()})
        for row in rows:
            row.update(quality[row["decoder"]])
    if getattr(args, "verify_cost", False):
        report["verify_cost"] = verify_cost(model, prompts[0], args)
    print_table(report, log)
    if out_dir is not None:
        write_pngs(results, variants, out_dir, log)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        log(f"wrote {args.json}")
    return report


def print_table(report: dict, log=print) -> None:
    head = (f"{'decoder':<12}{'steps':>8}{'step x':>9}{'wall x':>9}{'wall s':>9}{'nll':>9}{'nll gap':>9}"
            f"{'nll_full':>9}{'full gap':>9}{'outside':>9}{'accept':>8}{'cls acc':>9}{'fd':>8}  identical")
    log(f"{report['images']} images, grid {report['grid'][0]}x{report['grid'][1]}, medians")
    log(head)
    for r in report["rows"]:
        ident = "-" if r["identical_to_ar"] is None else str(r["identical_to_ar"]).lower()
        log(f"{r['decoder']:<12}{r['steps']:>8}{r['step_ratio']:>9.2f}{r['wall_ratio']:>9.2f}{r['wall_s']:>9.3f}"
            f"{_num(r['nll'], 1):>9}{_num(r['nll_gap'], 100):>8}%{r['nll_full']:>9.4f}{r['nll_full_gap'] * 100:>8.2f}%"
            f"{r['out_of_support'] * 100:>8.2f}%{r['accepted_share']:>8.2f}{_opt(r.get('class_acc'), 100, 1):>8}%"
            f"{_opt(r.get('fd'), 1, 3):>8}  {ident}")
    if "yardstick" in report:
        y, n = report["yardstick"], report["images"]
        log(f"yardstick v{y['version']}: real held-out glyphs {y['real_acc'] * 100:.1f}% class accuracy; real_fd "
            f"{y['real_fd']:.3f} (all training glyphs), {y[f'real_fd_at_{n}']:.3f} ({n} training glyphs)")
    if "verify_cost" in report:
        log("verify forward cost relative to a 1-token forward: " +
            ", ".join(f"{k} tokens {v:.2f}x" for k, v in report["verify_cost"].items()))


@torch.no_grad()
def verify_cost(model, prompt, args, lengths=(1, 8, 32, 64, 128), context: int | None = None, repeats: int = 5) -> dict:
    """Median time of one window forward of n tokens over a half-full cache, relative to n = 1."""
    from .sampling import SamplerSettings

    d = model.defaults
    layout = model.layout(None)
    cfg = d["cfg"] if args.cfg is None else args.cfg
    ctx = context if context is not None else layout.num_slots // 2
    lengths = [n for n in lengths if ctx + n <= layout.num_slots]
    prompt_ids = model.build_prompt(prompt, getattr(args, "negative_prompt", ""), SamplerSettings(cfg=cfg).guided, layout.grid)
    session = model.start(prompt_ids)
    ids = model.code_to_id(torch.zeros(layout.num_slots, dtype=torch.long, device=model.device)).cpu()
    session.forward(ids[:ctx])
    times = {}
    for n in lengths:
        samples = []
        for _ in range(repeats + 1):
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            session.forward(ids[ctx:ctx + n])
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t)
            session.crop(ctx)
        times[n] = statistics.median(samples[1:])
    return {str(n): round(t / times[lengths[0]], 3) for n, t in times.items()}


def write_pngs(results: dict, variants, out_dir: Path, log=print) -> None:
    from .images import save_image, sheet, status_image

    out_dir.mkdir(parents=True, exist_ok=True)
    labels = [v[0] for v in variants]
    n = len(results["ar"])
    for label in labels:
        runs = results[label]
        if runs[0].image is not None:
            save_image(sheet([r.image for r in runs]), out_dir / f"samples_{label.replace(' ', '').replace('=', '')}.png")
        save_image(sheet([status_image(r.trace.to_dict(), cell=4) for r in runs]),
                   out_dir / f"status_{label.replace(' ', '').replace('=', '')}.png")
    if results["ar"][0].image is not None:  # one labelled row per decoder, the same prompts and seeds in columns
        rows = [labelled(sheet([r.image for r in results[label]]), label) for label in labels]
        width = max(r.shape[1] for r in rows)
        import numpy as np

        grid = np.ones((sum(r.shape[0] for r in rows), width, 3), dtype=np.float32)
        y = 0
        for r in rows:
            grid[y:y + r.shape[0], :r.shape[1]] = r
            y += r.shape[0]
        save_image(grid, out_dir / "samples_all_decoders.png")
    log(f"wrote PNGs for {n} images x {len(labels)} decoders into {out_dir}")


def labelled(image, text: str, width: int = 84):
    """A row image with its label written in a white column on the left."""
    import numpy as np
    from PIL import Image, ImageDraw

    h = image.shape[0]
    pad = Image.new("RGB", (width, h), (255, 255, 255))
    ImageDraw.Draw(pad).text((6, h // 2 - 6), text, fill=(0, 0, 0))
    return np.concatenate([np.asarray(pad, dtype=np.float32) / 255.0, image], axis=1)


def _num(value, scale: float) -> str:
    return "inf" if value is None else f"{value * scale:.{4 if scale == 1 else 2}f}"


def _opt(value, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"
