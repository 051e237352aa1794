"""The template thumbnails (example_workflows/*.jpg, 512 x 512).

thumbnail(): the bundled models' templates: what their three samplers make (ar | ssd-exact | ssd, the same prompt and
seed, the model's defaults), each image above its status grid. download_card(): a downloaded model's template,
drawn without the model from runs of its tiny random twin; cards() rebuilds every one of them.

  python -m tools.thumbnail [--model reference] [--prompt face] [--seed 42] [--exact-rows 3] [--out example_workflows/SSD Bundled 24x24 model - ar vs ssd-exact vs ssd.jpg]
  python -m tools.thumbnail --model reference-48 --exact-rows 3 --seed recognised --out "example_workflows/SSD Bundled 48x48 model - ar vs ssd-exact vs ssd.jpg"
  python -m tools.thumbnail --cards [TEMPLATE ...]      # the download cards (all of them without a name)

Nothing is drawn in BADGE, the top-left corner where the template browser puts its own badge over the thumbnail.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

import ssd_core
from ssd_core.trace import status_image

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "example_workflows"
API_COPIES = ROOT / "tests" / "workflows_api"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
DECODERS = ("ar", "ssd-exact", "ssd")
BACKGROUND = (24, 24, 24)

# The template browser's "Node graph" badge, over the top-left corner of every card's thumbnail (ComfyUI frontend
# 1.58.1, static/assets/GraphView-*.js, WorkflowTemplateSelectorDialog): CardTop's "top-left" slot is
# `absolute top-2 left-2 flex flex-wrap justify-start gap-2` and holds `flex h-6 items-center gap-1 rounded-md
# bg-zinc-700/50 px-2` (a size-3 icon and the text-xs label): 99.5 x 24 CSS px at (8, 8) in Chromium. CardTop is
# `relative p-0 overflow-hidden aspect-square`, as wide as the card (grid `minmax(15rem,1fr)`) less its `p-2`, so
# at least 224 px; the thumbnail in it is `max-w-full max-h-64 object-contain`, centred: min(side, 256) px square.
# The worst case, a 224 px card top, shows the 512 px thumbnail at 224 px (x 2.29): the badge covers x 18-246,
# y 18-73 of it (at the usual 256 px, x 2: 16-215, 16-64). Translated, the label is longer: measured in the 15
# locales of 1.58.1, French "Graphe de nœuds" is the widest (135 px: x 18-327 on the 224 px card), then Italian
# (123 px). BADGE is that worst case with a margin, in a 512 px thumbnail's pixels.
BADGE = (0, 0, 344, 88)  # x0, y0, x1, y1 (x1, y1 exclusive): plain background, nothing drawn
BADGE_WIDTHS = {"en": 99.5, "it": 123.0, "fr": 135.2}  # CSS px: the badge in Chromium in English, Italian and French, the widest of its 15 locales

# What each download card says the template needs, line by line (the download instructions, kept as they were).
NEEDS = {
    "SSD Emu3 - ar vs ssd-exact": ["needs models/ssd_models/Emu3-Gen-hf", "no heads: ssd-exact drafts from the row above"],
    "SSD Emu3.5 - ar vs ssd-exact": ["needs models/ssd_models/Emu3.5-Image",
                                     "+ emu3.tiktoken, emu3_vision_tokens.txt", "+ ibq.safetensors (convert-ibq)"],
    "SSD Emu3.5 FlashAR - flashar vs ssd-exact": ["lxazjk/Emu3.5-Image-FlashAR (+ Emu3.5's tokenizer files)",
                                                  "ibq.safetensors: convert-ibq",
                                                  "weights: 68.0 / 38.1 / 23.6 GiB in bf16 / 8-bit / 4-bit"],
    "SSD Janus-Pro 7B - ar vs ssd-exact": ["needs models/ssd_models/Janus-Pro-7B",
                                           "no heads: ssd-exact drafts from the row above"],
    "SSD Lumina-mGPT 2.0 - ar vs ssd-exact": ["needs models/ssd_models/Lumina-mGPT-2.0",
                                              "+ movqgan.safetensors (convert-movqgan)"],
    "SSD Lumina-mGPT 7B - ar vs ssd-exact": ["needs models/ssd_models/Lumina-mGPT-7B-768",
                                             "+ vqgan.safetensors (convert-vqgan)"],
}
# Each template's model folder -> its tiny random twin in the released layout (the builders of tests/released_*.py)
# with the released model's default grid: (module, builder, keyword arguments, config.json keys to set).
TWINS = {
    "Emu3-Gen-hf": ("released_layouts", "build_emu3_gen_hf_released", {},
                    {"text_config.max_position_embeddings": 9216}),  # the release's positions: 90x90 at 720 px
    "Emu3.5-Image": ("released_emu35", "build_emu35_released", {}, {}),  # 64x64
    "Emu3.5-Image-FlashAR": ("released_flashar", "build_flashar_released", {}, {}),  # 32x32
    "Janus-Pro-7B": ("released_layouts", "build_janus_pro_released", {"size": "7B", "grid": 24}, {}),  # 384 / 16
    "Lumina-mGPT-2.0": ("released_lumina2", "build_lumina2_released", {}, {}),  # 96x96 at 768 px
    "Lumina-mGPT-7B-768": ("released_lumina", "build_lumina_released", {"side": 768}, {}),  # 48x48
}


def _font(size: int):
    try:
        return ImageFont.truetype(FONT, size)
    except OSError:
        return ImageFont.load_default()


def _fitted_px(draw: ImageDraw.ImageDraw, text: str, px: int, width: int, least: int) -> int:
    """The font size for `text`: up to px, one px smaller at a time until it fits `width` or reaches `least`."""
    while px > least and draw.textlength(text, font=_font(px)) > width:
        px -= 1
    return px


def badge_box(size: int = 512) -> tuple[int, int, int, int]:
    """BADGE in the pixels of a `size` px thumbnail."""
    return tuple(round(v * size / 512) for v in BADGE)


def draw_title(draw: ImageDraw.ImageDraw, lines, size: int = 512, top: int = 16,
               sizes: tuple[int, int] = (26, 20)) -> int:
    """The thumbnail's title, clear of the badge: each line right-aligned 16 px from the right edge, starting at
    least 8 px right of BADGE, the first line at up to sizes[0] px (brighter), the others at up to sizes[1],
    each shrunk until it fits; the lines end above BADGE's bottom edge. Returns the y below the title."""
    _, _, x1, y1 = badge_box(size)
    right, left = size - round(16 * size / 512), x1 + round(8 * size / 512)
    y = round(top * size / 512)
    for i, line in enumerate(lines):
        px = _fitted_px(draw, line, round(sizes[0 if i == 0 else 1] * size / 512), right - left, 8)
        font = _font(px)
        width = draw.textlength(line, font=font)
        draw.text((right - width, y), line, fill=(235, 235, 235) if i == 0 else (200, 200, 200), font=font)
        y += round(px * 1.25)
    if y > y1:
        raise ValueError(f"the title {lines} runs below the badge's band (y {y} > {y1})")
    return y


