"""Self-distillation of the draft heads, trained for acceptance, at any model's scale.

    prompts.py   what the model is asked to draw (a prompts file, the shipped PartiPrompts, class ids)
    data.py      grids (self-distilled, or read from files) and teacher-forced features of a batch
    shards.py    self-distilled grids on disk in shards (skipped on a rerun, refused when made otherwise)
    features.py  a batch's features: streamed from the frozen model, or from a bounded on-disk file
    dist.py      one process, or several (accelerate launch / torchrun: data parallel, gradients averaged)
    loop.py      losses, the one-cycle schedule, checkpoints, resume, the held-out report
    plan.py      `train-heads --plan`: a few measured steps here, and the run projected for a named model / GPU
    publish.py   `--push-to-hub`: the heads file and a model card
    cli.py       the train-heads command line

docs/heads.md says how to train heads for a real model on one GPU or eight.
"""
from .config import MAX_COUNT, MAX_GRIDS, MAX_WIDTH, TrainConfig
from .data import (base_quantization, check_features_file, collect_features, generate_grids, model_identity,
                   read_grids, stale_features)
from .loop import acceptance_lines, agreement, head_losses, one_cycle, start_heads, train_heads
from .prompts import default_prompts, prompt_order, read_prompts
from .state import state_path

__all__ = ["MAX_COUNT", "MAX_GRIDS", "MAX_WIDTH", "TrainConfig", "acceptance_lines", "agreement", "base_quantization",
           "check_features_file", "collect_features", "default_prompts", "generate_grids", "head_losses",
           "model_identity", "one_cycle", "prompt_order", "read_grids", "read_prompts", "stale_features",
           "start_heads", "state_path", "train_heads"]
