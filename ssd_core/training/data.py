"""The data side of heads training: self-distilled grids, grids read from files, teacher-forced features.

- grids: the base model samples its own images (batched AR with CFG, on the static KV cache); with per-grid
  seeds each grid is the `ar` decoder's image of its prompt and seed (Gumbel-max keyed by seed and slot);
- grids from files (`--grids`: safetensors `tokens` [N, H, W] and `classes` [N], e.g. the model's tokenised
  training data: `python -m reference_recipe.grids`);
- features: one teacher-forced forward of the frozen model per batch of grids gives the pre-norm last-layer
  features of both CFG streams (`collect_features`); `stale_features` the same with some tokens changed, as
  Hv meets them in ssd.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from ..acceptance import guided_logp
from ..errors import SSDError, shown
from ..model_files import MAX_JSON_BYTES, MAX_JSON_DEPTH, check_path
from ..outputs import check_output, replace_file
from ..sampling import SamplerSettings, _mix, _mix_int, _signed, guide, gumbel_of, log_probs, sample_logits, shr53
from ..session import Layout, stack_prompts

@torch.no_grad()
def generate_grids(model, prompts: list, settings: SamplerSettings, layout: Layout, batch: int = 8,
                   log=print, seeds: list[int] | None = None) -> torch.Tensor:
    """Batched AR sampling with CFG: [N, L] codes per slot (-1 at forced slots). One token per forward reads
    the whole KV cache, so the loop is memory-bound: it runs on the static cache (written in place) unless the
    model already has one: half the time of the dynamic cache on the bundled model, the same grids
    (`python -m tools.grids_bench`; figures in docs/heads-and-acceptance.md).

    seeds (one per grid): grid i is drawn by Gumbel-max keyed by (seeds[i], slot), as the `ar` decoder draws
    it, so it depends on its prompt and seed only (not on the grids batched with it, up to the floating-point
    rounding of a batched forward); without seeds, one generator seeded by settings.seed draws the batch."""
    from .. import static_cache

    before = getattr(model, "static", None)
    if before is None:
        try:
            static_cache.enable(model, "static")
        except SSDError:  # a family whose final norm the static path cannot bypass: the dynamic cache
            pass
    try:
        return _sample_grids(model, prompts, settings, layout, batch, log, seeds)
    finally:
        model.static = before  # the model's own cache mode again (and the sampling caches freed)


def _sample_grids(model, prompts, settings, layout, batch, log, seeds=None) -> torch.Tensor:
    out = []
    gen = torch.Generator().manual_seed(settings.seed)
    t0 = time.time()
    for b in range(0, len(prompts), batch):
        chunk = prompts[b:b + batch]
        k = len(chunk)
        prompt = stack_prompts([model.build_prompt(p, "", settings.guided, layout.grid) for p in chunk])
        session = model.start(prompt)
        logits = model.image_logits(session.last_features)  # [B, V]
        codes = torch.full((k, layout.num_slots), -1, dtype=torch.long)
        keys = None if seeds is None else seed_keys(seeds[b:b + batch])
        for s in range(layout.num_slots):
            forced = int(layout.forced[s])
            if forced >= 0:
                ids = torch.full((k,), forced, dtype=torch.long)
            else:
                streams = logits.view(-1, k, logits.shape[-1])  # [S, k, V]
                codes[:, s] = (sample_logits(streams, settings, gen) if keys is None else
                               seeded_draw(streams, settings, keys, s)).cpu()
                ids = model.code_to_id(codes[:, s].to(model.device)).cpu()
            if s + 1 < layout.num_slots:
                rows = ids.repeat(2) if settings.guided else ids
                logits = model.image_logits(session.forward(rows[:, None]))[:, 0]
        out.append(codes)
        log(f"  generated {min(b + batch, len(prompts))}/{len(prompts)} grids ({time.time() - t0:.0f} s)")
    return torch.cat(out)


def seed_keys(seeds: list[int]) -> torch.Tensor:
    """[k] int64 keys of whole seeds, as sampling.gumbel derives its key from one seed."""
    return torch.tensor([_mix_int(_signed(int(s) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)) for s in seeds],
                        dtype=torch.long)


def gumbel_rows(keys: torch.Tensor, slot: int, vocab: int, device=None) -> torch.Tensor:
    """Gumbel noise [k, V] of slot `slot` for k seeds (keys from seed_keys): row i equals
    sampling.gumbel(seeds[i], tensor([slot]), vocab), computed for the k seeds at once."""
    keys = keys.to(device)
    slot_key = torch.tensor([slot], dtype=torch.long, device=device) * _signed(0xD1B54A32D192ED03)
    base = _mix(keys ^ slot_key)  # [k]
    codes = torch.arange(vocab, dtype=torch.long, device=device)
    return gumbel_of(shr53(_mix(base[:, None] + codes[None, :] * _signed(0x9E3779B97F4A7C15))))


def seeded_draw(streams: torch.Tensor, settings: SamplerSettings, keys: torch.Tensor, slot: int) -> torch.Tensor:
    """One code per grid from raw per-stream logits [S, k, V]: the processed guided distribution's Gumbel-max
    with each grid's noise at `slot` (the `ar` decoder's draw)."""
    logp = log_probs(guide(streams if settings.guided else streams[:1], settings.cfg, settings.min_p), settings)
    if settings.temperature == 0:
        return logp.argmax(-1)
    return (logp.float() + gumbel_rows(keys, slot, logp.shape[-1], logp.device)).argmax(-1)


@torch.no_grad()
def collect_features(model, prompts: list, codes: torch.Tensor, settings: SamplerSettings, layout: Layout,
                     batch: int = 8, dtype: torch.dtype = torch.float32, stop_at: float | None = None,
                     log=None, device="cpu"):
    """Teacher-forced pre-norm features: h [N, S, L+1, d] (S streams; index 0 = prompt end, j+1 = slot j) on
    `device`, sequence ids [N, L]; stop_at (time.time()): only the first grids done by then (N fewer)."""
    feats, ids_all = [], []
    t0 = time.time()
    for b in range(0, len(prompts), batch):
        if stop_at is not None and b and time.time() >= stop_at:  # one batch at least
            break
        if log is not None and b and b % (64 * batch) == 0:
            log(f"  features of {b}/{len(prompts)} grids ({time.time() - t0:.0f} s)")
        chunk, c = prompts[b:b + batch], codes[b:b + batch]
        k = len(chunk)
        prompt = stack_prompts([model.build_prompt(p, "", settings.guided, layout.grid) for p in chunk])
        ids = torch.where(layout.forced[None] >= 0, layout.forced[None].expand_as(c), model.code_to_id(c.clamp(min=0)))
        session = model.start(prompt)
        rows = ids.repeat(2, 1) if settings.guided else ids
        h = session.forward(rows)  # [S*k, L, d], all conditional rows first
        h = torch.cat([session.last_features[:, None], h], dim=1)
        feats.append(h.view(-1, k, *h.shape[1:]).transpose(0, 1).to(device, dtype))  # [k, S, L+1, d]
        ids_all.append(ids)
    return torch.cat(feats), torch.cat(ids_all)


@torch.no_grad()
def stale_features(model, prompts: list, h: torch.Tensor, ids: torch.Tensor, settings: SamplerSettings,
                   layout: Layout, share: float, batch: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features as Hv meets them: a row's features come from the forward before its last verify round, so
    the cells changed in that round (`share` of them) were fed another token. Here each image cell is, with
    probability `share`, fed another sample of the model's processed p (the true token excluded) -> h [N, S,
    L+1, d] of those sequences (to be read with the true tokens' embeddings), changed [N, H*W] bool."""
    gen = torch.Generator().manual_seed(seed)
    H, W = layout.grid
    cells = layout.slot_of_cell.view(H, W).flatten()
    offset = int(model.code_to_id(torch.zeros(1, dtype=torch.long, device=model.device))[0])  # id of code 0
    out, changed = [], []
    for b in range(0, len(prompts), batch):
        hb = h[b:b + batch].to(model.device, model.dtype)
        seq = ids[b:b + batch].clone()  # [k, L] true sequence ids
        codes = seq[:, cells] - offset  # [k, H*W] true image codes
        p = guided_logp(model, hb[:, :, cells], settings).exp().float().cpu()  # [k, H*W, V]: p of each cell
        p.scatter_(-1, codes[..., None], 0.0)  # another token than the true one
        change = (torch.rand(codes.shape, generator=gen) < share) & (p.sum(-1) > 0)
        new = codes.clone()
        new[change] = torch.multinomial(p[change], 1, generator=gen)[:, 0]
        seq[:, cells] = new + offset
        session = model.start(stack_prompts([model.build_prompt(q, "", settings.guided, layout.grid)
                                             for q in prompts[b:b + batch]]))
        f = session.forward((seq.repeat(2, 1) if settings.guided else seq).to(model.device))  # [S*k, L, d]
        f = torch.cat([session.last_features[:, None], f], dim=1)
        out.append(f.view(-1, seq.shape[0], *f.shape[1:]).transpose(0, 1).to(h.device, h.dtype))
        changed.append(change)
    return torch.cat(out), torch.cat(changed)


