"""`emu3.5-flashar`: Emu3.5-Image-FlashAR (lxazjk/Emu3.5-FlashAR, checkpoint lxazjk/Emu3.5-Image-FlashAR).

FlashAR post-trains Emu3.5-Image with a vertical branch and decodes along anti-diagonals. Its checkpoint is the
whole wrapper (flashar/model/modeling_emu_flashar.py, Emuflashar), saved by flashar/utils/checkpoint_utils.py
_write_hf_checkpoint_dir as model-*.safetensors + index and a config.json of model_type "emu3_flashar" holding
`backbone_config` (the Emu3.5 config), `visual_token_offset`, `use_vertical_block`, `vertical_layers` and
`vertical_start_layer`. Its tensors:
- `backbone.*`: the post-trained Emu3.5 decoder (Emu3Model's names: embed_tokens, layers.N, norm);
- `horizontal_head.weight` [V, d]: predicts the right neighbour (h, w+1) from the final-normed feature of (h, w);
- `vertical_block.K.*` (copies of the backbone's layers from `vertical_start_layer`, run on the hidden state the
  backbone has before that layer, with a KV cache of their own and no prefix), `vertical_norm.weight`,
  `vertical_head.weight` [V, d]: the bottom neighbour (h+1, w);
- `hv_gate_mlp.{0,2}` (sigmoid of an MLP of [h feature of the left cell ; v feature of the cell above]) and
  `hv_gate_corner` (the first cell, from the prompt's last feature): the weight of the horizontal logits.
No pickle is read: the checkpoint is safetensors (flashar_checkpoint_utils.py safe_torch_load reads pickles with
weights_only=False; this loader never does). The Emu3.5 tokenizer files and ibq.safetensors go into the same
folder as for Emu3.5-Image (families/emu35.py).

Two distributions live in the checkpoint: `flashar`'s (ssd_core/flashar_decode.py), and a raster one, the
backbone under a causal mask over the H x W codes (no row ends) with the horizontal head at the cell before: the
"AR teacher" of FlashAR's own vertical-branch distillation (Emuflashar._compute_ar_distill_loss with
build_t2i_causal_mask). The pack's decoders (ar, ssd-exact, ...) run on that raster one: ssd-exact keeps ar's
tokens there; flashar's picture is another distribution (tests/test_flashar.py measures how far apart).
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch
import torch.nn as nn

from .. import model_files
from ..errors import SSDError
from ..session import Layout, Prompt
from . import common
from .emu35 import TEMPLATE, Emu35Model, released_config
from .base import ImageRowsHead
from .emu35_tokenizer import Emu35Tokenizer

REPO = "lxazjk/Emu3.5-Image-FlashAR"
UPSTREAM_GRID = (32, 32)  # its README and HF card: "the default 32 x 32 visual-token grid" (512 px)


@functools.cache
def net_class():
    """FlashARNet: Emuflashar's modules under its state-dict names on transformers' Qwen3 layers, as a transformers
    PreTrainedModel, so that from_pretrained reads the released shards as they are, with the pack's dtype,
    quantization (bitsandbytes) and offload (accelerate) choices and its strict name check (model_files)."""
    from transformers import PreTrainedModel, Qwen3Config, Qwen3Model

    class FlashARNet(PreTrainedModel):
        config_class = Qwen3Config
        _no_split_modules = ["Qwen3DecoderLayer"]
        _supports_sdpa = True
        layout_note = "Emuflashar's wrapper (backbone, heads, vertical block, gates) under its own names"

        def __init__(self, config):
            super().__init__(config)
            d, vocab = int(config.hidden_size), int(config.vocab_size)
            layers = int(config.flashar_vertical_layers)
            self.vertical_start_layer = int(config.flashar_vertical_start_layer)
            self.backbone = Qwen3Model(config)
            self.horizontal_head = nn.Linear(d, vocab, bias=False)
            # the vertical block runs as a Qwen3Model of its own (fed hidden states, with a cache of its own): its
            # layers, final norm and rotary table are registered under the checkpoint's names (vertical_block.K,
            # vertical_norm; the rotary buffers are in no checkpoint); the model itself is not a submodule
            vcfg = copy.deepcopy(config)
            vcfg.num_hidden_layers, vcfg.vocab_size, vcfg.pad_token_id = layers, 1, None
            if getattr(vcfg, "layer_types", None) is not None:
                vcfg.layer_types = list(vcfg.layer_types[:layers])
            vertical = Qwen3Model(vcfg)
            vertical.embed_tokens = None  # fed inputs_embeds only
            self.vertical_block, self.vertical_norm, self.vertical_rotary = vertical.layers, vertical.norm, \
                vertical.rotary_emb
            object.__setattr__(self, "vertical", vertical)
            self.vertical_head = nn.Linear(d, vocab, bias=False)
            gate = max(64, d // 8)  # Emuflashar.__init__: gate_proj_dim
            self.hv_gate_mlp = nn.Sequential(nn.Linear(2 * d, gate, bias=False), nn.SiLU(),
                                             nn.Linear(gate, 1, bias=True))
            self.hv_gate_corner = nn.Linear(d, 1, bias=True)
            self.post_init()

        def get_input_embeddings(self):
            return self.backbone.embed_tokens

        def train(self, mode: bool = True):
            self.vertical.training = mode
            return super().train(mode)

    return FlashARNet


def net_config(cfg: dict):
    """The Qwen3Config of a FlashAR config.json (its backbone_config), with where the vertical block sits."""
    config = released_config(cfg["backbone_config"])
    layers = int(cfg.get("vertical_layers") or 1)
    start = int(cfg.get("vertical_start_layer", -1))
    if start < 0:  # Emuflashar.__init__: the last `vertical_layers` layers
        start = int(config.num_hidden_layers) - layers
    if not 0 <= start <= int(config.num_hidden_layers) - layers:
        raise SSDError(f"FlashAR config.json: vertical_start_layer {start} + vertical_layers {layers} exceeds the "
                       f"backbone's {config.num_hidden_layers} layers: re-download config.json from {REPO}")
    config.flashar_vertical_layers, config.flashar_vertical_start_layer = layers, start
    config.architectures = ["Emuflashar"]
    return config


def read_flashar_config(folder) -> dict:
    cfg = model_files.read_config(folder)
    backbone = cfg.get("backbone_config")
    if not isinstance(backbone, dict) or not backbone.get("hidden_size"):
        raise SSDError(f"{Path(folder) / 'config.json'} has no backbone_config (the Emu3.5 config FlashAR's trainer "
                       f"saves with the checkpoint): re-download config.json from {REPO}")
    if not cfg.get("use_vertical_block", True):
        raise SSDError(f"{folder}: a FlashAR checkpoint without its vertical block (use_vertical_block false) is not "
                       f"supported: use {REPO}")
    return cfg


def build_net(cfg: dict, device="meta"):
    """The wrapper of a FlashAR config.json with random (or, on the meta device, no) weights."""
    with torch.device(device):
        return net_class()(net_config(cfg))


class FlashARModel(Emu35Model):
    layout_note = "Emuflashar's wrapper (backbone, heads, vertical block, gates) under its own names"
    family = "emu3.5-flashar"
    repo_ids = (REPO,)
    model_types = ("emu3_flashar",)  # checkpoint_utils.py _write_hf_checkpoint_dir
    architectures = ("Emuflashar",)
    transformers_class = ""
    name = "Emu3.5-Image-FlashAR"
    negative_prompts = False
    own_decoders = ("flashar",)  # decoders with a loop of their own that run on it (besides the engine's)
    extra_files = Emu35Model.extra_files

    @classmethod
    def listed_grids(cls):
        return [UPSTREAM_GRID]  # its release scripts' one size; other sizes run through the API and the CLI (--grid)

    @classmethod
    def model_class(cls, folder, config: dict | None = None, files=None):
        raise SSDError("FlashAR checkpoints are read by families/flashar.py, not by a transformers class")

    @classmethod
    def meta_net(cls, folder, config: dict):
        """check-model's build of what config.json describes, on the meta device (the checkpoint's names)."""
        if not isinstance(config.get("backbone_config"), dict):
            raise SSDError(f"config.json has no backbone_config: re-download it from {REPO}")
        return build_net(config)

    def __init__(self, net, tokenizer=None, folder: Path | None = None, ibq=None, grid=None,
                 visual_offset: int | None = None):
        super().__init__(_Config(net), tokenizer, folder, ibq=ibq, grid=grid or UPSTREAM_GRID)
        self.model = net.eval()
        self.visual_offset = int(visual_offset if visual_offset is not None else self.image_ids[0])
        self.image_ids = torch.arange(self.visual_offset, self.visual_offset + self.image_vocab_size)
        # the code rows of each head: views, or under offload loaded once each (families/base.py)
        self.head_rows = {"horizontal": ImageRowsHead(self.image_ids), "vertical": ImageRowsHead(self.image_ids)}
        # its README / HF card: CFG 5.0 for the released checkpoint; generate_flashar.py: top_k 0, top_p 1,
        # temperature 1 (tools/generate_geneval_flashar.py, which made the published GenEval figures, the same)
        self.defaults = {"cfg": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}

    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, ibq=None, **kwargs):
        folder = cls.ensure_folder(folder, download)
        cfg = read_flashar_config(folder)
        tokenizer = Emu35Tokenizer.from_folder(folder)
        ibq = cls.checked_ibq(folder, ibq)
        options = {k: kwargs.pop(k) for k in ("grid",) if k in kwargs}
        # config.json is FlashAR's (model_type "emu3_flashar", which no transformers class reads): the config
        # comes from its backbone_config
        net = model_files.load_pretrained(net_class(), folder, dtype, device, config=net_config(cfg), **kwargs)
        return cls(net, tokenizer, Path(folder), ibq=ibq, visual_offset=cfg.get("visual_token_offset"), **options)

    # ---- the contract: the raster distribution (the horizontal head), a grid without row ends -----------------
    def backbone(self):
        return self.model.backbone

    def final_norm(self):
        return self.model.backbone.norm

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.head_rows["horizontal"](normed, self.model.horizontal_head)

    def sequence_length(self, grid) -> int:
        H, W = grid
        return H * W  # FlashAR writes the H x W codes after the image token, nothing else

    def layout(self, grid=None) -> Layout:
        return Layout.build(self.check_grid(grid))

    def build_prompt(self, prompt, negative_prompt=None, cfg: bool = True, grid=None) -> Prompt:
        """tools/generate_geneval_flashar.py make_prefix: the T2I template + `<|image start|>{h}*{w}<|image
        token|>`; the unconditional row is the same template with an empty prompt (not Emu3.5's own unc_prompt).
        The pack's layout (cond, uncond; left-padded): flashar_decode.py batches them as the release does."""
        if negative_prompt:
            raise SSDError("Emu3.5-Image-FlashAR takes no negative prompt (its unconditional row is its template "
                           "with an empty prompt): clear it")
        grid = self.check_grid(grid)
        rows = [self.text_ids(TEMPLATE, prompt, grid)] + ([self.text_ids(TEMPLATE, "", grid)] if cfg else [])
        ids, mask = common.left_pad(rows, self.pad_id)
        return Prompt(ids, mask)


class _Config(nn.Module):
    """What Emu35Model.__init__ reads of a model (its config) before the FlashAR net takes its place."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.config = net.config
        self.generation_config = None


__all__ = ["FlashARModel", "build_net", "net_class", "net_config", "read_flashar_config"]
