"""Defaults that fit the device: ssd-exact's draft rows (0 = auto) and whether its heads pay for themselves,
picked from a short measured calibration.

ssd-exact's image is the same whatever rows and drafter it uses (every token is the model's own Gumbel-max
draw); only its steps and its time change. A step costs one forward of the window plus the policy's eager ops,
and both depend on the device: on a GPU a window of three rows costs about what one token does, on a CPU several
times more, and every op is a launch. So the first ssd-exact generation of a model on a device (per stream count,
grid and compile mode; api.py calls `pick` before the policy is made) times, with the session kind the generation
uses, the forward at one token and at its mean windows at 1..MAX_ROWS rows over a half-made image, a burst of small
ops and a call of the heads' vertical network on a row; the pick is the choice whose expected time

    steps share x (forward of its mean window + its ops a step x an op + its heads' calls a step x a call)

is least, with the ops and heads' calls a step of each choice measured on the bundled model (OPS_PER_STEP,
HEAD_CALLS_PER_STEP) and the steps shares the model's own, as its runs observe them (Calibration.shares; before
any, STEPS_SHARE, the bundled model's, from a first image started at CONSERVATIVE_ROWS and re-picked every row's
worth of cells by its Tuner). The costs are kept in the Calibration passed in (the model's own by default) and in
the JSON file named by SSD_CALIBRATION_FILE, when set, so later generations pay nothing; the measurement takes
0.4-0.5 s on the bundled model on a CPU. Tests force cost tables (`choose`)."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field, replace

import torch

try:
    import fcntl
except ImportError:  # Windows: msvcrt's byte lock instead
    fcntl = None
    import msvcrt

from . import opcount
from .session import Prompt
from . import static_cache

MAX_ROWS = static_cache.WINDOW_ROWS - 1  # the most rows a pick may use: the buckets fit its widest window
# ssd-exact's steps per image cell by (draft rows, heads), and its ops a step outside the forward (opcount),
# bundled model, 24x24, images 0-3 (classes 0-3, seeds 0-3; ops: images 0-1), this version's drafting
# (docs/speed.md, "Defaults that fit the device")
STEPS_SHARE = {(1, True): 0.2565, (2, True): 0.1836, (3, True): 0.1740, (4, True): 0.1684,
               (1, False): 0.2756, (2, False): 0.2023, (3, False): 0.1801, (4, False): 0.1788}
OPS_PER_STEP = {(1, True): 163.0, (2, True): 184.0, (3, True): 187.0, (4, True): 189.0,
                (1, False): 85.0, (2, False): 88.0, (3, False): 89.0, (4, False): 88.0}
MEAN_WINDOW_ROWS = {1: 0.70, 2: 1.52, 3: 2.36, 4: 3.16}  # the mean fed window, in rows (from the kept prefix to
#                                                        the end of the drafted rows: 17.5 / 38 / 59 / 79 slots)
HEAD_CALLS_PER_STEP = {1: 1.6, 2: 2.0, 3: 2.1, 4: 2.1}  # the heads' network calls a step (Hv rows, Hh cells)
HEAD_OPS_PER_CALL = 14  # ops of one call of a head's network (counted in OPS_PER_STEP too)
AR_OPS_PER_STEP = 56.0
CONTEXT_CAP = 1024  # context keys at most (Emu3 at 90x90: half an image would hold ~2 GB more KV on the GPU)
REPEATS = 2  # timed forwards per window (the least counts: a busy machine only ever adds time)
TIE = 0.03  # expected times this close to the least are ties (two timings of the same window differ by ~2%)


@dataclass(frozen=True)
class Costs:
    """Measured on one model and device: forward_s {window slots: seconds} at a half-made image's context, the
    seconds of one small eager op, the row stride the windows were made from, and head_s: the seconds of one call
    of the heads' vertical network on a row (their flops; 0 without heads)."""

    forward_s: dict
    op_s: float
    row_stride: int
    head_s: float = 0.0

    def window(self, rows: int) -> int:
        """ssd-exact's mean fed window at `rows` draft rows (MEAN_WINDOW_ROWS rows of this stride)."""
        return max(1, round(MEAN_WINDOW_ROWS[rows] * self.row_stride))

    def windows(self) -> list[int]:
        """The window lengths a choice needs timed: one token (ar) and the mean window at every row count."""
        return sorted({1} | {self.window(r) for r in range(1, MAX_ROWS + 1)})

    def step_s(self, rows: int, heads: bool) -> float:
        """Expected seconds of one ssd-exact step: the window's forward, the policy's ops, the heads' networks."""
        ops = OPS_PER_STEP[rows, heads]
        if not heads:
            return self.forward_s[self.window(rows)] + ops * self.op_s
        calls = HEAD_CALLS_PER_STEP[rows]
        return self.forward_s[self.window(rows)] + (ops - HEAD_OPS_PER_CALL * calls) * self.op_s + calls * self.head_s

    def ar_step_s(self) -> float:
        return self.forward_s[1] + AR_OPS_PER_STEP * self.op_s


