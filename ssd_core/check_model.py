"""`python -m ssd_core check-model FOLDER`: what a model folder is, holds and lacks, before a 14 GB load.

It reads only JSON files and safetensors headers (the 8-byte header length and the JSON header after it, never
tensor data) and builds the config's model on the meta device (nothing allocated): a folder of a 7B model is
checked in about a second. Findings, each one line with its fix: the family; the weight shards the index names
and which are missing; the tensors of the files against the state_dict of the config's model (missing,
unexpected, of another shape; a config.json that declares fewer layers than the weights is refused, not run
truncated); the tokenizer; the family's extra files (Lumina's vqgan.safetensors, Lumina-mGPT 2.0's
movqgan.safetensors, Emu3.5's ibq.safetensors, a llama-grid's ssd_model.json and VQ decoder); generation_config.json where the family reads one; and the memory of the weights in bf16 / fp16 /
fp32 / 8-bit / 4-bit beside this machine's free RAM (and each CUDA GPU's free memory). check_report.py puts the
report on one screen.

    report = check_folder(folder); print(check_report.format_report(report)); report.loadable
"""
from __future__ import annotations

import json
import os
import re
import struct
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import model_files
from .errors import SSDError, a_or_an, reason, shown
from .memory import free_memory, weights_bytes

LEVELS = ("ok", "missing", "error")
BUILT_IN = ("llama-grid", "janus", "emu3", "lumina", "lumina2", "emu3.5", "emu3.5-flashar")  # the families whose files this check knows
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
GIB = 2**30
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # what AutoTokenizer builds a tokenizer from
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "depth")  # config keys that count a layer stack
LAYERS = re.compile(r"^((?:.*?\.)?layers)\.(\d+)\.")  # "model.layers.12.mlp..." -> ("model.layers", "12")


@dataclass
class Finding:
    level: str  # ok / missing / error
    topic: str  # family, weights, shapes, tokenizer, vq, generation config, memory
    line: str  # what is there or wrong, and the fix
    blocks: bool = False  # loading fails (or the model cannot take the family's prompts) until it is fixed


@dataclass
class Report:
    folder: str
    family: str | None = None
    family_from: str = ""  # what named the family (ssd_model.json, config.json's architectures / model_type)
    files: list = field(default_factory=list)  # [name, bytes] of the folder's top-level entries
    findings: list = field(default_factory=list)
    params: int | None = None  # parameters of the config's model (meta device)
    memory: dict = field(default_factory=dict)  # bf16 / fp16 / fp32 / 8-bit / 4-bit -> bytes of the weights
    free: dict = field(default_factory=dict)  # RAM / cuda:N -> free bytes on this machine
    seconds: float = 0.0  # the check itself
    import_seconds: float = 0.0  # importing transformers' model code first (0 where it was imported already)

    @property
    def loadable(self) -> bool:
        return not any(f.blocks for f in self.findings)

    def add(self, level: str, topic: str, line: str, blocks: bool | None = None) -> None:
        assert level in LEVELS, level
        self.findings.append(Finding(level, topic, line, level == "error" if blocks is None else blocks))

    def blocking(self) -> list:
        return [f for f in self.findings if f.blocks]

    def to_dict(self) -> dict:
        return {**asdict(self), "loadable": self.loadable}


# ---- what a family's released layout may differ in from transformers' model ---------------------------------
# Lumina-mGPT's released checkpoint stores q_norm / k_norm as [model_parallel_size, head_dim] where transformers'
# Chameleon wants [num_heads, head_dim], and holds no model.vqmodel.* (the pixels come from vqgan.safetensors).
# The family says both itself: `optional_weights`, and its model_class (families/text.py; Lumina-mGPT's picks the
# class that reads its released q/k norms), so the check compares the files with what the loader builds.
def family_model_class(cls, folder: Path, config: dict):
    """(the class the family's load() builds for this folder, a note on its layout or ""), judged from the shards
    there (a missing or damaged one is a finding of its own); transformers' Auto class for other families."""
    import transformers

    if not hasattr(cls, "model_class"):
        return transformers.AutoModelForCausalLM, ""
    try:
        model_cls = cls.model_class(folder, config, sorted(Path(folder).glob("*.safetensors")))
    except (SSDError, OSError, ValueError):
        model_cls = getattr(transformers, cls.transformers_class)
    return model_cls, getattr(model_cls, "layout_note", "")