def check_features_file(path, flag: str = "--features", keys=("h", "ids", "codes")) -> None:
    """A features file to store or reuse: a new .safetensors file in a folder that takes files, or one that
    train-heads wrote (its tensors `keys`). Any other file (grids, heads, a pickle) is refused, never read as
    features nor overwritten."""
    if path is None:
        return
    check_output(path, flag, {".safetensors"})
    path = Path(path)
    if not path.exists():
        return
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:  # the header only, however large the file
            have = sorted(f.keys())
    except Exception as err:
        reason = " ".join(str(err).split())[:80]
        raise SSDError(f"{flag} {path} is not a safetensors file ({reason}): give a new file name (the features are "
                       "stored there) or a features file train-heads wrote") from None
    if not set(keys) <= set(have):
        shown = ", ".join(have[:5]) + (" ..." if len(have) > 5 else "")
        raise SSDError(f"{flag} {path} holds [{shown}], not the features train-heads stores ({', '.join(keys)}): is it a "
                       "grids or heads file? Give a new file name: the features are stored there")


def read_grids(path, model) -> tuple[list, torch.Tensor]:
    """Training grids from safetensors files (comma-separated paths): `tokens` [N, H, W] image codes and
    `classes` [N] -> (prompts, per-slot codes [N, L] with -1 at forced slots). Every file is checked whole
    (codes within the model's image vocabulary, one class per grid, classes of the model) before any is used."""
    from safetensors.torch import load_file

    prompts, out = [], []
    vocab = int(model.image_vocab_size)
    classes_known = len(model.class_names) if getattr(model, "class_names", None) else None
    for one in str(path).split(","):
        try:
            data = load_file(one)
        except Exception as err:
            raise SSDError(f"cannot read training grids from {one} ({err}): give a safetensors file with "
                           "'tokens' [N, H, W] and 'classes' [N]") from None
        if "tokens" not in data or "classes" not in data:
            raise SSDError(f"{one} needs the tensors 'tokens' [N, H, W] and 'classes' [N]; it has {sorted(data)}")
        tokens, classes = data["tokens"], data["classes"]
        for name, t, dims in (("tokens", tokens, 3), ("classes", classes, 1)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise SSDError(f"{one}: '{name}' must hold whole numbers (an integer tensor), it is {t.dtype}; "
                               "write it as int64")
            if t.dim() != dims:
                raise SSDError(f"{one}: '{name}' must be {'[N, H, W]' if dims == 3 else '[N]'}, it has shape "
                               f"{list(t.shape)}")
        if tokens.shape[0] == 0:
            raise SSDError(f"{one} holds no grids (tokens {list(tokens.shape)}): give a file with at least one grid")
        if classes.shape[0] != tokens.shape[0]:
            raise SSDError(f"{one} has {tokens.shape[0]} grids but {classes.shape[0]} classes: 'classes' needs one "
                           "class per grid, in the order of 'tokens'")
        tokens, classes = tokens.long(), classes.long()
        bad = ((tokens < 0) | (tokens >= vocab)).nonzero()
        if len(bad):
            n, y, x = bad[0].tolist()
            raise SSDError(f"{one}: token {int(tokens[n, y, x])} (grid {n}, row {y}, column {x}) is not an image code "
                           f"of this model (0..{vocab - 1}); {len(bad)} such token(s): were the grids made for "
                           "another model?")
        if classes_known is not None:
            wrong = ((classes < 0) | (classes >= classes_known)).nonzero()
            if len(wrong):
                i = int(wrong[0])
                raise SSDError(f"{one}: class {int(classes[i])} (grid {i}) is not a class of this model "
                               f"(0..{classes_known - 1})")
        layout = model.layout(tuple(tokens.shape[1:]))
        if layout.grid != model.default_grid:
            raise SSDError(f"the grids in {one} are {layout.grid[0]}x{layout.grid[1]}; heads train on the model's "
                           f"{model.default_grid[0]}x{model.default_grid[1]} grid")
        codes = torch.full((tokens.shape[0], layout.num_slots), -1, dtype=torch.long)
        codes[:, layout.slot_of_cell] = tokens.flatten(1)
        prompts += [int(c) for c in classes]
        out.append(codes)
    return prompts, torch.cat(out)


def base_quantization(model) -> str:
    """none / 8-bit / 4-bit: how the base model's weights are stored (bitsandbytes through transformers)."""
    inner = getattr(model, "model", None)
    if getattr(inner, "is_loaded_in_4bit", False):
        return "4-bit"
    if getattr(inner, "is_loaded_in_8bit", False):
        return "8-bit"
    q = getattr(getattr(inner, "config", None), "quantization_config", None)
    if q is None:
        return "none"
    get = q.get if isinstance(q, dict) else (lambda k, d=None: getattr(q, k, d))
    return "4-bit" if get("load_in_4bit", False) else "8-bit" if get("load_in_8bit", False) else str(
        get("quant_method", "quantized"))


@torch.no_grad()
def model_identity(model) -> dict:
    """What self-distilled grids and a resumable run are tied to: the family, sizes, grid, dtype, quantization
    and a fingerprint of the weights (the embeddings of the first image codes); `name` (the folder's) is kept
    for the record only."""
    folder = getattr(model, "folder", None)
    name = Path(folder).name if folder else model.family
    if folder and Path(folder).parent.name == "reference":
        name = "reference"
    codes = torch.arange(min(8, int(model.image_vocab_size)), device=model.device)
    emb = model.embed(model.code_to_id(codes)).float().cpu().contiguous()
    return {"family": model.family, "name": name, "hidden_size": int(model.hidden_size),
            "image_vocab_size": int(model.image_vocab_size), "grid": f"{model.default_grid[0]}x{model.default_grid[1]}",
            "dtype": str(model.dtype).replace("torch.", ""), "quantization": base_quantization(model),
            "weights": hashlib.sha256(emb.numpy().tobytes()).hexdigest()[:16]}


IDENTITY_CHECKED = ("family", "hidden_size", "image_vocab_size", "grid", "dtype", "quantization", "weights")


def settings_record(settings: SamplerSettings) -> dict:
    return {"seed": str(settings.seed), "cfg": settings.cfg, "temperature": settings.temperature,
            "top_k": int(settings.top_k), "top_p": settings.top_p, "min_p": settings.min_p}


def differences(stored: dict, now: dict, keys=None) -> list[str]:
    """'key stored -> now' for every key that differs (keys: those compared; default all of both)."""
    keys = keys or sorted(set(stored) | set(now))
    return [f"{k} {stored.get(k)} -> {now.get(k)}" for k in keys if json.dumps(stored.get(k)) != json.dumps(now.get(k))]


def codes_digest(codes: torch.Tensor) -> str:
    return hashlib.sha256(codes.long().contiguous().numpy().tobytes()).hexdigest()[:16]


# ---- the trainer's own files: JSON read with caps, files written whole -----------------------------------------
def _too_deep(value) -> bool:
    """A JSON value nested more than MAX_JSON_DEPTH levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse_json(text: str, what: str, fix: str, limit: int = MAX_JSON_BYTES):
    """The JSON value of `text`, or one SSDError line "`what`: ...; `fix`": longer than `limit` characters,
    not JSON, or nested more than MAX_JSON_DEPTH levels (model_files' caps)."""
    if len(text) > limit:
        raise SSDError(f"{what}: {len(text):,} characters of JSON, more than the {limit:,} it may have; {fix}")
    try:
        value = json.loads(text)
    except RecursionError:
        raise SSDError(f"{what}: nests JSON too deeply to read; {fix}") from None
    except ValueError as err:  # JSONDecodeError, a number of 5,000 digits
        raise SSDError(f"{what}: not JSON ({str(err).split(':')[0][:80]}); {fix}") from None
    if isinstance(value, (dict, list)) and _too_deep(value):
        raise SSDError(f"{what}: nests JSON more than {MAX_JSON_DEPTH} levels deep; {fix}")
    return value


def read_json_file(path, flag: str, fix: str) -> dict:
    """The JSON object of the file `path` (a command-line file such as --bench-json), or one SSDError line
    naming `flag`: a path no file system takes, not a file, over MAX_JSON_BYTES, not UTF-8, not JSON, nested too
    deep, not an object."""
    check_path(path, flag)
    path = Path(path)
    if not path.is_file():
        raise SSDError(f"{flag} {path} is not a file; {fix}")
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise SSDError(f"{flag} {path} is {size:,} bytes, more than the {MAX_JSON_BYTES:,} it may have; {fix}")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise SSDError(f"{flag} {path} cannot be read ({err.strerror or err}); {fix}") from None
    except UnicodeDecodeError as err:
        raise SSDError(f"{flag} {path} is not UTF-8 text (byte {err.start}); {fix}") from None
    value = parse_json(text, f"{flag} {path}", fix)
    if not isinstance(value, dict):
        raise SSDError(f"{flag} {path} holds a JSON {type(value).__name__}, not an object; {fix}")
    return value


def meta_number(meta: dict, key: str, what: str, fix: str) -> int:
    """A whole number >= 0 written as text in a safetensors metadata entry (12 digits at most), or one
    SSDError line naming `what`."""
    text = meta.get(key)
    if not (isinstance(text, str) and 0 < len(text) <= 12 and text.isascii() and text.isdigit()):
        raise SSDError(f"{what}: its {key} is {shown(text)}, not a whole number >= 0; {fix}")
    return int(text)


def json_of_kind(value, kind: type, what: str, fix: str):
    """`value` when it is of the JSON `kind` (dict, str, int: never a bool), else one SSDError line."""
    if isinstance(value, bool) or not isinstance(value, kind):
        names = {dict: "an object", str: "a text", int: "a whole number", list: "a list"}
        raise SSDError(f"{what} is {shown(value)}, not {names.get(kind, kind.__name__)}; {fix}")
    return value


def write_replacing(path, write) -> None:
    """write(temp), synced and renamed over `path` (outputs.replace_file): a file that is there is whole; any
    failure, or Ctrl-C, removes the temp file and leaves `path` as it was; the error goes on to the caller."""
    replace_file(path, write, sync=True)
