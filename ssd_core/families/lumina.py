"""`lumina`: Lumina-mGPT (Chameleon-based) through transformers' `ChameleonForConditionalGeneration`.

- features: `model.model`, pre-norm features from its final norm;
- image logits: `lm_head` over the model's features restricted to the image tokens, ordered by code
  (`vocabulary_mapping.bpe2img`). Chameleon's own forward sets every image-token logit to the dtype minimum, so
  it is never used;
- prompt, as Lumina-mGPT writes it: BOS + "Generate an image of {w}x{h} according to the following prompt:\\n
  {prompt}" + `<reserved08706>` (its turn separator), then the image start `<racm3:break>` and two size tokens
  `<reserved{08800 + size/32}>` (ids 8804 + size/32: height, then width), which Lumina-mGPT's model would
  write itself and we force;
- layout: rows of image tokens each followed by the row-end `<reserved08799>` (8803), then `<eoss>` (8196);
- CFG: the unconditional stream is what Lumina-mGPT's guidance processor feeds: the sequence from the image start
  on (image start + the two size tokens), left-padded into one batch with the conditional row;
- pixels: Meta's Chameleon VQGAN (`ssd_core.pixel_decoders.chameleon_vqgan`), read from `vqgan.safetensors` in
  the model folder or a given path (convert the released `vqgan.ckpt` with
  `python -m ssd_core convert-vqgan vqgan.ckpt <folder>/vqgan.safetensors`);
- the released folders (Alpha-VLLM/Lumina-mGPT-7B-512 / -768 / -1024) load as they are: Lumina-mGPT's fork of
  Chameleon wrote them, with each layer's q/k norm weight and bias as [model_parallel_size, head_dim] (applied
  to every head, ForkHeadNorm) and no `model.vqmodel.*` (its finetune solver deletes the VQ encoder, which the
  pack never uses). The resolution a folder was trained for is in its name (`-512` / `-768` / `-1024`), not in
  its config.json.
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import torch

from .. import model_files
from ..errors import SSDError, a_or_an, reason
from ..pixel_decoders.chameleon_vqgan import VQGANDecoder, find_vqgan
from ..session import Layout, Prompt
from . import common
from .text import PROMPT_ALLOWANCE, TextGridModel

IMAGE_START, IMAGE_END, ROW_END, TURN_END = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
# Lumina-mGPT's ids in Chameleon's vocabulary (used when a name is missing from a model's vocabulary)
IDS = {IMAGE_START: 8197, IMAGE_END: 8196, ROW_END: 8803, TURN_END: 8710}
SIZE_BASE = 8800  # size token name: <reserved{8800 + px/32:05d}>, id 8804 + px/32
UPSTREAM_SIDE = 48  # 768 px: Alpha-VLLM/Lumina-mGPT-7B-768, the README's model
RELEASED_SIDE = re.compile(r"-(512|768|1024)(?:-|$)")  # a released folder's name: Lumina-mGPT-7B-768(-Omni)
VQGAN_FIX = ("convert Meta's Chameleon tokenizer/vqgan.ckpt with `python -m ssd_core convert-vqgan vqgan.ckpt "
             "<model folder>/vqgan.safetensors`")
TOKENIZER_REPO = "Alpha-VLLM/Lumina-mGPT-7B-768"  # where Lumina-mGPT's item processor takes its tokenizer from


def release_of(config: dict) -> int:
    """Which Lumina-mGPT a fork config.json is: 2 when its vocabulary reaches Lumina-mGPT 2.0's image ids
    (155000-171383, families/lumina2.py), else 1 (Chameleon's 65,536 ids, image tokens named in vocabulary_map)."""
    vocab = config.get("vocab_size")
    return 2 if isinstance(vocab, int) and vocab > 155000 else 1


def upstream_side(folder) -> int:
    """The grid side a folder's model was trained for: its name's resolution (the released repos' names end in
    -512 / -768 / -1024, px / 16 tokens a side), else 768 px."""
    found = RELEASED_SIDE.search(Path(folder).name) if folder is not None else None
    return int(found.group(1)) // 16 if found else UPSTREAM_SIDE


class ForkHeadNorm(torch.nn.Module):
    """Lumina-mGPT's q/k norm as its fork writes it (lumina_mgpt/model/chameleon/modeling_chameleon.py,
    ChameleonLayerNorm): weight and bias [model_parallel_size, head_dim], each row serving its shard's heads
    (repeat_interleave), statistics over head_dim alone, eps 1e-5."""

    def __init__(self, rows: int, head_dim: int, heads: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(rows, head_dim))  # [model_parallel_size, head_dim]
        self.bias = torch.nn.Parameter(torch.zeros(rows, head_dim))
        self.heads_per_row = heads // rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [tokens, heads, head_dim]
        x = torch.nn.functional.layer_norm(x, (x.shape[-1],), None, None, eps=1e-5)
        return x * self.weight.repeat_interleave(self.heads_per_row, 0) + \
            self.bias.repeat_interleave(self.heads_per_row, 0)


def norm_rows(folder, config: dict, files=None) -> int | None:
    """model_parallel_size when the folder's weights hold the fork's q/k norms ([model_parallel_size, head_dim]
    rather than transformers' [heads, head_dim]), else None (read from the safetensors headers only). files: the
    safetensors files to read (default: the folder's weights, checked; check-model passes the shards present)."""
    from safetensors import safe_open

    key = "model.layers.0.self_attn.q_norm.weight"
    rows, heads = config.get("model_parallel_size", 1), config.get("num_attention_heads")
    if rows is None:
        rows = 1
    if not isinstance(rows, int) or isinstance(rows, bool) or not isinstance(heads, int) or rows < 1 or heads % rows:
        raise SSDError(f"{Path(folder) / 'config.json'}: model_parallel_size is {rows!r}; it must be a whole number "
                       f"that divides num_attention_heads ({heads!r}), 1 in the released Lumina-mGPT models: fix "
                       "config.json, or re-download the model")
    for path in model_files.check_weights(folder, config) if files is None else files:  # readable headers
        with safe_open(str(path), framework="pt") as f:
            if key in f.keys():
                shape = f.get_slice(key).get_shape()
                return rows if len(shape) == 2 and shape[0] == rows != heads else None
    return None


_RELEASED_CLASSES: dict = {}


def released_class(rows: int):
    """ChameleonForConditionalGeneration whose q/k norms are ForkHeadNorm of `rows` rows: it reads the released
    weights as they are (nothing converted, no copy) and computes what Lumina-mGPT's fork computes."""
    if rows not in _RELEASED_CLASSES:
        from transformers import ChameleonForConditionalGeneration

        class LuminaReleasedChameleon(ChameleonForConditionalGeneration):
            layout_note = f"q/k norms as [{rows}, head_dim], Lumina-mGPT's released layout, read as they are"

            def __init__(self, config):
                super().__init__(config)
                heads, kv = config.num_attention_heads, config.num_key_value_heads
                head_dim = config.hidden_size // heads
                for layer in self.model.layers:
                    layer.self_attn.q_norm = ForkHeadNorm(rows, head_dim, heads)
                    layer.self_attn.k_norm = ForkHeadNorm(rows, head_dim, kv)

        _RELEASED_CLASSES[rows] = LuminaReleasedChameleon
    return _RELEASED_CLASSES[rows]


def size_token_name(cells: int) -> str:
    return f"<reserved{SIZE_BASE + cells // 2:05d}>"


def crop_size_grids(side_patches: int, max_ratio: float = 4.0, cells: int = 2) -> list[tuple[int, int]]:
    """Lumina-mGPT's resolution list (its generate_crop_size_list over 32-px patches) as (rows, cols) grids of
    `cells` tokens a patch (2: Lumina-mGPT's 16-px tokens; 4: Lumina-mGPT 2.0's 8-px MoVQGAN tokens)."""
    num = side_patches * side_patches
    out = []
    wp, hp = num, 1
    while wp > 0:
        if max(wp, hp) / min(wp, hp) <= max_ratio:
            out.append((hp * cells, wp * cells))
        if (hp + 1) * wp <= num:
            hp += 1
        else:
            wp -= 1
    return out


class LuminaModel(TextGridModel):
    family = "lumina"
    repo_ids = ("Alpha-VLLM/Lumina-mGPT-7B-768", "Alpha-VLLM/Lumina-mGPT-7B-512", "Alpha-VLLM/Lumina-mGPT-7B-1024")
    model_types = ("chameleon",)
    architectures = ("ChameleonForConditionalGeneration",
                     "ChameleonXLLMXForConditionalGeneration")  # the second: Lumina-mGPT's released config.json
    extra_files = ("vqgan.safetensors (Meta's Chameleon tokenizer/vqgan.ckpt converted with "
                   "`python -m ssd_core convert-vqgan vqgan.ckpt <folder>/vqgan.safetensors`)")
    # Lumina-mGPT's finetune solver deletes the VQ encoder before saving (lumina_mgpt/finetune_solver.py,
    # _model_func: `del model.model.vqmodel`); pixels come from vqgan.safetensors
    optional_weights = ("model.vqmodel.",)
    transformers_class = "ChameleonForConditionalGeneration"
    name = "Lumina-mGPT"
    negative_prompts = False  # the unconditional stream is the image start and size tokens alone
    load_options = ("vqgan", "grid")
    pixels_per_token = 16
    release = 1  # which Lumina-mGPT (release_of): lumina2's subclass is 2

    @classmethod
    def fits_config(cls, config: dict) -> bool:
        """Both releases name the same architecture: the config tells them apart (families.detect_family)."""
        return release_of(config) == cls.release

    @classmethod
    def check_folder(cls, folder) -> dict:
        cfg = super().check_folder(folder)
        if not cls.fits_config(cfg):
            other, family = ("Lumina-mGPT 2.0", "lumina2") if release_of(cfg) == 2 else ("Lumina-mGPT 1", "lumina")
            raise SSDError(f"{folder} holds {a_or_an(other)} model (vocab_size {cfg.get('vocab_size')}), not a "
                           f"{cls.name} "
                           f"model: load it as family {family!r}")
        return cfg

    @classmethod
    def listed_grids(cls):
        return common.nearest_ratios(crop_size_grids(UPSTREAM_SIDE // 2))  # 7 of its 73 sizes, the square first

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None, vqgan=None,
                 grid=None):
        super().__init__(model, tokenizer, folder)
        cfg = model.config
        self.hidden_size = int(cfg.hidden_size)
        vm = model.model.vocabulary_mapping
        bpe2img = vm.bpe2img
        n = len(bpe2img)
        img2bpe = {c: b for b, c in bpe2img.items()}
        if n == 0 or sorted(img2bpe) != list(range(n)):
            raise SSDError(f"Lumina-mGPT model {folder or ''}: its vocabulary_map has no complete set of "
                           "'IMGIMG...Z' image tokens")
        self.image_vocab_size = n
        self.image_ids = torch.tensor([img2bpe[c] for c in range(n)], dtype=torch.long)
        self.vocab = dict(cfg.vocabulary_map or {})
        self.start_id = common.token_id(self.vocab, tokenizer, IMAGE_START, IDS[IMAGE_START])
        self.end_id = common.token_id(self.vocab, tokenizer, IMAGE_END, IDS[IMAGE_END])
        self.row_end_id = common.token_id(self.vocab, tokenizer, ROW_END, IDS[ROW_END])
        self.turn_end_id = common.token_id(self.vocab, tokenizer, TURN_END, IDS[TURN_END])
        self.bos_id = common.first_id(getattr(tokenizer, "bos_token_id", None), cfg.bos_token_id)
        self.pad_id = common.first_id(getattr(tokenizer, "pad_token_id", None), cfg.pad_token_id, 1)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 4096))
        self.default_grid = (int(grid[0]), int(grid[1])) if grid is not None else \
            self.largest_square(upstream_side(folder), step=2, smallest=2)  # even sides: size tokens count 2 cells
        self.defaults = {
            "cfg": 4.0,  # README.md, image generation: create_logits_processor(cfg=4.0, image_top_k=2000)
            "temperature": 1.0,  # README.md: inference_solver.generate(..., temperature=1.0)
            "top_k": 2000,  # README.md image_top_k=2000 (inference_solver.py create_logits_processor's default too)
            "top_p": 1.0,  # inference_solver.py generate: GenerationConfig sets no top_p (transformers' 1.0)
            "min_p": 0.0,  # nor a min_p
        }
        self._vqgan_path = find_vqgan(str(folder) if folder else None, vqgan if isinstance(vqgan, str) else None)
        if self._vqgan_path is not None and not isinstance(vqgan, str):  # found in the folder: it must lie inside
            self._vqgan_path = str(model_files.inside(folder, os.path.relpath(self._vqgan_path, folder), "the VQGAN file"))
        self._vqgan = vqgan if isinstance(vqgan, VQGANDecoder) else None

    # ---- loading --------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, vqgan=None, **kwargs):
        """`vqgan`: a VQGANDecoder or the path of its safetensors file (default: vqgan.safetensors in the folder).
        A released folder (the fork's q/k norms) loads through released_class (model_class)."""
        if vqgan is not None and not isinstance(vqgan, VQGANDecoder) and not Path(vqgan).is_file():
            raise SSDError(f"VQGAN file {vqgan} does not exist; {VQGAN_FIX}")
        return super().load(folder, dtype, device, download, vqgan=str(vqgan) if isinstance(vqgan, Path) else vqgan,
                            **kwargs)

    @classmethod
    def model_class(cls, folder, config: dict | None = None, files=None):
        """A released folder (the fork's q/k norms, norm_rows) reads through released_class, any other through
        transformers' ChameleonForConditionalGeneration."""
        rows = norm_rows(folder, model_files.read_config(folder) if config is None else config, files)
        return released_class(rows) if rows is not None else super().model_class(folder, config, files)

    # ---- the contract ----------------------------------------------------------------------------------------
    def backbone(self):
        return self.model.model

    def final_norm(self):
        return self.model.model.norm

    def sequence_length(self, grid) -> int:
        H, W = grid
        return H * (W + 1) + 1

    def check_grid(self, grid):
        H, W = tuple(int(v) for v in grid) if grid is not None else self.default_grid
        if H < 2 or W < 2 or H % 2 or W % 2:
            raise SSDError(f"Lumina-mGPT cannot make {a_or_an(f'{H}x{W}')} token grid: rows and columns must be even "
                           "(its size tokens count 32-px units, 2 cells)")
        size_ok = all(size_token_name(v) in self.vocab or not self.vocab for v in (H, W))
        if not size_ok:
            raise SSDError(f"Lumina-mGPT has no size token for {a_or_an(f'{H}x{W}')} grid "
                           f"({size_token_name(max(H, W))} is "
                           "not in its vocabulary)")
        limit = self.max_positions - PROMPT_ALLOWANCE
        if self.sequence_length((H, W)) > limit:
            raise SSDError(f"Lumina-mGPT cannot make {a_or_an(f'{H}x{W}')} token grid: it needs "
                           f"{self.sequence_length((H, W))} "
                           f"positions and {limit} are free after the prompt")
        return (H, W)

    def grid_options(self):
        out = [tuple(self.default_grid)]
        for g in crop_size_grids(self.default_grid[0] // 2):
            if g not in out:
                try:
                    self.check_grid(g)
                except SSDError:
                    continue
                out.append(g)
        return out

    def layout(self, grid=None) -> Layout:
        return Layout.build(self.check_grid(grid), self.row_end_id, (self.end_id,))

    # ---- prompts ---------------------------------------------------------------------------------------------
    def size_ids(self, grid) -> list[int]:
        H, W = grid
        return [common.token_id(self.vocab, self.tokenizer, size_token_name(v), IDS[ROW_END] + 1 + v // 2)
                for v in (H, W)]

    def image_prefix_ids(self, grid) -> list[int]:
        return [self.start_id] + self.size_ids(grid)

    def check_text(self, prompt) -> str:
        if isinstance(prompt, str) and self.tokenizer is None:
            raise SSDError(f"the Lumina-mGPT model folder {self.folder} has no tokenizer: copy the tokenizer files of "
                           f"{TOKENIZER_REPO} (tokenizer.json, tokenizer_config.json, special_tokens_map.json) into "
                           "it; Lumina-mGPT's own code reads its tokenizer from there for every model")
        return super().check_text(prompt)

    def prompt_text(self, prompt: str, grid) -> str:
        H, W = grid
        return f"Generate an image of {W * 16}x{H * 16} according to the following prompt:\n{prompt}"

    def build_prompt(self, prompt, negative_prompt: str = "", cfg: bool = True, grid=None) -> Prompt:
        if negative_prompt:
            raise SSDError("Lumina-mGPT takes no negative prompt (its unconditional stream is the image start "
                           "and size tokens alone): clear it")
        grid = self.check_grid(grid)
        bos = self.bos_id if self.bos_id is not None else common.first_id(getattr(self.tokenizer, "eos_token_id", None))
        given = common.token_id_list(prompt)
        if given is not None:  # already tokenized prompt text (e.g. a benchmark without a tokenizer)
            ids = given + [self.turn_end_id]
        else:
            # as Lumina-mGPT's item processor: [BOS] + encode(conversation, add_special_tokens=False), the turn
            # ending in its separator token
            text = self.prompt_text(self.check_text(prompt), grid)
            ids = self.token_ids(text + TURN_END)
            if not ids or ids[-1] != self.turn_end_id:
                ids = self.token_ids(text) + [self.turn_end_id]
        text_ids = ([bos] if bos is not None else []) + ids
        prefix = self.image_prefix_ids(grid)
        rows = [text_ids + prefix]
        if cfg:
            rows.append(prefix)
        ids, mask = common.left_pad(rows, self.pad_id)
        return Prompt(ids, mask)

    # ---- pixels ----------------------------------------------------------------------------------------------
    def vqgan(self) -> VQGANDecoder | None:
        if self._vqgan is None and self._vqgan_path is not None:
            try:
                self._vqgan = VQGANDecoder.load(self._vqgan_path, device="cpu", dtype=torch.float32)
            except (MemoryError, torch.OutOfMemoryError):
                raise
            except Exception as err:  # noqa: BLE001 -- safetensors and the decoder raise several types
                first = reason(err, 1000).replace(f"{self._vqgan_path}: ", "").replace(repr(self._vqgan_path), "it")
                raise SSDError(f"the VQGAN file {self._vqgan_path} is not a usable converted Chameleon VQGAN "
                               f"({first[:300]}); {VQGAN_FIX} again") from None
        return self._vqgan

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        vq = self.vqgan()
        if vq is None:
            warnings.warn(f"no vqgan.safetensors in the Lumina-mGPT model folder {self.folder}, so no pixels: "
                          f"{VQGAN_FIX}", stacklevel=2)
            return None
        dev = next(vq.parameters()).device
        return vq.decode_to_image(tokens[None].long().to(dev))[0].cpu()
