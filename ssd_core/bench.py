"""`bench`: every decoder on the same prompts and seeds; medians, ratios against `ar`, a table, JSON."""
from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .api import MAX_BATCH, generate, generate_batch
from .decoders import (DECODERS, DRAFT_ROWS, ENGINE_DECODERS, NO_HEADS, ROWS_AT, DecoderParams, bench_variant,
                       keeps_ar_tokens, needs_heads, own_loop, spec, uses_heads)
from .errors import SSDError, shown
from .limits import whole_number
from .sampling import SEEDS, check_seed
from .outputs import check_output, check_output_dir, write_or_keep
from .trace import finite_or_none, json_safe, status_image
from .yardstick import bench_rows, for_model


SAMPLER_KEYS = ("seed", "cfg", "temperature", "top_k", "top_p", "min_p")
MAX_IMAGES = 10_000  # a bench's images at most: every row's results stay in memory until the report
ROWS_DECODERS = tuple(d for d in DECODERS if "draft_rows" in spec(d).params)  # the ones NAME@N fits: ssd, ssd-exact
NOHEADS_DECODERS = tuple(d for d in DECODERS if uses_heads(d) and not needs_heads(d))  # NAME:noheads: ssd-exact


@dataclass
class BenchOptions:
    """What to bench: decoders, images (prompt i with seed seed+i), sampler values (None = the model's)."""

    decoders: tuple[str, ...] = ENGINE_DECODERS
    images: int = 4
    seed: int = 0
    prompt: object = None  # one prompt for every image; None: the model's classes / training prompts in turn
    negative_prompt: str = ""
    official_suffix: bool | None = None  # False: Emu3's prompts without its official positive suffix
    cfg: float | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    params: DecoderParams = field(default_factory=DecoderParams)  # every row's decoder parameters (None: each
    #                                        decoder's default); the ssd rows set the three below on top of them
    ssd_rounds: tuple[int, ...] = ()  # one ssd row per verify-round count (else one at params' verify_rounds)
    ssd_adaptive: tuple[int, ...] = ()  # also one ssd row per adaptive percent (per verify-round count)
    ssd_first_row: tuple[int, ...] = ()  # ssd rows for these stable_first_row values (else params')
    plot: str | None = None  # PNG: steps ratio against the nll_full gap (and class accuracy), one point a row
    grid: tuple[int, int] | None = None
    verify_cost: bool = False  # also time one verify forward per window length
    out_dir: str | None = None  # sample and status PNGs
    json: str | None = None  # the report as JSON
    model_name: str = ""  # shown in the report
    batch: int = 0  # also run every decoder in batches of this many images (images/s batched vs one at a time)
    step_ops: bool = True  # count the ops a step launches (one more untimed run of the first image a row)


def _variants(o: BenchOptions) -> list[tuple[str, str, DecoderParams]]:
    """(row label, decoder, decoder parameters); for ssd one row per verify-round count (ssd_rounds), times
    each adaptive percent (ssd_adaptive, besides params' own; unset: the model's default, else 0; the label names
    a percent above 0) and stable_first_row value; a name ending in ':noheads' is its decoder without heads,
    'NAME@N' the decoder at N draft rows (decoders.bench_variant)."""
    out = []
    for name in o.decoders:
        if name != "ssd":
            decoder, _, rows = bench_variant(name)
            out.append((name, decoder, o.params if rows is None else DecoderParams.of(o.params, draft_rows=rows)))
            continue
        for f in o.ssd_first_row or (o.params.stable_first_row,):
            for r in o.ssd_rounds or (o.params.verify_rounds,):
                for a in dict.fromkeys((o.params.adaptive_percent, *o.ssd_adaptive)):  # None: the model's or 0
                    label = "ssd" + (f" r={r}" if o.ssd_rounds else "") + (f" a={a}" if a else "") + \
                        (f" f={f}" if f is not None else "")
                    out.append((label, "ssd", DecoderParams.of(o.params, verify_rounds=r, adaptive_percent=a,
                                                               stable_first_row=f)))
    if "ar" not in [v[1] for v in out]:
        out.insert(0, ("ar", "ar", o.params))
    return out


def check_decoders(names) -> None:
    """Every bench decoder name can run (check_decoder), and none comes twice; one SSDError line otherwise."""
    seen = set()
    for name in names:
        check_decoder(name)
        if name in seen:
            raise SSDError(f"--decoders names {shown(name)} twice: give each decoder once")
        seen.add(name)


