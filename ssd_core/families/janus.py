"""`janus`: Janus / Janus-Pro (1B, 7B) through transformers' `JanusForConditionalGeneration`.

- features: the Llama language model (`model.model.language_model`), pre-norm features from its final norm;
- image logits: the generation head (`model.model.generation_head`), not `lm_head`;
- image-token inputs: `prepare_embeddings_for_image_generation` (generation embeddings + aligner). In the
  sequence an image code c is written as id `text_vocab + c`, so one id tensor carries both kinds;
- prompt: the reference implementation's chat format, `<|User|>: {prompt}\\n\\n<|Assistant|>:` + image start,
  after BOS, the prompt stripped of surrounding whitespace as DeepSeek's code does; CFG's unconditional stream is
  the same ids with every token but BOS / image start set to pad;
- grid: image_size / patch_size per side (24x24 for Janus-Pro), no row-end tokens;
- pixels: `decode_image_tokens`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SSDError
from ..session import Layout, Prompt
from . import common
from .text import TextGridModel

USER, ASSISTANT = "<|User|>", "<|Assistant|>"
IMAGE_START = "<begin_of_image>"


class JanusModel(TextGridModel):
    family = "janus"
    repo_ids = ("deepseek-community/Janus-Pro-7B", "deepseek-community/Janus-Pro-1B")
    model_types = ("janus",)
    architectures = ("JanusForConditionalGeneration",)
    transformers_class = "JanusForConditionalGeneration"
    name = "Janus"
    negative_prompts = False  # the unconditional stream is the padded prompt
    pixels_per_token = 16  # Janus-Pro's patch_size

    @classmethod
    def listed_grids(cls):
        return [(24, 24)]  # Janus-Pro's image_size / patch_size: 384 / 16

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None):
        super().__init__(model, tokenizer, folder)
        cfg = model.config
        self.hidden_size = int(cfg.text_config.hidden_size)
        self.text_vocab = int(cfg.text_config.vocab_size)
        self.image_vocab_size = int(cfg.vq_config.num_embeddings)
        n = int(cfg.vision_config.image_size) // int(cfg.vision_config.patch_size)
        self.default_grid = (n, n)
        gen = getattr(model, "generation_config", None)
        gkw = (getattr(gen, "generation_kwargs", None) or {}) if gen is not None else {}
        self.bos_id = common.first_id(getattr(gen, "bos_token_id", None), getattr(tokenizer, "bos_token_id", None),
                                   cfg.text_config.bos_token_id)
        self.pad_id = common.first_id(getattr(gen, "pad_token_id", None), getattr(tokenizer, "pad_token_id", None),
                                   cfg.text_config.pad_token_id)
        # where transformers' Janus generate reads it (generation_kwargs), else where its converter
        # (convert_janus_weights_to_hf.py) sets it (generation_config.boi_token_id), else the tokenizer's boi_token
        boi = gkw.get("boi_token_id", getattr(gen, "boi_token_id", None))
        if boi is None and tokenizer is not None:
            boi = common.token_id(None, tokenizer, getattr(tokenizer, "boi_token", None) or IMAGE_START, None)
        if self.bos_id is None or self.pad_id is None or boi is None:
            raise SSDError(f"Janus model {folder or ''} lacks its BOS, pad or image-start token ids "
                           "(generation_config.json: bos_token_id, pad_token_id, generation_kwargs.boi_token_id)")
        self.boi_id = int(boi)
        self.pixel_norm = common.pixel_normalization(folder)
        # deepseek-ai/Janus generation_inference.py `generate` (and the README's copy): cfg_weight=5, temperature=1,
        # softmax over every code (no top-k / top-p), img_size 384 = the 24x24 grid above
        self.defaults = {"cfg": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}

    # ---- the contract ----------------------------------------------------------------------------------------
    def backbone(self):
        return self.model.model.language_model

    def final_norm(self):
        return self.model.model.language_model.norm

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text ids through the text embeddings, image ids (text_vocab + code) through the generation embeddings
        and aligner, picked per token on the device. Both run for every call: asking whether a call holds any
        image id would copy that answer to the host (a sync every forward), and the unused half costs one
        embedding lookup and the aligner's two small matmuls on a few dozen tokens."""
        is_image = ids >= self.text_vocab
        text = self.model.get_input_embeddings()(ids.clamp(max=self.text_vocab - 1))
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
        """The Janus-Pro reference chat format + image start, as deepseek-ai/Janus writes it for generation
        (generation_inference.py: apply_sft_template_for_multi_turn_prompts with the "deepseek" template, system
        prompt "", then image_start_tag). That function strips each message (janus/models/processing_vlm.py:
        `message["content"].strip()`, Python's str.strip) and the template (janus/utils/conversation.py,
        Conversation.get_prompt, SeparatorStyle.DeepSeek) writes an empty message as the bare role and colon;
        its final `.strip()` of the whole prompt changes nothing here (it starts with <|User|>, ends with ':')."""
        start = getattr(self.tokenizer, "boi_token", None) or IMAGE_START
        text = prompt.strip()
        user = f"{USER}: {text}\n\n" if text else f"{USER}:"
        return f"{user}{ASSISTANT}:{start}"

    def prompt_ids(self, prompt) -> list[int]:
        """Text -> [BOS] + the chat-formatted prompt ending in the image start. Token ids (already formatted
        text, e.g. for a benchmark without a tokenizer) -> [BOS] + ids + [image start]."""
        given = common.token_id_list(prompt)
        if given is not None:
            return [self.bos_id] + given + [self.boi_id]
        ids = self.token_ids(self.prompt_text(self.check_text(prompt)))
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
        return common.to_unit_image(img, self.pixel_norm)
