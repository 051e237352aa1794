"""Where a training batch's features come from; never every grid's features in memory.

- Streamed (the default): each optimiser step runs the frozen model teacher-forced on that step's grids. The
  cost is one forward per grid per epoch; the memory is one batch's, however many grids the run has (a
  Janus-Pro-7B grid's features are 9.5 MB in bf16: 60,000 grids would be 0.6 TB).
- A features file (`--features FILE`, for small models: the bundled model's 5,463 grids are 3.4 GB in fp16):
  computed once, written batch by batch into a safetensors file (`h` [N, S, L+1, d] fp16, `ids`, `codes`),
  then read a batch's rows at a time; reused by a later run on the same grids. Refused up front when the
  disk lacks the room.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

import torch

from ..errors import SSDError
from ..outputs import WRITTEN
from . import data

HEADER_BYTES = 4088  # the header written first, padded with spaces: 8 + 4088 bytes put the data at 4096
DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64,
          "I32": torch.int32}
DISK_MARGIN = 1 << 30  # a features file leaves this much of the disk free


class Streamed:
    """Features of a batch of grids from one forward of the frozen model (on its device, in its dtype)."""

    def __init__(self, model, prompts: list, codes: torch.Tensor, settings, layout):
        self.model, self.prompts, self.codes, self.settings, self.layout = model, prompts, codes, settings, layout

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return data.collect_features(self.model, [self.prompts[i] for i in idx], self.codes[idx].long(),
                                     self.settings, self.layout, batch=max(1, len(idx)), dtype=self.model.dtype,
                                     device=self.model.device)


def file_bytes(n: int, streams: int, slots: int, hidden: int) -> int:
    """Bytes of a features file of n grids (fp16 features, int64 ids and codes)."""
    return n * (streams * (slots + 1) * hidden * 2 + 2 * slots * 8) + 8 + HEADER_BYTES


def check_room(path, n: int, streams: int, slots: int, hidden: int) -> None:
    """Refuse a features file the disk cannot hold (with DISK_MARGIN left), before any work."""
    if path is None or Path(path).is_file():
        return
    need = file_bytes(n, streams, slots, hidden)
    free = shutil.disk_usage(Path(path).parent).free
    if need > free - DISK_MARGIN:
        raise SSDError(f"--features {path} would take {need / 2**30:.1f} GB ({n} grids) and the disk has "
                       f"{free / 2**30:.1f} GB free: leave --features out (the features are then streamed, one batch "
                       "at a time), or put the file on a disk with room")


class FeatureFile:
    """A features file read a few rows at a time (positioned reads: never mapped or loaded whole)."""

    def __init__(self, path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.base = 8 + n
        header.pop("__metadata__", None)
        self.entries = {k: (DTYPES.get(v["dtype"]), tuple(v["shape"]), tuple(v["data_offsets"]))
                        for k, v in header.items()}  # a dtype not written here: None (the file holds other data)
        dtype, shape, _ = self.entries["h"]
        self.n, self.row_shape, self.dtype = (shape[0], shape[1:], dtype) if dtype and shape else (0, (), dtype)
        self.row_bytes = int(torch.Size(self.row_shape).numel()) * (torch.empty(0, dtype=dtype).element_size()
                                                                    if dtype else 0)

    def holds(self, codes: torch.Tensor, streams: int, hidden: int) -> bool:
        """The file holds these grids' features as build writes them: h [N, S, L+1, d] fp16, ids and codes
        [N, L] int64, its codes these grids' (else it is made again, never read into a batch)."""
        n, slots = codes.shape
        want = {"h": (torch.float16, (n, streams, slots + 1, hidden)), "ids": (torch.int64, (n, slots)),
                "codes": (torch.int64, (n, slots))}
        if any(self.entries.get(k, (None, None))[:2] != v for k, v in want.items()):
            return False
        return torch.equal(self.whole("codes"), codes.long())

    def __len__(self) -> int:
        return self.n

    def whole(self, name: str) -> torch.Tensor:
        """A small tensor of the file (ids, codes) whole."""
        dtype, shape, (a, b) = self.entries[name]
        with open(self.path, "rb") as f:
            f.seek(self.base + a)
            raw = bytearray(f.read(b - a))
        return torch.frombuffer(raw, dtype=dtype).reshape(shape) if raw else torch.zeros(shape, dtype=dtype)

    def rows(self, idx: list[int]) -> torch.Tensor:
        """h of the grids idx: [k, S, L+1, d] in the file's dtype."""
        _, _, (a, _) = self.entries["h"]
        out = torch.empty((len(idx), *self.row_shape), dtype=self.dtype)
        view = out.view(torch.uint8).view(len(idx), -1).numpy()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for j, i in enumerate(idx):
                got = os.preadv(fd, [view[j]], self.base + a + int(i) * self.row_bytes)
                if got != self.row_bytes:
                    raise SSDError(f"--features {self.path} is shorter than its header says (grid {i}): delete it, "
                                   "it is made again")
        finally:
            os.close(fd)
        return out


