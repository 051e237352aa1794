#!/usr/bin/env bash
# reference-48 trained on a GPU and judged, in one command of the device tool (issue 41: ar class accuracy >= 75%).
#
#   reference_recipe/gpu_r48.sh OUT [TRAIN_MINUTES]        (on the GPU machine, from the repository root)
#
# Before, here: `python -m reference_recipe.r48 data --work build/r48g --copies 24` (16-25 min) and `... pack --work
# build/r48g` (data.safetensors.xz, 18.6 MB: carry build/r48g/data.safetensors.xz, not the 100 MB unpacked file).
# There: with MINUTES32 set, first the tenth extension's curriculum: MINUTES32 of 32x32 sequences only from the shipped
# reference-48, its trained weights the start of what follows. Then trains on for TRAIN_MINUTES (default 4; batch
# BATCH, peak LR held for a third of the time then linearly to 0, classes balanced, the usual 30% of 32x32 steps;
# NOISE: a share of the codes read swapped, r48's --noise), ships the weights of the lowest held-out NLL (best.pt: the
# rule fixed before any image is drawn, and a guard against over-fitting the copies) into ssd_core/reference/$CANDIDATE
# (beside the VQ and yardstick it names), fine-tunes the shipped heads on its features (HEADS_EPOCHS of 240 training
# grids, the recipe's flags, saved in fp16; 0 skips it), copies the candidate to OUT/model48/ (5 files: the device
# tool returns 8 at most), then judges it on the 64 pairs (reference_recipe/judge48.py, PROCS processes) into
# OUT/judge.json; the log is OUT/train.log. A judge cut short by the tool's limit still leaves the model to bring back.
# Environment, all optional: WORK (build/r48g), DEVICE (cuda), BATCH (64), LR (6e-4), LAYERS (the init's 6),
# MINUTES32 (0), NOISE (0), HEADS_EPOCHS (4), PROCS (16), CANDIDATE (candidate48), JUDGE_LIMIT (pairs a block; all),
# JUDGE_GRID (the model's), PYTHON (python3).
set -euo pipefail
OUT=${1:?usage: reference_recipe/gpu_r48.sh OUT_FOLDER [TRAIN_MINUTES]}
MINUTES=${2:-4}
WORK=${WORK:-build/r48g}
CANDIDATE=ssd_core/reference/${CANDIDATE:-candidate48}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/model48"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)" | tee "$OUT/train.log"
TRAIN=(--device "${DEVICE:-cuda}" --batch "${BATCH:-64}" --lr "${LR:-6e-4}" --balance)
INIT=ssd_core/reference/model48
if [ "${MINUTES32:-0}" != 0 ]; then  # the curriculum's 32x32 phase, in a work folder of its own beside the data
  mkdir -p "$WORK/p32"
  ln -sf "$(realpath "$WORK")"/data.safetensors* "$WORK/p32/"
  $PY -m reference_recipe.r48 train --work "$WORK/p32" --init "$INIT" "${TRAIN[@]}" --minutes "$MINUTES32" \
    --mix32 1.0 ${LAYERS:+--layers "$LAYERS"} 2>&1 | tee -a "$OUT/train.log"
  $PY -m reference_recipe.r48 ship --work "$WORK/p32" --init "$INIT" --weights trained --out "${CANDIDATE}p" 2>&1 \
    | tee -a "$OUT/train.log"
  INIT=${CANDIDATE}p
  LAYERS=  # the phase grew them already
fi
$PY -m reference_recipe.r48 train --work "$WORK" --init "$INIT" "${TRAIN[@]}" --minutes "$MINUTES" \
  ${NOISE:+--noise "$NOISE"} ${LAYERS:+--layers "$LAYERS"} 2>&1 | tee -a "$OUT/train.log"
$PY -m reference_recipe.r48 ship --work "$WORK" --init "$INIT" --weights best \
  --out "$CANDIDATE" 2>&1 | tee -a "$OUT/train.log"
cp "$CANDIDATE"/config.json "$CANDIDATE"/generation_config.json "$CANDIDATE"/model.safetensors \
  "$CANDIDATE"/ssd_model.json "$OUT/model48/"
if [ "${HEADS_EPOCHS:-4}" != 0 ]; then  # the shipped heads fine-tuned on the candidate's features (the recipe's flags)
  $PY -m reference_recipe.r48 grids --work "$WORK" 2>&1 | tee -a "$OUT/train.log"
  $PY -m ssd_core train-heads --model "$CANDIDATE" --device "${DEVICE:-cuda}" --dtype fp32 \
    --grids "$WORK/grids48.safetensors" --samples 0 --heldout-grids "$WORK/heldout48.safetensors" \
    --init ssd_core/reference/model48/heads.safetensors --train both --vertical-shift 1 --vertical-left 2 \
    --vertical-intermediate 1024 --tv-weight 2 --kl-weight 0 --lr 1e-3 --batch 8 --epochs "${HEADS_EPOCHS:-4}" \
    --out "$WORK/heads48.safetensors" 2>&1 | tee -a "$OUT/train.log"
  $PY -c "import sys; from ssd_core.heads import load_heads_file
load_heads_file(sys.argv[1]).half().save(sys.argv[2])" "$WORK/heads48.safetensors" "$CANDIDATE/heads.safetensors"
  cp "$CANDIDATE/heads.safetensors" "$OUT/model48/"
fi
$PY -m reference_recipe.judge48 --model "$CANDIDATE" --procs "${PROCS:-16}" --out "$OUT/judge.json" \
  ${JUDGE_LIMIT:+--limit "$JUDGE_LIMIT"} ${JUDGE_GRID:+--grid "$JUDGE_GRID"}