def check_decoder(name) -> None:
    """A bench decoder name: a decoder, then '@N' (ASCII digits within DRAFT_ROWS' limits) only for one with
    draft rows, then ':noheads' only for one that drafts with heads but runs without them."""
    if not isinstance(name, str):
        raise SSDError(f"a bench decoder name must be a string, e.g. ssd-exact@3, got {shown(name)}")
    base, at, rows = name.removesuffix(NO_HEADS).partition(ROWS_AT)
    spec(base)
    if name.endswith(NO_HEADS) and base not in NOHEADS_DECODERS:
        raise SSDError(f"bench decoder {shown(name)}: {NO_HEADS} is only for {', '.join(NOHEADS_DECODERS)} (it "
                       f"drafts with heads and runs without them); {base} runs as it is: drop {NO_HEADS}")
    if at and base not in ROWS_DECODERS:
        raise SSDError(f"bench decoder {shown(name)}: {ROWS_AT}N draft rows are only for {', '.join(ROWS_DECODERS)}; "
                       f"{base} has no draft rows: drop {ROWS_AT}{shown(rows, 12)[1:-1]}")
    if at and not (rows.isascii() and rows.isdigit() and len(rows) <= 3 and DRAFT_ROWS.low <= int(rows) <= DRAFT_ROWS.high):
        raise SSDError(f"the draft rows of bench decoder {shown(name)} must be ASCII digits from {DRAFT_ROWS.low} "
                       f"to {DRAFT_ROWS.high} after the {ROWS_AT}, e.g. {base}{ROWS_AT}3")


def check_images(n) -> int:
    """A bench's image count: 1 .. MAX_IMAGES."""
    return whole_number("--images", n, 1, MAX_IMAGES, " (a bench keeps every image's results in memory)")


def check_options(o: BenchOptions) -> None:
    """The decoders, image count and seed of a bench, before any image runs."""
    check_images(o.images)
    check_seed(o.seed)
    check_decoders(o.decoders)


def check_own_loops(model, decoders) -> None:
    """bench sets every decoder beside `ar` on one model: flashar (its own post-trained checkpoint, its own loop) has
    no `ar` beside it; the README's peers table quotes its published figures instead."""
    own = [d for d in decoders if own_loop(bench_variant(d)[0])]
    if own and not getattr(model, "own_decoders", ()):
        raise SSDError(f"bench decoder {own[0]} runs on a FlashAR checkpoint only (its post-trained model): the "
                       "bundled models cannot run it; README's peers table quotes FlashAR's published figures")


def prompts_for(model, n: int, given) -> list:
    if given is not None:
        return [given] * n
    if model.class_names:
        return [i % len(model.class_names) for i in range(n)]
    texts = getattr(model, "training_prompts", ["a photo of a cat"])
    return [texts[i % len(texts)] for i in range(n)]


def _row_call(heads, o: BenchOptions, label: str, decoder: str, params: DecoderParams) -> tuple:
    """(heads or None, generate's keywords) of a bench row: the heads only where the row drafts with them, the
    bench's sampler values and grid, the row's decoder and parameters."""
    drafter = heads if uses_heads(decoder) and not label.endswith(NO_HEADS) else None
    if needs_heads(decoder) and drafter is None:
        raise SSDError(f"bench of {label} needs heads: pass --heads FILE (or drop it from --decoders)")
    return drafter, {"negative_prompt": o.negative_prompt, "official_suffix": o.official_suffix, "decoder": decoder,
                     "params": params, "cfg": o.cfg, "temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p,
                     "min_p": o.min_p, "grid": o.grid}


