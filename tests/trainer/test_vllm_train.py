"""`vlgrpo train ... rollout.engine=vllm` end to end on vLLM's CPU build (`make test-vllm`): 3 GRPO steps with the
plain and the LoRA backend (and plain on Qwen3-VL, vLLM running its own tower and DeepStack mergers), weights synced
into the engine after every step through the trainer's own code, and the engine's log-probs within 1e-3 of the
trainer's at every step (`rollout/logprob_abs_diff_max` in metrics.jsonl); the same on a file mixing one-image,
two-image and video rows (Qwen2.5-VL from the vision cache's embeddings, Qwen3-VL from pixels and frames). With
rollout.placement=split the engine runs in each rank's rollout worker, which gets every version's weights."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.config import save_config
from vlgrpo.trainer.metrics import read_metrics

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

VLLM = [
    "rollout.engine=vllm",
    "rollout.vllm.enable_sleep_mode=false",
    "data.max_prompt_length=256",
    "rollout.vllm.engine_kwargs={'enforce_eager': True, 'block_size': 32}",
]
PLAIN = ["train.backend=plain", "train.lr=1e-2"]
SPLIT = ["rollout.placement=split", "train.num_gpus=2", "rollout.vllm.rollout_gpus=1"]
KEYS = ("train/loss", "reward/total", "grpo/entropy", "train/grad_norm", "grpo/response_length")


def _train(out: Path, tiny_model_dir, shapes_dir, *overrides: str, arch: str = "qwen2_5_vl") -> list[dict]:
    """`vlgrpo train` for 3 steps in a process of its own (vLLM runs in it, or in its rollout worker) -> metrics."""
    out.mkdir(exist_ok=True)
    spec = write_reward_module(out)
    cfg = tiny_config(
        tiny_model_dir(arch),
        shapes_dir,
        out / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.steps=3",
        "model.freeze_merger=false",
        *VLLM,
        *overrides,
    )
    save_config(cfg, out / "cfg.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "vlgrpo.cli", "train", str(out / "cfg.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(out / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    return rows


CASES = [("plain", "qwen2_5_vl"), ("lora", "qwen2_5_vl"), ("plain", "qwen3_vl")]
ADAPTER_BYTES = {"qwen2_5_vl": 4 * 4 * 4 * ((128 + 128) * 2 + (128 + 64) * 2 + (128 + 384) * 3)}
"""fp32 bytes of the tiny model's rank-4 adapter: A [4, in] and B [out, 4] on the 7 linears of each of its 4 layers
(q, o 128 -> 128; k, v 128 -> 64; gate, up 128 -> 384 and down 384 -> 128): 155,648 bytes."""


@pytest.mark.parametrize("backend, arch", CASES)
def test_three_grpo_steps_on_vllm_keep_the_engine_on_the_trainers_policy(
    backend, arch, tmp_path, tiny_model_dir, shapes_dir
):
    """Qwen3-VL runs with mm_input=pixels: the merger and DeepStack mergers train (model.freeze_merger=false), so each
    step's sync must reach vLLM's own tower for its log-probs to stay on the trainer's."""
    lora = ["train.backend=lora", "train.lora.rank=4", "train.lr=5e-2"]
    pixels = ["rollout.vllm.mm_input=pixels"] if arch == "qwen3_vl" else []
    rows = _train(tmp_path, tiny_model_dir, shapes_dir, *(PLAIN if backend == "plain" else lora), *pixels, arch=arch)
    for r in rows:
        print(
            f"[{backend} {arch}] step {r['step']}: logprob_abs_diff max {r['rollout/logprob_abs_diff_max']:.2e}, "
            f"is_mean {r['grpo/is_mean']:.6f}, loss {r['train/loss']:.4f}"
        )
        assert r["rollout/logprob_abs_diff_max"] < 1e-3
        if backend == "lora":  # the adapter alone, as vLLM's LoRA request of each version: never the base
            assert r["rollout/adapter_syncs"] == 1 and r["rollout/weight_syncs"] == 0
            assert r["sync/bytes"] == ADAPTER_BYTES[arch]
        else:
            assert r["rollout/weight_syncs"] == 1 and r["rollout/params_pushed"] > 0
        assert abs(r["grpo/is_mean"] - 1.0) < 1e-3 and r["grpo/is_clipped_frac"] == 0.0  # sequence_mask, cap 3
    # the policy moved (the sync carried real changes) and the engine sampled from it: step 3 ran on version 2
    assert rows[0]["train/grad_norm"] > 0 and rows[-1]["rollout/prefix_cache_hit_tokens"] > 0


