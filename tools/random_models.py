"""Random-weight models of the released families' shapes: no files, no tokenizer (prompts as token ids).

For timing one step of a full-size architecture without its weights (the step-cost benchmark) and for the
tests (the same builders at tiny shapes). Never imported by the runtime.

    random_model("janus", "Janus-Pro-7B", device="cuda")        # a JanusModel of random weights
    random_model("lumina", TINY_SHAPES_DICT, grid=(4, 4))        # any shapes given as a dict
    count_parameters("emu3", "Emu3-Gen")                          # on the meta device, nothing allocated
    construction_bytes("janus", "Janus-Pro-7B")                   # bytes its build allocates, by dtype (meta)

Models are made in their dtype where they will live (build_random): a 7B model in bf16 on a 24 GB GPU never
holds a float32 copy.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ssd_core.families.emu3 import IMAGE_END as EMU3_IMAGE_END
from ssd_core.families.emu3 import IMAGE_START as EMU3_IMAGE_START
from ssd_core.families.emu3 import IMAGE_WRAPPER
from ssd_core.families.lumina import IMAGE_END as LUMINA_IMAGE_END
from ssd_core.families.lumina import IMAGE_START as LUMINA_IMAGE_START

JANUS_BOS_ID, JANUS_PAD_ID, JANUS_BOI_ID = 100000, 100002, 100016  # Janus-Pro's ids

# language-model / generation shapes of the released models (the parts generation does not use, such as
# Janus' vision encoder, are kept tiny)
SHAPES = {
    "janus": {
        "Janus-Pro-7B": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 30,
                         "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 102400,
                         "max_position_embeddings": 16384, "codes": 16384, "image_size": 384, "patch_size": 16},
        "Janus-Pro-1B": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                         "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
                         "max_position_embeddings": 16384, "codes": 16384, "image_size": 384, "patch_size": 16},
    },
    "emu3": {
        "Emu3-Gen": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 184622,
                     "max_position_embeddings": 9216, "codes": 32768, "vq_base_channels": 256,
                     "vq_channel_multiplier": [1, 2, 2, 4]},
    },
    "lumina": {
        "Lumina-mGPT-7B": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 65536,
                           "max_position_embeddings": 10240, "codes": 8192},
    },
    # Lumina-mGPT 2.0: Chameleon-7B's stack (the same fork); vocab_size past its image ids 155000-171383 is not
    # in the repo (172032 assumed), nor its config's positions (10240: generate.py's max_gen_len)
    "lumina2": {
        "Lumina-mGPT-2.0": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 172032,
                            "max_position_embeddings": 10240, "codes": 16384},
    },
    # Emu3.5-Image: 151,854 text / special ids + 131,072 visual ones (counted in the real tokenizer files); the
    # stack inferred from the published 34.1B = 31.2B transformer + 2.9B embeddings, the positions from its
    # 32,768-token context (no real config.json seen)
    "emu3.5": {
        "Emu3.5-Image": {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                         "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 282926,
                         "max_position_embeddings": 32768, "codes": 131072},
    },
}


def _shapes(family: str, shapes) -> dict:
    if isinstance(shapes, str):
        if shapes not in SHAPES[family]:
            raise KeyError(f"no {family} shapes named {shapes!r}; known: {', '.join(SHAPES[family])}")
        return dict(SHAPES[family][shapes])
    return dict(shapes)


def emu3_vocabulary(vocab_size: int, codes: int) -> dict[str, int]:
    """A vocabulary map laid out as Emu3's: visual tokens last, the special tokens just below them, and the
    characters the image prefix needs."""
    first_visual = vocab_size - codes
    specials = ["<|extra_200|>", "<|extra_201|>", "<|endoftext|>", "<|extra_203|>", "<|extra_204|>",
                EMU3_IMAGE_START, EMU3_IMAGE_END, IMAGE_WRAPPER]
    vocab = {name: first_visual - len(specials) + i for i, name in enumerate(specials)}
    vocab.update({c: i for i, c in enumerate("0123456789*")})
    vocab.update({f"<|visual token {i:06d}|>": first_visual + i for i in range(codes)})
    return vocab


def lumina_vocabulary(vocab_size: int, codes: int) -> dict[str, int]:
    """A vocabulary map laid out as Chameleon's: <s> <pad> </s>, image tokens from id 4 in code order, then
    <eoss>, <racm3:break> and the reserved tokens at their real ids (<reservedNNNNN> = NNNNN + 4)."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2}
    digits = {str(i): chr(ord("A") + i) for i in range(10)}
    vocab.update({"IMGIMG" + "".join(digits[c] for c in str(i)) + "Z": 4 + i for i in range(codes)})
    vocab.update({LUMINA_IMAGE_END: 4 + codes, LUMINA_IMAGE_START: 5 + codes})
    for n in range(6 + codes, vocab_size):
        if n - 4 >= 0 and n - 4 >= 8700 and n - 4 < 8900:
            vocab[f"<reserved{n - 4:05d}>"] = n
    return vocab