@dataclass(frozen=True)
class Choice:
    """What ssd-exact runs with: draft rows, heads used, and the expected time ratio to ar that made the pick."""

    rows: int
    heads: bool
    speedup: float  # expected ar time / this choice's time
    source: str  # "measured", "cached", "given" (a cost table passed in) or "offload" (not measured)
    tuner: "Tuner | None" = field(default=None, compare=False, repr=False)  # moves the rows as the run goes

    def params(self) -> dict:
        """The trace's and bench's record of the pick."""
        expected = round(self.speedup, 2) if math.isfinite(self.speedup) else None
        return {"draft_rows_picked": self.rows, "heads_used": self.heads, "expected_speedup": expected,
                "calibration": self.source}


def choose(costs: Costs, heads: bool, source: str = "given", shares: dict | None = None, rows: int | None = None,
           use: bool | None = None, fixed_heads: bool = False) -> Choice:
    """The choice of least expected time per image (heads: whether heads are there to use; shares: steps per cell
    of each choice, STEPS_SHARE when None; rows / use: only choices with those rows / that heads flag;
    fixed_heads: heads are used as `heads` says); choices within TIE of it count as ties (closer than the
    measurement can tell), and a tie goes to fewer rows, then to no heads (smaller windows, fewer ops)."""
    shares = STEPS_SHARE if shares is None else shares
    flags = (heads,) if fixed_heads else (False, True) if heads else (False,)
    options = [(r, h) for r in range(1, MAX_ROWS + 1) for h in flags
               if (rows is None or r == rows) and (use is None or h == use)]
    time_of = {o: shares[o] * costs.step_s(*o) for o in options}
    least = min(time_of.values())
    best = min(o for o in options if time_of[o] <= least * (1 + TIE))  # (rows, heads): fewer rows, then no heads
    return Choice(best[0], best[1], costs.ar_step_s() / time_of[best], source)


class Calibration:
    """What ssd-exact's picks have measured, handed to `pick` (api.py gives each model its own: calibration_of):
    costs per key (model, dtype, device, grid, streams, compile mode; also in the JSON file `path`,
    SSD_CALIBRATION_FILE when None), the heads' call time per heads object and shape, and the cells and steps runs
    observed per key and (rows, heads): the model's own acceptance, from which later picks and a running image's
    rows come."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.costs: dict[str, Costs] = {}
        self.head_s: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # heads -> {shape: seconds}
        self.observed: dict[str, dict[tuple[int, bool], list[int]]] = {}  # key -> {(rows, heads): [cells, steps]}
        self.lock = threading.RLock()

    def file(self) -> str | None:
        return self.path if self.path is not None else _path()

    def shares(self, key: str) -> dict[tuple[int, bool], float]:
        """Steps per image cell of every choice for this key: observed where runs made MIN_OBSERVED cells with it,
        else the bundled table's scaled by the observed / table ratio of the nearest observed choice (heads alike
        first): a model whose heads draft worse than the bundled one's gets every share raised, not just one."""
        seen = {o: steps / cells for o, (cells, steps) in self.observed.get(key, {}).items() if cells >= MIN_OBSERVED}
        out = {}
        for o, table in STEPS_SHARE.items():
            near = min(seen, key=lambda n: (n[1] != o[1], abs(n[0] - o[0]), n[0]), default=None)
            out[o] = seen[o] if o in seen else table * (seen[near] / STEPS_SHARE[near] if near is not None else 1.0)
        return out

    def observe(self, key: str, choice: tuple[int, bool], cells: int, steps: int) -> None:
        with self.lock:
            totals = self.observed.setdefault(key, {}).setdefault(choice, [0, 0])
            totals[0] += cells
            totals[1] += steps