def _pixels(x, side: int) -> Image.Image:
    """Float [H, W, 3] in [0, 1] -> a side x side PIL image (nearest: cells stay sharp)."""
    arr = (x.clamp(0, 1).numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(arr).resize((side, side), Image.NEAREST if arr.shape[0] < side // 2 else Image.LANCZOS)


def showcase_seed(model, prompt: str = "face", tries: int = 16) -> int:
    """The showcase's seed by a fixed rule, not by eye: of seeds 0 to tries - 1, the one whose `ar` image (the model's
    defaults) the yardstick gives the highest probability of the class asked for (the lowest seed on a tie).
    ssd-exact draws that very image; ssd its own."""
    from ssd_core import yardstick

    stick = yardstick.for_model(model)
    want = list(model.class_names).index(prompt)
    images = [ssd_core.generate(model, None, prompt=prompt, seed=seed, decoder="ar", score=False).image
              for seed in range(tries)]
    p = stick.logits_and_features(images)[0].softmax(1)[:, want]  # [tries] the yardstick's probability of `prompt`
    return int(p.argmax())


def thumbnail(prompt: str = "face", seed: int = 42, verify_rounds: int | None = None, size: int = 512,
              model_name: str = "reference", exact_rows: int = 0) -> Image.Image:
    """The bundled model's template thumbnail (the layout is for size 512): the title top right, then per decoder
    its steps, image and status grid, then what they show. exact_rows: ssd-exact's draft rows (0: the device's
    pick, which a busy CPU makes small; its image is the same whatever the rows, only its steps change); verify_rounds:
    ssd's (None: the model's default, as the template's samplers: reference-48's ssd_model.json says 3)."""
    model = ssd_core.load_model(model_name)
    heads = ssd_core.load_heads(model_name, model)
    rows = {"ssd-exact": {"draft_rows": exact_rows}} if exact_rows else {}
    runs = {d: ssd_core.generate(model, heads if d != "ar" else None, prompt=prompt, decoder=d, seed=seed,
                                 verify_rounds=verify_rounds, **rows.get(d, {})) for d in DECODERS}
    im = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(im)
    H, W = model.grid_options()[0]
    top = draw_title(draw, ["Bundled model", f'{H}x{W}, "{prompt}"'])
    side, gap, left = 152, 12, 16
    y = max(top, badge_box(size)[3]) + 6  # 94: below the badge's band
    for i, d in enumerate(DECODERS):
        x = left + i * (side + gap)
        draw.text((x, y), f"{d}: {runs[d].trace.steps} steps", fill=(220, 220, 220), font=_font(14))
        im.paste(_pixels(runs[d].image, side), (x, y + 20))
        im.paste(_pixels(status_image(runs[d].trace.to_dict()), side), (x, y + 28 + side))
    same = "the very image of ar" if bool((runs["ssd-exact"].tokens == runs["ar"].tokens).all()) else "ar's image"
    for j, line in enumerate([f"ssd-exact: {same} in fewer steps.", "ssd: the paper's lossy mode, fewest steps.",
                              "grid: green drafted right, orange fixed by the model, grey one at a time."]):
        draw.text((left, y + 40 + 2 * side + 18 * j), line, fill=(200, 200, 200), font=_font(13))
    return im


def download_card(title, needs: list[str], trace: dict, size: int = 512, left: dict | None = None,
                  labels: tuple[str, str] = ("ar", "ssd-exact")) -> Image.Image:
    """A downloaded model's template thumbnail, drawn without the model (the layout is for size 512): the title
    (a line, or lines: draw_title) top right, the left panel (grey, or the per-cell step grid of `left` where its
    decoder runs on the twin too: FlashAR's flashar, one shade per step), the right panel as the status grid of
    `trace` (a run of the family's tiny random twin at the model's default grid), each under its label, and
    what the template needs."""
    im = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(im)
    draw_title(draw, [title] if isinstance(title, str) else list(title))
    side, label_y = 221, badge_box(size)[3] + 6  # 94: below the badge's band
    top = label_y + 24
    for x, label in zip((24, 268), labels):
        draw.text((x, label_y), label, fill=(220, 220, 220), font=_font(16))
    if left is None:
        draw.rectangle((24, top, 24 + side - 1, top + side - 1), fill=(136, 140, 149))
    else:
        im.paste(_pixels(status_image(left, cell=4, color_by="step", gridlines=False), side), (24, top))
    im.paste(_pixels(status_image(trace, cell=4, gridlines=False), side), (268, top))
    for j, line in enumerate(needs):
        font = _font(_fitted_px(draw, line, 16, size - 2 * 24, 10))
        draw.text((24, top + side + 16 + 24 * j), line, fill=(215, 215, 215), font=font)
    H, W = len(trace["status"]), len(trace["status"][0])
    whose = "the grids: runs" if left is not None else f"{labels[1].split(':')[0]}'s grid: a run"
    draw.text((24, 474), f"{whose} of a tiny random model in this layout, {H}x{W} tokens",
              fill=(150, 150, 150), font=_font(12))
    return im


# ---- the download cards, from the templates ---------------------------------------------------------------------
def _api_copy(name: str) -> dict:
    """Template `name` in API format (tests/workflows_api/, which test_workflows keeps equal to the UI file)."""
    return json.loads((API_COPIES / f"{name}.json").read_text())


def _tests_importable() -> None:
    """tests/ on sys.path: its conftest (load_pack) and the released-layout builders are imported from there."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))


def template_samplers(name: str) -> list[tuple[str, dict]]:
    """A template's SSD Sampler nodes left to right as the canvas shows them (the UI file's positions), each as
    (node id, its inputs by name from the API copy in tests/workflows_api/, which test_workflows keeps equal)."""
    ui = json.loads((TEMPLATES / f"{name}.json").read_text())
    api = _api_copy(name)
    nodes = sorted((n for n in ui["nodes"] if n["type"] == "SSDSampler"), key=lambda n: (n["pos"][0], n["pos"][1]))
    return [(str(n["id"]), api[str(n["id"])]["inputs"]) for n in nodes]


def template_decoders(name: str) -> tuple[str, ...]:
    """The decoders a template runs, left to right."""
    return tuple(inputs["decoder"] for _, inputs in template_samplers(name))


def card_spec(name: str) -> dict:
    """What the download card of template `name` shows, from the template: its title (the model part of the
    template's name over its decoders), the panels' labels (its decoders, left to right), what it needs
    (NEEDS) and the model folder its loader names."""
    decoders = template_decoders(name)
    if len(decoders) != 2:
        raise ValueError(f"{name}: a download card shows two samplers, the template has {decoders}")
    api = _api_copy(name)
    (model,) = [n["inputs"]["model"] for n in api.values() if n["class_type"] == "SSDLoadModel"]
    shown = name.removeprefix("SSD ").split(" - ")[0]
    return {"title": (shown, " vs ".join(decoders)), "labels": decoders, "needs": NEEDS[name], "model": model}


def download_templates() -> list[str]:
    """The templates whose model is downloaded by the user: every one but the bundled models'."""
    return [p.stem for p in sorted(TEMPLATES.glob("*.json")) if not p.stem.startswith("SSD Bundled ")]


def _pack_nodes():
    """The pack's nodes as ComfyUI imports them, without ComfyUI: tests/conftest.py's load_pack (its import installs
    the stand-in of comfy_api.latest)."""
    _tests_importable()
    import conftest

    return conftest.load_pack()


def build_twin(model: str, models_dir: Path) -> Path:
    """The tiny random twin of the template's model `model`, as models_dir / model."""
    import importlib

    module, builder, kwargs, config = TWINS[model]
    _tests_importable()
    folder = getattr(importlib.import_module(module), builder)(models_dir / model, **kwargs)
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        for dotted, value in config.items():
            *path, key = dotted.split(".")
            d = cfg
            for part in path:
                d = d[part]
            d[key] = value
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def card(name: str, models_dir: Path) -> Image.Image:
    """Template `name`'s download card: its loader, heads loader and samplers run through the pack's nodes with
    the template's inputs (on the CPU) on the model's tiny random twin, ar's panel left grey (one token per step:
    its grid is all grey)."""
    import torch

    spec = card_spec(name)
    if not (models_dir / spec["model"]).is_dir():
        build_twin(spec["model"], models_dir)
    os.environ["SSD_MODELS_DIR"] = str(models_dir)
    nodes = _pack_nodes()
    api = _api_copy(name)
    (load,) = [n["inputs"] for n in api.values() if n["class_type"] == "SSDLoadModel"]
    (heads,) = [n["inputs"] for n in api.values() if n["class_type"] == "SSDLoadHeads"]
    torch.set_num_threads(1)
    (loaded,) = nodes.SSDLoadModel().load(load["model"], load["dtype"], "cpu", load["quantization"],
                                          load["offload"], load["compile"])
    (model,) = nodes.SSDLoadHeads().load(loaded, heads["heads"])
    traces = []
    for nid, inputs in template_samplers(name):
        if inputs["decoder"] == "ar":
            traces.append(None)
            continue
        out = nodes.SSDSampler().sample(model, unique_id=nid, **{k: v for k, v in inputs.items()
                                                                 if not isinstance(v, list)})
        traces.append(out["result"][1])
        print(f"  {name}: {inputs['decoder']} {out['result'][1]['steps']} steps at "
              f"{'x'.join(map(str, out['result'][1]['grid']))}", flush=True)
    left, right = traces
    labels = spec["labels"]
    if left is not None:  # both panels ran on the twin: their step counts compare
        labels = tuple(f"{d}: {t['steps']} steps" for d, t in zip(labels, traces))
    return download_card(spec["title"], spec["needs"], right, left=left, labels=labels)


def cards(names=None, out_dir: Path = TEMPLATES) -> list[Path]:
    """Rebuilds the download cards (every one without `names`) as out_dir / <template>.jpg."""
    written = []
    with tempfile.TemporaryDirectory(prefix="ssd-twins-") as tmp:
        for name in names or download_templates():
            path = Path(out_dir) / f"{name}.jpg"
            card(name, Path(tmp)).save(path, quality=90)
            print(f"wrote {path}", flush=True)
            written.append(path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="face")
    ap.add_argument("--seed", default="42", help="a number, or 'recognised': of seeds 0-15, the one whose ar image the "
                    "yardstick finds most likely to be --prompt (showcase_seed)")
    ap.add_argument("--model", default="reference", help="reference or reference-48")
    ap.add_argument("--exact-rows", type=int, default=0, help="ssd-exact's draft rows (0: the device's pick)")
    ap.add_argument("--out", default="example_workflows/SSD Bundled 24x24 model - ar vs ssd-exact vs ssd.jpg")
    ap.add_argument("--cards", nargs="*", metavar="TEMPLATE",
                    help="rebuild the download cards instead (the named templates, or all of them)")
    a = ap.parse_args(argv)
    if a.cards is not None:
        cards(a.cards)
        return 0
    seed = showcase_seed(ssd_core.load_model(a.model), a.prompt) if a.seed == "recognised" else int(a.seed)
    thumbnail(a.prompt, seed, model_name=a.model, exact_rows=a.exact_rows).save(a.out, quality=90)
    print(f"wrote {a.out} (seed {seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