# Every step draws one one-image, one two-image and one video row (the file cycles through them); the frame lists were
# taken at 4 fps, so Qwen2.5-VL's second_per_grid_ts is 0.5 and Qwen3-VL writes <0.1 seconds> and <0.6 seconds>.
MIXED = [
    "data.shuffle=false",
    "train.prompts_per_step=3",
    "data.video.max_pixels=50176",
    "data.video.fps=4.0",
    "rollout.vllm.limit_mm_per_prompt={'image': 2, 'video': 1}",
]


@pytest.mark.parametrize("arch, mode", [("qwen2_5_vl", "embeds"), ("qwen3_vl", "pixels")])
def test_three_grpo_steps_on_vllm_over_one_image_two_image_and_video_rows(arch, mode, tmp_path, tiny_model_dir):
    from vlgrpo.data.adapters import load_samples
    from vlgrpo.data.synth import synth_dataset

    data = tmp_path / "mixed"
    synth_dataset(data, 30, seed=3, image_size=64, kinds=("count", "compare", "motion"))
    rows = load_samples(data / "train.jsonl").samples
    assert [(len(s.images), s.video is not None) for s in rows[:9]] == [(1, False), (2, False), (0, True)] * 3
    out = _train(tmp_path, tiny_model_dir, data, *PLAIN, *MIXED, f"rollout.vllm.mm_input={mode}", arch=arch)
    for r in out:
        print(
            f"[mixed {arch} {mode}] step {r['step']}: logprob_abs_diff max {r['rollout/logprob_abs_diff_max']:.2e}, "
            f"loss {r['train/loss']:.4f}, completions {r['rollout/completions']:.0f}"
        )
        assert r["rollout/logprob_abs_diff_max"] < 1e-3
        assert r["rollout/completions"] == 12 and r["rollout/weight_syncs"] == 1 and r["rollout/params_pushed"] > 0
    assert out[0]["train/grad_norm"] > 0
    assert all(r["vision/videos_encoded"] >= 1 and r["vision/images_encoded"] >= 3 for r in out)  # every step's parts


def test_split_vllm_with_staleness_0_reproduces_the_colocated_run(tmp_path, tiny_model_dir, shapes_dir):
    """The worker's vLLM samples each step with the weights of the step before, as the colocated engine does: the
    same tokens, hence exactly the same rewards, losses and gradients, the rollout IS weights included (the trainer
    measures the engine's log-prob gap on a fresh split group as on a colocated one)."""
    colocated = _train(tmp_path / "colocated", tiny_model_dir, shapes_dir, *PLAIN)
    split = _train(tmp_path / "split", tiny_model_dir, shapes_dir, *PLAIN, *SPLIT, "rollout.max_staleness=0")
    gap = ("rollout/logprob_abs_diff", "rollout/logprob_abs_diff_max", "grpo/is_mean")
    assert all(0 < r["rollout/logprob_abs_diff_max"] < 1e-3 for r in split)  # the gap is measured, and small
    for a, b in zip(colocated, split, strict=True):
        assert {k: a[k] for k in (*KEYS, *gap)} == {k: b[k] for k in (*KEYS, *gap)}, a["step"]
        assert b["rollout/staleness"] == 0.0 and b["rollout/weight_syncs"] == 1.0  # the sync before its sampling
    assert split[0]["rollout/params_pushed"] == 0 and split[1]["rollout/params_pushed"] > 0  # v0: the checkpoint


def test_split_vllm_with_staleness_1_samples_one_version_behind(tmp_path, tiny_model_dir, shapes_dir):
    rows = _train(tmp_path, tiny_model_dir, shapes_dir, *PLAIN, *SPLIT, "rollout.max_staleness=1")
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]  # step 1 on version 0, then one version back
    assert all(r["train/loss"] == r["train/loss"] and r["rollout/completions"] == 8 for r in rows)


def test_split_vllm_lora_gets_versioned_adapters_and_keeps_stale_groups_on_their_own(
    tmp_path, tiny_model_dir, shapes_dir
):
    """Staleness 1: the worker's vLLM holds max_staleness + 1 = 2 adapters, each version's under its own name, so a
    group sampled one version back scores against the adapter it was sampled with (its log-probs stay within the
    corrected gap) and the sync carries the adapter alone."""
    lora = ["train.backend=lora", "train.lora.rank=4", "train.lr=5e-2"]
    rows = _train(tmp_path, tiny_model_dir, shapes_dir, *lora, *SPLIT, "rollout.max_staleness=1")
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["sync/bytes"] for r in rows] == [ADAPTER_BYTES["qwen2_5_vl"]] * 3
    assert all(r["train/loss"] == r["train/loss"] for r in rows)
    # the worker reports a sync with the next group it samples: v1 arrives with step 3's (v2 with a step 4 never run)
    # and no weight is ever pushed (version 0's handshake, the loaded checkpoint, pushes none)
    assert sum(r["rollout/adapter_syncs"] for r in rows) == 1 and all(r["rollout/params_pushed"] == 0 for r in rows)


