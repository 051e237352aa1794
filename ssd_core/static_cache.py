"""A static KV cache and a compiled verify forward (the GPU path; also runs eagerly on the CPU).

The cache is preallocated once per (streams, capacity) and reused by every generation of the model: keys of
[prompt ; slots] sit at fixed positions, "crop" only moves the valid length, and the mask hides every key
past it. A window of n slots is padded to the next bucket (BUCKETS), so a compiled forward sees a handful
of shapes and, on a GPU, replays one CUDA graph per bucket (torch.compile mode "reduce-overhead"). Padded
queries read and write only keys past the valid length, which the next step overwrites.

Turned on per model: `enable(model, mode)` (load_model's `compile`, the CLI's `--compile`, the loader node). transformers 5 moves the
write position with the cache's own length counter; 4.57 takes `cache_position`: both are handled here.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import threading
from dataclasses import dataclass, field

import torch

from .errors import SSDError
from .observer import Observers, ambient
from .sampling import all_rows_finite, processed
from .session import KVSession, Prompt, additive_mask, cache_kwarg, layer_tensors

BUCKETS = (1, 8, 16, 32, 64, 128)  # fixed padded window lengths (tests, bench_gpu's curve); models use buckets_for
WINDOW_ROWS = 5  # the widest window the buckets fit: ssd-exact's most drafted rows at its default (calibrate.MAX_ROWS,
#                 4) plus the final-but-uncached slots of the row before


def buckets_for(row_stride: int, rows: int = WINDOW_ROWS) -> tuple[int, ...]:
    """Padded window lengths for a layout's row stride (one compiled graph each): 1 (ar), 8, then steps of
    half a row (rounded up to 8) until `rows` rows and 8 slots more fit, so that every family's largest
    window at the decoders' defaults is compiled (Emu3's rows are 91 slots, Lumina-mGPT's 49, the bundled
    model's 25) and a window pads by at most half a row."""
    quantum = -(-max(row_stride, 1) // 16) * 8  # half a row, rounded up to 8
    largest = rows * row_stride + 8
    return (1, 8) + tuple(range(quantum if quantum > 8 else 16, largest + quantum, quantum))


POOL_ENTRIES = 2  # static caches a model keeps (one per streams x capacity); the least recently used is freed
# a cache's shape comes from a few classes, so that a session compiles a bounded set of graphs whatever its prompts
# and batches: prompt lengths round up to PROMPT_CLASSES (then to multiples of the last), compiled streams to a power
# of two (a batch of 3 guided images, 6 streams, runs on 8 rows: the spare rows copy row 0, where no image reads)
PROMPT_CLASSES = (256, 1024, 4096)
MAX_SHAPES = 6  # (streams, capacity) shapes compiled per model; a shape past them runs the static cache eagerly
MODES = ("off", "static", "compiled")  # the loaders' option: DynamicCache / static cache eager / compiled


@dataclass
class StaticOptions:
    """What `enable` stores on a model: whether steps are compiled, and the reused caches and step functions."""

    compiled: bool
    slots: int  # the most slots a layout of the model has (the cache's capacity beyond the prompt)
    buckets: tuple[int, ...] = BUCKETS
    backend: str = "inductor"  # torch.compile backend ("eager": graph capture only, for quick checks)
    pool: dict = field(default_factory=dict)  # (streams, capacity) -> (StaticCache, layers, eager step, compiled step)
    shapes: set = field(default_factory=set)  # the (streams, capacity) shapes compiled so far (MAX_SHAPES at most)
    samplers: dict = field(default_factory=dict)  # sampler values -> the compiled guided sampling (sampler_graph)
    regions: dict = field(default_factory=dict)  # function -> its compiled graph's launcher (region): per-step work
    lock: threading.RLock = field(default_factory=threading.RLock)  # one generation at a time uses the pool


def parse_mode(mode: str | bool | None) -> str:
    """'off' / 'static' / 'compiled'; a bool or None: True = 'compiled', False / None = 'off'."""
    if mode is None or isinstance(mode, bool):
        return "compiled" if mode else "off"
    if mode not in MODES:
        raise SSDError(f"compile mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


def enable(model, mode: str | bool = "static", buckets: tuple[int, ...] | None = None, backend: str = "inductor"):
    """Make `model.start` hand out static-cache sessions: mode 'static' (eager), 'compiled', 'off' (or a bool:
    True = compiled); buckets None: from the widest layout's row stride (buckets_for). Returns the model."""
    mode = parse_mode(mode)
    if mode == "off":
        model.static = None
        return model
    reason = unsupported_compile(model.model) if mode == "compiled" else None
    if reason is not None:  # torch.compile would break its graph at every quantized / offloaded module
        logging.getLogger(__name__).warning("compile 'compiled' is not used for this %s model: %s; it runs with "
                                            "the static cache uncompiled (compile 'static')", model.family, reason)
        mode = "static"
    features_backbone(model)  # refuses a family whose final norm it cannot bypass, before any generation
    layouts = [model.layout(g) for g in model.grid_options()]
    slots = max(layout.num_slots for layout in layouts)
    if buckets is None:
        buckets = buckets_for(max(layout.row_stride for layout in layouts))
    model.static = StaticOptions(mode == "compiled", slots, tuple(sorted(set(buckets))), backend)
    if model.static.compiled:
        _raise_compile_limits(2 * len(model.static.buckets) * MAX_SHAPES)  # x2: a window mask shared or per row
    return model


_graphs_budgeted = 0  # compiled graphs the enabled models may make in this process (2 x buckets x MAX_SHAPES each)


def _raise_compile_limits(graphs: int) -> None:
    """Every model's step is one code object to dynamo, so its recompile limit (per code object) must hold all the
    graphs of every compiled model: past it, dynamo would run the step eagerly, silently."""
    global _graphs_budgeted
    _graphs_budgeted += graphs
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, _graphs_budgeted)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 2 * _graphs_budgeted)


