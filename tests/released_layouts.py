"""Tiny random models in the LAYOUT OF THE RELEASED CHECKPOINTS (deepseek-community/Janus-Pro-1B / -7B,
BAAI/Emu3-Gen-hf): the release's file names, sharding, config keys (written as the transformers that made the
release wrote them: `torch_dtype`, `rope_theta` / `rope_scaling`), tensor names, torch dtype and tokenizer /
processor files, at tiny shapes. tiny_families.py's builders prove decoding; these prove that a user's download
loads. Each fact's source is in .work/docs_janus_emu3.md (not committed) and, in short, in the comments below:
  - Janus: transformers' models/janus/convert_janus_weights_to_hf.py (convert_model: the tokenizer with
    extra_special_tokens image_token / boi_token / eoi_token, JanusProcessor(use_default_system_prompt=True,
    chat_template=CHAT_TEMPLATE), generation_config temperature 1 / guidance_scale 5 / pad / boi, weights from
    the bf16 original, save_pretrained(safe_serialization=True) with transformers 4.5x's 5GB shards);
  - Emu3: transformers' models/emu3/convert_emu3_weights_to_hf.py (convert_tiktoken: tokenizer.json with every
    tiktoken special token an added token, tokenizer_config.json / special_tokens_map.json, vocab.json,
    merges.txt; vocabulary_map = tokenizer.json's vocab; Emu3Config(rope_scaling={"rope_type": "default"});
    weights as loaded, float32), with the tensor names of the transformers 4.48 Emu3ForConditionalGeneration
    the release was made with (text_model.model.*, text_model.lm_head, vqmodel.*: the names transformers 5
    still renames on load, conversion_mapping.py "emu3").

    build_janus_pro_released(tmp / "janus", size="1B")   # model.safetensors (1B) / 3 shards + index (7B)
    build_emu3_gen_hf_released(tmp / "emu3")              # 8 shards + index, float32
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tiny_families import CODES, JANUS_SPECIALS, _text_kwargs, byte_tokenizer

JANUS_VERSION, EMU3_VERSION = "4.52.0.dev0", "4.48.0.dev0"  # transformers_version the files carry (not verified)
# shards the release's save_pretrained wrote: transformers 4.5x's max_shard_size="5GB" over the released shapes
# (huggingface_hub.split_torch_state_dict_into_shards on the meta device: Janus-Pro-1B 4.15 GB bf16 -> one file,
# Janus-Pro-7B 14.8 GB bf16 -> 3, Emu3-Gen 35.1 GB float32 -> 8)
JANUS_SHARDS = {"1B": 1, "7B": 3}
EMU3_SHARDS = 8


# ---- files -----------------------------------------------------------------------------------------------------
def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_weights(folder: Path, tensors: dict[str, torch.Tensor], shards: int) -> list[str]:
    """save_pretrained's layout: model.safetensors, or `shards` files model-0000N-of-0000M.safetensors (tensors
    in order, about equal bytes) + model.safetensors.index.json (metadata.total_size, weight_map)."""
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    parts: list[dict] = [{} for _ in names]
    seen = 0
    for key, t in tensors.items():
        parts[min(shards - 1, seen * shards // total)][key] = t
        seen += t.numel() * t.element_size()
    weight_map = {}
    for name, part in zip(names, parts):
        assert part, "a shard without tensors: the model is too small for this many shards"
        save_file(part, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    write_json(folder / "model.safetensors.index.json", {"metadata": {"total_size": total},
                                                          "weight_map": dict(sorted(weight_map.items()))})
    return names


def legacy_config(d, torch_dtype: str | None = None):
    """A transformers 5 config dict as 4.4x / 4.5x wrote it: `dtype` -> `torch_dtype`, `rope_parameters` ->
    `rope_theta` + `rope_scaling` (None for the default rope), recursively."""
    if isinstance(d, list):
        return [legacy_config(v) for v in d]
    if not isinstance(d, dict):
        return d
    out = {}
    for k, v in d.items():
        if k == "dtype":
            out["torch_dtype"] = v
        elif k == "rope_parameters" and isinstance(v, dict):
            out["rope_theta"] = v.get("rope_theta")
            rest = {kk: vv for kk, vv in v.items() if kk != "rope_theta"}
            out["rope_scaling"] = None if rest in ({}, {"rope_type": "default"}) else rest
        else:
            out[k] = legacy_config(v)
    if torch_dtype is not None:
        out["torch_dtype"] = torch_dtype
    return out


def save_config(folder: Path, config, torch_dtype: str, version: str, **top) -> dict:
    d = legacy_config(config.to_dict(), torch_dtype)
    d.pop("dtype", None)
    d.update(top, transformers_version=version)
    write_json(folder / "config.json", d)
    return d


# ---- Janus-Pro (deepseek-community/Janus-Pro-1B, -7B) ------------------------------------------------------------
# deepseek-ai's special_tokens_map.json names these additional special tokens (read from memory of the file,
# not verified byte for byte); the converter keeps them and adds image_token / boi_token / eoi_token
JANUS_ADDITIONAL = ["<image_placeholder>", "<patch_placeholder>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>",
                    "<|grounding|>", "<|User|>", "<|Assistant|>"]
JANUS_IMAGE_TOKENS = {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>",
                      "eoi_token": "<end_of_image>"}  # convert_model: special_image_tokens
# a chat template with the behaviour of the converter's CHAT_TEMPLATE for text (and image) messages, written
# here: "<|User|>: " + text (outer whitespace stripped) + "\n\n", then "<|Assistant|>:" for the generation prompt
JANUS_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] | lower == 'user' -%}<|User|>: {% elif message['role'] | lower == 'assistant' -%}"
    "<|Assistant|>: {% else -%}{{ message['role'].capitalize() }}: {% endif -%}"
    "{%- for c in message['content'] -%}"
    "{%- if c['type'] == 'image' -%}<image_placeholder>{%- else -%}"
    "{%- set t = c['text'] -%}{%- if loop.first -%}{%- set t = t.lstrip() -%}{%- endif -%}"
    "{%- if loop.last -%}{%- set t = t.rstrip() -%}{%- endif -%}{{ t }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if not loop.last or add_generation_prompt -%}"
    "{{ '\\n\\n' if message['role'] | lower == 'user' else '<｜end▁of▁sentence｜>' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|Assistant|>:{%- endif -%}"
)


def janus_tokenizer():
    """DeepSeek's byte-level tokenizer at tiny size: the release's special tokens by name, BOS added by the
    tokenizer itself (DeepSeek-LLM's post-processor: tokenizer.encode(prompt) starts with BOS, as Janus'
    generation_inference.py relies on), the image tokens as extra_special_tokens."""
    from tokenizers.processors import TemplateProcessing

    specials = JANUS_SPECIALS + [t for t in JANUS_ADDITIONAL if t not in JANUS_SPECIALS]
    tok, vocab = byte_tokenizer(specials, bos=JANUS_SPECIALS[0], eos=JANUS_SPECIALS[1], pad=JANUS_SPECIALS[2],
                                extra_special=JANUS_IMAGE_TOKENS)
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{JANUS_SPECIALS[0]} $A", special_tokens=[(JANUS_SPECIALS[0], vocab[JANUS_SPECIALS[0]])])
    tok.add_special_tokens({"additional_special_tokens": JANUS_ADDITIONAL})
    tok.model_max_length = 16384
    return tok, vocab


def janus_config(vocab: dict, size: str, grid: int):
    from transformers import JanusConfig

    patch = 16  # Janus-Pro: 384 px / 16 = 24 tokens a side; tiny: grid * 16 px
    layers = {"1B": 2, "7B": 3}[size]  # a few layers more for the sharded one: every shard holds tensors
    return JanusConfig(
        text_config=dict(model_type="llama", **_text_kwargs(len(vocab) + 8, num_hidden_layers=layers,
                                                            bos_token_id=vocab[JANUS_SPECIALS[0]],
                                                            eos_token_id=vocab[JANUS_SPECIALS[1]],
                                                            pad_token_id=vocab[JANUS_SPECIALS[2]])),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=grid * patch,
                           patch_size=patch, projection_dim=32, num_image_tokens=grid * grid, depth=2),
        vq_config=dict(embed_dim=8, num_embeddings=CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=32, image_token_embed_dim=32,
                       num_hidden_layers=2, depth=2),  # the generation aligner: 2 linears, as released
        image_token_id=vocab["<image_placeholder>"])


def janus_generation_config(vocab: dict, boi_where: str = "generation_kwargs") -> dict:
    """convert_model's generation config: temperature 1, guidance_scale 5, pad = <｜▁pad▁｜>, the image start id;
    `boi_where` "generation_kwargs" (where transformers' Janus generate reads it) or "top" (where the converter
    sets it, model.generation_config.boi_token_id)."""
    g = {"_from_model_config": False, "bos_token_id": vocab[JANUS_SPECIALS[0]],
         "eos_token_id": vocab[JANUS_SPECIALS[1]], "guidance_scale": 5, "pad_token_id": vocab[JANUS_SPECIALS[2]],
         "temperature": 1, "transformers_version": JANUS_VERSION}
    boi = vocab["<begin_of_image>"]
    if boi_where == "top":
        g["boi_token_id"] = boi
    else:
        g["generation_kwargs"] = {"boi_token_id": boi}
    return g


def build_janus_pro_released(folder, size: str = "1B", seed: int = 0, grid: int = 4,
                             boi_where: str = "generation_kwargs") -> Path:
    """deepseek-community/Janus-Pro-{size}'s folder at tiny shapes: config.json (torch_dtype bfloat16),
    bf16 weights (model.safetensors for 1B, 3 shards + index for 7B), generation_config.json, the processor's
    files (processor_config.json, preprocessor_config.json, chat template) and the tokenizer's
    (tokenizer.json, tokenizer_config.json, special_tokens_map.json)."""
    from transformers import JanusForConditionalGeneration

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok, vocab = janus_tokenizer()
    cfg = janus_config(vocab, size, grid)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(cfg).eval()
    # the converter loads deepseek-ai's bf16 state dict with assign=True: the release's tensors are bf16
    tensors = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    write_weights(folder, tensors, JANUS_SHARDS[size])
    save_config(folder, cfg, "bfloat16", JANUS_VERSION, architectures=["JanusForConditionalGeneration"])
    write_json(folder / "generation_config.json", janus_generation_config(vocab, boi_where))
    write_janus_processor(folder, tok, vocab, grid)
    return folder


def write_janus_processor(folder: Path, tok, vocab: dict, grid: int) -> None:
    """processor.save_pretrained's files as transformers 4.52 wrote them (convert_model): tokenizer.json,
    tokenizer_config.json (LlamaTokenizer, the image tokens by name and in extra_special_tokens),
    special_tokens_map.json, preprocessor_config.json (JanusImageProcessor from deepseek-ai's: image_size,
    min_size 14, mean / std 0.5, rescale 1/255), processor_config.json (use_default_system_prompt, 576 image
    tokens: grid * grid here), chat_template.jinja."""
    from transformers import JanusImageProcessor

    tok.backend_tokenizer.save(str(folder / "tokenizer.json"))
    bos, eos, pad = JANUS_SPECIALS[:3]
    main = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "additional_special_tokens": JANUS_ADDITIONAL}
    write_json(folder / "special_tokens_map.json", main)
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for s, i in vocab.items() if s in JANUS_SPECIALS + JANUS_ADDITIONAL}
    write_json(folder / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added, **main, **JANUS_IMAGE_TOKENS,
        "clean_up_tokenization_spaces": False, "extra_special_tokens": JANUS_IMAGE_TOKENS, "legacy": True,
        "model_max_length": 16384, "processor_class": "JanusProcessor", "tokenizer_class": "LlamaTokenizer",
        "unk_token": None, "use_default_system_prompt": False})
    image = JanusImageProcessor(size={"height": grid * 16, "width": grid * 16}, min_size=14, do_normalize=True,
                                image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], rescale_factor=1 / 255)
    image = dict(image.to_dict(), image_processor_type="JanusImageProcessor", processor_class="JanusProcessor")
    write_json(folder / "preprocessor_config.json", image)
    write_json(folder / "processor_config.json", {"num_image_tokens": grid * grid, "processor_class": "JanusProcessor",
                                                  "use_default_system_prompt": True})
    (folder / "chat_template.jinja").write_text(JANUS_CHAT_TEMPLATE, encoding="utf-8")


# ---- Emu3-Gen (BAAI/Emu3-Gen-hf) ---------------------------------------------------------------------------------
EMU3_EXTRAS = [f"<|extra_{i}|>" for i in range(205)]  # emu3/mllm/tokenization_emu3.py: EXTRAS
# emu3_vision_tokens.txt's first lines (Emu3Config: img 151851, boi 151852, eoi 151853), then the visual tokens
EMU3_IMAGE_MARKS = ["<|image token|>", "<|image start|>", "<|image end|>"]
# the release's tokenizer_config.json names these (transformers' Emu3Processor reads each as tokenizer.<name>)
EMU3_EXTRA_SPECIAL = {"image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
                      "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"}


def emu3_vocab() -> tuple[dict, list[str]]:
    """Emu3's id order at tiny size: the byte-level BPE ranks, then from SPECIAL_START_ID <|endoftext|>,
    <|im_start|>, <|im_end|>, <|extra_0..204|>, the image marks, the visual tokens (tokenization_emu3.py,
    Emu3Tokenizer.__init__), then `<image>` (the HF processor's image placeholder, not embedded)."""
    from tokenizers import pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}  # a HashSet: sorted
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + EMU3_EXTRAS + EMU3_IMAGE_MARKS + \
        [f"<|visual token {i:06d}|>" for i in range(CODES)] + ["<image>"]
    for s in specials:
        vocab[s] = len(vocab)
    return vocab, specials


