"""Self-distilled grids on disk, in shards: a run that stops keeps every shard it finished.

A run's N grids are cut into shards of `shard_grids` (grid i is in shard i // shard_grids); process r of a
run of P processes makes the shards k with k % P == r, each written whole (a unique temp file beside, synced,
then renamed), so a file that is there is finished. A shard (safetensors) holds `tokens` [n, H, W] (image
codes), `prompt_index` [n] (into the run's prompt list; for a class-conditional model the class id, also as
`classes`, so that a shard is a `--grids` file), `seed` [n] (int64 two's complement: the grid is the `ar`
decoder's image of its prompt at that seed) and in its metadata the sampler settings, the model's identity,
the prompt list's fingerprint and size, the shard's place and the process that made it. A rerun skips the
shards it finds; a shard made with other settings, another model or other prompts is refused by name, never
mixed in; a damaged one (metadata or tensors of the wrong kind, shape or range) is refused before the heads
train on it (a process's own shards: before it generates any).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..errors import SSDError, reason
from ..model_files import check_path
from . import data
from .prompts import digest

FORMAT = "ssd-grids-shard"
VERSION = "1"
SEEDS = 2**64
MAX_META_CHARS = 1 << 20  # one metadata entry of a shard (the settings, the model's identity: under 1 KB)
INTEGER_DTYPES = ("I64", "I32", "I16", "I8", "U8")  # safetensors' names of whole-number tensors
DAMAGED = "the shard is damaged: delete it (it is made again) or give another --shards folder"


def default_folder(out_path) -> Path:
    """Beside the heads file: heads.safetensors -> heads.grids/."""
    out = Path(out_path)
    return out.with_name(out.stem + ".grids")


def shard_path(folder: Path, k: int) -> Path:
    return folder / f"shard-{k:05d}.safetensors"


class Shards:
    """The shard files of one run: which exist, which this process makes, and reading them all."""

    def __init__(self, folder, model, settings, prompts: list, prompts_name: str, shard_grids: int):
        self.folder = Path(folder)
        self.model, self.settings, self.prompts = model, settings, prompts
        self.shard_grids = int(shard_grids)
        self.grid = tuple(model.default_grid)
        self.record = {"format": FORMAT, "version": VERSION, "settings": data.settings_record(settings),
                       "model": data.model_identity(model), "prompts": digest(prompts),
                       "prompt_count": len(prompts), "prompts_from": prompts_name, "shard_grids": self.shard_grids}

    def check_folder(self) -> None:
        """The folder can take shards, and the shards already in it were made for this run (else refused)."""
        check_path(self.folder, "--shards")
        if self.folder.exists() and not self.folder.is_dir():
            raise SSDError(f"--shards {self.folder} is a file: give a folder for the self-distilled grids")
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("shard-*.safetensors"))[:1]:  # one shard speaks for the folder
            self._check(path)

    def _check(self, path: Path) -> dict:
        """The shard's metadata, checked: its kinds and numbers (else refused as damaged), then made for this
        run (else refused by what differs). Returns the metadata with first / grids / process as ints."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                meta = f.metadata() or {}
        except Exception as err:
            raise SSDError(f"--shards: {path} is not a readable shard ({reason(err, 60, fold=True)}): delete it, "
                           "it is made again") from None
        if meta.get("format") != FORMAT:
            raise SSDError(f"--shards: {path} is not a grids shard of train-heads: give another --shards folder")
        what, fix = f"--shards: {path}", DAMAGED
        stored = {}
        for key, kind in (("settings", dict), ("model", dict), ("prompts", str), ("prompt_count", int),
                          ("shard_grids", int)):
            value = data.parse_json(str(meta.get(key, "null")), f"{what}: its {key}", fix, MAX_META_CHARS)
            stored[key] = data.json_of_kind(value, kind, f"{what}: its {key}", fix)
        diff = []
        for key in ("settings", "model"):
            keys = data.IDENTITY_CHECKED if key == "model" else None
            diff += [f"{key} {d}" for d in data.differences(stored[key], self.record[key], keys)]
        diff += data.differences(stored, self.record, ("prompts", "prompt_count", "shard_grids"))
        if diff:
            more = f" (and {len(diff) - 2} more)" if len(diff) > 2 else ""
            raise SSDError(f"the grids in {self.folder} were made for another run: {'; '.join(diff[:2])}{more}; give "
                           "another --shards folder, delete this one to make the grids again, or run with the "
                           "settings they were made with")
        checked = {key: data.meta_number(meta, key, what, fix) for key in ("first", "grids", "process")}
        if checked["grids"] > self.shard_grids:
            raise SSDError(f"{what}: it says {checked['grids']} grids, more than the {self.shard_grids} of a shard; {fix}")
        return {**meta, **checked}

    def _load(self, k: int, total: int) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """Shard k's tokens [n, H, W] and prompt indices [n] (the n grids this run needs of it) and the process
        that made it, every one checked (else refused as damaged); None when it is not on disk or holds other
        grids of the run (it is made again)."""
        path = shard_path(self.folder, k)
        if not path.is_file():
            return None
        meta = self._check(path)
        a, b = self.extent(k, total)
        if meta["first"] != a or meta["grids"] < b - a:
            return None
        tokens, index = self._tensors(path, meta["grids"], b - a)
        return tokens, index, meta["process"]

    def _tensors(self, path: Path, grids: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n grids' tokens and prompt indices of a shard of `grids` grids: integer tensors of the
        shapes the metadata and the model say, tokens image codes of the model, indices into the prompts."""
        from safetensors import safe_open

        what = f"--shards: {path}"
        H, W = self.grid
        want = {"tokens": [grids, H, W], "prompt_index": [grids]}
        with safe_open(str(path), "pt") as f:
            keys = set(f.keys())
            out = {}
            for name, shape in want.items():
                if name not in keys:
                    raise SSDError(f"{what} has no {name!r} tensor; {DAMAGED}")
                part = f.get_slice(name)
                if part.get_dtype() not in INTEGER_DTYPES:
                    raise SSDError(f"{what}: its {name} are {part.get_dtype()}, not whole numbers; {DAMAGED}")
                if list(part.get_shape()) != shape:
                    raise SSDError(f"{what}: its {name} have shape {list(part.get_shape())}, not {shape} ({grids} "
                                   f"grids of {H}x{W}); {DAMAGED}")
                out[name] = part[:n].long()
        for name, high in (("tokens", int(self.model.image_vocab_size)), ("prompt_index", len(self.prompts))):
            bad = ((out[name] < 0) | (out[name] >= high)).nonzero()
            if len(bad):
                value = int(out[name][tuple(bad[0].tolist())])
                raise SSDError(f"{what}: its {name} hold {value} (at {bad[0].tolist()}), outside 0..{high - 1}; "
                               f"{DAMAGED}")
        return out["tokens"], out["prompt_index"]

    def extent(self, k: int, total: int) -> tuple[int, int]:
        return k * self.shard_grids, min((k + 1) * self.shard_grids, total)

    def count(self, total: int) -> int:
        return -(-total // self.shard_grids)

    def finished(self, k: int, total: int) -> bool:
        """Shard k is on disk with at least the grids this run needs of it (each checked)."""
        return self._load(k, total) is not None

    def make(self, total: int, order: list[int], layout, gen_batch: int, rank: int = 0, world: int = 1,
             log=print) -> dict:
        """Generate this process's missing shards of `total` grids (grid i: prompt order[i], seed S + i)."""
        self.check_folder()
        self.folder.mkdir(parents=True, exist_ok=True)
        mine = [k for k in range(self.count(total)) if k % world == rank]
        todo = [k for k in mine if not self.finished(k, total)]
        if len(todo) < len(mine):
            log(f"grids: {len(mine) - len(todo)} of this process's {len(mine)} shards found in {self.folder}, kept")
        made = 0
        t0 = time.time()
        for k in todo:
            a, b = self.extent(k, total)
            index = order[a:b]
            seeds = [(self.settings.seed + i) % SEEDS for i in range(a, b)]
            log(f"generating shard {k} ({b - a} grids, {a}..{b - 1}) with the base model (process {rank})")
            codes = data.generate_grids(self.model, [self.prompts[i] for i in index], self.settings, layout,
                                        gen_batch, log, seeds=seeds)
            self._write(k, a, codes, index, seeds, layout, rank)
            made += b - a
        if made:
            log(f"generated {made} grids in {len(todo)} shard(s): {time.time() - t0:.0f} s")
        return {"shards": len(mine), "made": len(todo), "grids_made": made}

    def _write(self, k: int, first: int, codes: torch.Tensor, index: list[int], seeds: list[int], layout,
               rank: int) -> None:
        from safetensors.torch import save_file

        H, W = layout.grid
        tensors = {"tokens": codes[:, layout.slot_of_cell].reshape(-1, H, W).long().contiguous(),
                   "prompt_index": torch.tensor(index, dtype=torch.long),
                   "seed": torch.tensor([s - SEEDS if s >= 2**63 else s for s in seeds], dtype=torch.long)}
        if isinstance(self.prompts[0], int):  # class ids: the shard is also a --grids file
            tensors["classes"] = tensors["prompt_index"].clone()
        meta = {k2: json.dumps(v) for k2, v in self.record.items() if k2 not in ("format", "version")}
        meta.update(format=FORMAT, version=VERSION, shard=str(k), first=str(first), grids=str(codes.shape[0]),
                    process=str(rank))
        path = shard_path(self.folder, k)
        try:  # a unique temp file beside, renamed over the shard: a shard that is there is whole
            data.write_replacing(path, lambda part: save_file(tensors, str(part), metadata=meta))
        except OSError as err:
            raise SSDError(f"could not write the grids shard {path} ({err.strerror or err}): free some disk or give "
                           "another --shards folder; the shards already written are kept") from None

    def read(self, total: int, layout) -> tuple[torch.Tensor, list[int], list[int]]:
        """Every grid of the run: codes [total, L] (int32, -1 at forced slots), prompt indices, processes."""
        codes = torch.full((total, layout.num_slots), -1, dtype=torch.int32)
        index, makers = [0] * total, [0] * total
        for k in range(self.count(total)):
            got = self._load(k, total)
            if got is None:
                raise SSDError(f"the grids shard {shard_path(self.folder, k)} is missing or short: another process "
                               "did not finish it; rerun (finished shards are kept)")
            tokens, prompt_index, process = got
            a, b = self.extent(k, total)
            codes[a:b, layout.slot_of_cell] = tokens.flatten(1).to(torch.int32)
            index[a:b] = prompt_index.tolist()
            makers[a:b] = [process] * (b - a)
        return codes, index, makers