def unsupported_compile(module: torch.nn.Module) -> str | None:
    """Why torch.compile of the verify forward would fall apart on this transformers model (None: it would not).

    bitsandbytes' layers and accelerate's offload hooks (weights loaded in each module's pre-forward, a
    compiler-disabled function) break the graph at every such module: issue 30 counts 57 graph breaks a forward
    with 8-bit and 96 with offload (10 on a 2-layer tiny model with one layer and the head offloaded)."""
    quantizer = getattr(module, "hf_quantizer", None)
    if getattr(module, "is_loaded_in_8bit", False) or getattr(module, "is_loaded_in_4bit", False) or \
            getattr(module, "is_quantized", False) or quantizer is not None:
        method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
        return f"it is quantized ({getattr(method, 'value', method) or 'bitsandbytes'})"
    return offloaded(module)


def offloaded(module: torch.nn.Module) -> str | None:
    """Where accelerate offloads part of this transformers model (None: nowhere): its weights move in every
    forward, behind compiler-disabled hooks."""
    places = {str(v) for v in (getattr(module, "hf_device_map", None) or {}).values()}
    hooked = any(getattr(getattr(m, "_hf_hook", None), "offload", False) or
                 any(getattr(h, "offload", False) for h in getattr(getattr(m, "_hf_hook", None), "hooks", ()))
                 for m in module.modules())
    if hooked or "disk" in places or ("cpu" in places and len(places) > 1):
        where = " and ".join(p for p in ("cpu", "disk") if p in places) or "cpu"
        return f"accelerate offloads part of it to the {where} (offload auto / a device_map)"
    return None


