"""The base-model contract every family implements.

A family adapter turns a transformers model into a `GridModel`: it says how a prompt becomes token ids,
how ids are embedded, where the final norm and the image head are, and how a token grid is laid out
(row-end tokens, forced tail tokens). The KV cache, masks, positions and classifier-free guidance as one
batch of 2 live once in ../session.py.
"""
from __future__ import annotations

import threading
from pathlib import Path

import torch

from .. import hub, model_files
from ..errors import SSDError, a_or_an
from ..session import KVSession, Layout, Prompt, Session


def as_rows(rows) -> slice | torch.Tensor:
    """Image rows of a vocabulary head: a slice when they are consecutive ascending ids (read as a view of the
    head, nothing copied), else a LongTensor of ids on the CPU."""
    if isinstance(rows, slice):
        return rows
    ids = torch.as_tensor(rows, dtype=torch.long).flatten().cpu()
    if ids.numel() and torch.equal(ids, torch.arange(int(ids[0]), int(ids[0]) + ids.numel())):
        return slice(int(ids[0]), int(ids[0]) + ids.numel())
    return ids


class ImageRowsHead:
    """Logits of a vocabulary head (an nn.Linear) restricted to its image rows, without a copy per step.

    - consecutive rows (llama-grid; Emu3's visual tokens): a slice view of the head's weight, nothing copied;
    - other rows (an id list in code order): gathered once into a [V_img, d] weight beside the head, gathered
      again only when the head's weight changes (moved, reloaded, edited in place);
    - a head that accelerate offloads (a device_map with cpu / disk entries keeps its weight on the meta device
      and loads it in the module's pre-forward hook): its hook loads it once, the image rows are copied to the
      hook's execution device and kept there. The text rows stay offloaded and are never read again: Emu3's
      image rows are 268 of its head's 1,512 MB in bf16, where calling the offloaded head would move all
      1,512 MB to the GPU every step.

    Kept by the GridModel (freed with it). The head may sit on another device than the features under a
    device_map: the logits are on the device of the rows.
    """

    def __init__(self, rows):
        self.rows = as_rows(rows)
        self._kept = None  # (head, key, weight rows, bias rows): the gathered / loaded-once rows
        self._lock = threading.Lock()  # generations in several threads share the model: one builds the rows

    def weights(self, head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight [V_img, d], bias [V_img] or None) of the image rows, as views where the rows allow."""
        weight, bias = head.weight, getattr(head, "bias", None)
        if weight.device.type != "meta":
            if isinstance(self.rows, slice):
                return weight[self.rows], None if bias is None else bias[self.rows]
            key = (weight.data_ptr(), weight.device, weight.dtype, weight._version,
                   None if bias is None else (bias.data_ptr(), bias._version))
            build = lambda: (self._pick(weight), None if bias is None else self._pick(bias))  # noqa: E731
        else:
            hook = getattr(head, "_hf_hook", None)
            if hook is None:
                raise SSDError("the image head's weights are on the meta device and no accelerate hook loads them: "
                               "load the model with its weights (not on the meta device), or with a device_map")
            key = ("offloaded", id(hook))
            build = lambda: self._load_offloaded(head, hook)  # noqa: E731
        with self._lock:
            if self._kept is None or self._kept[0] is not head or self._kept[1] != key:
                self._kept = None  # the old copy goes before the new one is made
                self._kept = (head, key, *build())
            return self._kept[2], self._kept[3]

    def _pick(self, t: torch.Tensor) -> torch.Tensor:
        """The image rows of a head tensor, as a tensor of their own."""
        if isinstance(self.rows, slice):
            return t[self.rows].clone()
        return t.index_select(0, self.rows.to(t.device))

    def _load_offloaded(self, head: torch.nn.Module, hook) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An offloaded head's image rows: accelerate's hook loads the weights onto the execution device, the rows
        are copied out, and the hook puts the weights back on the meta device."""
        hook.pre_forward(head)
        try:
            weight, bias = head.weight, getattr(head, "bias", None)
            return self._pick(weight), None if bias is None else self._pick(bias)
        finally:
            hook.post_forward(head, None)

    def __call__(self, normed: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
        weight, bias = self.weights(head)
        return torch.nn.functional.linear(normed.to(weight.device), weight, bias)


class GridModel:
    """A base AR image model behind one contract. Subclasses set the attributes and override the hooks."""

    # ---- what the family is (class attributes; the registry in __init__.py reads them) ------------
    family: str = "base"
    repo_ids: tuple[str, ...] = ()  # Hugging Face repos in transformers format; the first is the default download
    model_types: tuple[str, ...] = ()  # config.json model_type values of this family (empty: any causal LM)
    architectures: tuple[str, ...] = ()  # config.json architectures that name this family
    extra_files: str = ""  # what a folder needs besides the repo's files
    # tensor name prefixes the released weights may lack (the model's own values stay there, never used);
    # every other missing tensor is refused at load (model_files.check_loaded)
    optional_weights: tuple[str, ...] = ()
    text_prompts: bool = False
    negative_prompts: bool = False  # the unconditional stream can be a negative prompt
    # ---- what the nodes list before any model is loaded (the sampler's grid list) -----------------
    pixels_per_token: int = 0  # pixels per token side of the family's pixel decoder (0: none listed)
    # ---- per model (set by __init__) --------------------------------------------------------------
    hidden_size: int
    image_vocab_size: int
    default_grid: tuple[int, int]
    class_names: list[str] | None = None
    defaults: dict  # sampler defaults: cfg, temperature, top_k, top_p
    decoder_defaults: dict = {}  # a model's own decoder parameter defaults {decoder: {name: value}} (llama-grid)
    shown_as: str | None = None  # the model as the user loaded it ('reference', its folder's name): api.load_model

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()

    # ---- loading: every family has this one signature ------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs) -> "GridModel":
        """A model folder -> a GridModel. `download` (True = the first of repo_ids, or a repo id) fetches a
        folder without files first; kwargs are the family's options and transformers' loading options."""
        raise NotImplementedError

    @classmethod
    def listed_grids(cls) -> list[tuple[int, int]]:
        """The token grids the nodes offer for this family before a model is loaded (the released models'
        sizes); a loaded model's check_grid has the last word. Empty: the family's sizes are not listed."""
        return []

    @classmethod
    def where_to_get(cls, folder) -> str:
        text = f"download {' or '.join(cls.repo_ids)} from the Hugging Face Hub into {folder}" if cls.repo_ids \
            else f"put the model's files into {folder}"
        return text + (f", and add {cls.extra_files}" if cls.extra_files else "")

    @classmethod
    def check_folder(cls, folder) -> dict:
        """The folder exists, holds a transformers config, and that config is of this family's class."""
        from . import family_of_model_type

        folder = Path(folder)
        if not folder.is_dir():
            raise SSDError(f"{cls.family} model folder {folder} does not exist: {cls.where_to_get(folder)} "
                           "(or load with download=True to fetch it there)")
        cfg = model_files.read_config(folder)
        model_type = cfg.get("model_type")
        if cls.model_types and model_type not in cls.model_types:
            other = family_of_model_type(model_type)
            hint = f"; it is {a_or_an(other)} model: load it as family {other!r}" if other else ""
            raise SSDError(f"{folder} holds {a_or_an(repr(model_type))} model, not {a_or_an(cls.family)} model "
                           f"(expected model_type {' or '.join(cls.model_types)}){hint}")
        return cfg

    @classmethod
    def ensure_folder(cls, folder, download=None) -> Path:
        """The local folder of this family's model; with `download` (True = the first of repo_ids, or a repo
        id) a folder without config.json is fetched first. Never touches the network otherwise."""
        folder = Path(folder)
        if not (folder / "config.json").is_file() and download:
            if download is True and not cls.repo_ids:
                raise SSDError(f"{cls.family} has no default repo to download: {cls.where_to_get(folder)}")
            repo = cls.repo_ids[0] if download is True else str(download)
            hub.download(repo, folder, cls.extra_files)
        cls.check_folder(folder)
        return folder

    # ---- hooks a family overrides -------------------------------------------------------------
    def backbone(self) -> torch.nn.Module:
        """The decoder stack taking inputs_embeds / attention_mask / position_ids / cache."""
        raise NotImplementedError

    def final_norm(self) -> torch.nn.Module:
        raise NotImplementedError

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of sequence ids [..., n] -> [..., n, d] (image ids and forced ids alike)."""
        return self.model.get_input_embeddings()(ids)

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Final-normed features [..., d] -> logits over the image vocabulary [..., V_img]."""
        raise NotImplementedError

    def code_to_id(self, codes: torch.Tensor) -> torch.Tensor:
        """Image codes (0..V_img-1) -> sequence ids the model reads."""
        raise NotImplementedError

    def layout(self, grid: tuple[int, int] | None = None) -> Layout:
        raise NotImplementedError

    def grid_options(self) -> list[tuple[int, int]]:
        return [self.default_grid]

    def build_prompt(self, prompt, negative_prompt: str, cfg: bool, grid: tuple[int, int]) -> Prompt:
        raise NotImplementedError

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """A grid of image codes [H, W] -> pixels [H_px, W_px, 3] in [0, 1], or None without a decoder."""
        return None

    # ---- shared machinery ---------------------------------------------------------------------
    @property
    def shown_name(self) -> str:
        """The model as messages name it: as the user loaded it ('reference', 'reference-48', the folder's name),
        else the family's own name for it (a model built in memory)."""
        return self.shown_as or getattr(self, "name", None) or self.family

    @property
    def device(self) -> torch.device:
        """Where inputs go: the input embeddings' device (the first shard under a device_map)."""
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def check_grid(self, grid) -> tuple[int, int]:
        grid = tuple(int(v) for v in grid) if grid is not None else tuple(self.default_grid)
        if len(grid) != 2 or min(grid) < 1:
            raise SSDError(f"grid {grid} is not a (rows, columns) pair of positive integers")
        options = self.grid_options()
        if grid not in [tuple(o) for o in options]:
            shown = ", ".join(f"{h}x{w}" for h, w in options[:12]) + (" ..." if len(options) > 12 else "")
            raise SSDError(f"{self.shown_name} cannot make {a_or_an(f'{grid[0]}x{grid[1]}')} token grid; choose one "
                           f"of: {shown}")
        return grid  # type: ignore[return-value]

    def rows_logits(self, normed: torch.Tensor, head: torch.nn.Module, rows) -> torch.Tensor:
        """head_logits of a family whose image codes are `rows` of a vocabulary head: the model keeps one
        ImageRowsHead (a view, or rows gathered / loaded once), freed with it."""
        kept = self.__dict__.get("_image_rows_head")
        if kept is None:  # setdefault: threads starting together share one
            kept = self.__dict__.setdefault("_image_rows_head", ImageRowsHead(rows))
        return kept(normed, head)

    def image_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Pre-norm features [..., d] -> float32 logits over the image vocabulary."""
        return self.head_logits(self.final_norm()(features)).float()

    def start(self, prompt: Prompt, images: int = 1) -> KVSession:
        """The KV-cache session of a prompt (images: how many images its rows carry, for the static cache)."""
        static = getattr(self, "static", None)  # set by static_cache.enable (the loaders' compile option)
        if static is not None:
            from ..static_cache import StaticSession

            return StaticSession(self, prompt, static, images)
        return Session(self, prompt)
