#!/usr/bin/env bash
# GPU validation in one command, from a copy of this repository on a machine with one CUDA GPU (no network needed):
#
#   scripts/gpu_check.sh              # ~3-5 minutes on one GPU; writes docs/gpu-validation.md
#   scripts/gpu_check.sh --dry-run    # the same code path on the CPU at tiny sizes; writes under --work, not docs/
#   scripts/gpu_check.sh --arch qwen3_vl   # the same on Qwen3-VL (DeepStack); writes docs/gpu-validation-qwen3_vl.md
#   scripts/gpu_check.sh --arch qwen3_5    # the same on Qwen3.5 (hybrid); writes docs/gpu-validation-qwen3_5.md
#
# It measures 20 GRPO steps of the demo task (LoRA and full fine-tune, bf16, HF engine): seconds per phase and the
# vision cache's encoder calls; and the memory planner against torch.cuda.max_memory_allocated for a random ~2 B
# Qwen2.5-VL (see scripts/gpu_check.py). Exit status: 0 all within 10 %, 1 a planner miss (written, not hidden),
# 2 could not run (a missing package or no GPU; the message says which).
#
# Environment: PYTHON (default python), WHEELS (a folder of wheels to install first with --no-deps --no-index, e.g.
# qwen-vl-utils or math-verify when the image lacks them), TIMEOUT (seconds, default 600).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

if [[ -n "${WHEELS:-}" ]]; then
    "$PYTHON" -m pip install -q --no-deps --no-index "$WHEELS"/*.whl
fi
# The package runs from this checkout, installed or not (no pip install needed).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
exec timeout "${TIMEOUT:-600}" "$PYTHON" scripts/gpu_check.py "$@"
