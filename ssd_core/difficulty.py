"""The difficulty curve (`bench --difficulty`): every decoder's speed-up as the model's tokens get less certain.

The bundled models' tokens are easy (a guided top-1 probability near 0.7); real models' visual tokens are far
flatter (LANTERN, arXiv 2410.03355), and every method's acceptance falls with that. The sweep runs the bench at
several sampler settings (temperatures, and a weaker cfg) and puts beside each setting how certain `ar`'s own
draws were: the mean top-1 probability and entropy of the distribution `ar` sampled each cell from (guided, with
the run's temperature and truncation), teacher-forced over its tokens. docs/speed.md reads the curve.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from .bench import BenchOptions, run_bench
from .engine import sequence_logits
from .errors import SSDError
from .sampling import guide, log_probs, settings_from
from .trace import json_safe

TEMPERATURES = (0.8, 1.0, 1.3, 1.6)
ROW_KEYS = ("steps", "step_ratio", "wall_ratio", "nll_full", "nll_full_gap", "nll_gap", "same_cells_as_ar",
            "identical_to_ar", "class_acc", "fd", "accepted_share")


def points(model, temperatures=TEMPERATURES, weak_cfg: float | None = None) -> list[dict]:
    """The sweep's sampler settings: each temperature at the model's cfg, then the weaker cfg at temperature 1
    (default: half the way from the model's cfg to 1; none for a model without guidance)."""
    cfg = float(getattr(model, "defaults", {}).get("cfg", 1.0))
    out = [{"temperature": float(t), "cfg": cfg} for t in temperatures]
    if weak_cfg is None and cfg > 1:
        weak_cfg = round(1 + (cfg - 1) / 2, 3)
    if weak_cfg is not None and weak_cfg != cfg:
        out.append({"temperature": 1.0, "cfg": float(weak_cfg)})
    for p in out:
        if not (p["temperature"] > 0 and p["cfg"] >= 0):
            raise SSDError(f"difficulty point {p}: temperatures must be above 0 (greedy has no difficulty) and cfg >= 0")
    return out


def certainty(model, results, prompts, cfg: float, temperature: float, o: BenchOptions) -> dict:
    """Mean top-1 probability and entropy (nats) over every cell of `ar`'s images, of the distribution ar drew the
    cell from (its guided logits, temperature, top-k / top-p / min-p), teacher-forced in one forward an image."""
    top1, entropy = [], []
    for r, given in zip(results, prompts):
        s = settings_from(getattr(model, "defaults", {}), 0, cfg=cfg, temperature=temperature, top_k=o.top_k,
                          top_p=o.top_p, min_p=o.min_p)
        layout = model.layout(tuple(r.tokens.shape))
        prompt = model.build_prompt(given, o.negative_prompt or "", s.guided, layout.grid)
        ids = layout.forced.clone()
        ids[layout.slot_of_cell] = model.code_to_id(r.tokens.flatten().to(model.device)).cpu()
        with torch.no_grad():
            _, logits = sequence_logits(model, prompt, ids.to(model.device))
        image = layout.forced < 0
        guided = guide(logits if s.guided else logits[:1], s.cfg, s.min_p)[image]
        p = log_probs(guided, s).exp()
        top1.append(float(p.max(-1).values.mean()))
        entropy.append(float(-(p * p.clamp(min=1e-30).log()).sum(-1).mean()))
    return {"top1": round(statistics.mean(top1), 4), "entropy": round(statistics.mean(entropy), 4)}


def bench_point(model, heads, o: BenchOptions, log=print):
    """One point of the sweep by the bench -> (rows {decoder: figures}, ar's runs, their prompts)."""
    if "ar" not in o.decoders:
        raise SSDError("the difficulty sweep measures ar's own tokens: keep ar in --decoders")
    kept: dict = {}
    report = run_bench(model, heads, replace(o, plot=None, json=None, out_dir=None, step_ops=False), log=log,
                       keep=kept)  # no ops column
    rows = {r["decoder"]: {k: r[k] for k in ROW_KEYS if k in r} for r in report["rows"]}
    return rows, kept["results"]["ar"], kept["prompts"]


def sweep(model, heads, o: BenchOptions, temperatures=TEMPERATURES, weak_cfg: float | None = None,
          log=print, measure=bench_point) -> dict:
    """`measure` (default: the bench) at every point -> {"points": [{temperature, cfg, top1, entropy, rows: {decoder:
    figures}}], ...}; measure(model, heads, options at the point, log) -> (rows, ar's runs, their prompts)."""
    out = []
    for p in points(model, temperatures, weak_cfg):
        log(f"difficulty: temperature {p['temperature']:g}, cfg {p['cfg']:g}")
        rows, ar_runs, prompts = measure(model, heads, replace(o, temperature=p["temperature"], cfg=p["cfg"]), log)
        sure = certainty(model, ar_runs, prompts, p["cfg"], p["temperature"], o)
        out.append({**p, **sure, "rows": rows})
        log(f"  ar's tokens: mean top-1 probability {sure['top1']:.3f}, entropy {sure['entropy']:.3f} nats; "
            + ", ".join(f"{d} {r['step_ratio']}x" for d, r in rows.items()))
    return {"model": o.model_name, "images": o.images, "seed": o.seed, "grid": o.grid, "points": out}


def write(result: dict, json_path=None, plot_path=None) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(json_safe(result), indent=1, allow_nan=False))
    if plot_path:
        plot(result, plot_path)