# ---- files --------------------------------------------------------------------------------------------------
def read_header(path: Path) -> dict:
    """{tensor name: (dtype, shape)} from a safetensors file's header (8-byte little-endian length + JSON),
    checked against the file's size; an SSDError line for a damaged or cut-short file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
            raise SSDError(f"{path.name} is not a safetensors file (its header length is unreadable): re-download it")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise SSDError(f"{path.name} has a damaged safetensors header (not JSON): re-download it") from None
    if not isinstance(header, dict):
        raise SSDError(f"{path.name} has a damaged safetensors header (not an object): re-download it")
    out, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (_, stop) = entry["dtype"], [int(v) for v in entry["shape"]], entry["data_offsets"]
            end = max(end, int(stop))
        except (KeyError, TypeError, ValueError):
            raise SSDError(f"{path.name}: the header entry of {shown(name)} is damaged: re-download it") from None
        out[name] = (str(dtype), shape)
    if 8 + n + end > size:
        raise SSDError(f"{path.name} is cut short ({size:,} of {8 + n + end:,} bytes): the download is incomplete; "
                       "re-download it")
    return out


def _held(folder: Path, report: Report) -> None:
    """The folder's top-level entries with their sizes, and any that leaves it (a link outside)."""
    for entry in sorted(folder.iterdir()):
        if not entry.name.startswith("."):
            report.files.append([entry.name, entry.stat().st_size if entry.is_file() else 0])
    try:
        model_files.check_links(folder)
    except SSDError as err:
        report.add("error", "files", str(err))


def _weights(folder: Path, config: dict, report: Report) -> tuple[dict, set] | None:
    """({tensor: (dtype, shape)} of every weight file there is, the names the index puts in missing shards),
    after findings for missing shards and files that do not read; None when there are no weights to compare."""
    index = folder / "model.safetensors.index.json"
    unseen: set = set()
    try:
        files = model_files.weight_files(folder)
    except SSDError as err:
        if not os.path.lexists(index) or os.path.lexists(folder / "model.safetensors"):
            report.add("error", "weights", str(err))
            return None
        found = _index_shards(folder, index, report)
        if found is None:
            return None
        if not found[1]:  # no shard missing: the index itself is wrong (weight_files says how)
            report.add("error", "weights", str(err))
            return None
        files, unseen = found
    tensors = {}
    for path in files:
        try:
            tensors.update(read_header(path))
        except (SSDError, OSError) as err:
            report.add("error", "weights", str(err) if isinstance(err, SSDError) else f"{path.name}: {err}")
            return None
    if unseen:
        return tensors, unseen
    try:
        model_files.check_weights(folder, config)  # safetensors' own reading, and the dtype rule
    except SSDError as err:
        report.add("error", "weights", str(err))
    else:
        dtypes = sorted({d for d, _ in tensors.values()})
        size = size_text(sum(p.stat().st_size for p in files))
        what = files[0].name if len(files) == 1 else f"{len(files)} shards"
        report.add("ok", "weights", f"{what}: {len(tensors):,} tensors, {size} in {'/'.join(dtypes)}")
    return tensors, unseen


def _index_shards(folder: Path, index: Path, report: Report) -> tuple[list, set] | None:
    """(the shards of an index that are there, the tensors it puts in the others), after one finding naming
    the shards that are not there."""
    try:
        weight_map = model_files.read_json_object(folder, index.name, "re-download the model").get("weight_map")
    except SSDError as err:
        report.add("error", "weights", str(err))
        return None
    if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
        report.add("error", "weights", f"{index.name} has no weight_map of tensor names and shard files: "
                   "re-download the model")
        return None
    shards = sorted(set(weight_map.values()))
    try:
        paths = {s: model_files.inside(folder, s, f"{index.name}'s shard") for s in shards}
    except SSDError as err:
        report.add("error", "weights", str(err))
        return None
    lost = [s for s in shards if not paths[s].is_file()]
    if not lost:
        return [], set()
    gone = sum(1 for s in weight_map.values() if s in lost)
    report.add("missing", "weights", f"{index.name} names {len(shards)} shards and {len(lost)} are missing: "
               f"{', '.join(shown(s) for s in lost[:3])}{' ...' if len(lost) > 3 else ''} ({gone:,} of the "
               f"{len(weight_map):,} tensors): the download is incomplete; download the missing shard(s)", True)
    return [paths[s] for s in shards if s not in lost], {t for t, s in weight_map.items() if s in lost}


