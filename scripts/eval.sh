#!/usr/bin/env bash
# Evaluate a run or a checkpoint: scripts/eval.sh RUN_DIR_OR_MODEL [vlgrpo eval flags ...]
#
# RUN_DIR (holds config.yaml + checkpoints/): evaluates the newest checkpoint on the run's data.test (else data.val)
# with the run's eval.suites, answer format, box convention, dtype and rollout.max_new_tokens (as the run's own
# in-loop eval decodes), writing RUN_DIR/eval/step_N/{metrics.json,
# predictions.jsonl,report.md}. `vlgrpo eval` exports the run's newest checkpoint itself, in one process (LoRA
# merged; ZeRO-3 shards consolidated offline, whatever the training world size).
# MODEL (an HF checkpoint directory or hub id): pass --data FILE; writes to eval_out/ unless --out is given.
# Flags after the first argument go to `vlgrpo eval` and win over the ones set here (e.g. --suite pope
# --pope-data data/pope_coco/coco_pope_adversarial.json).
# Environment: SUITES (default: the run's eval.suites; vqa for a plain checkpoint), PYTHON (python), DRY_RUN=1 (print
# the commands only).
set -euo pipefail

TARGET=${1:?usage: scripts/eval.sh RUN_DIR_OR_MODEL [vlgrpo eval flags ...]}
shift
PYTHON=${PYTHON:-python}

run() {  # print the command; run it unless DRY_RUN=1
    echo "+ $*" >&2
    if [[ "${DRY_RUN:-0}" != 1 ]]; then "$@"; fi
}
cfg_get() {  # cfg_get KEY: a key of the run's resolved config.yaml (empty for null)
    "$PYTHON" -c 'import sys; from vlgrpo.config import get_key, load_config
v = get_key(load_config(sys.argv[1]), sys.argv[2])
print("" if v is None else ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v)' "$TARGET/config.yaml" "$1"
}

if [[ ! -f "$TARGET/config.yaml" ]]; then  # a plain checkpoint or hub id
    run "$PYTHON" -m vlgrpo.cli eval --model "$TARGET" --suite "${SUITES:-vqa}" "$@"
    exit
fi

STEP=$(ls -d "$TARGET"/checkpoints/step_* 2>/dev/null | sed 's/.*step_//' | sort -n | tail -1)
[[ -n "$STEP" ]] || { echo "error: '$TARGET' has no checkpoint under checkpoints/" >&2; exit 2; }
OUT="$TARGET/eval/step_$STEP"
DATA=$(cfg_get data.test)
DATA=${DATA:-$(cfg_get data.val)}
SUITES=${SUITES:-$(cfg_get eval.suites)}
COMMON=(--suite "$SUITES" --out "$OUT" --dtype "$(cfg_get model.dtype)" --max-new-tokens "$(cfg_get rollout.max_new_tokens)")
[[ -z "$DATA" ]] || COMMON+=(--data "$DATA")
BOX=$(cfg_get reward.box_format)
[[ "$BOX" == auto ]] || COMMON+=(--box-format "$BOX")

run "$PYTHON" -m vlgrpo.cli eval --model "$TARGET" "${COMMON[@]}" --answer-format "$(cfg_get data.answer_format)" "$@"