def plot(result: dict, path) -> None:
    """Step ratio against the mean top-1 probability of ar's tokens, one line per decoder (PIL only)."""
    from PIL import Image, ImageDraw

    pts = sorted(result["points"], key=lambda p: p["top1"])
    decoders = [d for d in pts[0]["rows"] if d != "ar"]
    W, H, pad = 640, 440, 60
    img = Image.new("RGB", (W, H), (255, 255, 255))
    d = ImageDraw.Draw(img)
    xs = [p["top1"] for p in pts]
    ys = [r["step_ratio"] for p in pts for k, r in p["rows"].items() if k != "ar"] or [1.0]
    xlo, xhi = min(xs) - 0.02, max(xs) + 0.02
    ylo, yhi = 0.0, max(ys) * 1.1
    at = lambda x, y: (pad + (x - xlo) / (xhi - xlo + 1e-9) * (W - 2 * pad),  # noqa: E731
                       H - pad - (y - ylo) / (yhi - ylo + 1e-9) * (H - 2 * pad))
    d.rectangle([pad, pad, W - pad, H - pad], outline=(0, 0, 0))
    d.text((pad, 10), f"speed-up against difficulty ({result.get('model') or 'model'}, {result['images']} images a "
           "point)", fill=(0, 0, 0))
    d.text((W // 2 - 150, H - 30), "mean top-1 probability of ar's tokens (lower = harder)", fill=(0, 0, 0))
    d.text((4, pad - 20), "x fewer steps than ar", fill=(0, 0, 0))
    for i in range(5):
        y = ylo + i * (yhi - ylo) / 4
        d.text((8, at(xlo, y)[1] - 6), f"{y:.1f}", fill=(0, 0, 0))
        x = xlo + i * (xhi - xlo) / 4
        d.text((at(x, 0)[0] - 12, H - pad + 6), f"{x:.2f}", fill=(0, 0, 0))
    palette = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
               (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]
    for k, dec in enumerate(decoders):
        color = palette[k % len(palette)]
        line = [at(p["top1"], p["rows"][dec]["step_ratio"]) for p in pts if dec in p["rows"]]
        if len(line) > 1:
            d.line(line, fill=color, width=2)
        for x, y in line:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)
        d.text((W - pad + 4 - 56, pad + 4 + 14 * k), dec, fill=color)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