def write_emu3_tokenizer(folder: Path) -> dict:
    """convert_tiktoken's files: tokenizer.json (BPE, byte-level pre-tokenizer with regex, no post-processor:
    BOS is text the processor writes), vocab.json, merges.txt, tokenizer_config.json (GPT2Tokenizer, BOS
    <|extra_203|>, EOS <|extra_204|>, pad <|endoftext|>) with the image tokens by name, special_tokens_map.json."""
    vocab, specials = emu3_vocab()
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in specials]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    write_json(folder / "tokenizer.json", {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level, add_prefix_space=True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": []}})
    write_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    main = {"bos_token": "<|extra_203|>", "eos_token": "<|extra_204|>", "pad_token": "<|endoftext|>"}
    write_json(folder / "special_tokens_map.json", main)
    write_json(folder / "tokenizer_config.json", {
        "add_prefix_space": False, "clean_up_tokenization_spaces": False, **main, **EMU3_EXTRA_SPECIAL,
        "extra_special_tokens": EMU3_EXTRA_SPECIAL, "model_max_length": 1000000000000000019884624838656,
        "processor_class": "Emu3Processor", "tokenizer_class": "GPT2Tokenizer"})
    return vocab


def legacy_emu3_name(name: str) -> str:
    """transformers 5's Emu3ForConditionalGeneration name -> the 4.48 name the release holds."""
    for new, old in (("model.text_model.", "text_model.model."), ("lm_head.", "text_model.lm_head."),
                     ("model.vqmodel.", "vqmodel.")):
        if name.startswith(new):
            return old + name[len(new):]
    raise ValueError(f"no 4.48 name for {name}")


def build_emu3_gen_hf_released(folder, seed: int = 0) -> Path:
    """BAAI/Emu3-Gen-hf's folder at tiny shapes: config.json (vocabulary_map = tokenizer.json's vocab,
    rope_scaling {"rope_type": "default"}, torch_dtype float32), 8 float32 shards + index under the 4.48 tensor
    names, generation_config.json from the model config, the tokenizer files and preprocessor_config.json."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_emu3_tokenizer(folder)
    text_vocab = vocab["<image>"]  # 184622 in the release: through the last visual token
    cfg = Emu3Config(
        text_config=_text_kwargs(text_vocab, num_hidden_layers=4, bos_token_id=vocab["<|extra_203|>"],
                                 eos_token_id=vocab["<|extra_204|>"], pad_token_id=vocab["<|endoftext|>"],
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        vq_config=dict(codebook_size=CODES, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                       num_attention_heads=1, temporal_downsample_factor=4),
        vocabulary_map=dict(vocab))
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(cfg).eval()
    tensors = {legacy_emu3_name(k): v.detach().float() for k, v in model.state_dict().items()}
    write_weights(folder, tensors, EMU3_SHARDS)
    d = save_config(folder, cfg, "float32", EMU3_VERSION, architectures=["Emu3ForConditionalGeneration"])
    d["text_config"]["rope_scaling"] = {"rope_type": "default"}  # convert_model: Emu3Config(rope_scaling=...)
    write_json(folder / "config.json", d)
    tc = cfg.text_config  # save_pretrained's generation config, from the model config
    write_json(folder / "generation_config.json", {"_from_model_config": True, "bos_token_id": tc.bos_token_id,
                                                   "eos_token_id": tc.eos_token_id, "pad_token_id": tc.pad_token_id,
                                                   "transformers_version": EMU3_VERSION})
    # Emu3ImageProcessor.from_pretrained("BAAI/Emu3-VisionTokenizer"): mean / std 0.5, spatial factor 8
    image = Emu3ImageProcessor(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], spatial_factor=8).to_dict()
    image.update(image_processor_type="Emu3ImageProcessor", processor_class="Emu3Processor")
    write_json(folder / "preprocessor_config.json", image)
    # no chat template: the converter's CHAT_TEMPLATE is a placeholder and what the release ships instead is not
    # known here; image generation does not use one (BAAI's image_generation.py and Emu3Processor write the text)
    return folder
