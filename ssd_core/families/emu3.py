"""`emu3`: Emu3-Gen through transformers' `Emu3ForConditionalGeneration`.

- features: `model.model.text_model`, pre-norm features from its final norm;
- image logits: `lm_head` restricted to the visual tokens, ordered by code (`vocabulary_mapping.img2bpe`);
- prompt: BOS + prompt + POSITIVE_SUFFIX + `<|image start|>{H}*{W}<|image token|>`, as BAAI's image_generation.py
  writes it (its POSITIVE_PROMPT appended, then Emu3Processor's generation prefix); `official_suffix=False` leaves
  the suffix out. The negative prompt (the unconditional row) carries the same image prefix; an empty one is BAAI's
  NEGATIVE_PROMPT. Prompts are not stripped: Emu3's processor (processing_emu3.py, Emu3Processor.__call__) writes
  the text as given;
- layout: H rows of (W visual tokens + the forced end-of-line `<|extra_200|>`), row stride W + 1, then the forced
  tail `<|extra_201|>`, `<|image end|>`, EOS;
- CFG: the negative prompt (with the same image prefix) is the second row of ONE batch, left-padded; not
  transformers' unbatched guidance processor, which runs a second forward per step;
- resolution selectable: any H x W grid that fits the model's positions (90x90 = 720 px upstream);
- pixels: the VQ model (`model.model.vqmodel.decode`).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from ..errors import SSDError
from ..session import Layout, Prompt
from . import common
from .text import TextGridModel

IMAGE_START, IMAGE_END = "<|image start|>", "<|image end|>"
IMAGE_WRAPPER, EOL, EOF = "<|image token|>", "<|extra_200|>", "<|extra_201|>"
# baaivision/Emu3 image_generation.py: POSITIVE_PROMPT, appended to every user prompt, and NEGATIVE_PROMPT, the
# unconditional row's text (the same two in BAAI/Emu3-Gen's model card and the Emu3-Gen-hf example)
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."
DEFAULT_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                    "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                    "username, blurry.")
UPSTREAM_SIDE = 90  # 720 px at f = 8
RATIOS = common.LISTED_RATIOS

def ratio_grids(default_grid) -> list[tuple[int, int]]:
    """The default grid, then its area at each of RATIOS (width:height) as (rows, cols)."""
    area = default_grid[0] * default_grid[1]
    out = [tuple(default_grid)]
    for rw, rh in RATIOS:
        s = math.sqrt(area / (rw * rh))
        g = (max(1, round(rh * s)), max(1, round(rw * s)))
        if g not in out:
            out.append(g)
    return out


class Emu3Model(TextGridModel):
    family = "emu3"
    repo_ids = ("BAAI/Emu3-Gen-hf",)
    model_types = ("emu3",)
    architectures = ("Emu3ForConditionalGeneration",)
    transformers_class = "Emu3ForConditionalGeneration"
    name = "Emu3"
    negative_prompts = True
    load_options = ("grid",)
    prompt_switches = ("official_suffix",)  # build_prompt switches generate() passes on (api.prompt_switches)
    pixels_per_token = 8

    @classmethod
    def listed_grids(cls):
        return ratio_grids((UPSTREAM_SIDE, UPSTREAM_SIDE))

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None, grid=None):
        super().__init__(model, tokenizer, folder)
        cfg = model.config
        self.hidden_size = int(cfg.text_config.hidden_size)
        vm = model.model.vocabulary_mapping
        img2bpe = vm.img2bpe
        n = len(img2bpe)
        if n == 0 or sorted(img2bpe) != list(range(n)):
            raise SSDError(f"Emu3 model {folder or ''}: its vocabulary_map has no complete set of "
                           "'<|visual token NNNNNN|>' entries")
        self.image_vocab_size = n
        self.image_ids = torch.tensor([img2bpe[c] for c in range(n)], dtype=torch.long)
        vocab = cfg.vocabulary_map
        self.eol_id = common.token_id(vocab, tokenizer, EOL)
        self.eof_id = common.token_id(vocab, tokenizer, EOF)
        self.eoi_id = common.token_id(vocab, tokenizer, IMAGE_END)
        tc = cfg.text_config
        gen = getattr(model, "generation_config", None)
        self.bos_id = common.first_id(getattr(tokenizer, "bos_token_id", None), tc.bos_token_id,
                                   getattr(gen, "bos_token_id", None))
        self.eos_id = common.first_id(getattr(tokenizer, "eos_token_id", None), tc.eos_token_id,
                                   getattr(gen, "eos_token_id", None))
        self.pad_id = common.first_id(getattr(tokenizer, "pad_token_id", None), tc.pad_token_id, self.eos_id)
        if self.bos_id is None or self.eos_id is None:
            raise SSDError(f"Emu3 model {folder or ''} lacks BOS / EOS token ids in its config")
        self.max_positions = int(getattr(tc, "max_position_embeddings", 9216))
        self.default_grid = (int(grid[0]), int(grid[1])) if grid is not None else self.largest_square(UPSTREAM_SIDE)
        self.pixel_norm = common.pixel_normalization(folder)
        # baaivision/Emu3 image_generation.py: classifier_free_guidance = 3.0, GenerationConfig(do_sample=True,
        # top_k=2048) (temperature and top_p left at 1), image_area = config.image_area = 720 * 720 (UPSTREAM_SIDE)
        self.defaults = {"cfg": 3.0, "temperature": 1.0, "top_k": 2048, "top_p": 1.0, "min_p": 0.0}

    # ---- the contract ----------------------------------------------------------------------------------------
    def backbone(self):
        return self.model.model.text_model

    def final_norm(self):
        return self.model.model.text_model.norm

    def sequence_length(self, grid) -> int:
        H, W = grid
        return H * (W + 1) + 3

    check_grid = TextGridModel.check_grid_positions  # any H x W its positions hold

    def grid_options(self):
        """The default area at Emu3's processor's aspect ratios (its `calculate_generate_size`)."""
        return [g for g in ratio_grids(self.default_grid) if g == tuple(self.default_grid) or self.fits(g)]

    def layout(self, grid=None) -> Layout:
        return Layout.build(self.check_grid(grid), self.eol_id, (self.eof_id, self.eoi_id, self.eos_id))

    # ---- prompts ---------------------------------------------------------------------------------------------
    def image_prefix(self, grid) -> str:
        H, W = grid
        return f"{IMAGE_START}{H}*{W}{IMAGE_WRAPPER}"

    def prefix_ids(self, grid) -> list[int]:
        """`<|image start|>{H}*{W}<|image token|>` as ids: through the tokenizer, or without one character by
        character from the vocabulary map (digits and '*' are single tokens in Emu3's vocabulary)."""
        if self.tokenizer is not None:
            return list(self.tokenizer(self.image_prefix(grid), add_special_tokens=False)["input_ids"])
        vocab = self.model.config.vocabulary_map
        H, W = grid
        try:
            return [vocab[IMAGE_START]] + [vocab[c] for c in f"{H}*{W}"] + [vocab[IMAGE_WRAPPER]]
        except KeyError as err:
            raise SSDError(f"the Emu3 model has no tokenizer and its vocabulary map lacks {err}") from None

    def text_ids(self, text, grid, suffix: str = "") -> list[int]:
        """BOS + text (+ suffix) + the image prefix. Token ids stand for text already formatted: no suffix."""
        given = [] if text == "" and self.tokenizer is None else common.token_id_list(text)
        if given is not None:
            return [self.bos_id] + given + self.prefix_ids(grid)
        return [self.bos_id] + self.token_ids(self.check_text(text) + suffix + self.image_prefix(grid))

    def build_prompt(self, prompt, negative_prompt=None, cfg: bool = True, grid=None,
                     official_suffix: bool = True) -> Prompt:
        """The prompt row (+ POSITIVE_SUFFIX unless official_suffix is False) and, with cfg, the negative row; a
        negative of None or "" is BAAI's NEGATIVE_PROMPT (without a tokenizer "" stays empty: ids only)."""
        grid = self.check_grid(grid)
        rows = [self.text_ids(prompt, grid, POSITIVE_SUFFIX if official_suffix else "")]
        if cfg:
            official = negative_prompt is None or (negative_prompt == "" and self.tokenizer is not None)
            rows.append(self.text_ids(DEFAULT_NEGATIVE if official else negative_prompt, grid))
        ids, mask = common.left_pad(rows, self.pad_id)
        return Prompt(ids, mask)

    # ---- pixels ----------------------------------------------------------------------------------------------
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        vq = self.model.model.vqmodel
        dev = next(vq.parameters()).device
        with torch.no_grad():
            img = vq.decode(tokens[None].long().to(dev))[0]  # [3, H_px, W_px], normalized as the processor's input
        return common.to_unit_image(img.permute(1, 2, 0), self.pixel_norm)
