"""The draft heads (horizontal and vertical) and their safetensors file format.

Each head maps (h, e) -> predicted h: z = W0 [h ; e] (2d -> d); out = z + SwiGLU(RMSNorm(z)).
  horizontal: (h[slot s-1], e(token[s]))     -> h[s]       (the next token's embedding says what was sampled)
  vertical:   (h[y, x+k],   e(token[y, x+k])) -> h[y+1, x]  (one call drafts a whole row)
    k = `vertical_shift`: 0 reads the cell above the predicted feature's cell (the paper); 1 reads the cell
    above the cell that feature drafts (y+1, x+1), whose token is the strongest hint (the last column reads
    the row above's last cell).
  vertical with `vertical_left` (beyond the paper): (h[y, x+k], e(token[y, x+k]), e(token[y+1, x]),
    h[y, x+k+1], e(token[y, x+k+1])) -> h[y+1, x], z = W0 [h ; e ; e_left ; h_right ; e_right] (5d -> d): it also
    reads the token drafted on the left of the cell it drafts (so a row is drafted left to right, one call per
    cell) and the cell above-right of it (clamped to the row above's last cell).
  vertical_left 2 also reads the token two to the left of the drafted cell (the slot before the left token: the row
    above's last slot for the first column) and the cell above-left of it (clamped to the row above's first cell):
    z = W0 [h ; e ; e_left ; h_right ; e_right ; e_left2 ; h_upleft ; e_upleft] (8d -> d).
Hv's MLP may be wider than Hh's (metadata `vertical_intermediate_size`, default `intermediate_size`).
h are the base model's pre-norm last-layer features; draft logits go through the model's own frozen head.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .errors import SSDError, printable, reason, shown
from .model_files import check_path

FORMAT = "ssd-heads"
FORMAT_VERSION = "1"
HEAD_FORM = "concat-linear+swiglu-residual"
# Hv's inputs by `vertical_left`: 0: h, e of the cell above; 1: + e of the token on the left, h, e of the cell
# above-right; 2: + e of the token two to the left, h, e of the cell above-left
VERTICAL_INPUTS = {0: 2, 1: 5, 2: 8}


class DraftHead(nn.Module):
    def __init__(self, hidden: int, intermediate: int, eps: float = 1e-6, inputs: int = 2):
        super().__init__()
        self.fuse = nn.Linear(inputs * hidden, hidden, bias=False)  # W0 [h ; e (; e_left ; h_right ; e_right)]
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, h: torch.Tensor, e: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        z = self.fuse(torch.cat([h] + [x.expand_as(h) for x in (e, *more)], dim=-1))
        x = self.norm(z)
        return z + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class DraftHeads(nn.Module):
    """Both heads plus the metadata that ties them to one base model."""

    def __init__(self, family: str, hidden: int, image_vocab: int, grid: tuple[int, int],
                 intermediate: int | None = None, extra: dict | None = None):
        super().__init__()
        self.family, self.hidden, self.image_vocab = family, int(hidden), int(image_vocab)
        self.grid = (int(grid[0]), int(grid[1]))
        self.intermediate = int(intermediate or hidden)
        self.extra = dict(extra or {})
        self.horizontal = DraftHead(self.hidden, self.intermediate)
        self.vertical = DraftHead(self.hidden, self.vertical_intermediate,
                                  inputs=VERTICAL_INPUTS[self.vertical_left])

    @classmethod
    def for_model(cls, model, intermediate: int | None = None, **extra) -> "DraftHeads":
        return cls(model.family, model.hidden_size, model.image_vocab_size, model.default_grid, intermediate, extra)

    @property
    def vertical_left(self) -> int:
        """0: Hv reads the row above only; 1: also the token drafted on the left of the cell it drafts (a row
        drafted cell by cell) and the cell above-right of it; 2: also the token two to the left and the cell
        above-left."""
        return int(self.extra.get("vertical_left", "0"))

    @property
    def vertical_intermediate(self) -> int:
        """The width of Hv's MLP (`vertical_intermediate_size`; Hh's `intermediate_size` when absent)."""
        return int(self.extra.get("vertical_intermediate_size", self.intermediate))

    @property
    def vertical_shift(self) -> int:
        """Columns to the right of the predicted feature's cell that Hv reads in the row above (0 or 1)."""
        return int(self.extra.get("vertical_shift", "0"))

    def metadata(self) -> dict[str, str]:
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "family": self.family,
                "hidden_size": str(self.hidden), "image_vocab_size": str(self.image_vocab),
                "grid": f"{self.grid[0]}x{self.grid[1]}", "head_form": HEAD_FORM,
                "intermediate_size": str(self.intermediate)}
        meta.update({k: str(v) for k, v in self.extra.items()})
        return meta

    def check_model(self, model) -> None:
        """Refuse heads made for another model, naming both sides."""
        mine = {"family": self.family, "hidden size": self.hidden, "image vocabulary": self.image_vocab,
                "grid": f"{self.grid[0]}x{self.grid[1]}"}
        theirs = {"family": model.family, "hidden size": model.hidden_size,
                  "image vocabulary": model.image_vocab_size,
                  "grid": f"{model.default_grid[0]}x{model.default_grid[1]}"}
        for key in mine:
            if mine[key] != theirs[key]:
                raise SSDError(f"these draft heads were trained for {key} {mine[key]} but the model has {key} "
                               f"{theirs[key]}; load heads trained for this model, or train them with "
                               "`python -m ssd_core train-heads`")

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(tensors, str(path), metadata=self.metadata())