BASE_CHECK = """
import json, sys, torch
from vlgrpo import grpo
from vlgrpo.config import load_config
from vlgrpo.models import load_model
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.offpolicy import OffPolicy
from vlgrpo.trainer.state import build_state

cfg = load_config(sys.argv[1])
state = build_state(cfg, progress=False)
adapter = [(n, p) for n, p in state.backend.model.named_parameters() if "lora_" in n]
versions, gaps = [], []
measure = OffPolicy.rollout_correction

def median_gap(trainer_logp, batch):
    # the median |trainer - vLLM| over the scored tokens: one token near a bf16 tie cannot move it
    valid = batch.loss_mask.bool() & ~torch.isnan(batch.engine_logp)
    return float((trainer_logp - batch.engine_logp).abs()[valid].median())

def rollout_correction(self, batch, behaviour_logp):
    # phase 6 of each step: the trainer holds the version vLLM was synced to; score vLLM's tokens one version back too
    out = measure(self, batch, behaviour_logp)
    versions.append([p.detach().clone() for _, p in adapter])
    previous = None
    if len(versions) > 1 and any(not torch.equal(a, b) for a, b in zip(*versions[-2:])):
        with torch.no_grad():
            for (_, p), old in zip(adapter, versions[-2]):
                p.copy_(old)
            stale = self.old_logprobs(batch)[1]
            for (_, p), now in zip(adapter, versions[-1]):
                p.copy_(now)
        previous = median_gap(stale, batch)
    mean = grpo.logprob_gap(behaviour_logp, batch.engine_logp, batch.loss_mask)[0]
    gaps.append({"mean": mean, "synced": median_gap(behaviour_logp, batch), "previous": previous})
    return out

OffPolicy.rollout_correction = rollout_correction
rows = Trainer(state).train()
base = load_model(cfg.model.name_or_path, dtype="bfloat16").model.state_dict()
trained = {n.replace(".base_layer.", "."): p for n, p in state.backend._peft.get_base_model().state_dict().items()}
state.close()
changed = [n for n in base if not torch.equal(trained[n], base[n])]
print(json.dumps({"rows": rows, "gaps": gaps, "changed": changed}))
"""


def test_bf16_lora_with_vllm_never_writes_the_trainers_base(tmp_path, tiny_model_dir, shapes_dir):
    """50 bf16 LoRA steps with vLLM in the trainer's process (a process of its own: vLLM's parallel state is per
    process), the adapter synced after each: the trainer's base weights (the reference policy, half of the export)
    are bit for bit those it loaded, and vLLM samples with each version's adapter.

    "Samples with each version's adapter" is asserted as an invariant, not as a bound on a bf16 gap: how far vLLM's
    bf16 log-probs fall from the trainer's depends on the kernels the CPU runs (up to 0.07 per token with AMX, where
    this test once required 1e-2). At every step the trainer also scores vLLM's tokens with the adapter one version
    back (what vLLM would hold had that sync been skipped): the median per-token gap to the synced version must be
    the smaller one, by at least half, whenever the two versions differ. Kernel noise moves both gaps alike; a
    skipped sync swaps them (measured: the step after a skipped sync has 0.11 against 6e-4; a run that syncs every
    step stays below 0.15 of the previous version's gap with the default kernels, 0.25 with ATen's scalar ones,
    ATEN_CPU_CAPABILITY=default). The median, not the mean: one token near a bf16 tie moved a step's mean gap from
    7e-4 to 0.015."""
    import json

    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "model.dtype=bfloat16",
        "train.backend=lora",
        "train.lora.rank=4",
        "train.lr=5e-2",
        "train.steps=50",
        "train.save_every=0",
        *VLLM,
    )
    save_config(cfg, tmp_path / "cfg.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-c", BASE_CHECK, str(tmp_path / "cfg.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rows, gaps = result["rows"], result["gaps"]
    assert len(rows) == 50 and all(r["sync/bytes"] == ADAPTER_BYTES["qwen2_5_vl"] for r in rows)
    assert [g["mean"] for g in gaps] == [r["rollout/logprob_abs_diff"] for r in rows]  # the gap the run logged
    compared = [g for g in gaps if g["previous"] is not None]  # step 1 has no previous version; unmoved ones none
    print("[bf16 lora vllm] median gap synced / one version back:", [(g["synced"], g["previous"]) for g in compared])
    assert len(compared) >= 45
    assert all(g["synced"] < 0.5 * g["previous"] for g in compared), compared
    assert result["changed"] == []