def run_bench(model, heads, o: BenchOptions, log=print, on_step=None, keep: dict | None = None) -> dict:
    """on_step(image index, row label, trace.Progress) after every step (the demo's progress bar); keep: a dict
    that receives the runs ("results": {label: [Result]}) and their "prompts" (the difficulty sweep reads them)."""
    if int(o.batch) != o.batch or not 0 <= o.batch <= MAX_BATCH:
        raise SSDError(f"--batch must be a whole number from 0 (off) to {MAX_BATCH}, got {o.batch}")
    check_options(o)
    check_own_loops(model, o.decoders)
    check_outputs(o)  # before the first image: a bad path never costs the run
    variants = _variants(o)
    for label, decoder, params in variants:  # a row that needs heads without them: refused before any image
        _row_call(heads, o, label, decoder, params)
    prompts = prompts_for(model, o.images, o.prompt)
    seeds = [(o.seed + i) % SEEDS for i in range(o.images)]  # wrapped past 2^64 - 1, as generate_batch's
    stick = for_model(model)  # the image-quality yardstick (class accuracy, FD), bundled model only
    results = run_singles(model, heads, o, variants, prompts, seeds, bool(o.out_dir) or stick is not None, log, on_step)
    if keep is not None:
        keep.update(results=results, prompts=prompts)
    batched = run_batches(model, heads, o, variants, prompts, seeds, log) if o.batch > 1 else None
    rows = [row_figures(label, decoder, results[label], results["ar"], batched and batched[label]["results"],
                        step_ops(model, heads, o, label, decoder, params, prompts[0], seeds[0]) if o.step_ops else {})
            for label, decoder, params in variants]
    ar = results["ar"]
    report = {"model": o.model_name, "images": len(prompts), "grid": list(ar[0].tokens.shape),
              "settings": ar[0].trace.settings, "rows": rows}
    if batched is not None:  # images per second (decode walls, prefill included) in batches vs one at a time
        report["batch"] = {
            "n": o.batch,
            "images_per_s": {label: round(b["images_per_s"], 4) for label, b in batched.items()},
            "single_images_per_s": {label: round(len(results[label]) / sum(r.trace.timings["wall"] for r in results[label]), 4)
                                    for label in batched},
        }
    if stick is not None:
        quality, report["yardstick"] = bench_rows(stick, model, prompts, {k: [r.image for r in v] for k, v in results.items()})
        for row in rows:
            row.update(quality[row["decoder"]])
    if o.verify_cost:
        report["verify_cost"] = verify_cost(model, prompts[0], o.cfg, o.negative_prompt)
    print_table(report, log)
    write_outputs(report, results, variants, o, log)
    return report


def run_singles(model, heads, o: BenchOptions, variants, prompts, seeds, pixels: bool, log=print,
                on_step=None) -> dict:
    """Every row on every image, one at a time -> {label: [Result per image]} (pixels: decode the images)."""
    results: dict[str, list] = {label: [] for label, _, _ in variants}
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        for label, decoder, params in variants:
            drafter, kw = _row_call(heads, o, label, decoder, params)
            results[label].append(generate(
                model, drafter, prompt=prompt, seed=seed, decode_pixels=pixels, **kw,
                on_step=None if on_step is None else (lambda p, i=i, label=label: on_step(i, label, p))))
        log(f"image {i + 1}/{len(prompts)} done")
    return results


def row_figures(label: str, decoder: str, runs: list, ar: list, batched: list | None, ops: dict) -> dict:
    """A report row: a bench row's medians over its images and its ratios against `ar`'s (batched: the same
    images in batches, for identical_to_ar; ops: step_ops)."""
    steps = [r.trace.steps for r in runs]
    walls = [r.trace.timings["wall"] - r.trace.timings["prefill"] for r in runs]
    nlls = [r.trace.nll for r in runs]
    fulls = [r.trace.nll_full for r in runs]
    ar_steps = [a.trace.steps for a in ar]
    ar_walls = [a.trace.timings["wall"] - a.trace.timings["prefill"] for a in ar]
    ar_nll = statistics.median([a.trace.nll for a in ar])
    ar_full = statistics.median([a.trace.nll_full for a in ar])
    exactness = None
    if keeps_ar_tokens(decoder, runs[0].trace.settings):  # one at a time and, with --batch, in batches too
        exactness = all(bool(torch.equal(r.tokens, a.tokens)) for r, a in zip(runs + (batched or []), ar + ar))
    return {
        "decoder": label, "steps": statistics.median(steps),
        "step_ratio": round(statistics.median([a / max(s, 1) for a, s in zip(ar_steps, steps)]), 3),
        "wall_ratio": round(statistics.median([a / max(w, 1e-9) for a, w in zip(ar_walls, walls)]), 3),
        "wall_s": round(statistics.median(walls), 4),
        "nll": finite_or_none(round(statistics.median(nlls), 4) + 0.0),  # + 0.0: 0.0, not -0.0 (top-k 1)
        "nll_gap": _gap(statistics.median(nlls), ar_nll),  # of the medians
        "identical_to_ar": exactness,
        # the share of cells with ar's token (1 for an exact decoder in fp32; bf16 rounding can move a few)
        "same_cells_as_ar": round(statistics.mean([float((r.tokens == a.tokens).float().mean()) for r, a in zip(runs, ar)]), 4),
        **ops,
        "nll_full": round(statistics.median(fulls), 4),
        "nll_full_gap": _gap(statistics.median(fulls), ar_full),
        "nll_full_gap_90": gap_interval(fulls, [a.trace.nll_full for a in ar]),
        "out_of_support": round(statistics.mean([r.trace.out_of_support for r in runs]), 4),
        "accepted_share": round(statistics.median([r.trace.counts["accepted"] / r.tokens.numel() for r in runs]), 3),
        # the share of the wall in the decoder's bookkeeping (not the base model, not the draft heads)
        "policy_share": round(statistics.median([r.trace.timings["policy"] / r.trace.timings["wall"] for r in runs]), 4),
        **round0_acceptance(runs), "params": {k: v for k, v in runs[0].trace.settings.items() if k not in SAMPLER_KEYS},
    }