class Cached:
    """Features of a batch read from a FeatureFile, with its ids (kept: [N, L] int64)."""

    def __init__(self, model, file: FeatureFile):
        self.model, self.file = model, file
        self.ids = file.whole("ids")

    def __len__(self) -> int:
        return len(self.file)

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.file.rows(idx).to(self.model.device, self.model.dtype), self.ids[idx]


def _header(n: int, streams: int, slots: int, hidden: int) -> bytes:
    h = n * streams * (slots + 1) * hidden * 2
    ids = n * slots * 8
    header = {"h": {"dtype": "F16", "shape": [n, streams, slots + 1, hidden], "data_offsets": [0, h]},
              "ids": {"dtype": "I64", "shape": [n, slots], "data_offsets": [h, h + ids]},
              "codes": {"dtype": "I64", "shape": [n, slots], "data_offsets": [h + ids, h + 2 * ids]},
              "__metadata__": {"format": "ssd-features", "written": "batch by batch by ssd_core.training"}}
    text = json.dumps(header).encode()
    if len(text) > HEADER_BYTES:
        raise SSDError("features file header too long")  # never: a few shapes
    return struct.pack("<Q", HEADER_BYTES) + text + b" " * (HEADER_BYTES - len(text))


def build(path, model, prompts: list, codes: torch.Tensor, settings, layout, batch: int, stop_at=None,
          log=print) -> int:
    """Write the features of the grids (the first ones done by stop_at) into `path`, a batch at a time;
    returns how many grids it holds. A failed or interrupted write leaves `path` as it was and no temp file (it
    is written into a unique temp file beside, synced, then renamed: data.write_replacing)."""
    path = Path(path)
    streams = 2 if settings.guided else 1
    slots, hidden = layout.num_slots, int(model.hidden_size)
    t0 = time.time()
    done = 0

    def write(part: Path) -> None:
        nonlocal done
        with open(part, "r+b") as f:  # the temp file write_replacing made (O_EXCL), empty
            f.write(b"\0" * (8 + HEADER_BYTES))
            for b in range(0, len(prompts), batch):
                if stop_at is not None and b and time.time() >= stop_at:  # one batch at least
                    break
                if b and b % (64 * batch) == 0:
                    log(f"  features of {b}/{len(prompts)} grids ({time.time() - t0:.0f} s)")
                h, _ = data.collect_features(model, prompts[b:b + batch], codes[b:b + batch].long(), settings, layout,
                                             batch, torch.float16)
                f.write(h.contiguous().view(torch.uint8).numpy().tobytes())
                done += h.shape[0]
            ids = torch.where(layout.forced[None] >= 0, layout.forced[None].expand(done, -1),
                              model.code_to_id(codes[:done].long().clamp(min=0)).cpu())
            f.write(ids.long().contiguous().numpy().tobytes())
            f.write(codes[:done].long().contiguous().numpy().tobytes())
            f.seek(0)
            f.write(_header(done, streams, slots, hidden))

    try:
        data.write_replacing(path, write)
    except OSError as err:
        raise SSDError(f"could not write --features {path} ({err.strerror or err}); leave --features out (the "
                       "features are then streamed) or free some disk") from None
    WRITTEN.append(str(path))
    log(f"features of {done} of {len(prompts)} grids written to {path}: {time.time() - t0:.0f} s")
    return done


def features_file(path, model, prompts, codes, settings, layout, batch, stop_at=None, log=print):
    """A Cached source of the grids' features from `path` (made when it does not hold these grids), and how
    many of the grids it holds (fewer with stop_at)."""
    data.check_features_file(path, "--features")
    path = Path(path)
    if path.is_file():
        file = FeatureFile(path)
        if file.holds(codes, 2 if settings.guided else 1, int(model.hidden_size)):
            log(f"features of {len(file)} grids read from {path} as needed")
            return Cached(model, file), len(file)
        log(f"{path} holds the features of other grids: made again")
    done = build(path, model, prompts, codes, settings, layout, batch, stop_at, log)
    return Cached(model, FeatureFile(path)), done
