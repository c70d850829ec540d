"""`vlgrpo train ... rollout.engine=vllm` end to end on vLLM's CPU build (`make test-vllm`): 3 GRPO steps with the
plain and the LoRA backend, weights synced into the engine after every step through the trainer's own code, and the
engine's log-probs within 1e-3 of the trainer's at every step (`rollout/logprob_abs_diff_max` in metrics.jsonl)."""

import os
import subprocess
import sys

import pytest

from vlgrpo.config import save_config
from vlgrpo.trainer.metrics import read_metrics

from trainer_helpers import tiny_config, write_reward_module

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

VLLM = ["rollout.engine=vllm", "rollout.vllm.enable_sleep_mode=false", "data.max_prompt_length=256",
        "rollout.vllm.engine_kwargs={'enforce_eager': True, 'block_size': 32}"]  # fmt: skip


@pytest.mark.parametrize("backend", ["plain", "lora"])
def test_three_grpo_steps_on_vllm_keep_the_engine_on_the_trainers_policy(backend, tmp_path, tiny_model_dir,
                                                                         shapes_dir):  # fmt: skip
    spec = write_reward_module(tmp_path)
    extra = ["train.lora.rank=4", "train.lr=5e-2"] if backend == "lora" else ["train.lr=1e-2"]
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}",
                      f"train.backend={backend}", "train.steps=3", "model.freeze_merger=false", *VLLM, *extra)
    save_config(cfg, tmp_path / "cfg.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "vlgrpo.cli", "train", str(tmp_path / "cfg.yaml")], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        print(f"[{backend}] step {r['step']}: logprob_abs_diff max {r['rollout/logprob_abs_diff_max']:.2e}, "
              f"is_mean {r['grpo/is_mean']:.6f}, loss {r['train/loss']:.4f}")
        assert r["rollout/logprob_abs_diff_max"] < 1e-3
        assert r["rollout/weight_syncs"] == 1 and r["rollout/params_pushed"] > 0
        assert abs(r["grpo/is_mean"] - 1.0) < 1e-3 and r["grpo/is_clipped_frac"] == 0.0  # sequence_mask, cap 3
    # the policy moved (the sync carried real changes) and the engine sampled from it: step 3 ran on version 2
    assert rows[0]["train/grad_norm"] > 0 and rows[-1]["rollout/prefix_cache_hit_tokens"] > 0