_SHARED: dict[str, Calibration] = {}  # model key -> its Calibration, for this process (calibration_of)
_SHARED_LOCK = threading.Lock()


def calibration_of(model) -> Calibration:
    """The model's own Calibration: one per model, dtype, device and compile mode in this process, so a model loaded
    again (ComfyUI reloads it after /free, or after another dtype) keeps its costs and observed acceptance, and
    its picks do not move between loads."""
    found = getattr(model, "calibration", None)
    if not isinstance(found, Calibration):
        if _named(model):
            with _SHARED_LOCK:
                found = _SHARED.setdefault(_model_key(model), Calibration())
        else:  # a model built in memory has no name to know it again by: its own
            found = Calibration()
        model.calibration = found
    return found


MIN_OBSERVED = 16  # image cells a choice must have made before its observed share replaces the table's
CONSERVATIVE_ROWS = 1  # a model's first ssd-exact image starts here (its acceptance unknown: the narrowest window)


@dataclass
class Tuner:
    """ssd-exact's rows while an image runs: each stretch of cells it makes (a row's worth) is recorded as the
    model's own acceptance at those rows, and the rows are picked again from the shares so far (heads stay as
    picked). The image never changes, only how far the window reaches."""

    calibration: Calibration
    key: str
    costs: Costs
    heads: bool
    source: str

    def rows_after(self, rows: int, cells: int, steps: int) -> int:
        """The rows for the next stretch, after `cells` cells made final in `steps` steps at `rows` rows."""
        self.calibration.observe(self.key, (rows, self.heads), cells, steps)
        shares = self.calibration.shares(self.key)
        return choose(self.costs, self.heads, self.source, shares, fixed_heads=True).rows


def pick(model, heads, layout, streams: int, calibration: Calibration, images: int = 1,
         costs: Costs | None = None) -> Choice:
    """ssd-exact's rows and heads for a generation of `streams` stream rows (`images` images) on this model, grid
    and device: from `costs` when given, else the calibration's (measured now, with the session kind and compile
    mode the generation will use, when not known yet). Before any run of the model has been observed the rows
    start at CONSERVATIVE_ROWS; the choice's tuner moves them as the run measures its acceptance."""
    has_heads = heads is not None
    inner = getattr(model, "model", None)  # the transformers module
    if costs is None and isinstance(inner, torch.nn.Module) and static_cache.offloaded(inner):
        # weights move in every forward: its cost is flat in the window, and timing it would take many slow
        # forwards; the widest window with the heads, unmeasured
        return Choice(MAX_ROWS, has_heads, float("nan"), "offload")
    key = _key(model, layout, streams)
    with calibration.lock:
        source = "given" if costs is not None else "cached"
        if costs is None:
            costs = calibration.costs.get(key) or _read_file(calibration.file(), key)
            if costs is None:
                costs = measure(model, layout, streams, images)  # no generation's step: nothing counts it
                _write_file(calibration.file(), key, costs)
                source = "measured"
            calibration.costs[key] = costs
        if has_heads and not costs.head_s:  # the heads' own flops (per heads object and shape: a few ms to time)
            timed = calibration.head_s.setdefault(heads, {})
            shape = (streams, layout.grid[1], str(model.device))
            if shape not in timed:
                timed[shape] = head_seconds(heads, streams, layout.grid[1], model.device)
            costs = replace(costs, head_s=timed[shape])
        shares = calibration.shares(key)
        best = choose(costs, has_heads, source, shares)
        if key not in calibration.observed:  # acceptance unknown: start narrow, the tuner widens from what runs
            best = choose(costs, has_heads, source, shares, rows=CONSERVATIVE_ROWS, use=best.heads)
        return replace(best, tuner=Tuner(calibration, key, costs, best.heads, source))


def _named(model) -> bool:
    return bool(getattr(getattr(getattr(model, "model", None), "config", None), "_name_or_path", ""))