def random_config(family: str, shapes):
    """The transformers config of `family` at `shapes` (a name in SHAPES[family] or a dict of them)."""
    sh = _shapes(family, shapes)
    if family == "janus":
        from transformers import JanusConfig

        codes, image_size, patch = sh.pop("codes"), sh.pop("image_size"), sh.pop("patch_size")
        # the VQ model's own sizes (optional: Janus-Pro's by default); generation never runs it
        vq = {k: sh.pop("vq_" + k) for k in ("base_channels", "channel_multiplier", "latent_channels")
              if "vq_" + k in sh}
        d = sh["hidden_size"]
        n = image_size // patch
        return JanusConfig(
            text_config=dict(model_type="llama", bos_token_id=JANUS_BOS_ID % sh["vocab_size"],
                             pad_token_id=JANUS_PAD_ID % sh["vocab_size"], **sh),
            vision_config=dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=image_size,
                               patch_size=patch, projection_dim=d, num_image_tokens=n * n, depth=1),
            vq_config=dict(num_embeddings=codes, embed_dim=8, projection_dim=d, image_token_embed_dim=d, **vq),
            tie_word_embeddings=False)
    if family == "emu3":
        from transformers import Emu3Config

        codes, base, mult = sh.pop("codes"), sh.pop("vq_base_channels"), sh.pop("vq_channel_multiplier")
        vocab = emu3_vocabulary(sh["vocab_size"], codes)
        return Emu3Config(
            text_config=dict(bos_token_id=vocab["<|extra_203|>"], eos_token_id=vocab["<|extra_204|>"],
                             pad_token_id=vocab["<|endoftext|>"], attention_dropout=0.0, **sh),
            vq_config=dict(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=base,
                           channel_multiplier=mult, num_res_blocks=1, attn_resolutions=[],
                           hidden_size=base * mult[-1], num_attention_heads=1),
            vocabulary_map=vocab)
    if family == "lumina":
        from transformers import ChameleonConfig

        codes = sh.pop("codes")
        return ChameleonConfig(bos_token_id=0, pad_token_id=1, eos_token_id=2,
                               vocabulary_map=lumina_vocabulary(sh["vocab_size"], codes),
                               vq_config=dict(num_embeddings=codes, base_channels=32, channel_multiplier=[1, 1],
                                              num_res_blocks=1, embed_dim=8, latent_channels=8), **sh)
    if family == "lumina2":  # image codes are ids 155000 + c: no image names in the vocabulary map
        from transformers import ChameleonConfig

        sh.pop("codes")
        return ChameleonConfig(bos_token_id=None, pad_token_id=None, eos_token_id=151666, vocabulary_map={},
                               vq_config=dict(num_embeddings=64, base_channels=32, channel_multiplier=[1, 1],
                                              num_res_blocks=1, embed_dim=8, latent_channels=8), **sh)
    if family == "emu3.5":  # the release's config.json layout, read as the loader reads it (a Qwen3Config)
        from ssd_core.families.emu35 import FIRST_VISUAL, released_config

        codes = sh.pop("codes")
        if sh["vocab_size"] != FIRST_VISUAL + codes:
            raise ValueError(f"emu3.5 shapes: vocab_size {sh['vocab_size']} != {FIRST_VISUAL} + codes {codes}")
        return released_config({"architectures": ["Emu3ForCausalLM"], "model_type": "Emu3", "hidden_act": "silu",
                                "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "tie_word_embeddings": False,
                                "pad_token_id": 151643, "bos_token_id": 151849, "eos_token_id": 151850, **sh})
    raise KeyError(f"no random shapes for family {family!r}; known: {', '.join(SHAPES)}")


