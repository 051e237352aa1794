"""The reference example workflow's thumbnail: what its three samplers make (ar | ssd-exact | ssd, the same
prompt and seed, the model's defaults), each image above its status grid. download_card: a downloaded model's
template thumbnail, drawn from runs of its tiny random twin.

  python -m tools.thumbnail [--model reference] [--prompt face] [--seed 42] [--out example_workflows/SSD Bundled 24x24 model - ar vs ssd-exact vs ssd.jpg]
"""
from __future__ import annotations

import argparse

import numpy as np
from PIL import Image, ImageDraw, ImageFont

import ssd_core
from ssd_core.trace import status_image

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
DECODERS = ("ar", "ssd-exact", "ssd")


def _font(size: int):
    try:
        return ImageFont.truetype(FONT, size)
    except OSError:
        return ImageFont.load_default()


def _pixels(x, side: int) -> Image.Image:
    """Float [H, W, 3] in [0, 1] -> a side x side PIL image (nearest: cells stay sharp)."""
    arr = (x.clamp(0, 1).numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(arr).resize((side, side), Image.NEAREST if arr.shape[0] < side // 2 else Image.LANCZOS)


def thumbnail(prompt: str = "face", seed: int = 42, verify_rounds: int = 2, size: int = 512,
              model_name: str = "reference") -> Image.Image:
    model = ssd_core.load_model(model_name)
    heads = ssd_core.load_heads(model_name, model)
    runs = {d: ssd_core.generate(model, heads if d != "ar" else None, prompt=prompt, decoder=d, seed=seed,
                                 verify_rounds=verify_rounds) for d in DECODERS}
    im = Image.new("RGB", (size, size), (24, 24, 24))
    draw = ImageDraw.Draw(im)
    title = "Bundled model" if model_name == "reference" else f"Bundled {model.grid_options()[0][0]}x{model.grid_options()[0][1]} model"
    draw.text((20, 16), f'{title}: "{prompt}"', fill=(235, 235, 235), font=_font(26))
    side, gap, left = 152, 12, 16
    for i, d in enumerate(DECODERS):
        x = left + i * (side + gap)
        draw.text((x, 66), f"{d}: {runs[d].trace.steps} steps", fill=(220, 220, 220), font=_font(14))
        im.paste(_pixels(runs[d].image, side), (x, 92))
        im.paste(_pixels(status_image(runs[d].trace.to_dict()), side), (x, 258))
    same = "the very image of ar" if bool((runs["ssd-exact"].tokens == runs["ar"].tokens).all()) else "ar's image"
    for j, line in enumerate([f"ssd-exact: {same} in fewer steps.", "ssd: the paper's lossy mode, fewest steps.",
                              "grid: green drafted right, orange fixed by the model, grey one at a time."]):
        draw.text((left, 428 + 20 * j), line, fill=(200, 200, 200), font=_font(13))
    return im


def download_card(title: str, needs: list[str], trace: dict, size: int = 512, left: dict | None = None,
                  labels: tuple[str, str] = ("ar", "ssd-exact")) -> Image.Image:
    """A downloaded model's template thumbnail, drawn without the model: the title, the left panel (grey, or the
    per-cell step grid of `left` where its decoder runs on the twin too: FlashAR's flashar, one shade per step), the
    right panel as the status grid of `trace` (a run of the family's tiny random twin at the model's default
    grid), each under its label, and what the template needs, as the Lumina-mGPT 2.0 template's thumbnail shows
    them."""
    im = Image.new("RGB", (size, size), (24, 24, 24))
    draw = ImageDraw.Draw(im)
    draw.text((24, 26), title, fill=(235, 235, 235), font=_font(26))
    side, top = 221, 110
    for x, label in zip((24, 268), labels):
        draw.text((x, 86), label, fill=(220, 220, 220), font=_font(16))
    if left is None:
        draw.rectangle((24, top, 24 + side - 1, top + side - 1), fill=(136, 140, 149))
    else:
        im.paste(_pixels(status_image(left, cell=4, color_by="step", gridlines=False), side), (24, top))
    im.paste(_pixels(status_image(trace, cell=4, gridlines=False), side), (268, top))
    for j, line in enumerate(needs):
        draw.text((24, 352 + 24 * j), line, fill=(215, 215, 215), font=_font(16))
    H, W = len(trace["status"]), len(trace["status"][0])
    whose = "the grids: runs" if left is not None else f"{labels[1].split(':')[0]}'s grid: a run"
    draw.text((24, 470), f"{whose} of a tiny random model in this layout, {H}x{W} tokens",
              fill=(150, 150, 150), font=_font(12))
    return im


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="face")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--model", default="reference", help="reference or reference-48")
    ap.add_argument("--out", default="example_workflows/SSD Bundled 24x24 model - ar vs ssd-exact vs ssd.jpg")
    a = ap.parse_args(argv)
    thumbnail(a.prompt, a.seed, model_name=a.model).save(a.out, quality=90)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