def _gap(value: float, ar: float) -> float | None:
    """(value - ar) / ar, rounded; None where it is not a number (ar's nll 0, e.g. top-k 1, or not finite)."""
    return finite_or_none(round((value - ar) / ar, 4)) if ar != 0 else None


def gap_interval(values: list, ar: list, draws: int = 2000, seed: int = 0) -> list | None:
    """A 90% bootstrap interval [low, high] of the gap of medians: the images drawn again with replacement, the same
    image indices for the row and for `ar` (the pairs share a prompt and seed), `draws` times. How far a gap at
    this many images can move by the images alone: a decoder that keeps ar's distribution but not its tokens
    lands anywhere inside it. None where a draw has no finite gap."""
    rng, n, gaps = random.Random(seed), len(values), []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        gap = _gap(statistics.median(values[i] for i in idx), statistics.median(ar[i] for i in idx))
        if gap is None:
            return None
        gaps.append(gap)
    gaps.sort()
    return [gaps[int(0.05 * (draws - 1))], gaps[int(0.95 * (draws - 1))]]


def write_outputs(report: dict, results: dict, variants, o: BenchOptions, log=print) -> None:
    """The plot, the PNGs and the JSON; every one is tried, one that fails is kept beside
    (outputs.write_or_keep) and the first failure raised after the others."""
    failed: list[str] = []
    if o.plot:
        from .bench_plot import plot_tradeoff

        _keep(o.plot, lambda p: plot_tradeoff(report, p), "--plot", failed, log)
    if o.out_dir:
        write_pngs(results, variants, Path(o.out_dir), log, failed)
    if o.json:
        text = json.dumps(json_safe(report), indent=1, allow_nan=False)  # strict JSON: no Infinity / NaN
        _keep(o.json, lambda p: (Path(p).parent.mkdir(parents=True, exist_ok=True), Path(p).write_text(text)), "--json",
              failed, log)
    if failed:
        more = f" ({len(failed) - 1} more output(s) kept the same way)" if len(failed) > 1 else ""
        raise SSDError(failed[0] + more)


def step_ops(model, heads, o: BenchOptions, label: str, decoder: str, params: DecoderParams, prompt, seed) -> dict:
    """Ops a step launches outside the base model's forward (opcount; one extra run of the first image, not
    timed): on a GPU each is a kernel launch of 5-10 us. policy_ops: the decoder's share of them (not in the
    draft heads' networks)."""
    from .opcount import count_ops

    drafter, kw = _row_call(heads, o, label, decoder, params)
    with count_ops() as c:
        generate(model, drafter, prompt=prompt, seed=seed, decode_pixels=False, score=False, **kw)
    return {"ops_per_step": round(c.per_step(), 1), "head_ops_per_step": round(c.head_total / max(c.steps, 1), 1)}


def _keep(path, write, flag: str, failed: list, log=None) -> None:
    try:
        written = write_or_keep(path, write, flag)
        if log is not None:
            log(f"wrote {written}")
    except SSDError as err:
        failed.append(str(err))