# ---- the config's model on the meta device ------------------------------------------------------------------
def meta_model(folder: Path, family: str, config: dict):
    """(the transformers model config.json describes, built on the meta device: shapes, no memory; a note on
    its layout). A family whose config.json AutoConfig cannot read (Emu3.5's model_type "Emu3") writes the
    config its loader builds (its transformers_config)."""
    import torch
    import transformers
    from transformers import AutoConfig

    from .families import family_class

    cls = family_class(family)
    if hasattr(cls, "meta_net"):  # a family read by a module of its own (FlashAR's wrapper), not a transformers class
        return cls.meta_net(folder, config), getattr(cls, "layout_note", "")
    model_cls, note = family_model_class(cls, folder, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            if hasattr(cls, "transformers_config"):
                cfg = cls.transformers_config(folder, config)
            else:
                cfg = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
            with torch.device("meta"):
                if model_cls is transformers.AutoModelForCausalLM:
                    return model_cls.from_config(cfg, trust_remote_code=False), note
                return model_cls(cfg), note
        finally:
            transformers.logging.set_verbosity(verbosity)


def _renamer(model, wanted: dict):
    """checkpoint key -> (the model's key, converted by transformers at load?), as from_pretrained renames them
    (transformers 5: its conversion mapping; 4.57: the model's _checkpoint_conversion_mapping)."""
    prefix = getattr(model, "base_model_prefix", "") or None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        mapping = dict(getattr(model, "_checkpoint_conversion_mapping", None) or {})

        def rename(key):
            for pattern, target in mapping.items():
                new, n = re.subn(pattern, target, key)
                if n:
                    return new, False
            if prefix and key not in wanted and f"{prefix}.{key}" in wanted:
                return f"{prefix}.{key}", False
            return key, False
        return rename
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]

    def rename(key):
        new, pattern = rename_source_key(key, renamings, converters, prefix, wanted)
        if new not in wanted and key in wanted:
            return key, False
        return new, pattern is not None
    return rename


def _layer_counts(names) -> dict:
    """{"model.layers": count} of the layer stacks among tensor names (the highest index + 1)."""
    out: dict = {}
    for name in names:
        m = LAYERS.match(name)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)) + 1)
    return out


def _layers(n: int) -> str:
    return f"{n} layer" if n == 1 else f"{n} layers"


def _config_key(config: dict, prefix: str, count: int) -> str:
    """The config.json key that declares a layer stack of `count` layers (e.g. text_config.num_hidden_layers)."""
    found = []
    stack = [("", config)]
    while stack:
        where, node = stack.pop()
        for key, value in node.items():
            at = f"{where}.{key}" if where else key
            if isinstance(value, dict):
                stack.append((at, value))
            elif key in LAYER_KEYS and value == count:
                found.append(at)
    vision = "vision" in prefix
    found.sort(key=lambda k: (("vision" in k) != vision, "vq" in k, len(k)))
    return found[0] if found else "num_hidden_layers"


def _groups(names) -> str:
    """Tensor names summarized: 'model.layers.2-3.* (18), model.vqmodel.* (96)'."""
    groups: dict = {}
    for name in names:
        m = LAYERS.match(name)
        key = (m.group(1), int(m.group(2))) if m else (".".join(name.split(".")[:2]), None)
        groups[key] = groups.get(key, 0) + 1
    out, stacks = [], {}
    for (head, i), n in groups.items():
        if i is None:
            out.append(f"{head}{'.*' if n > 1 or head not in names else ''} ({n})")
        else:
            stacks.setdefault(head, []).append((i, n))
    for head, items in stacks.items():
        idx = sorted(i for i, _ in items)
        span = str(idx[0]) if len(idx) == 1 else f"{idx[0]}-{idx[-1]}" if idx[-1] - idx[0] + 1 == len(idx) \
            else ",".join(map(str, idx[:6]))
        out.append(f"{head}.{span}.* ({sum(n for _, n in items)})")
    return ", ".join(out[:4]) + (f" and {len(out) - 4} more groups" if len(out) > 4 else "")


