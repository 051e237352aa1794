"""The resumable state of a heads-training run (heads.state.safetensors beside the heads file): the heads, Adam's
moments and the step, saved every `checkpoint_every` steps and at SIGTERM / SIGINT; on --resume every part is
checked against this run (its identity, names, dtypes, shapes, finite values) before anything is loaded."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import SSDError, reason, shown
from ..heads import DraftHeads
from ..outputs import WRITTEN, write_or_keep
from . import data

STATE_FORMAT = "ssd-train-state"
START_AGAIN = "run without --resume to start again"
MAX_IDENTITY_CHARS = 1 << 20  # the run's identity in a state's metadata (settings, model, data: about 2 KB)
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # safetensors' names of the tensors a run state holds
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")  # AdamW's state of one parameter


def state_path(out_path) -> Path:
    """The resumable state beside the heads file: heads.safetensors -> heads.state.safetensors."""
    out = Path(out_path)
    return out.with_name(out.stem + ".state.safetensors")


def save_state(path: Path, heads: DraftHeads, opt, step: int, identity: dict, log=print) -> None:
    """Heads, Adam's moments and the step (the data position and the schedule follow from it)."""
    from safetensors.torch import save_file

    tensors = {"heads." + k: v.detach().cpu().contiguous() for k, v in heads.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"opt.{i}.{k}"] = v.detach().cpu().contiguous().reshape(v.shape)
    meta = {"format": STATE_FORMAT, "step": str(step), "identity": json.dumps(identity)}
    while str(path) in WRITTEN:  # rewritten every checkpoint: named once, as the last file written
        WRITTEN.remove(str(path))
    try:
        write_or_keep(path, lambda p: save_file(tensors, str(p), metadata=meta), "--out (run state)")
    except SSDError as err:
        log(f"warning: {err}")


def _read_state(path: Path) -> dict:
    """The saved run's metadata: its step (a whole number >= 0) and identity (a JSON object of objects), each
    checked; else one SSDError line."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception as err:
        raise SSDError(f"--resume: {path} is not a readable run state ({reason(err, 60, fold=True)}): run "
                       "without --resume to start again") from None
    if meta.get("format") != STATE_FORMAT:
        raise SSDError(f"--resume: {path} is not a train-heads run state: run without --resume to start again")
    what, fix = f"--resume: {path}", f"the file is damaged: {START_AGAIN}"
    step = data.meta_number(meta, "step", what, fix)
    text = str(meta.get("identity", "null"))
    identity = data.json_of_kind(data.parse_json(text, f"{what}: its identity", fix, MAX_IDENTITY_CHARS), dict,
                                 f"{what}: its identity", fix)
    for part, value in identity.items():
        data.json_of_kind(value, dict, f"{what}: its identity's {shown(part, 30)}", fix)
    return {"step": step, "identity": identity}


def check_state(path: Path, identity: dict, total: int | None = None) -> dict:
    """The saved run's metadata (step, identity), when it was saved by this run (the parts of `identity` given)
    at a step within its `total` steps; else one SSDError naming what differs."""
    meta = _read_state(path)
    stored = meta["identity"]
    diff = []
    for part in identity:
        keys = data.IDENTITY_CHECKED if part == "model" else None
        diff += [f"{part} {d}" for d in data.differences(stored.get(part, {}), identity[part], keys)]
    if diff:
        more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
        raise SSDError(f"--resume: {path} was saved by another run: {'; '.join(diff[:3])}{more}; run with the "
                       "settings it was saved with, or without --resume to start again")
    if total is not None and meta["step"] > total:
        raise SSDError(f"--resume: {path} says step {meta['step']:,}, past the {total} steps of this run: the file "
                       f"is damaged; {START_AGAIN}")
    return meta


def state_tensors(path: Path, heads: DraftHeads, opt) -> dict:
    """The saved heads and Adam moments, each checked against this run's heads before it is read (its name,
    float dtype and shape), then read and checked finite (second moments >= 0); else one SSDError line."""
    from safetensors import safe_open

    params = opt.param_groups[0]["params"]
    want = {"heads." + k: tuple(v.shape) for k, v in heads.state_dict().items()}
    want.update({f"opt.{i}.{name}": () if name == "step" else tuple(p.shape) for i, p in enumerate(params)
                 for name in ADAM_STATE})
    what, fix = f"--resume: {path}", f"the file is damaged or was saved for other heads: {START_AGAIN}"
    out = {}
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
        missing = sorted(k for k in want if k.startswith("heads.") and k not in keys)
        unknown = sorted(keys - set(want))
        if missing or unknown:
            name = missing[0] if missing else unknown[0]
            raise SSDError(f"{what} {'lacks' if missing else 'holds an unknown tensor'} {shown(name, 50)} "
                           f"({len(missing)} missing, {len(unknown)} unknown); {fix}")
        for key in sorted(keys):
            part = f.get_slice(key)
            shape = tuple(part.get_shape())
            if part.get_dtype() not in FLOAT_DTYPES or shape != want[key]:
                raise SSDError(f"{what}: {key} is {part.get_dtype()} {list(shape)}, not a float tensor "
                               f"{list(want[key])}; {fix}")
            out[key] = f.get_tensor(key)
    for i in range(len(params)):
        have = [name for name in ADAM_STATE if f"opt.{i}.{name}" in out]
        if have and len(have) < len(ADAM_STATE):
            raise SSDError(f"{what}: Adam's state of parameter {i} has {', '.join(have)} only, not "
                           f"{', '.join(ADAM_STATE)}; {fix}")
    for key, value in out.items():
        if not bool(torch.isfinite(value).all()) or (key.endswith(("exp_avg_sq", ".step")) and bool((value < 0).any())):
            raise SSDError(f"{what}: {key} holds NaN, infinite or negative values; {fix}")
    return out


def load_state(path: Path, heads: DraftHeads, opt, identity: dict, total: int | None = None) -> int:
    """Restore a saved run into heads and opt; returns its step. A state of another run, or one whose step,
    names, shapes or values do not fit this run, is refused by name before anything is loaded."""
    meta = check_state(path, identity, total)
    tensors = state_tensors(path, heads, opt)
    heads.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("heads.")})
    state = opt.state_dict()
    for key, v in tensors.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            state["state"].setdefault(int(i), {})[name] = v
    opt.load_state_dict(state)
    return meta["step"]