def check_outputs(o: BenchOptions) -> None:
    """The JSON, plot and PNG folder can be written (outputs.check_output)."""
    from .images import image_extensions

    check_output(o.json, "--json", {".json"}, make_folder=True)  # e.g. inside out_dir (the demo)
    check_output(o.plot, "--plot", image_extensions(), make_folder=True)
    check_output_dir(o.out_dir, "--out-dir")


def round0_acceptance(runs) -> dict:
    """Measured accepted share and expected acceptance sum min(p, q) of the round-0 checks (ssd), image means."""
    pairs = [r.trace.acceptance_round0() for r in runs]
    pairs = [p for p in pairs if p[0] is not None]
    if not pairs:
        return {"acceptance_round0": None, "expected_acceptance": None}
    rounds: dict[str, dict] = {}
    for r in runs:
        for k, v in r.trace.acceptance.get("by_round", {}).items():
            rounds.setdefault(k, {"accepted": [], "expected": []})
            rounds[k]["accepted"].append(v["accepted"])
            rounds[k]["expected"].append(v["expected"])
    return {"acceptance_round0": round(statistics.mean(p[0] for p in pairs), 4),
            "expected_acceptance": round(statistics.mean(p[1] for p in pairs), 4),
            "acceptance_by_verify_round": {k: {m: round(statistics.mean(v[m]), 4) for m in v} for k, v in rounds.items()}}


def run_batches(model, heads, o: BenchOptions, variants, prompts, seeds, log=print) -> dict:
    """Every decoder on the same images in batches of o.batch -> {label: {"results", "images_per_s"}}."""
    out = {}
    for label, decoder, params in variants:
        results, wall = [], 0.0
        drafter, kw = _row_call(heads, o, label, decoder, params)
        for i in range(0, len(prompts), o.batch):
            chunk = generate_batch(model, drafter, prompts=prompts[i:i + o.batch], seeds=seeds[i:i + o.batch],
                                   decode_pixels=False, score=False, **kw)
            wall += max(r.trace.timings["wall"] for r in chunk)  # the batch's wall: its last image's
            results += chunk
        out[label] = {"results": results, "images_per_s": len(results) / wall}
        log(f"{label}: {len(results)} images in batches of {o.batch}: {len(results) / wall:.3f} images/s")
    return out


def _rows(params: dict) -> str:
    """The draft rows a row ran with: '3' as given; picked by ssd-exact's calibration (calibrate.py) '1*', with
    '+h' where it used the heads; '-' for decoders without rows."""
    if "draft_rows_picked" in params:
        return f"{params['draft_rows_picked']}*" + ("+h" if params.get("heads_used") else "")
    return str(params["draft_rows"]) if params.get("draft_rows") else "-"