def _shapes(model, tensors: dict, unseen: set, family: str, cls, config: dict, report: Report,
            note: str = "") -> None:
    """The files' tensors against the state_dict of config.json's model: one finding per kind of difference
    (`unseen`: names in missing shards, counted as there: their finding is the missing shard's)."""
    wanted = {k: list(v.shape) for k, v in model.state_dict().items()}
    aliases: dict = {}  # tied parameters: one of their names in the files is enough
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    rename = _renamer(model, wanted)
    held, converted, shown_as = {}, set(), {}  # the model's key -> shape in the files; converted by transformers
    for key, (_, shape) in tensors.items():
        new, conv = rename(key)
        held[new], shown_as[new] = shape, key
        if conv:
            converted.add(new)
    ignore = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    unexpected = [k for k in held if k not in wanted and not any(p.search(shown_as[k]) for p in ignore)]
    known = set(held) | {rename(k)[0] for k in unseen}
    covered = {n for names in aliases.values() if any(a in known for a in names) for n in names} | known
    lacking = [k for k in wanted if k not in held and k not in covered]
    skipped = [k for k in lacking if k.startswith(cls.optional_weights)]
    lacking = [k for k in lacking if k not in skipped]
    wrong = [k for k, shape in held.items() if k in wanted and k not in converted and shape != wanted[k]]
    # a layer stack of another depth: one finding naming config.json's key, instead of the tensor lists
    declared, stored = _layer_counts(wanted), _layer_counts(known)
    stacks = [s for s in declared if s in stored and stored[s] != declared[s]]
    for s in stacks:
        n_cfg, n_file = declared[s], stored[s]
        named = next((LAYERS.match(shown_as[k]).group(1) for k in held if k.startswith(s + ".")
                      and LAYERS.match(shown_as[k])), s)  # the stack as the files name it
        report.add("error", "shapes", f"config.json declares {_layers(n_cfg)}, the weights hold {n_file} ({named}."
                   f"0-{n_file - 1}): fix {_config_key(config, s, n_cfg)} to {n_file}, or use the config.json that "
                   "came with these weights")
    in_stack = lambda name: any(name.startswith(s + ".") for s in stacks)  # noqa: E731
    lacking = [k for k in lacking if not in_stack(k)]
    unexpected = [k for k in unexpected if not in_stack(k)]
    vq = [k for k in lacking if ".vqmodel." in f".{k}"]
    if vq:
        report.add("missing", "vq", f"the weights lack the VQ model, {_groups(vq)} tensors (it makes the pixels): "
                   "re-download the model's weights", True)
    rest = [k for k in lacking if k not in vq]
    if rest:
        report.add("error", "shapes", f"the weights lack {len(rest):,} tensors config.json's model has: "
                   f"{_groups(rest)}: re-download the model, or use the config.json that came with the weights")
    if unexpected:
        report.add("error", "shapes", f"the weights hold {len(unexpected):,} tensors config.json's model does not "
                   f"have: {_groups([shown_as[k] for k in unexpected])}: use the config.json that came with these "
                   "weights")
    if wrong:
        k = wrong[0]
        report.add("error", "shapes", f"{len(wrong):,} tensors have another shape than config.json's model wants, "
                   f"e.g. {shown_as[k]} is {held[k]} in the weights, {wanted[k]} for config.json: use the "
                   "config.json that came with these weights (hidden_size, intermediate_size, heads, vocab_size)")
    if not (lacking or unexpected or wrong or stacks):
        notes = [note] if note else []
        notes += [f"{_groups(skipped)} not needed (not in this layout)"] if skipped else []
        what = f"the {len(held):,} tensors of the shards there fit" if unseen else \
            f"all {len(wanted) - len(skipped):,} tensors of config.json's model are there, of the right shapes"
        report.add("ok", "shapes", what + (f" ({'; '.join(notes)})" if notes else ""))


# ---- the family's other files -------------------------------------------------------------------------------
def _tokenizer(folder: Path, family: str, cls, report: Report) -> None:
    if family in ("emu3.5", "emu3.5-flashar"):  # baaivision/Emu3.5 src/tokenizer_emu3_ibq, not a transformers one
        from .families.emu35 import TOKENIZER_FIX
        from .families.emu35_tokenizer import FILES, tokenizer_folder

        where = tokenizer_folder(folder)
        if where is None:
            report.add("missing", "tokenizer", f"no {' / '.join(FILES)} (Emu3.5's tokenizer): its prompts are text; "
                       f"{TOKENIZER_FIX}", True)
        else:
            sub = f"{where.name}/" if where != folder else ""
            report.add("ok", "tokenizer", ", ".join(sub + n for n in FILES))
        return
    held = [n for n in TOKENIZER_FILES if (folder / n).is_file()]
    if held:
        report.add("ok", "tokenizer", ", ".join(held + [n for n in ("tokenizer_config.json",)
                                                        if (folder / n).is_file()]))
    elif getattr(cls, "text_prompts", False):
        # Lumina-mGPT's releases share the 768 folder's tokenizer (families/lumina.py TOKENIZER_REPO)
        repo = getattr(sys.modules.get(cls.__module__), "TOKENIZER_REPO", None) or \
            (cls.repo_ids[0] if getattr(cls, "repo_ids", ()) else "the model's repo")
        report.add("missing", "tokenizer", f"no tokenizer ({' / '.join(TOKENIZER_FILES)}): {family} prompts are "
                   f"text; copy tokenizer.json, tokenizer_config.json and special_tokens_map.json from {repo}", True)


