"""Run under `torchrun --nproc_per_node 2`: train a few ZeRO-3 steps on the CPU, then dump the gathered weights
(every rank joins the gather; rank 0 saves) and export a plain HF checkpoint. Used by test_zero3.py."""

import sys

import torch

from vlgrpo.config import load_config
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


def main(config_path: str, out_dir: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config_path, list(overrides))
    state = build_state(cfg, progress=False)
    Trainer(state).train()
    gathered = {k: v.clone() for k, v in state.backend.named_weights()}
    if torch.distributed.get_rank() == 0:
        torch.save(gathered, f"{out_dir}/gathered.pt")
    state.backend.export(f"{out_dir}/export", state.lm.processor)
    state.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
