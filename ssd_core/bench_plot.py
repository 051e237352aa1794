"""The bench's trade-off picture: steps ratio against fidelity, one point per decoder setting (PIL only).

Left panel: steps ratio (x fewer steps than ar) against the nll_full gap to ar; right panel, when the rows
carry `class_acc` (the yardstick classifier): steps ratio against class accuracy. Exact decoders (tokens
identical to ar) are drawn as filled squares, the others as circles, each labelled.
"""
from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

PANEL, PAD = 420, 56


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / (n - 1)
    return [lo + i * step for i in range(n)]


def _panel(draw: ImageDraw.ImageDraw, x0: int, rows: list, xkey: str, xlabel: str, xscale: float, title: str) -> None:
    pts = [(r[xkey] * xscale, r["step_ratio"], r) for r in rows if r.get(xkey) is not None]
    if not pts:
        return
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xlo, xhi = min(xs + [0.0]), max(xs + [0.0])
    ylo, yhi = 0.0, max(ys) * 1.1
    xlo, xhi = xlo - 0.05 * (xhi - xlo + 1e-9), xhi + 0.1 * (xhi - xlo + 1e-9)
    left, top, size = x0 + PAD, 40, PANEL - PAD - 10

    def at(x, y):
        return left + (x - xlo) / (xhi - xlo) * size, top + size - (y - ylo) / (yhi - ylo) * size

    draw.rectangle([left, top, left + size, top + size], outline=(0, 0, 0))
    draw.text((x0 + 4, 4), title, fill=(0, 0, 0))
    for t in _ticks(xlo, xhi):
        x, _ = at(t, ylo)
        draw.line([x, top + size, x, top + size + 4], fill=(0, 0, 0))
        draw.text((x - 12, top + size + 6), f"{t:.0f}" if abs(xhi - xlo) > 8 else f"{t:.1f}", fill=(0, 0, 0))
    for t in _ticks(ylo, yhi):
        _, y = at(xlo, t)
        draw.line([left - 4, y, left, y], fill=(0, 0, 0))
        draw.text((left - 34, y - 6), f"{t:.1f}", fill=(0, 0, 0))
    draw.text((left + size // 2 - 60, top + size + 22), xlabel, fill=(0, 0, 0))
    draw.text((x0 + 4, 22), "steps ratio (x fewer than ar)", fill=(0, 0, 0))
    for x, y, r in pts:
        px, py = at(x, y)
        if r.get("identical_to_ar"):
            draw.rectangle([px - 5, py - 5, px + 5, py + 5], fill=(20, 120, 20))
        else:
            draw.ellipse([px - 5, py - 5, px + 5, py + 5], outline=(30, 60, 200), width=2)
        draw.text((px + 7, py - 6), r["decoder"], fill=(0, 0, 0))


def plot_tradeoff(report: dict, path: str) -> None:
    rows = report["rows"]
    panels = [("nll_full_gap", "nll_full gap to ar (%)", 100.0, "speed vs fidelity")]
    if any(r.get("class_acc") is not None for r in rows):
        panels.append(("class_acc", "class accuracy (%)", 100.0, "speed vs class accuracy"))
    img = Image.new("RGB", (PANEL * len(panels), PANEL + 50), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for i, (key, label, scale, title) in enumerate(panels):
        _panel(draw, i * PANEL, rows, key, label, scale, f"{title}, {report.get('images')} images "
               "(squares: identical to ar)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # e.g. bench_out/ on a fresh checkout
    img.save(path)