def _model_parts(model) -> tuple[list[str], list[str]]:
    """The model, dtype and device, and the compile mode (empty when off): what a pick's costs depend on besides
    the grid and streams."""
    dev = torch.device(model.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    ident = getattr(getattr(getattr(model, "model", None), "config", None), "_name_or_path", "") or model.family
    mode = static_cache.mode_of(model)  # a compiled step costs another time than an eager one
    return [model.family, ident, str(model.dtype).removeprefix("torch."), name], ([] if mode == "off" else [mode])


def _model_key(model) -> str:
    what, mode = _model_parts(model)
    return "|".join(what + mode)


def _key(model, layout, streams: int) -> str:
    what, mode = _model_parts(model)
    H, W = layout.grid
    return "|".join(what + [f"{H}x{W}", f"{streams} streams"] + mode)


@torch.no_grad()
def measure(model, layout, streams: int, images: int = 1) -> Costs:
    """Time the forward and window logits of one token and of ssd-exact's mean windows at 1..MAX_ROWS rows, each
    over the keys of half the image, REPEATS times (the least counts), and a policy's ops. The session is the kind
    the generation gets (model.start: the static cache, compiled or not, in the shape the generation's prompt class
    gets), made before the generation starts; a compiled one runs every window once first, so that no compile is
    timed. The prompt is a few image-token ids (any family takes them; no tokenizer needed), the run's streams."""
    stride = layout.row_stride
    windows = Costs({}, 0.0, stride).windows()
    half = min(layout.num_slots // 2, CONTEXT_CAP)
    ids = model.code_to_id(torch.zeros(layout.num_slots + max(windows), dtype=torch.long, device=model.device))
    op_s = _op_seconds(model.device, stride, model.image_vocab_size)
    prompt = Prompt(ids[:4].cpu().expand(streams, 4).clone(), torch.ones(streams, 4, dtype=torch.bool))
    static = getattr(model, "static", None)
    warm_up = 1 if static_cache.mode_of(model) == "compiled" else 0
    best = {}
    with static.lock if static is not None else contextlib.nullcontext():  # the static cache: one user at a time
        session = model.start(prompt, images)
        for lo in range(0, half, stride):  # the context: half an image's keys, a row a forward (windows a step feeds)
            session.forward(ids[lo:min(lo + stride, half)])
        for i in range(warm_up + REPEATS):
            for w in windows:
                start = time.perf_counter()
                feats = session.forward(ids[half:half + w])
                model.image_logits(feats).sum().item()  # the window's logits, as a step makes them; a host read waits
                if i >= warm_up:
                    best[w] = min(best.get(w, float("inf")), time.perf_counter() - start)
                session.crop(half)
    best[1] = min(best.values())  # a wider window reads the same weights: one token slower than it is noise
    return Costs(best, op_s, stride)


@torch.no_grad()
def head_seconds(heads, streams: int, width: int, device) -> float:
    """Seconds of one call of the heads' vertical network on a row ([streams, width] cells), the least of 3 after
    one to warm up: what the heads' flops add to a step besides their ops."""
    from .heads import VERTICAL_INPUTS

    param = next(heads.vertical.parameters())
    x = torch.randn(streams, width, heads.hidden, device=param.device, dtype=param.dtype)
    inputs = [x] * VERTICAL_INPUTS[heads.vertical_left]
    best = float("inf")
    for i in range(4):
        start = time.perf_counter()
        heads.vertical.forward(*inputs).sum().item()  # a call outside Run.call_heads: no head call counted
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def _op_seconds(device, n: int, V: int, rounds: int = 20) -> float:
    """Seconds of one of a policy's eager ops on the device, Python around it included: the sampler's own
    functions (guidance, min-p, top-k, log-softmax, a Gumbel pick, an acceptance test) on [n, V] logits, timed
    `rounds` times (the least of 3 bursts) and divided by the ops they dispatch (counted once, opcount)."""
    from .sampling import SamplerSettings, guide, gumbel_argmax, log_probs, rejected

    settings = SamplerSettings(cfg=4.0, top_k=min(40, V), min_p=0.01)
    logits = torch.randn(2, n, V, device=device)
    noise, u = torch.rand(n, V, device=device), torch.rand(n, device=device)
    codes = torch.zeros(n, dtype=torch.long, device=device)

    def burst():
        logp = log_probs(guide(logits, settings.cfg, settings.min_p), settings, check=False)
        p = logp.exp()
        return rejected(u, p, p, gumbel_argmax(logp, noise) + codes)

    counter = opcount.OpCounter()
    with counter:
        burst()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            out = burst()
        out.sum().item()
        best = min(best, time.perf_counter() - start)
    return best / (rounds * max(counter.total, 1))


def _path() -> str | None:
    return os.environ.get("SSD_CALIBRATION_FILE") or None


MAX_FILE_BYTES = 1 << 20  # a calibration file holds a few hundred bytes an entry; a larger one is not ours
_log = logging.getLogger("ssd_core.calibrate")
PLAUSIBLE_FLOOR = 0.5  # a window's forward at least half of one token's (a timing differs ~2% from the next)
MAX_FORWARD_S = 3600.0  # an hour a forward: anything slower is not a measurement


_NO_FOLLOW_NOR_WAIT = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _lock_exclusive(f) -> None:
    """Wait for the inter-process lock on the open lock file `f` (released when it is closed)."""
    if fcntl is not None:
        fcntl.flock(f, fcntl.LOCK_EX)
    else:
        msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)


def _regular_fd(path: str, flags: int) -> int | None:
    """An fd of `path` only when it is a regular file reached without following a symlink (never a device, a FIFO,
    a directory or a link, which a cache must neither read nor replace); None when absent; otherwise one log line."""
    try:
        fd = os.open(path, flags | _NO_FOLLOW_NOR_WAIT, 0o644)
    except FileNotFoundError:
        return None
    except OSError as e:
        _log.warning("SSD_CALIBRATION_FILE %s is not a regular file we may use (%s): calibrating without it", path, e)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        _log.warning("SSD_CALIBRATION_FILE %s is not a regular file: calibrating without it", path)
        return None
    return fd


def _load(path: str) -> dict:
    """The file's entries ({} when absent, too large, damaged or not a regular file)."""
    fd = _regular_fd(path, os.O_RDONLY)
    if fd is None:
        return {}
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        _log.warning("SSD_CALIBRATION_FILE %s is over %d bytes: ignored", path, MAX_FILE_BYTES)
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # damaged or absurdly nested: measured again
        return {}
    return data if isinstance(data, dict) else {}


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _costs_of(entry) -> Costs | None:
    """An entry as Costs, when every value is in range (finite positive seconds, a stride 1-4096, this version's
    windows); anything else is measured again."""
    if not isinstance(entry, dict) or not isinstance(entry.get("forward_s"), dict):
        return None
    forward, op_s, stride = entry["forward_s"], entry.get("op_s"), entry.get("row_stride")
    if not (_finite_positive(op_s) and isinstance(stride, int) and not isinstance(stride, bool)
            and 1 <= stride <= 4096 and len(forward) <= 64):
        return None
    if not all(isinstance(w, str) and w.isascii() and w.isdigit() and len(w) <= 6 and _finite_positive(s)
               for w, s in forward.items()):
        return None
    costs = Costs({int(w): float(s) for w, s in forward.items()}, float(op_s), stride)  # head_s: timed, not kept
    if not set(costs.windows()) <= set(costs.forward_s):  # another version's windows
        return None
    one = costs.forward_s[1]  # a wider window reads the same weights: never far cheaper than one token
    return costs if all(one * PLAUSIBLE_FLOOR <= s <= MAX_FORWARD_S for s in costs.forward_s.values()) else None


def _read_file(path: str | None, key: str) -> Costs | None:
    return _costs_of(_load(path).get(key)) if path else None


def _write_file(path: str | None, key: str, costs: Costs) -> None:
    """Merge one entry into the file under an inter-process lock, via a unique temp file renamed over it."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            return  # never replaced; the read before this measurement already logged why
        lock_fd = _regular_fd(path + ".lock", os.O_RDWR | os.O_CREAT)
        if lock_fd is None:
            return
        with os.fdopen(lock_fd, "r+b") as lock:
            _lock_exclusive(lock)
            data = {k: v for k, v in _load(path).items() if _costs_of(v) is not None}  # the others' entries kept
            data[key] = {k: v for k, v in asdict(costs).items() if k != "head_s"}
            fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)  # O_EXCL
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
    except (OSError, ValueError) as e:  # an unwritable cache is only a cache
        _log.warning("SSD_CALIBRATION_FILE %s not written (%s)", path, e)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
