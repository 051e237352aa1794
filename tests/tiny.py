"""Tiny real llama-grid models for the tests: random-init LlamaForCausalLM saved with save_pretrained."""
from __future__ import annotations

import json
from pathlib import Path

import torch


def make_llama_grid(folder: Path, grid=(4, 5), image_vocab: int = 16, num_classes: int = 3, row_end: bool = False,
                    hidden: int = 32, layers: int = 2, seed: int = 0, max_positions: int = 256) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    row_end_token = image_vocab if row_end else None
    class_start = image_vocab + (1 if row_end else 0)
    null = class_start + num_classes
    config = LlamaConfig(vocab_size=null + 1, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so that drafts and decisions matter
        model.lm_head.weight.mul_(8.0)
    folder = Path(folder)
    model.save_pretrained(folder)
    spec = {"family": "llama-grid", "grid": list(grid), "image_token_start": 0, "image_vocab_size": image_vocab,
            "row_end_token": row_end_token, "num_classes": num_classes, "class_token_start": class_start,
            "null_class_token": null, "vq_decoder": None, "class_names": [f"class{i}" for i in range(num_classes)]}
    (folder / "ssd_model.json").write_text(json.dumps(spec))
    return folder


def make_heads(model, path: Path, seed: int = 0) -> Path:
    from ssd_core.heads import DraftHeads

    torch.manual_seed(seed)
    heads = DraftHeads.for_model(model)
    heads.save(path)
    return path


def tiny_model_and_heads(folder: Path, grid, row_end: bool = True):
    """A tiny llama-grid model saved in `folder`, loaded, with random heads beside it (loaded)."""
    import ssd_core

    model = ssd_core.load_model(make_llama_grid(folder, grid=grid, row_end=row_end))
    return model, ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)


def heads_with(model, plain, **extra):
    """`plain`'s weights in heads with these metadata switches (e.g. refine=1, vertical_shift=1)."""
    from ssd_core.heads import DraftHeads

    heads = DraftHeads.for_model(model, **extra)
    heads.load_state_dict(plain.state_dict())
    return heads


def drafted_rows(model, heads, rows: int):
    """ssd's drafting of the first `rows` rows after a class-1 prompt (cfg 2, each draft its argmax): the run
    and the log q of every drafted slot, by slot."""
    from ssd_core.decoders.drafting import draft, rows_end
    from ssd_core.run import Run
    from ssd_core.sampling import SamplerSettings

    layout = model.layout(None)
    session = model.start(model.build_prompt(1, "", True, layout.grid))
    run = Run(model, heads, layout, SamplerSettings(seed=0, cfg=2.0), session.last_features)
    run.session = session
    seen = {}

    def pick(logp, a, b):
        for slot, row in zip(run.index.image_slots[a:b], logp):
            seen[slot] = row
        return logp.argmax(-1).cpu()

    draft(run, rows_end(run, 0, rows), pick)
    return run, seen
