#!/usr/bin/env bash
# reference-48 trained on a GPU and judged, in one command of the device tool (issue 41: ar class accuracy >= 75%).
#
#   reference_recipe/gpu_r48.sh OUT [TRAIN_MINUTES]        (on the GPU machine, from the repository root)
#
# Before, here: `python -m reference_recipe.r48 data --work build/r48g --copies 24` (25 min) and `... pack --work
# build/r48g` (data.safetensors.xz, 18.6 MB: carry build/r48g/data.safetensors.xz, not the 100 MB unpacked file).
# There: trains the shipped reference-48 on for TRAIN_MINUTES (default 4; batch BATCH, peak LR held for a third of
# the time then linearly to 0, classes balanced), ships the weights of the lowest held-out NLL (best.pt: the rule
# fixed before any image is drawn, and a guard against over-fitting the copies) into ssd_core/reference/$CANDIDATE
# (beside the VQ and yardstick it names), copies them to OUT/model48/ (4 files: the device tool returns 8 at most),
# then judges them on the 64 pairs (reference_recipe/judge48.py, PROCS processes) into OUT/judge.json; the log is
# OUT/train.log. A judge cut short by the tool's limit still leaves the model to bring back.
# Environment, all optional: WORK (build/r48g), DEVICE (cuda), BATCH (64), LR (6e-4), LAYERS (the init's 6),
# PROCS (16), CANDIDATE (candidate48), JUDGE_LIMIT (pairs a block; all), JUDGE_GRID (the model's), PYTHON (python3).
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
$PY -m reference_recipe.r48 train --work "$WORK" --init ssd_core/reference/model48 --device "${DEVICE:-cuda}" \
  --batch "${BATCH:-64}" --minutes "$MINUTES" --lr "${LR:-6e-4}" --balance \
  ${LAYERS:+--layers "$LAYERS"} 2>&1 | tee -a "$OUT/train.log"
$PY -m reference_recipe.r48 ship --work "$WORK" --init ssd_core/reference/model48 --weights best \
  --out "$CANDIDATE" 2>&1 | tee -a "$OUT/train.log"
cp "$CANDIDATE"/config.json "$CANDIDATE"/generation_config.json "$CANDIDATE"/model.safetensors \
  "$CANDIDATE"/ssd_model.json "$OUT/model48/"
$PY -m reference_recipe.judge48 --model "$CANDIDATE" --procs "${PROCS:-16}" --out "$OUT/judge.json" \
  ${JUDGE_LIMIT:+--limit "$JUDGE_LIMIT"} ${JUDGE_GRID:+--grid "$JUDGE_GRID"}
