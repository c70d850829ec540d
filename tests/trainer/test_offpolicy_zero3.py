"""ZeRO-3 on 2 CPU ranks with an engine that holds its own weights (a stand-in for vLLM, offpolicy_worker.py): after
every sync the trainer measures the engine/trainer log-prob gap from its own partitioned forward and weights the loss
by the rollout IS weights. Before this fix the check ran inside the engine while only `visual` was gathered, which
fails on the first rollout after a sync."""

import json
from pathlib import Path

import pytest
from trainer_helpers import run_ranks, tiny_config, write_reward_module

from vlgrpo.config import save_config

WORKER = Path(__file__).with_name("offpolicy_worker.py")


def test_zero3_checks_an_off_policy_engine_after_every_sync(tmp_path, tiny_model_dir, shapes_dir):
    pytest.importorskip("deepspeed")
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.backend=zero3",
        "train.steps=3",
        "train.lr=1e-2",
    )
    save_config(cfg, tmp_path / "cfg.yaml")
    status, stderr = run_ranks(WORKER, str(tmp_path / "cfg.yaml"), str(tmp_path), port=29531, timeout=900)
    assert status == 0, stderr[-3000:]
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"rank{rank}.json").read_text())["history"]
        assert [r["step"] for r in rows] == [1, 2, 3]
        for r in rows:  # the engine's copy follows the trainer: same weights, same log-probs
            assert r["rollout/logprob_abs_diff_max"] < 1e-4, r
            assert abs(r["grpo/is_mean"] - 1.0) < 1e-4 and r["grpo/is_clipped_frac"] == 0.0
        assert all(r["rollout/params_pushed"] > 0 for r in rows)  # a full gathered sync every step
