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
  `python -m ssd_core.pixel_decoders.convert_vqgan`).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .. import hub
from ..errors import SSDError
from ..session import Layout, Prompt
from .base import GridModel, head_rows_logits
from ..pixel_decoders.chameleon_vqgan import VQGANDecoder, find_vqgan

IMAGE_START, IMAGE_END, ROW_END, TURN_END = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
# Lumina-mGPT's ids in Chameleon's vocabulary (used when a name is missing from a model's vocabulary)
IDS = {IMAGE_START: 8197, IMAGE_END: 8196, ROW_END: 8803, TURN_END: 8710}
SIZE_BASE = 8800  # size token name: <reserved{8800 + px/32:05d}>, id 8804 + px/32
PATCH_PX = 32  # Lumina-mGPT's size unit; a grid cell is 16 px, so a size token counts 2 cells
UPSTREAM_SIDE = 48  # 768 px

# Lumina-mGPT-7B (Chameleon-7B) shapes, to time one step of the full-size architecture with random weights
SHAPES = {
    "Lumina-mGPT-7B": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 65536,
                       "max_position_embeddings": 10240, "codes": 8192},
}


def random_vocabulary(vocab_size: int, codes: int) -> dict[str, int]:
    """A vocabulary map laid out as Chameleon's: <s> <pad> </s>, image tokens from id 4 in code order, then
    <eoss>, <racm3:break> and the reserved tokens at their real ids (<reservedNNNNN> = NNNNN + 4)."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2}
    digits = {str(i): chr(ord("A") + i) for i in range(10)}
    vocab.update({"IMGIMG" + "".join(digits[c] for c in str(i)) + "Z": 4 + i for i in range(codes)})
    vocab.update({IMAGE_END: 4 + codes, IMAGE_START: 5 + codes})
    for n in range(6 + codes, vocab_size):
        if n - 4 >= 0 and n - 4 >= 8700 and n - 4 < 8900:
            vocab[f"<reserved{n - 4:05d}>"] = n
    return vocab


def random_config(shapes="Lumina-mGPT-7B"):
    from transformers import ChameleonConfig

    sh = dict(SHAPES[shapes] if isinstance(shapes, str) else shapes)
    codes = sh.pop("codes")
    return ChameleonConfig(bos_token_id=0, pad_token_id=1, eos_token_id=2,
                           vocabulary_map=random_vocabulary(sh["vocab_size"], codes),
                           vq_config=dict(num_embeddings=codes, base_channels=32, channel_multiplier=[1, 1],
                                          num_res_blocks=1, embed_dim=8, latent_channels=8), **sh)


def size_token_name(cells: int) -> str:
    return f"<reserved{SIZE_BASE + cells // 2:05d}>"


def crop_size_grids(side_patches: int, max_ratio: float = 4.0) -> list[tuple[int, int]]:
    """Lumina-mGPT's resolution list (its generate_crop_size_list over 32-px patches) as (rows, cols) grids."""
    num = side_patches * side_patches
    out = []
    wp, hp = num, 1
    while wp > 0:
        if max(wp, hp) / min(wp, hp) <= max_ratio:
            out.append((hp * 2, wp * 2))
        if (hp + 1) * wp <= num:
            hp += 1
        else:
            wp -= 1
    return out