def prompt_class(prompt_len: int) -> int:
    """The prompt length a cache is sized for: the first of PROMPT_CLASSES that holds it (then multiples of the last)."""
    fits = next((c for c in PROMPT_CLASSES if c >= prompt_len), None)
    return fits if fits is not None else -(-prompt_len // PROMPT_CLASSES[-1]) * PROMPT_CLASSES[-1]


def stream_rows(opts: StaticOptions, streams: int) -> int:
    """The cache's rows for `streams` streams: a power of two when compiled (a graph per class, not per batch size)."""
    return 1 << (streams - 1).bit_length() if opts.compiled else streams


def capacity(opts: StaticOptions, prompt_len: int, images: int = 1) -> int:
    """Positions of the static cache a prompt of prompt_len tokens gets: its prompt class, the model's most slots
    (twice for a batch of images: a feed is written after the most any row holds, then moved into place) and the
    widest bucket, rounded up to 64. Every prompt of a class shares one cache shape (and its compiled graphs)."""
    need = prompt_class(prompt_len) + opts.slots * (1 if images == 1 else 2) + max(opts.buckets)
    return -(-need // 64) * 64


def cache_bytes(model, streams: int = 2, prompt_len: int = 256) -> int:
    """Bytes of one static cache of the model (0 with the static cache off): keys and values of every layer for
    `streams` rows (2: a guided image) of its capacity (Emu3 at 90x90 in bf16: about 2.3 GB)."""
    opts = getattr(model, "static", None)
    if opts is None:
        return 0
    layers, kv_heads, head_dim = _kv_shape(model)
    positions = capacity(opts, prompt_len)
    return layers * 2 * streams * kv_heads * positions * head_dim * model.dtype.itemsize


def _kv_shape(model) -> tuple[int, int, int]:
    """(layers, key-value heads, head dim) of the model's text stack: what one position of its KV cache holds."""
    cfg = model.backbone().config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = getattr(cfg, "num_attention_heads", 1)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return cfg.num_hidden_layers, kv_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def pool_bytes(model) -> int:
    """Bytes the model's static caches hold now."""
    opts = getattr(model, "static", None)
    if opts is None:
        return 0
    return sum(t.numel() * t.element_size() for cache, *_ in opts.pool.values()
               for k, v in layer_tensors(cache) for t in (k, v))


def release(model) -> None:
    """Free the model's static caches (ComfyUI unloading the model); the next generation allocates anew."""
    opts = getattr(model, "static", None)
    if opts is not None:
        with opts.lock:
            opts.pool.clear()


def mode_of(model) -> str:
    opts = getattr(model, "static", None)
    return "off" if opts is None else ("compiled" if opts.compiled else "static")


def bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding n slots (None: longer than every bucket, run eagerly at its own length)."""
    return next((b for b in buckets if b >= n), None)


def features_backbone(model) -> torch.nn.Module:
    """The backbone with its final norm replaced by Identity (shared weights): its output is the pre-norm
    features, with no hook (hooks and compiled graphs do not mix)."""
    backbone, norm = model.backbone(), model.final_norm()
    name = next((n for n, m in backbone.named_children() if m is norm), None)
    if name is None:
        raise SSDError(f"{model.family} model: its final norm is not a direct child of its backbone, so the static "
                       "cache cannot read the pre-norm features; load it with compile 'off'")
    twin = copy.copy(backbone)
    twin._modules = dict(backbone._modules)
    twin._modules[name] = torch.nn.Identity()
    return twin


def _new_cache(model, capacity: int, rows: int | None = None):
    """transformers' StaticCache; rows given: made now on the model's device with that many rows (a compiled cache,
    whose first prefill may have fewer streams), else each layer's at its first write (its streams, its device)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.backbone().config, max_cache_len=capacity)  # same call in 4.57 and 5.x
    if rows is None:
        return cache
    _, kv_heads, head_dim = _kv_shape(model)
    cache.early_initialization(rows, kv_heads, head_dim, model.dtype, model.device)
    return cache


def _layers_function(model, cache):
    """(embeds [B, n, d], mask [B, 1, n, C], positions [B, n], cache positions [n]) -> pre-norm features: the
    model's layers writing the cache (the prefill's forward; the step's inside its graph). Run eagerly: inside the
    observers' graph span (opcount counts none of the layers' ops; compiled, the whole step is one launch)."""
    twin = features_backbone(model)
    kw = cache_kwarg(model.backbone())
    takes_position = "cache_position" in inspect.signature(model.backbone().forward).parameters

    def layers(embeds, mask, positions, cache_positions):
        for counter in _length_counters(cache):  # transformers 5's write positions, set inside the graph
            counter.copy_(cache_positions[0])
        extra = {"cache_position": cache_positions} if takes_position else {}
        with contextlib.nullcontext() if torch.compiler.is_compiling() else Observers(ambient()).graph(False):
            out = twin(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{kw: cache}, **extra)
        return out.last_hidden_state

    return layers


def _with_spare(t: torch.Tensor, spare: int) -> torch.Tensor:
    """t [B, ...] with `spare` more rows, copies of row 0 (a compiled step's rows of images that left)."""
    return torch.cat([t, t[:1].expand(spare, *t.shape[1:])]) if spare else t


def _step_function(model, cache, backend: str | None):
    """The verify step, the forward's preparation inside it: (ids [B, w], window [1 or B, w, w] bool: which fed
    token sees which, steps [1 or B, w]: the fed tokens' positions from the held count, held [B]: each row's held
    slots, prompt keys [B, C] bool: real prompt tokens, first: 0-d, the prompt's length (the first slot column),
    real_len [B]) -> (pre-norm features [B, w, d], float32 image logits [B, w, V]). The window starts at column
    first + held.max() (the cache's slot columns: the most any row holds); every number is a tensor, so one graph
    per (B, w) serves every step, prompt and position."""
    layers = _layers_function(model, cache)
    with torch.no_grad():  # what the head makes once (a family's image rows, base.rows_logits) is made now, not traced
        model.image_logits(torch.zeros(1, model.hidden_size, dtype=model.dtype, device=model.device))

    def step(ids, window, steps, held, prompt_keys, first, real_len):
        width, columns = ids.shape[1], prompt_keys.shape[1]
        start = first + held.max()  # the window's first column
        keys = torch.arange(columns, device=ids.device)
        offset = keys - start  # [C] a key's index in the window
        in_window = window[:, :, offset.clamp(0, width - 1)] & ((offset >= 0) & (offset < width))  # [1 or B, w, C]
        held_keys = (keys >= first) & (keys < start) & (keys - first < held[:, None])  # [B, C] each row's held slots
        allowed = prompt_keys[:, None, :] | in_window | held_keys[:, None, :]  # [B, w, C]
        mask = additive_mask(allowed, model.dtype)
        positions = real_len[:, None] + held[:, None] + steps
        feats = layers(model.embed(ids), mask, positions, start + torch.arange(width, device=ids.device))
        return feats, model.image_logits(feats)

    if backend is None:
        return step
    # every (streams, capacity) x bucket x (window mask and positions shared by the streams or not) is one more
    # compiled entry of this one function (_raise_compile_limits)
    cudagraphs = model.device.type == "cuda" and backend == "inductor"
    return torch.compile(step, backend=backend, mode="reduce-overhead" if cudagraphs else None, dynamic=False)


def sampler_graph(model, settings, features: bool = False):
    """With compile 'compiled': the sampler's processing of raw logits [B, n, V] as one compiled graph -> (guided
    logits [n, V], 0-d bool: every row finite, processed log p [n, V]): guidance, min-p, temperature, top-k / top-p and
    log-softmax, ~17 eager ops a call otherwise; features: of pre-norm features [B, n, d] (the heads' drafts), the
    model's image logits first. One per set of sampler values (they are constants of the graph; n is dynamic); None
    when the model's steps are not compiled (the eager functions run)."""
    opts = getattr(model, "static", None)
    if opts is None or not opts.compiled:
        return None
    key = (settings.cfg, settings.min_p, settings.temperature, settings.top_k, settings.top_p, features)
    if key not in opts.samplers:
        if len(opts.samplers) >= 2 * MAX_SHAPES:  # a session sweeping sampler values keeps the newest 12 functions;
            # past dynamo's recompile limit for their one code object the sampling runs eagerly (the same functions)
            opts.samplers.pop(next(iter(opts.samplers)))

        def process(x, s=settings, m=model if features else None):
            guided, logp = processed(x if m is None else m.image_logits(x), s)
            return guided, all_rows_finite(guided), logp

        opts.samplers[key] = torch.compile(process, backend=opts.backend, dynamic=True)
    return opts.samplers[key]


REGIONS: set = set()  # every function some model compiled as a region in this process (its graphs: tests count them)


def compiles_regions(model) -> bool:
    """Whether region() compiles for this model (compile 'compiled')."""
    opts = getattr(model, "static", None)
    return opts is not None and opts.compiled


def region(model, fn):
    """With compile 'compiled': `fn` (a module-level function of tensors, modules and settings) as one compiled graph,
    shapes dynamic, each call one launch of opcount's compiled view: a policy's per-step work (the heads' networks,
    the drafts' logits, the near-tie record, the token writes), dozens of eager ops a call otherwise. Else `fn`."""
    if not compiles_regions(model):
        return fn
    opts = model.static
    launch = opts.regions.get(fn)
    if launch is None:  # made once per model and function, not per call
        graph = torch.compile(fn, backend=opts.backend, dynamic=True)

        def launch(*args):
            with Observers(ambient()).graph(True):
                return graph(*args)
        opts.regions[fn] = launch
        REGIONS.add(fn)
    return launch


def _may_compile(opts: StaticOptions, key: tuple[int, int]) -> bool:
    """Whether this cache shape gets compiled steps: the model's first MAX_SHAPES shapes do (those a session meets
    again replay their graphs); a shape past them runs eagerly, with one warning, instead of compiling anew."""
    if not opts.compiled:
        return False
    if key in opts.shapes or len(opts.shapes) < MAX_SHAPES:
        opts.shapes.add(key)
        return True
    logging.getLogger(__name__).warning(
        "this model already compiled its steps for %d cache shapes (%s streams x positions); %d streams x %d positions "
        "runs uncompiled: reload the model to compile for new shapes", MAX_SHAPES,
        ", ".join(f"{r}x{c}" for r, c in sorted(opts.shapes)), *key)
    return False


def _length_counters(cache) -> list[torch.Tensor]:
    """The layers' write positions that are tensors (transformers 5's StaticCache; 4.57 takes cache_position): the
    step sets them from its cache positions, inside the compiled graph (one op a layer outside it otherwise, 30 on a
    7B model). Read at every call: a layer's first write replaces its counter (moved to the cache's device)."""
    return [layer.cumulative_length for layer in getattr(cache, "layers", [])
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]


def _set_length(cache, length: int) -> None:
    """Put the write position of every layer whose counter is no tensor at `length` (the step sets the tensors)."""
    for layer in getattr(cache, "layers", []):
        counter = getattr(layer, "cumulative_length", None)
        if counter is not None and not isinstance(counter, torch.Tensor):
            layer.cumulative_length = length


class StaticSession(KVSession):
    """The session (session.KVSession) over a preallocated static cache, a pool entry of the model that its
    generations reuse: masks over the whole capacity, windows padded to buckets, crop only moves valid lengths.

    images > 1 (a batch): rows hold different numbers of slots and a feed is written after the most any row
    holds before it moves into place, so the capacity is two layouts' slots instead of one. Finished images
    leave (select): the live rows move to the front of the cache's rows and the eager steps run on them alone
    (views of them); a compiled step keeps the batch it was compiled for, its spare rows a copy of row 0
    written where no image reads (a smaller batch would compile every bucket again, mid-generation)."""

    def __init__(self, model, prompt: Prompt, opts: StaticOptions, images: int = 1):
        self.opts = opts
        self.rows = stream_rows(opts, prompt.ids.shape[0])  # the cache's rows (batch: the streams still live)
        self.capacity = capacity(opts, prompt.ids.shape[1], images)
        key = (self.rows, self.capacity)
        if key in opts.pool:
            opts.pool[key] = opts.pool.pop(key)  # the most recently used last
        else:
            while len(opts.pool) >= POOL_ENTRIES:  # free the least recently used cache (and its compiled step)
                opts.pool.pop(next(iter(opts.pool)))
            cache = _new_cache(model, self.capacity, self.rows if opts.compiled else None)
            opts.pool[key] = (cache, _layers_function(model, cache), _step_function(model, cache, None),
                              _step_function(model, cache, opts.backend) if _may_compile(opts, key) else None)
        self.cache, self._layers_eager, self._eager, self._compiled = opts.pool[key]
        self._constants = None  # (prompt_mask, the step's prompt inputs for the cache's rows): made again when rows leave
        self._windows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # width -> (causal [1, w, w], eye [w, w])
        super().__init__(model, prompt)

    def _prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        dev = self.m.device
        keys = torch.arange(self.capacity, device=dev)
        causal = keys[None, :] <= torch.arange(self.prompt_len, device=dev)[:, None]  # [P, C]
        allowed = causal[None] & torch.nn.functional.pad(self.prompt_mask, (0, self.capacity - self.prompt_len))[:, None]
        mask = additive_mask(allowed, self.m.dtype)
        _set_length(self.cache, 0)
        with torch.no_grad(), _live_rows(self.cache, self.batch):
            return self._layers_eager(self.m.embed(ids), mask, pos, self.ramp(self.prompt_len))

    def _feed(self, ids: torch.Tensor, visible: torch.Tensor | None, held: torch.Tensor,
              positions: torch.Tensor | None, logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        n = ids.shape[1]
        size = bucket(n, self.opts.buckets) if self._compiled is not None else None
        width = size or n
        if width > 1:  # padded queries repeat the last id; their keys land past the valid length (one layout of
            # ids in every step of a width: the graph's inputs keep their strides)
            ids = torch.cat([ids, ids[:, -1:].expand(self.batch, width - n)], dim=1)
        start = self.prompt_len + self.cached
        if start + width > self.capacity:
            raise SSDError(f"static cache of {self.capacity} positions is too small for {start + width}; "
                           "load the model with compile 'off'")
        _set_length(self.cache, start)
        feats, raw = self._step(ids, self._window(width, visible), self._offsets(width, positions), held,
                                compiled=size is not None)
        return feats[:, :n], raw[:, :n]

    def _step(self, ids, window, steps, held, compiled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One verify step (_step_function) of ids [B, w] -> (features [B, w, d], logits [B, w, V]) of the live rows."""
        prompt_keys, first, real_len = self._prompt_inputs()
        with torch.no_grad():
            if compiled:
                if self.m.device.type == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()
                spare = self.rows - self.batch  # rows of images that left: row 0 again keeps the compiled shape
                ids, held = _with_spare(ids, spare), _with_spare(held, spare)
                window, steps = (t if t.shape[0] == 1 else _with_spare(t, spare) for t in (window, steps))
                with Observers(ambient()).graph(True):  # one graph launch (opcount's compiled view)
                    feats, raw = self._compiled(ids, window, steps, held, prompt_keys, first, real_len)
                return feats[:self.batch].clone(), raw[:self.batch].clone()
            B = self.batch
            with _live_rows(self.cache, B):
                return self._eager(ids, window, steps, held, prompt_keys[:B], first, real_len[:B])

    def _prompt_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's inputs that only change with the batch's rows: real prompt keys [R, C] bool, the prompt's
        length (0-d), each row's real prompt tokens [R], for the cache's R rows (spare rows copy row 0)."""
        if self._constants is None or self._constants[0] is not self.prompt_mask:
            spare = self.rows - self.batch
            keys = torch.nn.functional.pad(self.prompt_mask, (0, self.capacity - self.prompt_len))
            first = torch.full((), self.prompt_len, dtype=torch.long, device=self.m.device)
            self._constants = (self.prompt_mask, (_with_spare(keys, spare), first, _with_spare(self.real_len, spare)))
        return self._constants[1]

    def _window(self, width: int, visible: torch.Tensor | None) -> torch.Tensor:
        """[1 or B, width, width] bool: which fed token sees which; causal, and `visible`: ([n] or [B, n]) the window
        slots the others may attend to (each slot sees itself), or [1 or B, n, n] the fed tokens' whole window mask
        (KVSession.forward); padding stays causal."""
        if width not in self._windows:
            causal = torch.ones(width, width, dtype=torch.bool, device=self.m.device).tril()[None]
            self._windows[width] = (causal, torch.eye(width, dtype=torch.bool, device=self.m.device))
        causal, eye = self._windows[width]
        if visible is None:
            return causal
        visible = visible.to(self.m.device)
        n = visible.shape[-1]
        if visible.dim() == 3:
            given = causal.expand(visible.shape[0], -1, -1).clone()
            given[:, :n, :n] = visible
            return given
        shown = torch.nn.functional.pad(visible.view(-1, n), (0, width - n), value=True)  # [1 or B, w]
        return causal & (shown[:, None, :] | eye)

    def _offsets(self, width: int, positions: torch.Tensor | None) -> torch.Tensor:
        """[1 or B, width]: each fed token's position from its row's held count: `positions` ([n] or [B, n]), the
        padding's (and all, without them) slot order."""
        steps = self.ramp(width)[None]
        if positions is None:
            return steps
        positions = positions.to(self.m.device).view(-1, positions.shape[-1])
        return torch.cat([positions, steps[:, positions.shape[1]:].expand(positions.shape[0], -1)], dim=1)

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:self.batch], v[:self.batch]) for k, v in layer_tensors(self.cache)]

    def _drop(self, columns: int) -> None:
        pass  # the mask hides every key past the valid length; the next feed overwrites them

    def _keep_rows(self, rows: torch.Tensor) -> None:
        """The kept rows' keys move to the cache's first rows (in place: the compiled step's tensors stay)."""
        n = self.prompt_len + max(self.held_host)
        for k, v in layer_tensors(self.cache):
            k[:self.batch, :, :n] = k[rows, :, :n]
            v[:self.batch, :, :n] = v[rows, :, :n]


@contextlib.contextmanager
def _live_rows(cache, rows: int):
    """Inside the block every layer of the cache shows only its first `rows` rows (views of them): an eager
    forward of a batch that finished images left. Outside, the whole tensors (the pool's, the compiled step's)."""
    swapped = [(layer, layer.keys, layer.values) for layer in getattr(cache, "layers", [])
               if getattr(layer, "keys", None) is not None and layer.keys.shape[0] > rows]
    for layer, keys, values in swapped:
        layer.keys, layer.values = keys[:rows], values[:rows]
    try:
        yield
    finally:
        for layer, keys, values in swapped:
            layer.keys, layer.values = keys, values
