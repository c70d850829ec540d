"""Run under `torchrun --nproc_per_node 2`: train a few steps on the CPU (any backend), then dump each rank's full
weights (ZeRO-3: gathered, every rank joins) to weights_rank{r}.pt and export a plain HF checkpoint.
rank{r}.json holds the rank's history and, after each step, its optimiser step count, the ids of the samples it
trained on and a fingerprint of its full weights (observed around the Trainer's own step, which runs unchanged).
Used by test_distributed.py."""

import json
import sys

import torch

from vlgrpo.config import load_config
from vlgrpo.trainer.group import exit_rank, leave_group
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


def group_timeouts(backend) -> dict[str, float]:
    """Seconds each process group the run uses waits in a collective: the world's and, under ZeRO-3, the group
    DeepSpeed reduce-scatters the gradients on (its optimiser's data-parallel group)."""
    groups = {"world": torch.distributed.group.WORLD}
    if backend.name == "zero3":
        groups["deepspeed_data_parallel"] = backend.engine.optimizer.dp_process_group
    cpu = torch.device("cpu")
    return {k: g._get_backend(cpu).options._timeout.total_seconds() for k, g in groups.items()}


def main(config_path: str, out_dir: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config_path, list(overrides))
    state = build_state(cfg, progress=False)
    trainer, progress, drawn = Trainer(state), [], []
    run_step, collate = trainer.step_fn, trainer._collate

    def recording_collate(groups, features):  # the samples this rank trains on (its own: the metrics are the union's)
        drawn.append([g.sample.id for g in groups])
        return collate(groups, features)

    trainer._collate = recording_collate

    def step_and_record() -> dict:
        metrics = run_step()
        progress.append(
            {
                "optimizer_steps": state.backend.scheduler.last_epoch,  # LambdaLR: stepped once per optimiser step
                "fingerprint": [float(w.double().sum()) for _, w in state.backend.named_weights()],  # collective
                "samples": drawn[-1] if drawn else [],
            }
        )
        return metrics

    trainer.step_fn = step_and_record
    history = trainer.train()
    weights = {k: v.clone() for k, v in state.backend.named_weights()}
    rank = torch.distributed.get_rank()
    torch.save(weights, f"{out_dir}/weights_rank{rank}.pt")
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump({"history": history, "progress": progress, "timeouts": group_timeouts(state.backend)}, f)
    if state.backend.name == "zero3" or rank == 0:  # the ZeRO-3 export is collective
        state.backend.export(f"{out_dir}/export", state.lm.processor)
    state.close()
    leave_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_rank(0)  # as `vlgrpo train` ends a rank
