"""`janus`: Janus / Janus-Pro (1B, 7B) through transformers' `JanusForConditionalGeneration`.

- features: the Llama language model (`model.model.language_model`), pre-norm features from its final norm;
- image logits: the generation head (`model.model.generation_head`), not `lm_head`;
- image-token inputs: `prepare_embeddings_for_image_generation` (generation embeddings + aligner). In the
  sequence an image code c is written as id `text_vocab + c`, so one id tensor carries both kinds;
- prompt: the reference implementation's chat format, `<|User|>: {prompt}\\n\\n<|Assistant|>:` + image start,
  after BOS; CFG's unconditional stream is the same ids with every token but BOS / image start set to pad;
- grid: image_size / patch_size per side (24x24 for Janus-Pro), no row-end tokens;
- pixels: `decode_image_tokens`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import hub
from ..errors import SSDError
from ..session import Layout, Prompt
from .base import GridModel

USER, ASSISTANT = "<|User|>", "<|Assistant|>"
IMAGE_START = "<begin_of_image>"
BOS_ID, PAD_ID, BOI_ID = 100000, 100002, 100016  # Janus-Pro's ids (random_init only; real folders carry theirs)

# language-model / generation shapes of the released models (the vision encoder, unused for generation, is kept
# tiny in random_init); used to time one step of a full-size architecture with random weights
SHAPES = {
    "Janus-Pro-7B": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 30,
                     "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 102400,
                     "max_position_embeddings": 16384, "codes": 16384, "image_size": 384, "patch_size": 16},
    "Janus-Pro-1B": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
                     "max_position_embeddings": 16384, "codes": 16384, "image_size": 384, "patch_size": 16},
}


def random_config(shapes="Janus-Pro-7B"):
    """A JanusConfig with the language model and generation head of `shapes` (a SHAPES name or a dict)."""
    from transformers import JanusConfig

    sh = dict(SHAPES[shapes] if isinstance(shapes, str) else shapes)
    codes, image_size, patch = sh.pop("codes"), sh.pop("image_size"), sh.pop("patch_size")
    d = sh["hidden_size"]
    n = image_size // patch
    return JanusConfig(
        text_config=dict(model_type="llama", bos_token_id=BOS_ID % sh["vocab_size"],
                         pad_token_id=PAD_ID % sh["vocab_size"], **sh),
        vision_config=dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=image_size,
                           patch_size=patch, projection_dim=d, num_image_tokens=n * n, depth=1),
        vq_config=dict(num_embeddings=codes, embed_dim=8, projection_dim=d, image_token_embed_dim=d),
        tie_word_embeddings=False)


class JanusModel(GridModel):
    family = "janus"
    text_prompts = True
    negative_prompts = False
    training_prompts = list(hub.TRAINING_PROMPTS)

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None):
        super().__init__(model)
        cfg = model.config
        self.folder = folder
        self.tokenizer = tokenizer
        self.hidden_size = int(cfg.text_config.hidden_size)
        self.text_vocab = int(cfg.text_config.vocab_size)
        self.image_vocab_size = int(cfg.vq_config.num_embeddings)
        n = int(cfg.vision_config.image_size) // int(cfg.vision_config.patch_size)
        self.default_grid = (n, n)
        gen = getattr(model, "generation_config", None)
        gkw = (getattr(gen, "generation_kwargs", None) or {}) if gen is not None else {}
        self.bos_id = hub.first_id(getattr(gen, "bos_token_id", None), getattr(tokenizer, "bos_token_id", None),
                                     cfg.text_config.bos_token_id)
        self.pad_id = hub.first_id(getattr(gen, "pad_token_id", None), getattr(tokenizer, "pad_token_id", None),
                                     cfg.text_config.pad_token_id)
        boi = gkw.get("boi_token_id")
        if boi is None and tokenizer is not None:
            boi = hub.token_id(None, tokenizer, getattr(tokenizer, "boi_token", None) or IMAGE_START, None)
        if self.bos_id is None or self.pad_id is None or boi is None:
            raise SSDError(f"Janus model {folder or ''} lacks its BOS, pad or image-start token ids "
                           "(generation_config.json: bos_token_id, pad_token_id, generation_kwargs.boi_token_id)")
        self.boi_id = int(boi)
        self.pixel_norm = hub.pixel_normalization(folder)
        self.defaults = {"cfg": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}

    # ---- loading ---------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs) -> "JanusModel":
        from transformers import JanusForConditionalGeneration

        folder = hub.ensure_folder(folder, cls.family, download)
        model = hub.load_pretrained(JanusForConditionalGeneration, folder, dtype, device, **kwargs)
        return cls(model, hub.load_tokenizer(folder), Path(folder))

    @classmethod
    def random_init(cls, shapes="Janus-Pro-7B", device="cpu", dtype=torch.bfloat16, seed: int = 0) -> "JanusModel":
        """A random-weight model of the released shapes, no files and no tokenizer (prompts as token ids)."""
        from transformers import GenerationConfig, JanusForConditionalGeneration

        cfg = random_config(shapes)
        model = hub.build_random(JanusForConditionalGeneration, cfg, device, dtype, seed)
        v = cfg.text_config.vocab_size
        model.generation_config = GenerationConfig(bos_token_id=BOS_ID % v, pad_token_id=PAD_ID % v,
                                                   generation_kwargs={"boi_token_id": BOI_ID % v})
        return cls(model)

    # ---- the contract ----------------------------------------------------------------------------------------
    def backbone(self):
        return self.model.model.language_model

    def final_norm(self):
        return self.model.model.language_model.norm

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        is_image = ids >= self.text_vocab
        text = self.model.get_input_embeddings()(ids.clamp(max=self.text_vocab - 1))
        if not bool(is_image.any()):
            return text
        image = self.model.prepare_embeddings_for_image_generation((ids - self.text_vocab).clamp(min=0))
        return torch.where(is_image.to(text.device)[..., None], image.to(text.device, text.dtype), text)

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.model.model.generation_head(normed)

    def code_to_id(self, codes: torch.Tensor) -> torch.Tensor:
        return codes + self.text_vocab

    def layout(self, grid=None) -> Layout:
        return Layout.build(self.check_grid(grid))

    # ---- prompts ---------------------------------------------------------------------------------------------
    def prompt_text(self, prompt: str) -> str:
        """The Janus-Pro reference chat format (DeepSeek template, empty system prompt) + image start."""
        start = getattr(self.tokenizer, "boi_token", None) or IMAGE_START
        return f"{USER}: {prompt}\n\n{ASSISTANT}:{start}"

    def prompt_ids(self, prompt) -> list[int]:
        """Text -> [BOS] + the chat-formatted prompt ending in the image start. Token ids (already formatted
        text, e.g. for a benchmark without a tokenizer) -> [BOS] + ids + [image start]."""
        given = hub.token_id_list(prompt)
        if given is not None:
            return [self.bos_id] + given + [self.boi_id]
        if not isinstance(prompt, str):
            raise SSDError(f"a Janus prompt is text (or a list of token ids), got {type(prompt).__name__}")
        if self.tokenizer is None:
            raise SSDError(f"the Janus model folder {self.folder} has no tokenizer (tokenizer.json / "
                           "tokenizer_config.json): copy them from the model's repo")
        ids = list(self.tokenizer(self.prompt_text(prompt), add_special_tokens=False)["input_ids"])
        if not ids or ids[-1] != self.boi_id:
            raise SSDError(f"the Janus tokenizer does not map {IMAGE_START!r} to the image-start token "
                           f"{self.boi_id}; check the model folder's tokenizer files")
        return [self.bos_id] + ids

    def build_prompt(self, prompt, negative_prompt: str = "", cfg: bool = True, grid=None) -> Prompt:
        if negative_prompt:
            raise SSDError("Janus-Pro takes no negative prompt (its unconditional stream is the padded prompt): "
                           "clear it")
        cond = torch.tensor([self.prompt_ids(prompt)], dtype=torch.long)
        rows = [cond]
        if cfg:
            keep = (cond == self.bos_id) | (cond == self.boi_id)
            rows.append(torch.where(keep, cond, torch.full_like(cond, self.pad_id)))
        ids = torch.cat(rows)
        return Prompt(ids, torch.ones_like(ids, dtype=torch.bool))

    # ---- pixels ----------------------------------------------------------------------------------------------
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        H, W = tokens.shape
        if (H, W) != tuple(self.default_grid):
            raise SSDError(f"Janus decodes a {self.default_grid[0]}x{self.default_grid[1]} grid, got {H}x{W}")
        vq = self.model.model.vqmodel
        dev = next(vq.parameters()).device
        with torch.no_grad():
            img = self.model.decode_image_tokens(tokens.reshape(1, H * W).long().to(dev))[0]  # [H_px, W_px, 3]
        return hub.to_unit_image(img, self.pixel_norm)