def expected_shapes(hidden: int, intermediate: int, vertical_left: int = 0,
                    vertical_intermediate: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor of a heads file and its shape, from the sizes in its metadata."""
    out = {}
    for head, inputs, inter in (("horizontal", 2, intermediate),
                                ("vertical", VERTICAL_INPUTS[int(vertical_left)],
                                 vertical_intermediate or intermediate)):
        out.update({f"{head}.fuse.weight": (hidden, inputs * hidden), f"{head}.norm.weight": (hidden,),
                    f"{head}.gate.weight": (inter, hidden), f"{head}.up.weight": (inter, hidden),
                    f"{head}.down.weight": (hidden, inter)})
    return out


def check_shapes(name: str, tensors: dict, hidden: int, intermediate: int, vertical_left: int = 0,
                 vertical_intermediate: int | None = None) -> None:
    """One short line naming the first tensor that is missing, extra or of the wrong shape."""
    want = expected_shapes(hidden, intermediate, vertical_left, vertical_intermediate)
    missing = [k for k in want if k not in tensors]
    extra = [k for k in tensors if k not in want]
    wrong = [k for k in want if k in tensors and tuple(tensors[k].shape) != want[k]]
    if missing or extra or wrong:
        what = (f"lacks {missing[:3]}" if missing else f"has unknown tensors {extra[:3]}" if extra else
                f"has {wrong[0]} of shape {list(tensors[wrong[0]].shape)} where its metadata (hidden_size {hidden}, "
                f"intermediate_size {intermediate}, vertical_intermediate_size {vertical_intermediate or intermediate}, "
                f"vertical_left {int(vertical_left)}) needs {list(want[wrong[0]])}")
        raise SSDError(f"{name} {what}: the file is damaged or not made by this pack; re-train the heads")


def load_heads_file(path: str | Path, dtype: torch.dtype | None = None) -> DraftHeads:
    """Read a heads file (safetensors only). Any other or damaged file is refused with a clear message."""
    from safetensors import safe_open

    check_path(path, "heads file")  # a NUL, a name of 256+ bytes: refused before any look at it
    path = Path(path)
    if path.is_dir():
        raise SSDError(f"heads path {path} is a folder: give the .safetensors heads file inside it (e.g. "
                       f"{path / 'heads.safetensors'})")
    if not path.is_file():
        raise SSDError(f"heads file {path} does not exist; pick a .safetensors file from models/ssd_heads "
                       "or 'none' to decode without heads")
    if path.suffix != ".safetensors":
        raise SSDError(f"{path.name} is not a .safetensors file; SSD heads are only read from safetensors "
                       "(pickled .pt/.bin/.ckpt files are never loaded)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as err:  # safetensors raises several types for a damaged header
        raise SSDError(f"{path.name} is not a readable safetensors file ({reason(err)}); re-download or re-train "
                       "it") from None
    if meta.get("format") != FORMAT:
        raise SSDError(f"{path.name} is a safetensors file but not an SSD heads file (metadata format="
                       f"{shown(meta.get('format'))}, expected {FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION or meta.get("head_form") != HEAD_FORM:
        raise SSDError(f"{path.name} has heads format version {shown(meta.get('format_version'))} / form "
                       f"{shown(meta.get('head_form'))}; this version of the pack reads version {FORMAT_VERSION} / "
                       f"{HEAD_FORM}: retrain the heads or update the pack")
    try:
        grid = tuple(int(v) for v in meta["grid"].split("x"))
        hidden, inter = int(meta["hidden_size"]), int(meta["intermediate_size"])
        vocab, family = int(meta["image_vocab_size"]), meta["family"]
        v_inter = int(meta.get("vertical_intermediate_size", inter))
        if len(grid) != 2 or min(grid + (hidden, inter, vocab, v_inter)) < 1:
            raise ValueError("sizes must be whole numbers >= 1")
    except (KeyError, ValueError) as err:
        raise SSDError(f"{path.name} has damaged heads metadata ({printable(str(err))[:120]}); "
                       "re-train the heads") from None
    if meta.get("vertical_shift", "0") not in ("0", "1"):
        raise SSDError(f"{path.name} has vertical_shift {shown(meta.get('vertical_shift'))} in its metadata; "
                       "this version of the pack reads 0 or 1: retrain the heads or update the pack")
    if meta.get("vertical_left", "0") not in {str(level) for level in VERTICAL_INPUTS}:
        raise SSDError(f"{path.name} has vertical_left {shown(meta.get('vertical_left'))} in its metadata; "
                       "this version of the pack reads 0, 1 or 2: retrain the heads or update the pack")
    if not isinstance(family, str) or not family.isprintable() or len(family) > 100:
        raise SSDError(f"{printable(path.name)} has family {shown(family)} in its metadata, not a family name; "
                       "re-train the heads")
    odd = [(k, t.dtype) for k, t in tensors.items() if not t.dtype.is_floating_point]
    if odd:
        raise SSDError(f"{printable(path.name)} holds {shown(odd[0][0])} as {odd[0][1]}: heads tensors are floating "
                       "point (fp32 / bf16 / fp16); the file is damaged or not made by this pack: re-train the heads")
    check_shapes(path.name, tensors, hidden, inter, int(meta.get("vertical_left", "0")), v_inter)  # before the network is built
    known = {"format", "format_version", "family", "hidden_size", "image_vocab_size", "grid", "head_form",
             "intermediate_size"}
    heads = DraftHeads(family, hidden, vocab, grid, inter,
                       {k: v for k, v in meta.items() if k not in known})
    heads.load_state_dict(tensors)
    return heads.to(dtype) if dtype is not None else heads
