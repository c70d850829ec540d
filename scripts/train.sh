#!/usr/bin/env bash
# Train on one node: scripts/train.sh CONFIG [section.key=value ...]
#
#   1. `vlgrpo data doctor CONFIG` checks every split the config names (SKIP_DOCTOR=1 skips it);
#   2. `vlgrpo train CONFIG overrides` runs in NPROC_PER_NODE processes (default: the config's train.num_gpus, less
#      rollout.vllm.rollout_gpus with split vLLM: those run each rank's rollout worker) under torchrun, or the
#      deepspeed launcher with LAUNCHER=deepspeed; with one process, directly.
#   3. under torchrun a rank that dies (killed, out of memory) or fails restarts the whole group up to MAX_RESTARTS
#      times (default 3); each restart resumes from the newest verified checkpoint (train.resume, on by default), so
#      it repeats at most train.save_every steps. A rank that hangs is stopped by train.fault_timeout_s first. A
#      permanent failure (bad config or data, the non-finite limit, a full disk, a checkpoint that fails its checksum:
#      exit status 2) is recorded in the run directory and not replayed: the restarted ranks stop at once.
#
# Environment: NPROC_PER_NODE, LAUNCHER (torchrun | deepspeed), MASTER_PORT (29500), MAX_RESTARTS (3), SKIP_DOCTOR=1,
# DRY_RUN=1 (print the commands, run nothing), PYTHON (the interpreter that has vlgrpo installed; default python).
# Examples:
#   scripts/train.sh configs/qwen2_5_vl_7b_zero3_8xa100.yaml
#   scripts/train.sh configs/qwen2_5_vl_7b_lora_8xa100.yaml train.lr=2e-5 train.output_dir=runs/lora_lr2e-5
set -euo pipefail

CONFIG=${1:?usage: scripts/train.sh CONFIG [section.key=value ...]}
shift
PYTHON=${PYTHON:-python}
LAUNCHER=${LAUNCHER:-torchrun}
MASTER_PORT=${MASTER_PORT:-29500}
MAX_RESTARTS=${MAX_RESTARTS:-3}

run() {  # print the command; run it unless DRY_RUN=1
    echo "+ $*" >&2
    if [[ "${DRY_RUN:-0}" != 1 ]]; then "$@"; fi
}

# The config is the single source of truth: the process count defaults to its training GPUs (this also validates
# the config and the overrides before any GPU is touched).
NPROC=${NPROC_PER_NODE:-$("$PYTHON" -c 'import sys; from vlgrpo.config import ConfigError, load_config
try: c = load_config(sys.argv[1], sys.argv[2:]); r = c.rollout
except ConfigError as e: sys.exit(f"error: {e}")
print(c.train.num_gpus - (r.vllm.rollout_gpus if (r.engine, r.placement) == ("vllm", "split") else 0))' \
    "$CONFIG" "$@")}

if [[ "${SKIP_DOCTOR:-0}" != 1 ]]; then
    sets=()
    for o in "$@"; do sets+=(--set "$o"); done
    run "$PYTHON" -m vlgrpo.cli data doctor "$CONFIG" ${sets[@]+"${sets[@]}"}
fi

if [[ "$NPROC" == 1 ]]; then
    run "$PYTHON" -m vlgrpo.cli train "$CONFIG" "$@"
elif [[ "$LAUNCHER" == deepspeed ]]; then
    run deepspeed --num_gpus "$NPROC" --master_port "$MASTER_PORT" --no_local_rank \
        --module vlgrpo.cli train "$CONFIG" "$@"
else
    run "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" --max-restarts "$MAX_RESTARTS" \
        -m vlgrpo.cli train "$CONFIG" "$@"
fi
