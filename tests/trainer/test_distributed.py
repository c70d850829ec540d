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

WORKER = Path(__file__).with_name("dist_worker.py")


def _torchrun(tmp_path, port: int, *overrides: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(WORKER), str(tmp_path / "cfg.yaml"), str(tmp_path), *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _config(tmp_path, tiny_model_dir, shapes_dir, *extra):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}",
                      "train.save_every=1", *extra)
    save_config(cfg, tmp_path / "cfg.yaml")


def test_zero3_two_ranks_on_cpu_trains_and_exports_the_gathered_weights(tmp_path, tiny_model_dir, shapes_dir):
    pytest.importorskip("deepspeed")
    _config(tmp_path, tiny_model_dir, shapes_dir, "train.backend=zero3", "grpo.beta=0.04")
    _torchrun(tmp_path, 29517)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and "grpo/kl" in rows[-1]
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "zero3").is_dir()  # DeepSpeed's own sharded checkpoint
    gathered = torch.load(tmp_path / "weights_rank0.pt")
    exported = load_model(str(tmp_path / "export")).model.state_dict()
    base = load_model(tiny_model_dir()).model.state_dict()
    missing = set(exported) - set(gathered)
    assert missing <= {"lm_head.weight"}  # tied to the embeddings: one gathered tensor serves both
    for name, tensor in exported.items():
        expected = gathered.get(name, gathered["model.language_model.embed_tokens.weight"])
        assert torch.equal(tensor, expected), name  # the export is exactly the gathered weights
    moved = [n for n in exported if not torch.equal(exported[n], base[n])]
    assert moved and all(".visual." not in f".{n}" for n in moved)  # trained, vision tower frozen
    # `vlgrpo export` in ONE process consolidates the 2-rank ZeRO-3 checkpoint to the same weights
    from vlgrpo.cli import main

    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "offline")]) == 0
    offline = load_model(str(tmp_path / "offline")).model.state_dict()
    assert all(torch.equal(offline[n], exported[n]) for n in exported)


def test_lora_data_parallel_keeps_the_ranks_identical(tmp_path, tiny_model_dir, shapes_dir):
    _config(tmp_path, tiny_model_dir, shapes_dir, "train.backend=lora", "train.lora.rank=4", "train.lr=1e-2")
    _torchrun(tmp_path, 29518)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]  # rank 0 logs, once per step
    w0, w1 = (torch.load(tmp_path / f"weights_rank{r}.pt") for r in (0, 1))
    base = load_model(tiny_model_dir()).model.state_dict()
    # each rank saw different prompts; averaged gradients keep the replicas equal, and training moved them
    assert all(torch.equal(w0[n], w1[n]) for n in w0)
    assert any(not torch.equal(w0[n], base[n]) for n in base if n in w0)


def test_zero3_sft_gathers_only_the_vision_tower_to_encode(tmp_path, tiny_model_dir, shapes_dir):
    pytest.importorskip("deepspeed")
    _config(tmp_path, tiny_model_dir, shapes_dir, "train.backend=zero3", "train.stage=sft")
    _torchrun(tmp_path, 29519)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["vision/images_encoded"] >= 1
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]  # the gold answers got likelier