class LuminaModel(GridModel):
    family = "lumina"
    text_prompts = True
    negative_prompts = False
    training_prompts = list(hub.TRAINING_PROMPTS)

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None, vqgan=None,
                 grid=None):
        super().__init__(model)
        cfg = model.config
        self.folder = folder
        self.tokenizer = tokenizer
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
        self.start_id = hub.token_id(self.vocab, tokenizer, IMAGE_START, IDS[IMAGE_START])
        self.end_id = hub.token_id(self.vocab, tokenizer, IMAGE_END, IDS[IMAGE_END])
        self.row_end_id = hub.token_id(self.vocab, tokenizer, ROW_END, IDS[ROW_END])
        self.turn_end_id = hub.token_id(self.vocab, tokenizer, TURN_END, IDS[TURN_END])
        self.bos_id = hub.first_id(getattr(tokenizer, "bos_token_id", None), cfg.bos_token_id)
        self.pad_id = hub.first_id(getattr(tokenizer, "pad_token_id", None), cfg.pad_token_id, 1)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 4096))
        if grid is not None:
            self.default_grid = (int(grid[0]), int(grid[1]))
        else:
            side = UPSTREAM_SIDE
            while side > 2 and self._length((side, side)) > self.max_positions - 256:
                side -= 2
            self.default_grid = (side, side)
        self.defaults = {"cfg": 3.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}
        self._vqgan_path = find_vqgan(str(folder) if folder else None, vqgan if isinstance(vqgan, str) else None)
        self._vqgan = vqgan if isinstance(vqgan, VQGANDecoder) else None

    # ---- loading ---------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, vqgan=None, grid=None, **kwargs):
        from transformers import ChameleonForConditionalGeneration

        folder = hub.ensure_folder(folder, cls.family, download)
        if vqgan is not None and not isinstance(vqgan, VQGANDecoder) and not Path(vqgan).is_file():
            raise SSDError(f"VQGAN file {vqgan} does not exist; convert Meta's vqgan.ckpt with `python -m "
                           "ssd_core.pixel_decoders.convert_vqgan vqgan.ckpt <model folder>/vqgan.safetensors`")
        model = hub.load_pretrained(ChameleonForConditionalGeneration, folder, dtype, device, **kwargs)
        return cls(model, hub.load_tokenizer(folder), Path(folder), str(vqgan) if isinstance(vqgan, Path) else vqgan,
                   grid)

    @classmethod
    def random_init(cls, shapes="Lumina-mGPT-7B", device="cpu", dtype=torch.bfloat16, seed: int = 0, grid=None,
                    vqgan=None):
        """A random-weight model of the released shapes, no files and no tokenizer (prompts as token ids)."""
        from transformers import ChameleonForConditionalGeneration

        model = hub.build_random(ChameleonForConditionalGeneration, random_config(shapes), device, dtype, seed)
        return cls(model, None, None, vqgan, grid)

    # ---- the contract ----------------------------------------------------------------------------------------
    def backbone(self):
        return self.model.model

    def final_norm(self):
        return self.model.model.norm

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return head_rows_logits(normed, self.model.lm_head, self.image_ids)

    def code_to_id(self, codes: torch.Tensor) -> torch.Tensor:
        return self.image_ids.to(codes.device)[codes]

    def _length(self, grid) -> int:
        H, W = grid
        return H * (W + 1) + 1

    def check_grid(self, grid):
        H, W = tuple(int(v) for v in grid) if grid is not None else self.default_grid
        if H < 2 or W < 2 or H % 2 or W % 2:
            raise SSDError(f"Lumina-mGPT cannot make a {H}x{W} token grid: rows and columns must be even "
                           "(its size tokens count 32-px units, 2 cells)")
        size_ok = all(size_token_name(v) in self.vocab or not self.vocab for v in (H, W))
        if not size_ok:
            raise SSDError(f"Lumina-mGPT has no size token for a {H}x{W} grid ({size_token_name(max(H, W))} is "
                           "not in its vocabulary)")
        limit = self.max_positions - 256
        if self._length((H, W)) > limit:
            raise SSDError(f"Lumina-mGPT cannot make a {H}x{W} token grid: it needs {self._length((H, W))} "
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
        return [hub.token_id(self.vocab, self.tokenizer, size_token_name(v), IDS[ROW_END] + 1 + v // 2)
                for v in (H, W)]

    def image_prefix_ids(self, grid) -> list[int]:
        return [self.start_id] + self.size_ids(grid)

    def prompt_text(self, prompt: str, grid) -> str:
        H, W = grid
        return f"Generate an image of {W * 16}x{H * 16} according to the following prompt:\n{prompt}"

    def build_prompt(self, prompt, negative_prompt: str = "", cfg: bool = True, grid=None) -> Prompt:
        if negative_prompt:
            raise SSDError("Lumina-mGPT takes no negative prompt (its unconditional stream is the image start "
                           "and size tokens alone): clear it")
        grid = self.check_grid(grid)
        bos = self.bos_id if self.bos_id is not None else hub.first_id(getattr(self.tokenizer, "eos_token_id", None))
        given = hub.token_id_list(prompt)
        if given is not None:  # already tokenized prompt text (e.g. a benchmark without a tokenizer)
            ids = given + [self.turn_end_id]
        elif not isinstance(prompt, str):
            raise SSDError(f"a Lumina-mGPT prompt is text (or a list of token ids), got {type(prompt).__name__}")
        elif self.tokenizer is None:
            raise SSDError(f"the Lumina-mGPT model folder {self.folder} has no tokenizer (tokenizer.json / "
                           "tokenizer_config.json): copy them from the model's repo")
        else:
            # as Lumina-mGPT's item processor: [BOS] + encode(conversation, add_special_tokens=False), the turn
            # ending in its separator token
            text = self.prompt_text(prompt, grid)
            ids = list(self.tokenizer(text + TURN_END, add_special_tokens=False)["input_ids"])
            if not ids or ids[-1] != self.turn_end_id:
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.turn_end_id]
        text_ids = ([bos] if bos is not None else []) + ids
        prefix = self.image_prefix_ids(grid)
        rows = [text_ids + prefix]
        if cfg:
            rows.append(prefix)
        ids, mask = hub.left_pad(rows, self.pad_id)
        return Prompt(ids, mask)

    # ---- pixels ----------------------------------------------------------------------------------------------
    def vqgan(self) -> VQGANDecoder | None:
        if self._vqgan is None and self._vqgan_path is not None:
            self._vqgan = VQGANDecoder.load(self._vqgan_path, device="cpu", dtype=torch.float32)
        return self._vqgan

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        vq = self.vqgan()
        if vq is None:
            warnings.warn(f"no VQGAN for Lumina-mGPT in {self.folder}: put vqgan.safetensors there (convert Meta's "
                          "vqgan.ckpt with `python -m ssd_core.pixel_decoders.convert_vqgan`) to get pixels",
                          stacklevel=2)
            return None
        dev = next(vq.parameters()).device
        return vq.decode_to_image(tokens[None].long().to(dev))[0].cpu()
