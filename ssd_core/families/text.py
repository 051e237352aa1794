"""What the three text-to-image families (janus, emu3, lumina) share: a Hub repo in transformers format read
by one transformers class, the folder's own tokenizer, prompts as text or as token ids, and image codes that
are listed rows of the vocabulary head (Janus overrides this: it has a generation head)."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import model_files
from ..errors import SSDError, a_or_an
from . import common
from .base import GridModel

PROMPT_ALLOWANCE = 256  # positions kept free for the prompt when a grid is checked


class TextGridModel(GridModel):
    text_prompts = True
    training_prompts = list(common.TRAINING_PROMPTS)
    name = "text model"  # how messages call it
    transformers_class = ""  # the transformers class that reads the folder
    load_options: tuple[str, ...] = ()  # load() keyword arguments that go to the adapter, not to transformers
    image_ids: torch.Tensor  # [V_img] the vocabulary id of each image code
    max_positions: int  # the positions the model has (grids must fit after the prompt)

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None):
        super().__init__(model)
        self.folder = folder
        self.tokenizer = tokenizer

    @classmethod
    def model_class(cls, folder, config: dict | None = None, files=None):
        """The transformers class that reads this folder's weights (a family may pick one by the folder's layout:
        its config.json, read when None, and `files`, the safetensors files to look at, default the folder's
        weights). check-model builds it too."""
        import transformers

        return getattr(transformers, cls.transformers_class)

    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs):
        options = {k: kwargs.pop(k) for k in cls.load_options if k in kwargs}
        folder = cls.ensure_folder(folder, download)
        model = model_files.load_pretrained(cls.model_class(folder), folder, dtype, device,
                                            optional=cls.optional_weights, **kwargs)
        return cls(model, model_files.load_tokenizer(folder), Path(folder), **options)

    # ---- the contract: image codes are rows `image_ids` of lm_head ------------------------------------------
    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.rows_logits(normed, self.model.lm_head, self.image_ids)

    def code_to_id(self, codes: torch.Tensor) -> torch.Tensor:
        return self.image_ids.to(codes.device)[codes]

    def sequence_length(self, grid) -> int:
        """Positions a grid takes after the prompt (image tokens and the forced ones)."""
        raise NotImplementedError

    def fits(self, grid) -> bool:
        """Whether the grid's positions fit the model's after the prompt (PROMPT_ALLOWANCE kept for it)."""
        return self.sequence_length(grid) <= self.max_positions - PROMPT_ALLOWANCE

    def largest_square(self, side: int, step: int = 1, smallest: int = 1) -> tuple[int, int]:
        """The upstream side x side grid, or the largest square (side down by `step`) that fits the positions."""
        while side > smallest and not self.fits((side, side)):
            side -= step
        return (side, side)

    def check_grid_positions(self, grid) -> tuple[int, int]:
        """check_grid of a family that draws any size its positions hold (Emu3, Emu3.5): (H, W) of `grid` (None:
        the default), or one SSDError line naming the positions it needs and the default grid."""
        H, W = tuple(int(v) for v in grid) if grid is not None else self.default_grid
        limit = self.max_positions - PROMPT_ALLOWANCE
        if H < 1 or W < 1 or not self.fits((H, W)):
            raise SSDError(f"{self.name} cannot make {a_or_an(f'{H}x{W}')} token grid: it needs "
                           f"{self.sequence_length((H, W))} "
                           f"positions, {limit} are free after the prompt; choose a smaller grid (e.g. "
                           f"{self.default_grid[0]}x{self.default_grid[1]})")
        return (H, W)

    # ---- prompts ---------------------------------------------------------------------------------------------
    def check_text(self, prompt) -> str:
        """The prompt as text, with one clear error when it is not text or the folder has no tokenizer."""
        if not isinstance(prompt, str):
            raise SSDError(f"{self.name} prompts are text (or a list of token ids), got {type(prompt).__name__}")
        if self.tokenizer is None:
            raise SSDError(f"the {self.name} model folder {self.folder} has no tokenizer (tokenizer.json / "
                           "tokenizer_config.json): copy them from the model's repo")
        return prompt

    def token_ids(self, text: str) -> list[int]:
        """Formatted prompt text -> ids by the folder's tokenizer (the family adds its special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