def _extras(folder: Path, family: str, config: dict, report: Report) -> None:
    if family == "lumina":
        from .pixel_decoders.chameleon_vqgan import find_vqgan

        found = find_vqgan(str(folder))
        if found is None:
            report.add("missing", "vq", "no vqgan.safetensors (Lumina-mGPT's pixel decoder): convert Meta's "
                       "Chameleon tokenizer/vqgan.ckpt with `python -m ssd_core convert-vqgan vqgan.ckpt "
                       f"{folder}/vqgan.safetensors`; without it the pictures come out as the token grid", False)
        else:
            _vq_file(folder, Path(found), "vqgan.safetensors", report)
    elif family == "lumina2":
        from .pixel_decoders.movqgan import CONVERT_FIX, MoVQDecoder, find_movqgan, pickled_checkpoints

        found, fix = find_movqgan(folder), CONVERT_FIX.format(folder=folder)
        if found is None:
            pickled = pickled_checkpoints(folder)
            what = f"only the pickle {pickled[0].name} (never unpickled)" if pickled else "no movqgan.safetensors"
            report.add("missing", "vq", f"{what}, Lumina-mGPT 2.0's pixel decoder: {fix}", True)
        else:
            try:
                cfg = MoVQDecoder.check_file(found)
                report.add("ok", "vq", f"movqgan.safetensors: {cfg.n_embed} codes, {cfg.factor} px a code")
            except SSDError as err:
                report.add("error", "vq", str(err))
    elif family in ("emu3.5", "emu3.5-flashar"):
        from .pixel_decoders.ibq import CONVERT_FIX, IBQDecoder, find_ibq, pickled_checkpoints

        found, fix = find_ibq(folder), CONVERT_FIX.format(folder=folder)
        if found is None:
            pickled = pickled_checkpoints(folder)
            what = f"only the pickle {pickled[0].name} (never unpickled)" if pickled else "no ibq.safetensors"
            report.add("missing", "vq", f"{what}, Emu3.5's IBQ pixel decoder: {fix}", True)
        else:
            try:
                cfg = IBQDecoder.check_file(model_files.inside(folder, os.path.relpath(found, folder), "the IBQ file"))
                report.add("ok", "vq", f"{os.path.relpath(found, folder)}: {cfg.n_embed} codes, {cfg.factor} px a code")
            except SSDError as err:
                report.add("error", "vq", str(err))
    elif family == "llama-grid":
        from .families.llama_grid import folder_file, read_spec

        vocab = config.get("vocab_size")
        try:
            spec = read_spec(folder, vocab if isinstance(vocab, int) else None)
            name = spec.get("vq_decoder")
            size = "{}x{}".format(*spec["grid"])
            report.add("ok", "family", f"ssd_model.json: {a_or_an(size)} grid of "
                       f"{spec['image_vocab_size']} codes, {spec['num_classes']} classes")
        except SSDError as err:
            report.add("error", "family", str(err))
            return
        if name:
            try:
                path = folder_file(folder, name, "vq_decoder")
            except SSDError as err:
                report.add("error", "vq", str(err))
                return
            _vq_file(folder, path, f"vq_decoder {name}", report)


def _vq_file(folder: Path, path: Path, what: str, report: Report) -> None:
    try:
        n = len(read_header(model_files.inside(folder, os.path.relpath(path, folder), what)))
        report.add("ok", "vq", f"{what}: {n} tensors")
    except (SSDError, OSError) as err:
        report.add("error", "vq", f"{what}: {err}")


