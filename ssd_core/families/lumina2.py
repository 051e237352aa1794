"""`lumina2`: Lumina-mGPT 2.0 (Alpha-VLLM/Lumina-mGPT-2.0, 7B trained from scratch, 768 px).

The same Chameleon fork as Lumina-mGPT 1 (lumina_mgpt/model/chameleon/modeling_chameleon.py), so the released
weights load through lumina.py's model_class (the fork's [model_parallel_size, head_dim] q/k norms read as they
are: one place for both). What differs, as Alpha-VLLM/Lumina-mGPT-2.0 writes it:

- image tokens: a configured id range, code c = id 155000 + c (lumina_mgpt/inference_solver.py
  MultiModalLogitsProcessor: range(155000, 171383 + 1); decode_ids: `- 155000`), not named BPE tokens; a model
  whose vocabulary ends earlier has the codes that fit (the tiny test models);
- special tokens by name in the folder's tokenizer (data/item_processor.py FlexARItemProcessor): image start
  `<racm3:break>`, image end `<eoss>` (also the generation's EOS, id 151666), row end `<reserved08799>`, size
  tokens `<reserved{8800 + px/32:05d}>` (height, then width), turn separator `<reserved08706>`
  (data/convertsation.py);
- MoVQGAN-270M pixels, 8 px a token: a size token counts 32 px = 4 cells, so rows and columns are multiples of 4;
- prompt (generate_examples/generate.py, t2i): "Generate an image of {w}x{h} according to the following
  prompt:\\n{prompt}" + `<reserved08706>`, after the tokenizer's BOS, or its EOS where it has none (xllmx/model/
  tokenizer.py); the model writes the image start and the size tokens itself, the pack forces them;
- CFG as LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor: the unconditional stream is the
  sequence from the image start (image start + the two size tokens), guidance on raw logits. Its scale schedule,
  max(4.0, cfg * (1 - n / (h * w))) compounded each step, is the constant 4.0 at the README's cfg 4.0; other
  values are taken as given here (see docs/models-and-memory.md);
- defaults: README `--cfg 4.0 --top_k 4096 --temperature 1.0 --width 768 --height 768` (96x96 tokens).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from .. import model_files
from ..errors import SSDError, a_or_an
from ..pixel_decoders.movqgan import CONVERT_FIX, MoVQDecoder, find_movqgan, pickled_checkpoints
from ..session import Layout
from . import common
from .lumina import IMAGE_END, IMAGE_START, ROW_END, SIZE_BASE, TURN_END, LuminaModel, crop_size_grids
from .text import PROMPT_ALLOWANCE, TextGridModel

IMAGE_FIRST, IMAGE_LAST = 155000, 171383  # inference_solver.py: the image token ids, code c = id 155000 + c
IDS = {IMAGE_START: 151665, IMAGE_END: 151666, ROW_END: 151670}  # ids the release writes literally
CELLS_PER_SIZE = 4  # a size token counts 32-px units; MoVQGAN: 8 px a token
UPSTREAM_SIDE = 96  # README: --width 768 --height 768
MAX_GEN_LEN = 10240  # generate.py: max_gen_len=10240 new tokens, whatever config.json's positions say
REPO = "Alpha-VLLM/Lumina-mGPT-2.0"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # AutoTokenizer.from_pretrained(model_path)


def size_token_name(cells: int) -> str:
    return f"<reserved{SIZE_BASE + cells // CELLS_PER_SIZE:05d}>"


class Lumina2Model(LuminaModel):
    family = "lumina2"
    release = 2
    repo_ids = (REPO, "Alpha-VLLM/Lumina-mGPT-2.0-Omni")
    name = "Lumina-mGPT 2.0"
    extra_files = ("movqgan.safetensors (ai-forever/MoVQGAN's movqgan_270M.ckpt, which Lumina-mGPT 2.0's README "
                   "downloads, converted with `python -m ssd_core convert-movqgan movqgan_270M.ckpt "
                   "<folder>/movqgan.safetensors`)")
    load_options = ("movqgan", "grid")
    pixels_per_token = 8
    grid_tag = "lumina2"

    @classmethod
    def listed_grids(cls):
        # the size nearest each listed aspect of its resolution list, the square first
        return common.nearest_ratios(crop_size_grids(UPSTREAM_SIDE // CELLS_PER_SIZE, cells=CELLS_PER_SIZE))

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None, movqgan=None,
                 grid=None):
        TextGridModel.__init__(self, model, tokenizer, folder)
        cfg = model.config
        self.hidden_size = int(cfg.hidden_size)
        vocab_size = int(cfg.vocab_size)
        if vocab_size <= IMAGE_FIRST:
            raise SSDError(f"{folder or 'the model'}: vocab_size {vocab_size} does not reach Lumina-mGPT 2.0's "
                           f"image ids ({IMAGE_FIRST}-{IMAGE_LAST}): it is not a Lumina-mGPT 2.0 model")
        self.image_vocab_size = min(IMAGE_LAST + 1, vocab_size) - IMAGE_FIRST
        self.image_ids = torch.arange(IMAGE_FIRST, IMAGE_FIRST + self.image_vocab_size)  # a view of lm_head
        self.vocab = {}  # names come from the tokenizer (config.json's vocabulary_map names no image tokens)
        self.start_id = common.token_id(None, tokenizer, IMAGE_START, IDS[IMAGE_START])
        self.end_id = common.token_id(None, tokenizer, IMAGE_END, IDS[IMAGE_END])
        self.row_end_id = common.token_id(None, tokenizer, ROW_END, IDS[ROW_END])
        self.turn_end_id = common.token_id(None, tokenizer, TURN_END) if tokenizer is not None else None
        # xllmx Tokenizer: bos_id = the tokenizer's BOS, else its EOS
        self.bos_id = common.first_id(getattr(tokenizer, "bos_token_id", None),
                                      getattr(tokenizer, "eos_token_id", None))
        self.pad_id = common.first_id(getattr(tokenizer, "pad_token_id", None), self.bos_id, 0)
        # the release generates max_gen_len new tokens after the prompt whatever max_position_embeddings says
        self.max_positions = max(int(getattr(cfg, "max_position_embeddings", 0) or 0), MAX_GEN_LEN + PROMPT_ALLOWANCE)
        self.default_grid = (int(grid[0]), int(grid[1])) if grid is not None else (UPSTREAM_SIDE, UPSTREAM_SIDE)
        self.defaults = {
            "cfg": 4.0,  # README: --cfg 4.0
            "temperature": 1.0,  # README: --temperature 1.0
            "top_k": 4096,  # README: --top_k 4096 (create_logits_processor's image_top_k)
            "top_p": 1.0,  # inference_solver.py generate: GenerationConfig sets no top_p (transformers' 1.0)
            "min_p": 0.0,  # nor a min_p
        }
        self._movqgan_path = movqgan if isinstance(movqgan, (str, Path)) else find_movqgan(folder)
        self._movqgan = movqgan if isinstance(movqgan, MoVQDecoder) else None

    # ---- loading --------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, movqgan=None, **kwargs):
        """`movqgan`: a MoVQDecoder or the path of its safetensors file (default: movqgan.safetensors in the
        folder). The tokenizer files and the decoder are checked before any weights load."""
        folder = cls.ensure_folder(folder, download)
        missing = [n for n in TOKENIZER_FILES if not (Path(folder) / n).is_file()]
        if missing:
            raise SSDError(f"the Lumina-mGPT 2.0 folder {folder} lacks {' and '.join(missing)}: download them "
                           f"from {REPO} into it (its code reads the tokenizer from the model folder)")
        if movqgan is None:
            found = find_movqgan(folder)
            if found is None:
                pickled = pickled_checkpoints(folder)
                what = f"holds only the pickle {pickled[0].name}, which the pack never unpickles" if pickled \
                    else "has no movqgan.safetensors (the MoVQGAN-270M pixel decoder)"
                raise SSDError(f"the Lumina-mGPT 2.0 folder {folder} {what}: {CONVERT_FIX.format(folder=folder)}")
            model_files.inside(folder, os.path.relpath(found, folder), "the MoVQGAN file")
            MoVQDecoder.check_file(found)  # header and config only: a damaged file is refused before the model
        elif not isinstance(movqgan, MoVQDecoder) and not Path(movqgan).is_file():
            raise SSDError(f"MoVQGAN file {movqgan} does not exist; {CONVERT_FIX.format(folder=folder)}")
        return super(LuminaModel, cls).load(folder, dtype, device, None, movqgan=movqgan, **kwargs)

    # ---- the contract ----------------------------------------------------------------------------------------
    def check_grid(self, grid):
        H, W = tuple(int(v) for v in grid) if grid is not None else self.default_grid
        if H < CELLS_PER_SIZE or W < CELLS_PER_SIZE or H % CELLS_PER_SIZE or W % CELLS_PER_SIZE:
            raise SSDError(f"Lumina-mGPT 2.0 cannot make {a_or_an(f'{H}x{W}')} token grid: rows and columns must be "
                           "multiples "
                           "of 4 (its size tokens count 32-px units, 4 cells of 8 px)")
        for v in (H, W):
            if self.tokenizer is not None and self.tokenizer.convert_tokens_to_ids(size_token_name(v)) in (
                    None, getattr(self.tokenizer, "unk_token_id", None)):
                raise SSDError(f"Lumina-mGPT 2.0 has no size token for {a_or_an(f'{H}x{W}')} grid "
                               f"({size_token_name(v)} is not "
                               "in its tokenizer): choose a smaller grid")
        limit = self.max_positions - PROMPT_ALLOWANCE
        if self.sequence_length((H, W)) > limit:
            raise SSDError(f"Lumina-mGPT 2.0 cannot make {a_or_an(f'{H}x{W}')} token grid: it needs "
                           f"{self.sequence_length((H, W))} positions, its generation writes at most {limit}")
        return (H, W)

    def grid_options(self):
        out = [tuple(self.default_grid)]
        for g in crop_size_grids(self.default_grid[0] // CELLS_PER_SIZE, cells=CELLS_PER_SIZE):
            try:
                if g not in out:
                    out.append(self.check_grid(g))
            except SSDError:
                continue
        return out

    def layout(self, grid=None) -> Layout:
        return Layout.build(self.check_grid(grid), self.row_end_id, (self.end_id,))

    # ---- prompts ---------------------------------------------------------------------------------------------
    def require_tokenizer(self):
        """The size tokens and the turn separator are known by name only: a model without its tokenizer makes no
        prompt (load() refuses such a folder; this is for a model built without one)."""
        if self.tokenizer is None:
            raise SSDError(f"the Lumina-mGPT 2.0 model {self.folder or ''} has no tokenizer: download "
                           f"{' and '.join(TOKENIZER_FILES)} from {REPO} into its folder")
        return self.tokenizer

    def size_ids(self, grid) -> list[int]:
        return [common.token_id(None, self.require_tokenizer(), size_token_name(v)) for v in grid]

    def check_text(self, prompt) -> str:
        self.require_tokenizer()
        return TextGridModel.check_text(self, prompt)

    def prompt_text(self, prompt: str, grid) -> str:
        H, W = grid
        return f"Generate an image of {W * 8}x{H * 8} according to the following prompt:\n{prompt}"

    def build_prompt(self, prompt, negative_prompt: str = "", cfg: bool = True, grid=None):
        if negative_prompt:
            raise SSDError("Lumina-mGPT 2.0 takes no negative prompt (its unconditional stream is the image start "
                           "and size tokens alone): clear it")
        self.require_tokenizer()
        return super().build_prompt(prompt, "", cfg, grid)

    # ---- pixels ----------------------------------------------------------------------------------------------
    def movqgan(self) -> MoVQDecoder | None:
        if self._movqgan is None and self._movqgan_path is not None:
            self._movqgan = MoVQDecoder.load(self._movqgan_path, device="cpu", dtype=torch.float32)
        return self._movqgan

    def vqgan(self):
        return self.movqgan()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        vq = self.movqgan()
        if vq is None:
            warnings.warn(f"no movqgan.safetensors for the Lumina-mGPT 2.0 model {self.folder}, so no pixels: "
                          f"{CONVERT_FIX.format(folder=self.folder)}", stacklevel=2)
            return None
        dev = next(vq.parameters()).device
        return vq.decode_to_image(tokens[None].long().to(dev))[0].cpu()