def print_table(report: dict, log=print) -> None:
    head = (f"{'decoder':<12}{'steps':>8}{'step x':>9}{'wall x':>9}{'wall s':>9}{'nll':>9}{'nll gap':>9}"
            f"{'nll_full':>9}{'full gap':>9}{'outside':>9}{'accept':>8}{'acc r0':>8}{'E acc r0':>9}{'policy':>8}{'ops/st':>8}"
            f"{'rows':>6}"
            f"{'cls acc':>9}{'fd':>8}{'same':>8}  identical")
    log(f"{report['images']} images, grid {report['grid'][0]}x{report['grid'][1]}, medians")
    log(head)
    for r in report["rows"]:
        ident = "-" if r["identical_to_ar"] is None else str(r["identical_to_ar"]).lower()
        log(f"{r['decoder']:<12}{r['steps']:>8}{r['step_ratio']:>9.2f}{r['wall_ratio']:>9.2f}{r['wall_s']:>9.3f}"
            f"{_num(r['nll'], 1):>9}{_num(r['nll_gap'], 100, 'inf' if r['nll'] is None else '-'):>8}%"
            f"{r['nll_full']:>9.4f}{_num(r['nll_full_gap'], 100, '-'):>8}%"
            f"{r['out_of_support'] * 100:>8.2f}%{r['accepted_share']:>8.2f}{_num(r.get('acceptance_round0'), 1, '-', 3):>8}"
            f"{_num(r.get('expected_acceptance'), 1, '-', 3):>9}{r['policy_share'] * 100:>7.1f}%{_num(r.get('ops_per_step'), 1, '-', 0):>8}"
            f"{_rows(r.get('params', {})):>6}"
            f"{_num(r.get('class_acc'), 100, '-', 1):>8}%{_num(r.get('fd'), 1, '-', 3):>8}{_num(r.get('same_cells_as_ar'), 100, '-', 1):>7}%  {ident}")
    spread = [f"{r['decoder']} {r['nll_full_gap_90'][0] * 100:+.1f}% to {r['nll_full_gap_90'][1] * 100:+.1f}%"
              for r in report["rows"] if r.get("nll_full_gap_90") and r["identical_to_ar"] is not True]
    if spread:
        log("full gap, 90% bootstrap interval over these images: " + ", ".join(spread))
    if "yardstick" in report:
        y, n = report["yardstick"], report["images"]
        log(f"yardstick v{y['version']}: real held-out glyphs {y['real_acc'] * 100:.1f}% class accuracy; real_fd "
            f"{y['real_fd']:.3f} (all training glyphs), {_num(y[f'real_fd_at_{n}'], 1, '-', 3)} ({n} training glyphs)")
    if "batch" in report:
        b = report["batch"]
        log(f"images/s in batches of {b['n']} vs one at a time: " + ", ".join(
            f"{k} {v:.3f} vs {b['single_images_per_s'][k]:.3f}" for k, v in b["images_per_s"].items()))
    if "verify_cost" in report:
        log("verify forward cost relative to a 1-token forward: " +
            ", ".join(f"{k} tokens {v:.2f}x" for k, v in report["verify_cost"].items()))


@torch.no_grad()
def verify_cost(model, prompt, cfg: float | None = None, negative_prompt: str = "", lengths=(1, 8, 32, 64, 128),
                context: int | None = None, repeats: int = 5) -> dict:
    """Median time of one window forward of n tokens over a half-full cache, relative to n = 1."""
    from .sampling import SamplerSettings

    d = model.defaults
    layout = model.layout(None)
    cfg = d["cfg"] if cfg is None else cfg
    ctx = context if context is not None else layout.num_slots // 2
    lengths = [n for n in lengths if ctx + n <= layout.num_slots]
    prompt_ids = model.build_prompt(prompt, negative_prompt, SamplerSettings(cfg=cfg).guided, layout.grid)
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


def write_pngs(results: dict, variants, out_dir: Path, log=print, failed: list | None = None) -> None:
    """The sample and status sheets into out_dir; a PNG that cannot be written is kept in the temp folder and
    its error added to `failed` (raised when None)."""
    from .images import save_image as _save, sheet

    errors = [] if failed is None else failed
    before = len(errors)

    def save_image(image, path):
        _keep(path, lambda p: _save(image, p), "--out-dir", errors)

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # every PNG then fails and is kept in the temp folder, its error says where
    labels = [v[0] for v in variants]
    n = len(results["ar"])
    for label in labels:
        runs = results[label]
        if runs[0].image is not None:
            save_image(sheet([r.image for r in runs]), out_dir / f"samples_{label.replace(' ', '').replace('=', '').replace(':', '-')}.png")
        save_image(sheet([status_image(r.trace.to_dict(), cell=4) for r in runs]),
                   out_dir / f"status_{label.replace(' ', '').replace('=', '').replace(':', '-')}.png")
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
    if len(errors) == before:
        log(f"wrote PNGs for {n} images x {len(labels)} decoders into {out_dir}")
    if failed is None and errors:
        raise SSDError(errors[0] + (f" ({len(errors) - 1} more PNG(s) kept the same way)" if len(errors) > 1 else ""))


def labelled(image, text: str, width: int = 84):
    """A row image with its label written in a white column on the left."""
    import numpy as np
    from PIL import Image, ImageDraw

    h = image.shape[0]
    pad = Image.new("RGB", (width, h), (255, 255, 255))
    ImageDraw.Draw(pad).text((6, h // 2 - 6), text, fill=(0, 0, 0))
    return np.concatenate([np.asarray(pad, dtype=np.float32) / 255.0, image], axis=1)


def _num(value, scale: float, missing: str = "inf", digits: int | None = None) -> str:
    if value is None:
        return missing
    return f"{value * scale:.{digits if digits is not None else (4 if scale == 1 else 2)}f}"
