import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vlgrpo.config import save_config
from vlgrpo.models import load_model
from vlgrpo.trainer.metrics import read_metrics

from trainer_helpers import tiny_config, write_reward_module

pytest.importorskip("deepspeed")


def test_zero3_two_ranks_on_cpu_trains_and_exports_the_gathered_weights(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "train.backend=zero3",
                      f"reward.recipe={{'{spec}': 1.0}}", "grpo.beta=0.04", "train.save_every=1")
    save_config(cfg, tmp_path / "cfg.yaml")
    worker = Path(__file__).with_name("zero3_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           str(worker), str(tmp_path / "cfg.yaml"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and "grpo/kl" in rows[-1]
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "zero3").is_dir()  # DeepSpeed's own sharded checkpoint
    gathered = torch.load(tmp_path / "gathered.pt")
    exported = load_model(str(tmp_path / "export")).model.state_dict()
    base = load_model(tiny_model_dir()).model.state_dict()
    missing = set(exported) - set(gathered)
    assert missing <= {"lm_head.weight"}  # tied to the embeddings: one gathered tensor serves both
    for name, tensor in exported.items():
        expected = gathered.get(name, gathered["model.language_model.embed_tokens.weight"])
        assert torch.equal(tensor, expected), name  # the export is exactly the gathered weights
    moved = [n for n in exported if not torch.equal(exported[n], base[n])]
    assert moved and all(".visual." not in f".{n}" for n in moved)  # trained, vision tower frozen
