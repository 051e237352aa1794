"""`emu3.5`: Emu3.5-Image (baaivision/Emu3.5, BAAI/Emu3.5-Image: 34B, 64x64 tokens at 1024 px, IBQ codes).

The release's decoder (src/emu3p5/modeling_emu3.py, remote code `Emu3ForCausalLM`, config.json model_type "Emu3")
is the Emu3 text stack with a per-head RMSNorm of q and k (`q_norm` / `k_norm` over head_dim, before RoPE): layer
for layer the computation of transformers' own Qwen3 decoder, under the same tensor names (model.embed_tokens,
model.layers.N.self_attn.{q,k,v,o}_proj / q_norm / k_norm, mlp.{gate,up,down}_proj, input_layernorm,
post_attention_layernorm, model.norm, lm_head). So the released safetensors load as they are into
`Qwen3ForCausalLM` with a Qwen3Config written from the release's config.json (released_config): no remote code,
no conversion, and the KV cache, sdpa, the static cache and compile of transformers' own class.
tests/test_family_emu35.py re-creates the release's attention from its code and compares logits.

What the release writes (configs/example_config_t2i.py, src/utils/logits_processor.py, inference.py):
- the T2I prompt `<|extra_203|>You are a helpful assistant for t2i task. USER: {question} ASSISTANT: <|extra_100|>`
  (`<|extra_203|>` is its BOS); the unconditional prompt (unconditional_type "no_text") `<|extra_203|>You are a
  helpful assistant. USER:  ASSISTANT: <|extra_100|>`: a negative prompt here takes the place of its empty text;
- the image prefix `<|image start|>{h}*{w}<|image token|>` (the processor forces h, w and the image token once the
  model writes the image start; the pack forces all of it), then h rows of w visual tokens (`<|visual token
  NNNNNN|>`, id 151854 + code), rows ended by `<|extra_200|>` except the last, which the image end
  `<|image end|>` follows: (w + 1) h tokens after the prefix;
- guidance on log-probs: log_softmax(c) and log_softmax(u) over the vocabulary, u + cfg (c - u). Each log_softmax
  shifts its stream's logits by one constant, so the guided scores are the pack's u + cfg (c - u) on raw logits
  plus one constant a step: the same distribution, top-k set and argmax (the test replays the release's
  processor literally); cfg 5.0 for Emu3.5-Image;
- image top-k 5120, top-p 1, temperature 1 (example_config_t2i.py sampling_params image_*);
- sizes: image_area 1024^2 at 16 px a token, its aspect list ("1:1" 64*64, "4:3" 55*73, ...).
Pixels: the IBQ decoder (pixel_decoders/ibq.py) from ibq.safetensors, converted from BAAI/Emu3.5-VisionTokenizer.
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from .. import model_files
from ..errors import SSDError
from ..session import Layout, Prompt
from . import common
from .emu35_tokenizer import FILES as TOKENIZER_FILES
from .emu35_tokenizer import SUBFOLDER, Emu35Tokenizer, tokenizer_folder
from .text import TextGridModel

REPO = "BAAI/Emu3.5-Image"
VISION_REPO = "BAAI/Emu3.5-VisionTokenizer"
FIRST_VISUAL = 151854  # logits_processor.py BOV: <|visual token 000000|>
MAX_CODES = 131072  # IBQ's codebook
IDS = {"<|extra_203|>": 151849, "<|extra_204|>": 151850, "<|image token|>": 151851, "<|image start|>": 151852,
       "<|image end|>": 151853, "<|extra_200|>": 151846, "<|endoftext|>": 151643}  # logits_processor.py
BOS, EOS, PAD, EOL = "<|extra_203|>", "<|extra_204|>", "<|endoftext|>", "<|extra_200|>"
IMAGE_START, IMAGE_TOKEN, IMAGE_END = "<|image start|>", "<|image token|>", "<|image end|>"
TEMPLATE = f"{BOS}You are a helpful assistant for t2i task. USER: {{question}} ASSISTANT: <|extra_100|>"
UNCONDITIONAL = f"{BOS}You are a helpful assistant. USER: {{question}} ASSISTANT: <|extra_100|>"  # question ""
# example_config_t2i.py aspect_ratios (h*w at image_area 1048576, 16 px a token), the square first
ASPECTS = {"1:1": (64, 64), "4:3": (55, 73), "3:4": (73, 55), "3:2": (52, 78), "2:3": (78, 52), "16:9": (47, 85),
           "9:16": (85, 47), "21:9": (41, 97)}
UPSTREAM_GRID = ASPECTS["1:1"]
TOKENIZER_FIX = (f"copy {' and '.join(TOKENIZER_FILES)} from baaivision/Emu3.5 src/{SUBFOLDER}/ on GitHub into "
                 "the model folder (Emu3.5's code reads its tokenizer from there)")


def released_config(config: dict):
    """The Qwen3Config of a released Emu3.5 config.json (configuration_emu3.py's fields and defaults)."""
    from transformers import Qwen3Config

    get = lambda key, default: config.get(key, default) if config.get(key) is not None else default  # noqa: E731
    scaling = config.get("rope_scaling")
    if scaling is not None:  # the release's linear / dynamic RoPE variants: none of its configs uses one
        raise SSDError(f"this Emu3.5 config.json sets rope_scaling {scaling!r}, which the pack does not read; "
                       f"re-download config.json from {REPO}")
    if int(get("pretraining_tp", 1)) != 1:
        raise SSDError("this Emu3.5 config.json sets pretraining_tp != 1; re-download config.json from " + REPO)
    heads = int(get("num_attention_heads", 32))
    kw = dict(vocab_size=int(get("vocab_size", 184622)), hidden_size=int(get("hidden_size", 4096)),
              intermediate_size=int(get("intermediate_size", 14336)),
              num_hidden_layers=int(get("num_hidden_layers", 32)), num_attention_heads=heads,
              num_key_value_heads=int(get("num_key_value_heads", heads)), head_dim=int(get("head_dim", 128)),
              hidden_act=str(get("hidden_act", "silu")), max_position_embeddings=int(get("max_position_embeddings", 9216)),
              rms_norm_eps=float(get("rms_norm_eps", 1e-5)), tie_word_embeddings=bool(get("tie_word_embeddings", False)),
              pad_token_id=get("pad_token_id", 151643), bos_token_id=get("bos_token_id", 151849),
              eos_token_id=get("eos_token_id", 151850), attention_bias=False, attention_dropout=0.0,
              use_sliding_window=False)
    theta = float(get("rope_theta", 1000000.0))
    qwen = Qwen3Config(**kw, rope_theta=theta)
    if hasattr(qwen, "rope_parameters"):  # transformers 5: RoPE settings live in rope_parameters
        qwen.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    qwen.architectures = ["Qwen3ForCausalLM"]
    return qwen


@functools.cache
def model_class():
    """Qwen3ForCausalLM reading the release's folder: its config from released_config, not AutoConfig (whose
    registry has no model_type "Emu3"; transformers' own "emu3" is Emu3-Gen's class)."""
    from transformers import Qwen3ForCausalLM

    class Emu35ForCausalLM(Qwen3ForCausalLM):
        layout_note = "Emu3.5's remote-code Emu3ForCausalLM read as transformers' Qwen3 (the same layers and names)"

        @classmethod
        def from_pretrained(cls, folder, *args, **kwargs):
            kwargs.setdefault("config", released_config(model_files.read_config(folder)))
            return super().from_pretrained(folder, *args, **kwargs)

    return Emu35ForCausalLM


class Emu35Model(TextGridModel):
    family = "emu3.5"
    repo_ids = (REPO, "BAAI/Emu3.5")
    model_types = ("Emu3",)  # configuration_emu3.py model_type, capital E (transformers' Emu3-Gen is "emu3")
    architectures = ("Emu3ForCausalLM",)
    transformers_class = "Qwen3ForCausalLM"
    name = "Emu3.5"
    negative_prompts = True
    load_options = ("ibq", "grid")
    pixels_per_token = 16
    extra_files = (f"{' and '.join(TOKENIZER_FILES)} (baaivision/Emu3.5 src/{SUBFOLDER}/ on GitHub) and "
                   f"ibq.safetensors ({VISION_REPO}'s model.ckpt and config.yaml converted with `python -m ssd_core "
                   "convert-ibq model.ckpt config.yaml <folder>/ibq.safetensors`)")

    @classmethod
    def listed_grids(cls):
        return list(ASPECTS.values())

    @classmethod
    def model_class(cls, folder, config: dict | None = None, files=None):
        return model_class()

    @classmethod
    def transformers_config(cls, folder, config: dict):
        """check-model's meta build: the Qwen3Config the loader builds (AutoConfig cannot read "Emu3")."""
        return released_config(config)

    def __init__(self, model: torch.nn.Module, tokenizer=None, folder: Path | None = None, ibq=None, grid=None):
        super().__init__(model, tokenizer, folder)
        cfg = model.config
        self.hidden_size = int(cfg.hidden_size)
        vocab_size = int(cfg.vocab_size)
        if vocab_size <= FIRST_VISUAL:
            raise SSDError(f"{folder or 'the model'}: vocab_size {vocab_size} does not reach Emu3.5's visual tokens "
                           f"(ids from {FIRST_VISUAL}): it is not an Emu3.5 model")
        self.image_vocab_size = min(vocab_size - FIRST_VISUAL, MAX_CODES)
        self.image_ids = torch.arange(FIRST_VISUAL, FIRST_VISUAL + self.image_vocab_size)  # a view of lm_head
        tid = lambda name: common.token_id(None, tokenizer, name, IDS[name])  # noqa: E731
        self.bos_id, self.eos_id, self.pad_id, self.eol_id = tid(BOS), tid(EOS), tid(PAD), tid(EOL)
        self.start_id, self.image_token_id, self.end_id = tid(IMAGE_START), tid(IMAGE_TOKEN), tid(IMAGE_END)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.default_grid = (int(grid[0]), int(grid[1])) if grid is not None else self.largest_square(UPSTREAM_GRID[0])
        # example_config_t2i.py: classifier_free_guidance 5.0, image_top_k 5120, image_top_p 1.0, image_temperature 1.0
        self.defaults = {"cfg": 5.0, "temperature": 1.0, "top_k": 5120, "top_p": 1.0, "min_p": 0.0}
        self._ibq_path = ibq if isinstance(ibq, (str, Path)) else _find_ibq(folder)
        self._ibq = ibq if ibq is not None and not isinstance(ibq, (str, Path)) else None

    # ---- loading --------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, ibq=None, **kwargs):
        """`ibq`: an IBQDecoder or the path of its safetensors file (default: ibq.safetensors in the folder). The
        tokenizer files and the decoder's header are checked before any weights load."""
        folder = cls.ensure_folder(folder, download)
        if not _has_qk_norms(folder):
            raise SSDError(f"{folder} holds weights with no q_norm / k_norm: it is BAAI/Emu3-Gen's remote-code release "
                           "(Emu3, not Emu3.5), which says model_type 'Emu3' too; load BAAI/Emu3-Gen-hf as family "
                           f"'emu3' instead, or download {REPO} for Emu3.5")
        tokenizer = Emu35Tokenizer.from_folder(folder)  # an SSDError naming the files when they are missing
        ibq = cls.checked_ibq(folder, ibq)
        options = {k: kwargs.pop(k) for k in cls.load_options if k in kwargs}
        model = model_files.load_pretrained(cls.model_class(folder), folder, dtype, device, **kwargs)
        return cls(model, tokenizer, Path(folder), ibq=ibq, **options)

    @classmethod
    def checked_ibq(cls, folder, ibq=None):
        """The IBQ decoder to use: `ibq` as given (an IBQDecoder, or a path that must exist), else the folder's
        ibq.safetensors, its header and config checked; one SSDError line naming the fix otherwise."""
        from ..pixel_decoders import ibq as ibq_module

        fix = ibq_module.CONVERT_FIX.format(folder=folder)
        if ibq is not None:
            if isinstance(ibq, (str, Path)) and not Path(ibq).is_file():
                raise SSDError(f"IBQ file {ibq} does not exist; {fix}")
            return ibq
        found = ibq_module.find_ibq(folder)
        if found is None:
            pickled = ibq_module.pickled_checkpoints(folder)
            what = f"holds only the pickle {pickled[0].name}, which the pack never unpickles" if pickled \
                else "has no ibq.safetensors (Emu3.5's IBQ pixel decoder)"
            raise SSDError(f"the {cls.name} folder {folder} {what}: {fix}")
        model_files.inside(folder, os.path.relpath(found, folder), "the IBQ file")
        ibq_module.IBQDecoder.check_file(found)
        return found

    # ---- the contract ----------------------------------------------------------------------------------------
    def backbone(self):
        return self.model.model

    def final_norm(self):
        return self.model.model.norm

    def sequence_length(self, grid) -> int:
        H, W = grid
        return H * (W + 1)  # rows of W + a row end, the last row's end being the image end

    check_grid = TextGridModel.check_grid_positions  # any H x W its positions hold

    def grid_options(self):
        """The default grid, then the release's aspect list (example_config_t2i.py) where it fits."""
        out = [tuple(self.default_grid)]
        out += [g for g in ASPECTS.values() if g not in out and self.fits(g)]
        return out

    def layout(self, grid=None) -> Layout:
        return Layout.build(self.check_grid(grid), self.eol_id, (self.end_id,), last_row_end=False)

    # ---- prompts ---------------------------------------------------------------------------------------------
    def require_tokenizer(self):
        if self.tokenizer is None:
            raise SSDError(f"the Emu3.5 model {self.folder or ''} has no tokenizer: {TOKENIZER_FIX}")
        return self.tokenizer

    def prefix_ids(self, grid) -> list[int]:
        """`<|image start|>{h}*{w}<|image token|>`: the size as the tokenizer cuts it (a token a digit and '*')."""
        H, W = grid
        return [self.start_id] + self.require_tokenizer().encode(f"{H}*{W}") + [self.image_token_id]

    def text_ids(self, template: str, text, grid) -> list[int]:
        given = common.token_id_list(text)
        if given is not None:  # ids stand for the whole formatted prompt
            return given + self.prefix_ids(grid)
        self.require_tokenizer()
        return self.token_ids(template.format(question=self.check_text(text))) + self.prefix_ids(grid)

    def build_prompt(self, prompt, negative_prompt=None, cfg: bool = True, grid=None) -> Prompt:
        """The T2I row and, with cfg, the unconditional row (the release's; a negative prompt as its text)."""
        grid = self.check_grid(grid)
        rows = [self.text_ids(TEMPLATE, prompt, grid)]
        if cfg:
            rows.append(self.text_ids(UNCONDITIONAL, negative_prompt or "", grid))
        ids, mask = common.left_pad(rows, self.pad_id)
        return Prompt(ids, mask)

    # ---- pixels ----------------------------------------------------------------------------------------------
    def ibq(self):
        if self._ibq is None and self._ibq_path is not None:
            from ..pixel_decoders.ibq import IBQDecoder

            self._ibq = IBQDecoder.load(self._ibq_path, device="cpu", dtype=torch.float32)
        return self._ibq

    def vqgan(self):
        return self.ibq()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        vq = self.ibq()
        if vq is None:
            from ..pixel_decoders.ibq import CONVERT_FIX

            warnings.warn(f"no ibq.safetensors for the Emu3.5 model {self.folder}, so no pixels: "
                          f"{CONVERT_FIX.format(folder=self.folder)}", stacklevel=2)
            return None
        dev = next(vq.parameters()).device
        return vq.decode_to_image(tokens[None].long().to(dev))[0].cpu()


def _has_qk_norms(folder) -> bool:
    """Whether the folder's safetensors name per-head q / k norms (Emu3.5 has them, Emu3's own release not)."""
    from safetensors import safe_open

    for path in model_files.weight_files(folder):  # an SSDError for a missing shard or pickle-only weights
        try:
            with safe_open(str(path), framework="pt") as f:
                if any(k.endswith("self_attn.q_norm.weight") for k in f.keys()):
                    return True
        except Exception:  # noqa: BLE001 -- a damaged shard: the loader's own check names it
            return True
    return False


def _find_ibq(folder):
    if folder is None:
        return None
    from ..pixel_decoders.ibq import find_ibq

    return find_ibq(folder)


__all__ = ["Emu35Model", "Emu35Tokenizer", "released_config", "tokenizer_folder"]
