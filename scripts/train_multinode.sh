#!/usr/bin/env bash
# Train on several nodes: scripts/train_multinode.sh CONFIG [section.key=value ...]
#
# torchrun (default): run this script on EVERY node with the same CONFIG and overrides, and
#   NNODES        number of nodes
#   MASTER_ADDR   address of the node that hosts the rendezvous, reachable from every node
#   MASTER_PORT   (29500)  GPUS_PER_NODE (NPROC_PER_NODE if set, else 8)
#   RDZV_ID       (vlgrpo) the job's rendezvous id, the same on every node
#   The nodes meet in torchrun's c10d rendezvous (--rdzv-backend c10d): a restart is agreed by all nodes and every
#   node starts the same attempt (with the static one each node counted its own restarts, and nodes that disagreed
#   waited for each other for ever). Ranks are assigned by the rendezvous: NODE_RANK is not needed. The ranks
#   number their restart attempt by the rendezvous' round (VLGRPO_RDZV_ENDPOINT, set here), the same on every node:
#   a launch of your own with torchrun on several nodes needs VLGRPO_RDZV_ENDPOINT=<its --rdzv-endpoint> too.
#   NPROC_PER_NODE training processes per node: GPUS_PER_NODE, less rollout.vllm.rollout_gpus with a split vLLM
#                 rollout (rollout.placement=split, rollout.engine=vllm: those GPUs run each rank's rollout worker)
#   MAX_RESTARTS  (3) restarts of the whole group after a rank or node fails; each resumes from the newest verified
#                 checkpoint. A permanent failure (bad config or data, the non-finite limit, a full disk, a checkpoint
#                 that fails its checksum: exit status 2) is not replayed: the restarted ranks stop at once. A node
#                 that dies for good needs the job restarted (on a replacement node, same command).
# deepspeed launcher: set HOSTFILE (lines "hostname slots=8") and run this script ONCE, on the first host; it starts
#   every rank over passwordless ssh. MASTER_ADDR defaults to the first host. A split vLLM rollout needs the torchrun
#   way (the launcher would start a rank on every slot, the rollout GPUs included).
#
# Every node must see the config, the dataset and the model at the same paths, and train.output_dir must be on a
# filesystem shared by all nodes (every rank writes its shard of each checkpoint there). train.num_gpus is set to
# the GPUs of all nodes, NNODES x GPUS_PER_NODE (the hostfile's slots), so the saved run config records them.
# `vlgrpo data doctor` runs first on each node (SKIP_DOCTOR=1 skips it); DRY_RUN=1 prints the commands only.
set -euo pipefail

CONFIG=${1:?usage: scripts/train_multinode.sh CONFIG [section.key=value ...]}
shift
PYTHON=${PYTHON:-python}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS=${GPUS_PER_NODE:-${NPROC_PER_NODE:-8}}  # an older NPROC_PER_NODE alone still means the GPUs
MAX_RESTARTS=${MAX_RESTARTS:-3}

run() {  # print the command; run it unless DRY_RUN=1
    echo "+ $*" >&2
    if [[ "${DRY_RUN:-0}" != 1 ]]; then "$@"; fi
}

if [[ -n "${HOSTFILE:-}" ]]; then
    [[ -f "$HOSTFILE" ]] || { echo "error: HOSTFILE '$HOSTFILE' does not exist" >&2; exit 2; }
    # the world size is the sum of the slots (DeepSpeed's hostfile format: every host line has slots=N)
    WORLD=$(awk '!/^[[:space:]]*(#|$)/ { if (!match($0, /slots=[0-9]+/)) { bad = 1; exit }
                                         s += substr($0, RSTART + 6, RLENGTH - 6) }
                 END { print (bad ? 0 : s) }' "$HOSTFILE")
    [[ "$WORLD" -gt 0 ]] || { echo "error: every host line of '$HOSTFILE' needs slots=N (GPUs)" >&2; exit 2; }
    MASTER_ADDR=${MASTER_ADDR:-$(awk '!/^[[:space:]]*(#|$)/ { print $1; exit }' "$HOSTFILE")}
else
    : "${NNODES:?set NNODES and MASTER_ADDR (or HOSTFILE for the deepspeed launcher)}"
    : "${MASTER_ADDR:?set MASTER_ADDR (the address of the node that hosts the rendezvous)}"
    WORLD=$((NNODES * GPUS))
fi
ARGS=(train "$CONFIG" "train.num_gpus=$WORLD" "$@")  # later overrides win: the user's own come last

# The config (with the overrides) is validated before anything starts; it says how many of a node's GPUs run vLLM.
ROLLOUT=$("$PYTHON" -c 'import sys; from vlgrpo.config import ConfigError, load_config
try: c = load_config(sys.argv[1], sys.argv[2:]); r = c.rollout
except ConfigError as e: sys.exit(f"error: {e}")
print(r.vllm.rollout_gpus if (r.engine, r.placement) == ("vllm", "split") else 0)' "$CONFIG" "${ARGS[@]:2}")
if [[ "$ROLLOUT" -gt 0 && -n "${HOSTFILE:-}" ]]; then
    echo "error: rollout.placement=split with vLLM runs under torchrun (NNODES, MASTER_ADDR): the" \
         "deepspeed launcher starts a rank on every slot of '$HOSTFILE', the $ROLLOUT rollout GPU(s) per node included" >&2
    exit 2
fi
NPROC=${NPROC_PER_NODE:-$((GPUS - ROLLOUT))}

if [[ "${SKIP_DOCTOR:-0}" != 1 ]]; then
    sets=()
    for o in "${ARGS[@]:2}"; do sets+=(--set "$o"); done
    run "$PYTHON" -m vlgrpo.cli data doctor "$CONFIG" "${sets[@]}"
fi

if [[ -n "${HOSTFILE:-}" ]]; then
    run deepspeed --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --no_local_rank \
        --module vlgrpo.cli "${ARGS[@]}"
else
    # the ranks read the rendezvous' round there: the restart attempt every node agrees on (trainer/group.py)
    export VLGRPO_RDZV_ENDPOINT="$MASTER_ADDR:$MASTER_PORT"
    run "$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node "$NPROC" --rdzv-backend c10d \
        --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "${RDZV_ID:-vlgrpo}" --max-restarts "$MAX_RESTARTS" \
        -m vlgrpo.cli "${ARGS[@]}"
fi