def _generation_config(folder: Path, family: str, report: Report) -> None:
    """Janus reads its BOS / pad / image-start ids there (else from the tokenizer); Emu3 its BOS / EOS fallbacks."""
    if family not in ("janus", "emu3"):
        return
    name = "generation_config.json"
    if not (folder / name).is_file():
        tok = any((folder / n).is_file() for n in TOKENIZER_FILES)
        need = family == "janus" and not tok
        report.add("missing", "generation config", f"no {name}: {family} reads its BOS / pad / image-start ids "
                   f"there{', else from the tokenizer' if family == 'janus' else ', else from config.json'}; copy it "
                   "from the model's repo", need)
        return
    try:
        gen = model_files.read_json_object(folder, name, "re-download it from the model's repo")
    except SSDError as err:
        report.add("error", "generation config", str(err))
        return
    boi = (gen.get("generation_kwargs") or {}).get("boi_token_id") if isinstance(gen.get("generation_kwargs"), dict) \
        else None
    ids = [k for k in ("bos_token_id", "eos_token_id", "pad_token_id") if gen.get(k) is not None]
    report.add("ok", "generation config", f"{name} ({', '.join(ids + (['boi_token_id'] if boi is not None else []))})")


# ---- memory -------------------------------------------------------------------------------------------------
def _memory(model, family: str, report: Report) -> None:
    report.params = sum(p.numel() for p in model.parameters())
    report.memory = {q: weights_bytes(model, q, family) for q in ("bf16", "fp16", "fp32", "8-bit", "4-bit")}
    report.free = free_memory()


# ---- the check ----------------------------------------------------------------------------------------------
def check_folder(folder) -> Report:
    """Every finding about a model folder (or 'reference' / 'reference-48'), from its JSON files and safetensors
    headers only."""
    from .api import BUNDLED_MODELS
    from .families import detect_family, family_class

    start = time.perf_counter()
    folder = Path(BUNDLED_MODELS.get(str(folder), folder))
    report = Report(str(folder))
    try:
        model_files.check_path(folder, "model folder")  # a NUL or a name no file system takes
    except SSDError as err:
        report.add("error", "family", str(err))
        return _done(report, start)
    if not folder.is_dir():
        report.add("error", "family", f"{folder} is not a folder: put the model's files (config.json, "
                   "*.safetensors, tokenizer) in a folder of their own")
        return _done(report, start)
    _held(folder, report)
    try:
        report.family = detect_family(folder)
        cls = family_class(report.family)
        config = model_files.read_config(folder)
    except SSDError as err:
        report.add("error", "family", f"not a model folder this pack knows (it looked for ssd_model.json's family, "
                   f"then config.json's architectures and model_type): {err}")
        return _done(report, start)
    archs = config.get("architectures") or []
    report.family_from = "ssd_model.json" if (folder / model_files.SSD_MODEL_JSON).is_file() else \
        f"config.json: {archs[0] if archs else config.get('model_type')}"
    if report.family not in BUILT_IN:
        report.add("ok", "family", f"{report.family} is a family another pack registered: its own load() checks "
                   "its files")
        return _done(report, start)
    report.import_seconds = _import_model_code(cls)
    start += report.import_seconds
    weights = _weights(folder, config, report)
    try:
        model, note = meta_model(folder, report.family, config)
    except Exception as err:  # noqa: BLE001 -- transformers raises many types for a config it cannot build
        report.add("error", "shapes", f"config.json does not describe a model transformers can build ({reason(err)}): "
                   "fix config.json, or re-download the model")
        model, note = None, ""
    if model is not None and weights is not None and config.get("quantization_config") is None:
        _shapes(model, *weights, report.family, cls, config, report, note)
    _tokenizer(folder, report.family, cls, report)
    _extras(folder, report.family, config, report)
    _generation_config(folder, report.family, report)
    if model is not None:
        _memory(model, report.family, report)
    return _done(report, start)


def _import_model_code(cls) -> float:
    """Seconds spent importing the family's transformers model code (a fresh process: most of its time)."""
    start = time.perf_counter()
    import transformers

    getattr(transformers, getattr(cls, "transformers_class", "") or "AutoModelForCausalLM")
    return time.perf_counter() - start


def size_text(n: int) -> str:
    """Bytes as the report says them: '13.8 GiB', '3.4 MB', '12 KB'."""
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.0f} KB"


def _done(report: Report, start: float) -> Report:
    report.seconds = time.perf_counter() - start
    return report
