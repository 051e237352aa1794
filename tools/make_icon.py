"""Draws docs/icon.png, the pack's registry icon (pyproject.toml [tool.comfy] Icon): a 400x400 token grid in the
widget's palette, rows done top-down: one at a time (grey), drafted right (green), fixed by the model (orange),
a drafted row in progress, pending below.

    .venv/bin/python tools/make_icon.py   # writes docs/icon.png
"""

from pathlib import Path

from PIL import Image, ImageDraw

# the pack's palette (ssd_core/trace.py STATUS_COLORS, web/ssd_grid_core.js PALETTE)
COLORS = {"p": (43, 43, 43), "a": (138, 143, 152), "g": (63, 185, 80), "o": (240, 136, 62), "f": (88, 166, 255)}
GRID = [
    "aaaaaaaa",
    "gggoggga",
    "ggggggog",
    "gogggggg",
    "gggggogg",
    "ggogg...",
    "........",
    "........",
]
SIZE, PAD, GAP = 400, 28, 6


def draw(size=SIZE):
    img = Image.new("RGB", (size, size), (20, 20, 20))
    d = ImageDraw.Draw(img)
    n = len(GRID)
    cell = (size - 2 * PAD - (n - 1) * GAP) / n
    for r, row in enumerate(GRID):
        for c, ch in enumerate(row):
            x0, y0 = PAD + c * (cell + GAP), PAD + r * (cell + GAP)
            d.rounded_rectangle([x0, y0, x0 + cell, y0 + cell], radius=cell * 0.18, fill=COLORS.get(ch, COLORS["p"]))
    return img


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "icon.png"
    draw().save(out, optimize=True)
    print(out, out.stat().st_size, "bytes")
