"""Faults on 2 CPU ranks (gloo) under torchrun, launched as a user launches `vlgrpo train`: one rank raises or
blocks in one phase; every rank is out within the bound, with a non-zero exit, the failing rank named, and no
process left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlgrpo.config import save_config

from trainer_helpers import tiny_config, write_reward_module

WORKER = Path(__file__).with_name("fault_worker.py")


def _launch(tmp_path, port: int, fault: str, *overrides: str, timeout: int = 180) -> tuple[int, str, float]:
    """(exit status, stderr, seconds from the injected fault to the end of torchrun)."""
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(str(tmp_path / "model"), tmp_path, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}",
                      "train.steps=4", "train.save_every=1", *overrides)  # fmt: skip
    save_config(cfg, tmp_path / "cfg.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "VLGRPO_TEST_FAULT": fault}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(WORKER), str(tmp_path / "cfg.yaml")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
        pytest.fail(f"still running {timeout} s after launch: a rank waits for one that will never come\n"
                    f"{stderr[-3000:]}")  # fmt: skip
    end = time.time()
    fault_at = float((tmp_path / "fault_at.txt").read_text())
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "cfg.yaml")], capture_output=True, text=True).stdout
    assert not left.strip(), f"processes left running: {left}"
    return proc.returncode, stderr, end - fault_at


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir, shapes_dir):
    import shutil

    shutil.copytree(tiny_model_dir(), tmp_path / "model")
    shutil.copytree(shapes_dir, tmp_path, dirs_exist_ok=True)  # train.jsonl and images/ beside the config
    return tmp_path


@pytest.mark.parametrize("phase, port", [("batch", 29551), ("reward", 29552), ("update", 29553), ("save", 29554)])
def test_an_exception_on_one_rank_stops_every_rank_fast(run_dir, phase, port):
    status, err, seconds = _launch(run_dir, port, f"1:2:{phase}:raise")
    assert status != 0 and f"injected fault on rank 1 in {phase} at step 2" in err
    assert seconds < 60, seconds
    print(f"{phase}: every rank out {seconds:.1f} s after the exception")


def test_a_rank_that_blocks_is_named_and_every_rank_stops(run_dir):
    status, err, seconds = _launch(run_dir, 29555, "1:2:reward:block", "train.fault_timeout_s=8")
    assert status != 0
    assert "rank 1 made no progress for" in err and "in step 2, phase 'reward'" in err
    assert seconds < 8 + 30, seconds  # the timeout, then the launcher's stop
    print(f"blocked reward: every rank out {seconds:.1f} s after it blocked (fault_timeout_s 8)")