def _model_class(family: str):
    """The class the family's loader builds: its own where it has one for a config of its own (emu3.5's Qwen3
    subclass), else transformers' class of that name."""
    from ssd_core.families import family_class
    import transformers

    cls = family_class(family)
    if hasattr(cls, "transformers_config"):
        return cls.model_class(None)
    return getattr(transformers, cls.transformers_class)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default floating dtype inside the block (the dtype new parameters get), restored after it."""
    if not dtype.is_floating_point:
        raise TypeError(f"a random model is built in a floating dtype, got {dtype}")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_random(model_cls, config, device="cpu", dtype=torch.bfloat16, seed: int = 0):
    """A random-init transformers model of `config`, made in `dtype` on `device` directly: every parameter is
    created there in `dtype` (torch's default dtype and device while it is built) and initialised in place, so
    no float32 copy is ever held (Janus-Pro-7B in bf16 allocates its 14.2 GB of weights and nothing else, where
    a float32 build and a cast held 28.3 + 14.2 GB: construction_bytes). Buffers that transformers computes in
    float32 on purpose (rotary inv_freq) stay float32, as from_pretrained leaves them. device "meta": the
    shapes only, nothing allocated."""
    torch.manual_seed(seed)
    with default_dtype(dtype), torch.device(device):
        return model_cls(config).eval()


def random_heads(model, device=None, dtype=None, seed: int = 0):
    """Random-init DraftHeads for a GridModel, built in the model's dtype on its device (no float32 copy)."""
    from ssd_core.heads import DraftHeads

    torch.manual_seed(seed)
    with default_dtype(dtype or model.dtype), torch.device(device or model.device):
        return DraftHeads.for_model(model).eval()


def random_model(family: str, shapes, device="cpu", dtype=torch.bfloat16, seed: int = 0, grid=None, vqgan=None):
    """A GridModel of `family` with random weights of `shapes`; `grid` (emu3, lumina) and `vqgan` (lumina; emu3.5's
    ibq) as the family's load options."""
    from ssd_core.families import family_class

    config = random_config(family, shapes)
    model = build_random(_model_class(family), config, device, dtype, seed)
    cls = family_class(family)
    if family == "janus":
        from transformers import GenerationConfig

        v = config.text_config.vocab_size
        model.generation_config = GenerationConfig(bos_token_id=JANUS_BOS_ID % v, pad_token_id=JANUS_PAD_ID % v,
                                                   generation_kwargs={"boi_token_id": JANUS_BOI_ID % v})
        return cls(model)
    if family == "emu3":
        return cls(model, None, None, grid=grid)
    if family == "emu3.5":
        return cls(model, None, None, ibq=vqgan, grid=grid)
    return cls(model, None, None, vqgan=vqgan, grid=grid)


def count_parameters(family: str, shapes) -> int:
    """Parameters of `family`'s model at `shapes`, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = _model_class(family)(random_config(family, shapes))
    return sum(p.numel() for p in model.parameters())


class AllocationCounter(TorchDispatchMode):
    """Bytes of every new storage the ops run inside it create, by dtype; views and in-place ops (the random
    init) create none. Their sum bounds the block's peak memory from above. Works on the meta device, where
    nothing is allocated: the shapes and dtypes are the real ones."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[torch.dtype, int] = {}  # dtype -> bytes of the new storages
        self.largest: dict[torch.dtype, int] = {}  # dtype -> bytes of the largest one

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in {id(t): t for t in tree_leaves(out) if isinstance(t, torch.Tensor)}.values():
            storage = t.untyped_storage()
            if storage._cdata not in given:
                given.add(storage._cdata)
                n = storage.nbytes()
                self.bytes[t.dtype] = self.bytes.get(t.dtype, 0) + n
                self.largest[t.dtype] = max(self.largest.get(t.dtype, 0), n)
        return out


def construction_bytes(family: str, shapes, dtype=torch.bfloat16, device="meta", build=None) -> dict:
    """What building `family`'s random model at `shapes` allocates: {"parameters": bytes of its parameters,
    "allocated": {dtype name: bytes of every storage created}, "largest": {dtype name: the largest one}}.
    `build` (model class, config, device, dtype) -> model: the builder to count (default build_random)."""
    build = build or (lambda cls, config, dev, dt: build_random(cls, config, dev, dt))
    counter = AllocationCounter()
    with counter:
        model = build(_model_class(family), random_config(family, shapes), device, dtype)
    name = lambda dt: str(dt).replace("torch.", "")  # noqa: E731
    return {"parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
            "allocated": {name(k): v for k, v in counter.bytes.items()},
            "largest": {name(k): v for k, v in counter.largest.items()}}
