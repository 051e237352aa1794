"""`reference-48`: the bundled model's 48x48-token sibling (192x192 px), warm-started from `reference`.

    python -m reference_recipe.r48 data  --work build/r48            # render + tokenize (minutes)
    python -m reference_recipe.r48 train --work build/r48 --minutes 70 [--resume]
    python -m reference_recipe.r48 train --work build/r48x --init ssd_core/reference/model48 --steps 2000 [--resume] [--lr 2e-4]
    python -m reference_recipe.r48 ship  --work build/r48 --out ssd_core/reference/model48
    python -m reference_recipe.r48 classes --work build/r48x --model ssd_core/reference/model48 --side 48
    python -m reference_recipe.r48 data  --work build/r48g --copies 24    # 25 renders a glyph
    python -m reference_recipe.r48 pack  --work build/r48g                # data.safetensors.xz, to carry to a GPU
    python -m reference_recipe.r48 train --work build/r48g --init ssd_core/reference/model48 --device cuda --batch 64

Design (issue 24): the same glyphs, classes, held-out split and VQ as `reference` (the VQ is fully
convolutional: a 192 px render gives a 48x48 grid, a 128 px render 32x32); the same LlamaForCausalLM, every
weight copied from `reference` (RoPE has no learned positions: only max_position_embeddings grows), trained on
a mix of 48x48 sequences (2,353 tokens) and 32x32 ones (1,057) so that it also samples the middle size of the
sweep. The learning rate follows the wall clock (held for a third of the budget, then linearly to 0), so a
slower shared CPU shortens the run instead of cutting the schedule; a checkpoint (weights, AdamW moments,
step, elapsed seconds, data position) every 50 steps and at SIGTERM/SIGINT lets `--resume` continue.
`--steps N` schedules by steps instead (held for a third of N, then linearly to 0), for a run that shares the CPU
with other work at a low priority, and `--init DIR` starts from a shipped model folder (the extension of issue 41
starts from the shipped reference-48). `--ema D` keeps an exponential moving average of the weights (decay D a
step) beside them: held-out NLL is then measured on it and `best.pt` is the best average, so that a long run
sharing several sessions can be shipped at any point of a held learning rate. A resume that sets a new `--lr`
warms up to it again (WARMUP steps) from where it resumed. `--balance` draws each class equally often instead of
each grid (the glyph set runs from 19 hearts to 130 animals, and the class accuracy asks every class in turn).
`--noise P` swaps a share P of the image codes the model reads (never its targets) for codes of the same grid
elsewhere, so that it learns to go on from a context with the slips its own sampling makes (exposure bias).
`--originals` trains on the glyphs as rendered only (not their shifted copies), `--mix32 F` on 32x32 sequences for a
share F of the steps (0.3 by default). `--layers N` grows the init model deeper before training (`deepen`: a copy of
evenly spaced layers inserted after each with its output projections zero, so that training starts from the same
function with more capacity). `--device cuda --batch N` trains on a GPU (bf16 autocast, fp32 weights; checkpoints
load on any device); `data --copies N` makes N augmented copies of each glyph instead of 6 / 4, and `pack` compresses
the data to travel (reference_recipe/gpu_r48.sh: the whole GPU run in one command). One run a work folder at a time:
a second is refused (train.lock), as it would overwrite the first's checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

import numpy as np
import torch
from PIL import Image

from . import data as D
from .ar import ar_loss, layout, sequences
from .common import SEED, log

REFERENCE = "ssd_core/reference/model"
SIZES = {48: 192, 32: 128}        # grid side -> pixels (4 px per token)
COPIES = {48: 6, 32: 4}           # augmented copies per training glyph
MIX_32 = 0.3                      # share of steps on 32x32 sequences
BATCH = 4
LR = 5e-4
WARMUP = 30
MAX_POSITIONS = 2432              # >= 48 * 49 + 1 = 2353
CFG_DROP = 0.1
EVAL_EVERY = 200                  # steps between held-out evaluations (48x48; 32x32 at the end)
SAVE_GAP_S = 60                   # a checkpoint every 50 steps, at most once a minute
AUTOCAST = {"cuda": torch.bfloat16}  # device type -> the dtype of its matrix work in training
DATA = "data.safetensors"         # in the work folder; DATA + ".xz" is its packed copy (`pack`)


def render(ch: str, size: int) -> np.ndarray:
    """data.render at `size` px: the same crop, margin and LANCZOS resize."""
    a = D.render_raw(ch)
    ink = (a < 250).any(axis=2)
    ys, xs = np.nonzero(ink)
    crop = a[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    h, w = crop.shape[:2]
    side = int(round(max(h, w) * (1 + 2 * D.MARGIN)))
    sq = np.full((side, side, 3), 255, np.uint8)
    oy, ox = (side - h) // 2, (side - w) // 2
    sq[oy:oy + h, ox:ox + w] = crop
    return np.asarray(Image.fromarray(sq).resize((size, size), Image.LANCZOS))


def build_data(work: str, copies: dict | None = None) -> None:
    """Render, augment and tokenize the glyphs into `work`/data.safetensors. copies: augmented copies per training
    glyph and grid side (default COPIES); the glyphs as rendered come first, `train{side}_glyphs` says how many."""
    from safetensors.torch import save_file
    from ssd_core.pixel_decoders.reference_vq import load_vq
    copies = copies or COPIES
    ds = D.build_dataset_v2(os.path.join(work, "emoji.npz"), verbose=True)
    vq = load_vq(os.path.join(REFERENCE, "vq.safetensors"))
    rng = np.random.default_rng(SEED + 48)
    tr, ho = ~ds["heldout"], ds["heldout"]
    out = {}
    for side, px in SIZES.items():
        imgs = np.stack([render(c, px) for c in ds["chars"]])
        log(f"rendered {len(imgs)} glyphs at {px} px")

        def enc(x):
            with torch.no_grad():
                return torch.cat([vq.encode(D.to_tensor(x[i:i + 64])).to(torch.int16) for i in range(0, len(x), 64)])
        toks, labs = [enc(imgs[tr])], [ds["labels"][tr]]
        for c in range(copies[side]):
            toks.append(enc(D.augment(imgs[tr], rng, max_shift=4 * px // 96)))
            labs.append(ds["labels"][tr])
            log(f"{side}x{side}: copy {c + 1}/{copies[side]}")
        out[f"train{side}"] = torch.cat(toks).contiguous()
        out[f"train{side}_glyphs"] = torch.tensor(int(tr.sum()))
        out[f"train{side}_classes"] = torch.from_numpy(np.concatenate(labs)).long()
        out[f"heldout{side}"] = enc(imgs[ho]).contiguous()
        out[f"heldout{side}_classes"] = torch.from_numpy(ds["labels"][ho]).long()
        if side == 48:
            np.save(os.path.join(work, "heldout192.npy"), imgs[ho])  # the real held-out glyphs at 192 px
    save_file(out, os.path.join(work, "data.safetensors"))
    log(f"wrote {os.path.join(work, 'data.safetensors')}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in out.items()))


def load_data(work: str) -> dict:
    """`work`/data.safetensors, or else its packed copy data.safetensors.xz (`pack`: what travels to a GPU machine)."""
    from safetensors.torch import load, load_file
    path = os.path.join(work, DATA)
    if os.path.exists(path):
        return load_file(path)
    if os.path.exists(path + ".xz"):
        import lzma
        with lzma.open(path + ".xz") as f:
            return load(f.read())
    raise SystemExit(f"{work} holds no {DATA} (nor {DATA}.xz): build it with "
                     f"`python -m reference_recipe.r48 data --work {work}`")


def pack(work: str) -> None:
    """data.safetensors -> data.safetensors.xz, about a fifth of its size (mostly white codes), for the trip to a
    GPU machine, whose copy of the working tree is limited in size; `train` reads either."""
    import lzma
    path = os.path.join(work, DATA)
    if not os.path.exists(path):
        raise SystemExit(f"{work} holds no {DATA} to pack: build it with `python -m reference_recipe.r48 data --work "
                         f"{work}`")
    with open(path, "rb") as src, lzma.open(path + ".xz.tmp", "wb", preset=6) as dst:
        while chunk := src.read(1 << 24):
            dst.write(chunk)
    os.replace(path + ".xz.tmp", path + ".xz")
    size, packed = os.path.getsize(path) / 1e6, os.path.getsize(path + ".xz") / 1e6
    log(f"wrote {path}.xz: {packed:.1f} MB ({size:.1f} MB unpacked)")


def warm_start(init: str | None = None, layers: int | None = None):
    """`reference` (or the model folder `init`) in fp32 with room for 48x48 sequences; `layers` more than it has
    grows it deeper without changing what it computes (`deepen`)."""
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(init or REFERENCE, dtype=torch.float32)
    model.config.max_position_embeddings = MAX_POSITIONS
    if layers and layers != model.config.num_hidden_layers:
        model = deepen(model, layers)
    return model


def layer_count(weights: dict) -> int:
    """The number of decoder layers in a LlamaForCausalLM state dict (more than the init's after --layers)."""
    return 1 + max(int(k.split(".")[2]) for k in weights if k.startswith("model.layers."))


def deepen(model, layers: int):
    """The model with `layers` decoder layers, the same function (block expansion, as LLaMA Pro): after evenly spaced
    layers a copy of that layer is inserted whose output projections (attention o_proj, MLP down_proj) are zero, so
    that each new layer adds nothing to the residual stream until it is trained."""
    from transformers import LlamaForCausalLM
    have = model.config.num_hidden_layers
    if not have < layers <= 2 * have:
        raise SystemExit(f"--layers {layers}: give more than the model's {have} layers and at most twice as many")
    extra = layers - have
    after = {round((j + 1) * have / extra) - 1 for j in range(extra)}  # copy these layers (evenly spaced)
    old = model.state_dict()
    new, k = {}, 0
    for name, value in old.items():
        if not name.startswith("model.layers."):
            new[name] = value
    for i in range(have):
        for copy in ([False, True] if i in after else [False]):
            prefix = f"model.layers.{i}."
            for name, value in old.items():
                if name.startswith(prefix):
                    zero = copy and name.endswith(("o_proj.weight", "down_proj.weight"))
                    new[f"model.layers.{k}.{name[len(prefix):]}"] = torch.zeros_like(value) if zero else value.clone()
            k += 1
    config = model.config
    config.num_hidden_layers = layers
    grown = LlamaForCausalLM(config).to(torch.float32)
    grown.load_state_dict(new)
    return grown


@torch.no_grad()
def heldout_nll(model, toks, classes, lay) -> float:
    model.eval()
    dev = next(model.parameters()).device
    ce = torch.cat([ar_loss(model, sequences(toks[i:i + 8].long(), classes[i:i + 8], lay).to(dev), reduction="none")
                    for i in range(0, len(toks), 8)])
    return float(ce.mean())


def batch_indices(classes: torch.Tensor, n: int, g: torch.Generator, balance: bool) -> torch.Tensor:
    """n training grids to draw: uniformly over the grids, or (balance) a class uniformly, then one of its grids, so
    that each class is trained on as often as it is asked for (bench and the sampler sweep ask classes in turn)."""
    if not balance:
        return torch.randint(len(classes), (n,), generator=g)
    present = classes.unique()
    picked = present[torch.randint(len(present), (n,), generator=g)]
    pools = [(classes == c).nonzero().flatten() for c in picked]
    return torch.stack([pool[torch.randint(len(pool), (1,), generator=g)[0]] for pool in pools])


def corrupt(seq: torch.Tensor, share: float, g: torch.Generator, image_vocab: int = 512) -> torch.Tensor:
    """The model's inputs seq[:, :-1] with about `share` of their image codes swapped for the code at a random
    other position of the same sequence (an image code, so the grid's own palette); the class and row-end tokens
    stay."""
    inputs = seq[:, :-1].clone()
    hit = (torch.rand(inputs.shape, generator=g) < share) & (inputs < image_vocab)
    source = torch.randint(1, inputs.shape[1], inputs.shape, generator=g)  # a position of the same sequence
    swapped = inputs.gather(1, source)
    hit &= swapped < image_vocab
    inputs[hit] = swapped[hit]
    return inputs


def hold_work(work: str):
    """An exclusive lock on `work`/train.lock until train() returns (or the process exits), or SystemExit."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        return None
    f = open(os.path.join(work, "train.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise SystemExit(f"another training run is using {work} (pid {f.read().strip() or '?'}): wait for it to stop "
                         "(a stop by signal saves its checkpoint first), then --resume")
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def train(work: str, minutes: float, resume: bool, steps: int | None = None, init: str | None = None,
          peak_lr: float | None = None, ema_decay: float | None = None, balance: bool | None = None,
          originals: bool | None = None, mix32: float | None = None, layers: int | None = None,
          device: str = "cpu", batch: int | None = None, noise: float | None = None) -> None:
    torch.set_num_threads(int(os.environ.get("SSD_THREADS", "2")))
    dev = torch.device(device)
    spec = json.load(open(os.path.join(REFERENCE, "ssd_model.json")))
    lay = layout(spec["num_classes"], row_end=True)
    lock = hold_work(work)  # one run a folder: a second would overwrite the first's checkpoint
    data = load_data(work)
    ckpt = os.path.join(work, "checkpoint.pt")
    saved = (torch.load(ckpt, weights_only=True, map_location=dev)  # our own: tensors
             if resume and os.path.exists(ckpt) else None)
    began = saved and layer_count(saved["model"])  # the layers of the run resumed
    if began and layers and layers != began:
        raise SystemExit(f"--layers {layers}: the run in {work} began with {began} layers and a resume keeps them: "
                         "leave --layers out, or start a fresh run in another --work")
    # the architecture the run began with
    model = warm_start(init or (saved and saved["state"].get("init")), layers or began).to(dev)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95))
    state = {"step": 0, "elapsed": 0.0, "history": [], "budget_s": (minutes or 70.0) * 60, "budget_steps": steps,
             "init": init, "peak_lr": peak_lr or LR, "balance": False, "originals": False, "mix32": MIX_32,
             "batch": BATCH}
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        if minutes is not None:  # a new budget for the rest of the run
            state["budget_s"] = minutes * 60
        if steps is not None:
            state["budget_steps"] = steps
        if peak_lr is not None:  # a new peak for the rest of the run, warmed up to from here
            state["peak_lr"] = peak_lr
            state["warm_from"] = state["step"]
        log(f"resumed at step {state['step']}, {state['elapsed'] / 60:.1f} of {state['budget_s'] / 60:.0f} min")
    else:  # a fresh run (also --resume with no checkpoint yet)
        log(f"{'--resume: no checkpoint in ' + work + ', so ' if resume else ''}a fresh run from "
            f"{init or REFERENCE}")
    # options given replace the run's (a resume keeps those not given, from its checkpoint)
    given = {"ema_decay": ema_decay, "balance": balance, "originals": originals, "mix32": mix32, "batch": batch,
             "noise": noise}
    state.update({k: v for k, v in given.items() if v is not None})
    # the weights' moving average (fp32), when asked for: what is evaluated and kept as best.pt
    ema = None
    if state.get("ema_decay"):
        ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if saved is not None and saved.get("ema") is not None:
            ema = saved["ema"]
    g = torch.Generator().manual_seed(SEED + 4800 + state["step"])  # the draw of grids: on the CPU, any device
    # on a GPU: bf16 matrix work, fp32 weights, moments and loss (this CPU has no fast bf16: fp32 throughout)
    autocast = torch.autocast(dev.type, dtype=AUTOCAST.get(dev.type), enabled=dev.type in AUTOCAST)
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state, "ema": ema}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)

    def evaluate(final=False):
        if ema is not None:  # measure the average: swap it in, keep the training weights aside
            live = {k: v.detach().clone() for k, v in model.state_dict().items()}
            model.load_state_dict(ema)
        nll48 = heldout_nll(model, data["heldout48"], data["heldout48_classes"], lay)
        nll32 = heldout_nll(model, data["heldout32"], data["heldout32_classes"], lay) if final else float("nan")
        state["history"].append({"step": state["step"], "minutes": round(state["elapsed"] / 60, 1),
                                 "nll48": round(nll48, 4), "nll32": round(nll32, 4)})
        log(f"eval step {state['step']}: held-out NLL 48x48 {nll48:.4f}, 32x32 {nll32:.4f}")
        best = state.get("best_nll48", float("inf"))
        if nll48 < best:
            state["best_nll48"] = nll48
            state["best_step"] = state["step"]
            torch.save(model.state_dict(), os.path.join(work, "best.pt"))
        json.dump(state["history"], open(os.path.join(work, "history.json"), "w"), indent=1)
        if ema is not None:
            model.load_state_dict(live)

    if state["step"] == 0:
        evaluate()
    t_start = time.time() - state["elapsed"]
    saved_at = 0.0
    def done_share() -> float:  # of the budget: steps when counted in steps, else the wall clock
        if state.get("budget_steps"):
            return state["step"] / state["budget_steps"]
        return state["elapsed"] / state["budget_s"]

    while done_share() < 1 and not stop["now"]:
        model.train()
        frac = done_share()
        lr = state.get("peak_lr") or LR
        lr *= min(1.0, (state["step"] - state.get("warm_from", 0) + 1) / WARMUP) * min(1.0, (1 - frac) / (2 / 3))
        for grp in opt.param_groups:
            grp["lr"] = lr
        side = 32 if torch.rand(1, generator=g).item() < state.get("mix32", MIX_32) else 48
        X, Y = data[f"train{side}"], data[f"train{side}_classes"]
        if state.get("originals"):  # the glyphs as rendered, without their shifted copies (build_data puts them first)
            glyphs = data.get(f"train{side}_glyphs")  # absent from data built before --copies: COPIES then
            glyphs = int(glyphs) if glyphs is not None else len(X) // (COPIES[side] + 1)
            X, Y = X[:glyphs], Y[:glyphs]
        size = state.get("batch", BATCH)
        idx = batch_indices(Y, size, g, state.get("balance", False))
        labels = Y[idx].clone()
        labels[torch.rand(size, generator=g) < CFG_DROP] = spec["num_classes"]  # the null class
        seq = sequences(X[idx].long(), labels, lay)
        inputs = corrupt(seq, state["noise"], g).to(dev) if state.get("noise") else None
        with autocast:
            loss = ar_loss(model, seq.to(dev), inputs=inputs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if ema is not None:
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    ema[k].lerp_(v, 1 - state["ema_decay"]) if v.is_floating_point() else ema[k].copy_(v)
        state["step"] += 1
        state["elapsed"] = time.time() - t_start
        if state["step"] % 10 == 0:
            log(f"step {state['step']} {side}x{side} loss {loss.item():.4f} lr {lr:.2e} "
                f"{state['elapsed'] / 60:.1f} min, {frac:.1%} of the budget")
        if state["step"] % EVAL_EVERY == 0:
            evaluate()
        if state["step"] % 50 == 0 and time.time() - saved_at >= SAVE_GAP_S:  # a fast GPU: once a minute at most
            save()
            saved_at = time.time()
    evaluate(final=True)
    save()
    if lock is not None:
        lock.close()
    log("stopped by a signal: --resume continues" if stop["now"] else
        f"done: {state['step']} steps in {state['elapsed'] / 60:.1f} min, best NLL48 {state['best_nll48']:.4f} "
        f"at step {state['best_step']}")


def ship(work: str, out: str, init: str | None = None, weights: str = "best") -> None:
    """A checkpoint as a model folder: fp16 weights and ssd_model.json naming reference's VQ and yardstick.
    weights: "best" (best.pt, the lowest held-out NLL), "latest" (checkpoint.pt's moving average, else its weights:
    for a run whose held-out NLL is not what it is judged by, e.g. with --balance) or "trained" (checkpoint.pt's
    weights themselves: a short fine-tune whose average still holds much of the weights it began from)."""
    if weights in ("latest", "trained"):
        saved = torch.load(os.path.join(work, "checkpoint.pt"), weights_only=True, map_location="cpu")
        average = saved.get("ema") if weights == "latest" else None
        chosen = average if average is not None else saved["model"]
        log(f"shipping step {saved['state']['step']}{' (the moving average)' if average is not None else ''}")
    else:
        chosen = torch.load(os.path.join(work, "best.pt"), weights_only=True, map_location="cpu")
    model = warm_start(init, layer_count(chosen))
    model.load_state_dict(chosen)
    os.makedirs(out, exist_ok=True)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    spec = json.load(open(os.path.join(REFERENCE, "ssd_model.json")))
    shipped = os.path.join(out, "ssd_model.json")
    if os.path.exists(shipped):  # what the model folder declares of its own (its decoder_defaults) stays
        own = json.load(open(shipped)).get("decoder_defaults")
        if own:
            spec["decoder_defaults"] = own
    spec["grid"] = [48, 48]
    spec["grids"] = [[32, 32]]
    # the VQ and the yardstick are reference's own: one copy in the pack, named from here (model_files.inside)
    spec["vq_decoder"] = "../model/vq.safetensors"
    spec["yardstick"] = "../model/yardstick.safetensors"
    with open(os.path.join(out, "ssd_model.json"), "w") as f:
        json.dump(spec, f, indent=1)
    log(f"wrote {out}")


def heads_grids(work: str, count: int = 240) -> None:
    """The heads' fine-tuning grids from the tokenized data: `count` random 48x48 training grids (the draw is seeded)
    and the 32 held-out ones, as train-heads' --grids / --heldout-grids files (tokens [N, 48, 48], classes [N])."""
    from safetensors.torch import save_file
    data = load_data(work)
    pick = torch.randperm(len(data["train48"]), generator=torch.Generator().manual_seed(48))[:count]
    for name, tokens, classes in (("grids48", data["train48"][pick], data["train48_classes"][pick]),
                                  ("heldout48", data["heldout48"], data["heldout48_classes"])):
        path = os.path.join(work, f"{name}.safetensors")
        save_file({"tokens": tokens.long().contiguous(), "classes": classes.long().contiguous()}, path)
        log(f"wrote {path}: {tuple(tokens.shape)}")


def classes(work: str, model_dir: str, side: int) -> dict:
    """ar.class_likelihood of a model folder on the held-out grids of one size (24: the bundled model's held-out file
    the tests read; 48 / 32: `work`'s data)."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    from .ar import class_likelihood
    spec = json.load(open(os.path.join(REFERENCE, "ssd_model.json")))
    if side == 24:
        held = load_file("tests/data/heldout_tokens.safetensors")
        tokens, labels = held["tokens"], held["labels"]
    else:
        data = load_data(work)
        tokens, labels = data[f"heldout{side}"], data[f"heldout{side}_classes"]
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = class_likelihood(model, tokens, labels, layout(spec["num_classes"], row_end=True), spec["num_classes"])
    log(f"{model_dir} on {out['grids']} held-out {side}x{side} grids: the true class has the lowest NLL for "
        f"{out['accuracy']:.1%}; NLL under the true class {out['nll_true']:.4f}, under the null class "
        f"{out['nll_null']:.4f}")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m reference_recipe.r48", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["data", "pack", "train", "ship", "grids", "classes"])
    ap.add_argument("--work", default="build/r48")
    ap.add_argument("--minutes", type=float, default=None,
                    help="training budget in wall-clock minutes (default 70; with --resume: a new budget)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="budget in steps instead of minutes (lr by step)")
    ap.add_argument("--init", default=None, help="start from this model folder instead of reference")
    ap.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {LR}; with --resume: from now on)")
    ap.add_argument("--ema", type=float, default=None,
                    help="keep a moving average of the weights with this decay a step (e.g. 0.998); it is what is "
                         "evaluated and kept as best.pt")
    ap.add_argument("--balance", action=argparse.BooleanOptionalAction, default=None,
                    help="draw each class equally often (default: each grid; with --resume: from now on)")
    ap.add_argument("--originals", action=argparse.BooleanOptionalAction, default=None,
                    help="train on the glyphs as rendered only, not their shifted copies (default: all; with "
                         "--resume: from now on)")
    ap.add_argument("--mix32", type=float, default=None,
                    help=f"share of steps on 32x32 sequences (default {MIX_32}; with --resume: from now on)")
    ap.add_argument("--noise", type=float, default=None,
                    help="train: share of the image codes read swapped for codes of the same grid (default 0; with "
                         "--resume: from now on)")
    ap.add_argument("--copies", type=int, default=None,
                    help=f"data: augmented copies of each training glyph at both sizes (default {COPIES})")
    ap.add_argument("--layers", type=int, default=None,
                    help="train: grow the init model to this many layers first (deepen; a resume keeps the run's)")
    ap.add_argument("--device", default="cpu", help="train: where (cpu, cuda; on cuda the matrix work runs in bf16)")
    ap.add_argument("--batch", type=int, default=None,
                    help=f"train: sequences a step (default {BATCH}; with --resume: from now on)")
    ap.add_argument("--weights", default="best", choices=["best", "latest", "trained"],
                    help="ship: best.pt (lowest held-out NLL), the checkpoint's latest moving average, or its weights")
    ap.add_argument("--out", default="ssd_core/reference/model48")
    ap.add_argument("--model", default="ssd_core/reference/model48", help="classes: the model folder to check")
    ap.add_argument("--side", type=int, default=48, choices=[24, 32, 48], help="classes: the held-out grid size")
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: this torch ({torch.__version__}) sees no GPU; train on --device cpu")
    if a.copies is not None and a.copies < 0:
        ap.error(f"--copies {a.copies}: give the number of augmented copies of each glyph, 0 or more")
    if a.batch is not None and a.batch < 1:
        ap.error(f"--batch {a.batch}: give the number of sequences a step, 1 or more")
    if a.mix32 is not None and not 0 <= a.mix32 <= 1:
        ap.error(f"--mix32 {a.mix32} is a share of the steps: give a number from 0 to 1")
    if a.noise is not None and not 0 <= a.noise < 1:
        ap.error(f"--noise {a.noise} is a share of the codes read: give a number from 0 up to (not) 1")
    os.makedirs(a.work, exist_ok=True)
    {"data": lambda: build_data(a.work, a.copies and {side: a.copies for side in SIZES}),
     "pack": lambda: pack(a.work),
     "train": lambda: train(a.work, a.minutes, a.resume, a.steps, a.init, a.lr, a.ema, a.balance, a.originals,
                            a.mix32, a.layers, a.device, a.batch, a.noise),
     "ship": lambda: ship(a.work, a.out, a.init, a.weights), "grids": lambda: heads_grids(a.work),
     "classes": lambda: classes(a.work, a.model, a.side)}[a.stage]()


if __name__ == "__main__":
    main()
