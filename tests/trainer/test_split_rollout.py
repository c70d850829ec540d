"""rollout.placement=split: the rollout engine in a worker process of its own, one per trainer rank. With
max_staleness=0 it reproduces the colocated run exactly (plain backend, ZeRO-3 on two ranks; LoRA up to the rounding
of merged weights); with max_staleness=1 it samples the next step while the trainer updates, and no group is more than
one version old when trained."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_distributed import RANK_REWARD, _config, _torchrun
from test_dynamic_sampling import REWARD as ODD_IDS_REWARD
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.config import ConfigError, save_config
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import _rollout_gpu, build_state

VLLM_SPLIT = ("rollout.placement=split", "rollout.engine=vllm", "train.num_gpus=2", "rollout.vllm.rollout_gpus=1")
KEYS = ("train/loss", "reward/total", "grpo/kl", "grpo/entropy", "train/grad_norm", "grpo/response_length")


def _run(tmp_path, tiny_model_dir, shapes_dir, name: str, *overrides: str, reward: str | None = None) -> list[dict]:
    """Train a tiny run; `reward`: a recipe spec (default: the length reward of trainer_helpers)."""
    spec = reward or write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / name,
        f"reward.recipe={{'{spec}': 1.0}}",
        "grpo.beta=0.04",
        "train.lr=1e-2",
        "train.seed=0",
        # the update runs its own prompt pass, as a split run's does, so the two compare bit for bit (the rollout's
        # kept prefill gives the same gradient to fp32 rounding: tests/trainer/test_prefill_once.py)
        "train.prefill_once=off",
        *overrides,
    )
    state = build_state(cfg, progress=False)
    try:
        return Trainer(state).train()
    finally:
        state.close()


def test_split_with_staleness_0_reproduces_the_colocated_run(tmp_path, tiny_model_dir, shapes_dir):
    colocated = _run(tmp_path, tiny_model_dir, shapes_dir, "colocated", "train.steps=3")
    split = _run(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "split",
        "train.steps=3",
        "rollout.placement=split",
        "rollout.max_staleness=0",
    )
    for a, b in zip(colocated, split, strict=True):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]  # exactly: same weights, seeds, tokens
        assert b["rollout/staleness"] == 0.0
    assert split[0]["rollout/completions"] == 8  # the worker's engine counters reach the trainer's metrics
    # the frozen tower's features go with the requests: the trainer encodes each image as a colocated run does,
    # the worker adopts them and encodes nothing itself
    encoded = [h["vision/images_encoded"] for h in colocated]
    assert sum(encoded) > 0 and [h["vision/images_encoded"] for h in split] == encoded
    assert [h["rollout/images_encoded"] for h in split] == [0.0] * 3
    assert [h["rollout/features_adopted"] for h in split] == encoded


def test_split_with_the_zoom_tool_reproduces_the_colocated_run(tmp_path, tool_caller_dir, shapes_dir):
    """rollout.tools in the split placement: the worker runs the multi-turn rollouts (the tools, the crops, the kept
    KV) and returns trajectories whose crops the trainer encodes; with max_staleness=0 the run equals the colocated
    one exactly, on the tiny model taught to call the tool (so trajectories call it and get crops back)."""
    row = json.loads((shapes_dir / "train.jsonl").read_text().splitlines()[0])  # the row the model was taught on
    row["image"] = str(shapes_dir / row["image"])
    taught = tmp_path / "taught"
    taught.mkdir()
    (taught / "train.jsonl").write_text("".join(json.dumps({**row, "id": f"taught-{k}"}) + "\n" for k in range(8)))
    tools = ("rollout.tools=[zoom_in]", "rollout.max_turns=3", "rollout.max_new_tokens=100", "train.steps=2")
    run = (*tools, "rollout.temperature=0.5", "data.max_prompt_length=1500", "data.answer_format=think_answer")
    colocated = _run(tmp_path, lambda: tool_caller_dir, taught, "colocated", *run)
    split = _run(
        tmp_path, lambda: tool_caller_dir, taught, "split", *run, "rollout.placement=split", "rollout.max_staleness=0"
    )
    keys = (*KEYS, "tools/calls_per_sample", "tools/turns", "tools/crop_area", "tools/errors", "rollout/prefill_tokens")
    for a, b in zip(colocated, split, strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["step"]
    assert split[0]["tools/crop_area"] > 0  # crops came back (at temperature 0.5 the taught call holds)


def test_split_with_staleness_1_overlaps_and_bounds_staleness(tmp_path, tiny_model_dir, shapes_dir):
    history = _run(tmp_path, tiny_model_dir, shapes_dir, "split1", "train.steps=5", "rollout.placement=split")
    staleness = [h["rollout/staleness"] for h in history]
    assert staleness == [0.0, 1.0, 1.0, 1.0, 1.0]  # step 1 on version 0; then each step sampled one version back
    assert all(h["train/loss"] == h["train/loss"] for h in history)  # finite: the stale ratio is corrected, not NaN
    assert all("timing/rollout_wait" in h and "timing/rollout_worker_idle" in h for h in history)


def test_the_rollout_worker_samples_with_one_torch_thread(tmp_path, tiny_model_dir, shapes_dir, monkeypatch):
    """The worker shares the CPUs with its trainer (one worker per rank): one thread, whatever OMP_NUM_THREADS says
    (a spawned process reads it afresh; unset, torch takes every core)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    history = _run(tmp_path, tiny_model_dir, shapes_dir, "threads", "train.steps=1", "rollout.placement=split")
    assert history[0]["rollout/worker_threads"] == 1.0


TRAINER = """
import sys, time
from vlgrpo.config import load_config
from vlgrpo.trainer.state import build_state

state = build_state(load_config(sys.argv[1]), progress=False)
print(state.engine.process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_rollout_worker_exits_when_its_trainer_is_killed(tmp_path, tiny_model_dir, shapes_dir):
    """A rank that torchrun stops (SIGTERM: no `finally` runs) or the OOM killer takes cannot stop its worker: the
    worker notices and exits, rather than hold its model copy until the machine is rebooted."""
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "rollout.placement=split")
    save_config(cfg, tmp_path / "cfg.yaml")
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path / "cfg.yaml")], stdout=subprocess.PIPE, text=True
    )
    worker = int(trainer.stdout.readline())
    trainer.kill()
    trainer.wait()
    try:
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker)
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


DYNAMIC = ("grpo.dynamic_sampling=true", "grpo.max_topup_rounds=2", "train.prompts_per_step=3")
DYNAMIC_KEYS = (*KEYS, "grpo/sampling_rounds", "grpo/dropped_groups", "grpo/zero_adv_frac")


def _dynamic_run(tmp_path, tiny_model_dir, shapes_dir, name: str, *overrides: str) -> list[dict]:
    """Dynamic sampling on a reward that is constant on odd sample ids: their groups are dropped and topped up."""
    (tmp_path / "odd.py").write_text(ODD_IDS_REWARD)
    return _run(
        tmp_path, tiny_model_dir, shapes_dir, name, *DYNAMIC, *overrides, reward=f"{tmp_path}/odd.py:odd_ids_constant"
    )


def test_split_dynamic_sampling_with_staleness_0_reproduces_the_colocated_run(tmp_path, tiny_model_dir, shapes_dir):
    """The top-up rounds go to the worker when the trainer finds its batch short: the same prompts, in the same
    order, with the same seeds as a colocated run's rounds (the 7B ZeRO-3 recipe runs dynamic sampling)."""
    colocated = _dynamic_run(tmp_path, tiny_model_dir, shapes_dir, "colocated", "train.steps=3")
    split = _dynamic_run(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "split",
        "train.steps=3",
        "rollout.placement=split",
        "rollout.max_staleness=0",
    )
    for a, b in zip(colocated, split, strict=True):
        assert {k: a[k] for k in DYNAMIC_KEYS} == {k: b[k] for k in DYNAMIC_KEYS}, a["step"]
    assert max(h["grpo/sampling_rounds"] for h in split) > 1  # top-up rounds ran through the worker


def test_split_dynamic_sampling_with_staleness_1_bounds_staleness(tmp_path, tiny_model_dir, shapes_dir):
    """A top-up round queues behind the step submitted ahead; whatever weights sample it, no group of the batch is
    more than one version old, and the batch trains against the oldest round's behaviour log-probs."""
    history = _dynamic_run(tmp_path, tiny_model_dir, shapes_dir, "split1", "train.steps=4", "rollout.placement=split")
    assert history[0]["rollout/staleness"] == 0.0
    assert all(0.0 <= h["rollout/staleness"] <= 1.0 for h in history)
    assert max(h["grpo/sampling_rounds"] for h in history) > 1
    assert all(h["grpo/dropped_groups"] >= h["grpo/sampling_rounds"] - 1 for h in history)  # a top-up: a drop
    assert all(h["train/loss"] == h["train/loss"] for h in history)  # finite


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.max_staleness=1"], "needs rollout.placement=split"),
        (["rollout.placement=split", "grpo.num_iterations=2"], "does not run with grpo.num_iterations > 1"),
        (["rollout.placement=split", "train.stage=sft"], "does not run with train.stage=sft"),
        (["rollout.placement=split", "rollout.max_staleness=-1"], "must be >= 0"),
        ([*VLLM_SPLIT, "rollout.vllm.tensor_parallel_size=2"], "does not run with rollout.vllm.tensor_parallel_size=2"),
        ([*VLLM_SPLIT, "rollout.top_p=0.9"], "renormalised over the kept tokens"),  # max_staleness: 1 by default
        ([*VLLM_SPLIT, "rollout.vllm.rollout_gpus=0"], "needs rollout.vllm.rollout_gpus >= 1"),
        ([*VLLM_SPLIT, "rollout.vllm.rollout_gpus=2"], "must leave training GPUs out of train.num_gpus"),
    ],
)
def test_split_configs_that_cannot_run_are_named(tmp_path, tiny_model_dir, shapes_dir, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", *overrides)


@pytest.mark.parametrize(
    "engine, visible, expected", [("vllm", "6,7,2,3", "3"), ("vllm", None, "3"), ("hf", None, None)]
)
def test_each_ranks_vllm_worker_gets_its_own_gpu(
    tmp_path, tiny_model_dir, shapes_dir, monkeypatch, engine, visible, expected
):
    """Rank 1 of 2 on a 4-GPU node: it trains on cuda:1, its worker runs vLLM on the 4th GPU the trainer sees (the
    hf engine's worker stays on the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path,
        "rollout.placement=split",
        f"rollout.engine={engine}",
        "train.num_gpus=4",
        "rollout.vllm.rollout_gpus=2",
    )
    assert _rollout_gpu(cfg) == expected


def test_a_resumed_split_run_with_staleness_0_equals_an_uninterrupted_one(tmp_path, tiny_model_dir, shapes_dir):
    """The worker starts afresh on resume and gets the checkpoint's weights before any prompt."""
    whole = _run(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "whole",
        "train.steps=3",
        "rollout.placement=split",
        "rollout.max_staleness=0",
    )
    _run(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "cut",
        "train.steps=2",
        "rollout.placement=split",
        "rollout.max_staleness=0",
    )
    resumed = _run(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "cut",
        "train.steps=3",
        "rollout.placement=split",
        "rollout.max_staleness=0",
        "train.resume=true",
    )
    assert [h["step"] for h in resumed] == [3]
    assert {k: resumed[0][k] for k in KEYS} == {k: whole[2][k] for k in KEYS}


def test_split_runs_the_lora_backend_with_merged_weights(tmp_path, tiny_model_dir, shapes_dir):
    """The worker gets LoRA's merged weights under the base names (W + s·BA, not the adapter's x·W + s·(x·A)·B): with
    staleness 0 the run equals the colocated one up to the rounding of that merge."""
    colocated = _run(tmp_path, tiny_model_dir, shapes_dir, "lora", "train.steps=2", "train.backend=lora")
    split = _run(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "lora_split",
        "train.steps=2",
        "train.backend=lora",
        "rollout.placement=split",
        "rollout.max_staleness=0",
    )
    for a, b in zip(colocated, split, strict=True):
        assert all(b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7) for k in KEYS), (a["step"], a, b)


# ---------------------------------------------------------------- data-parallel ranks (torchrun, gloo on the CPU)


def test_zero3_split_on_two_ranks_with_staleness_0_reproduces_the_colocated_run(tmp_path, tiny_model_dir, shapes_dir):
    """One worker per rank: it samples that rank's prompts with that rank's seeds, and receives the full weights
    that every rank gathers after each ZeRO-3 step (and after loading a checkpoint)."""
    pytest.importorskip("deepspeed")
    _config(
        tmp_path, tiny_model_dir, shapes_dir, "train.backend=zero3", "train.steps=3", "grpo.beta=0.04", "train.lr=1e-2"
    )
    split = ("rollout.placement=split", "rollout.max_staleness=0")
    colocated = _torchrun(tmp_path, 29541, f"train.output_dir={tmp_path / 'colocated'}", "train.save_every=0")
    whole = _torchrun(tmp_path, 29541, f"train.output_dir={tmp_path / 'split'}", *split)
    for rank, (a_rank, b_rank) in enumerate(zip(colocated, whole)):
        for a, b in zip(a_rank["history"], b_rank["history"], strict=True):
            assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, (rank, a["step"])
            assert b["rollout/staleness"] == 0.0
    # each worker samples its own rank's prompts, the ones the colocated rank trains on (the logged metrics are the
    # union's, the same on both ranks: the samples each rank trained on tell them apart)
    drawn = [[p["samples"] for p in r["progress"]] for r in colocated]
    assert drawn[0] != drawn[1] and drawn == [[p["samples"] for p in r["progress"]] for r in whole]
    # as if killed before its last checkpoint: resumed from step 2, each worker starts afresh and gets the gathered
    # step-2 weights before any prompt
    shutil.rmtree(tmp_path / "split" / "checkpoints" / "step_3")
    resumed = _torchrun(tmp_path, 29541, f"train.output_dir={tmp_path / 'split'}", *split, "train.resume=true")
    for rank in (0, 1):
        (step3,) = resumed[rank]["history"]
        assert step3["step"] == 3 and {k: step3[k] for k in KEYS} == {k: colocated[rank]["history"][2][k] for k in KEYS}


@pytest.mark.parametrize("backend, port", [("zero3", 29542)])  # the plain backend's split: the other tests
def test_split_on_two_ranks_with_staleness_1_bounds_staleness(tmp_path, tiny_model_dir, shapes_dir, backend, port):
    if backend == "zero3":
        pytest.importorskip("deepspeed")
    _config(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        f"train.backend={backend}",
        "train.steps=5",
        "train.save_every=0",
        "rollout.placement=split",
    )
    ranks = _torchrun(tmp_path, port)
    for rank in ranks:
        history = rank["history"]
        assert [h["rollout/staleness"] for h in history] == [0.0, 1.0, 1.0, 1.0, 1.0]  # each rank's worker one back
        assert all(h["train/loss"] == h["train/loss"] for h in history)  # finite
        assert [p["optimizer_steps"] for p in rank["progress"]] == [1, 2, 3, 4, 5]
    weights = [[p["fingerprint"] for p in r["progress"]] for r in ranks]
    assert weights[0] == weights[1]  # the replicas' full weights stay equal, step by step


def test_zero3_split_dynamic_sampling_ranks_agree_on_the_top_up_rounds(tmp_path, tiny_model_dir, shapes_dir):
    """Rank 1's groups never vary, rank 0's always do: rank 1 sends two top-up rounds to its worker while rank 0,
    with nothing to sample, still joins each round's vision gather (a ZeRO-3 collective; skipping it hangs)."""
    pytest.importorskip("deepspeed")
    (tmp_path / "rank_reward.py").write_text(RANK_REWARD)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        "train.backend=zero3",
        "train.save_every=0",
        f"reward.recipe={{'{tmp_path}/rank_reward.py:rank_one_constant': 1.0}}",
        "grpo.dynamic_sampling=true",
        "grpo.max_topup_rounds=2",
        "rollout.placement=split",
    )
    save_config(cfg, tmp_path / "cfg.yaml")
    rank0, rank1 = _torchrun(tmp_path, 29544, timeout=300)
    assert [h["step"] for h in rank0["history"]] == [h["step"] for h in rank1["history"]] == [1, 2]
    for h0, h1 in zip(rank0["history"], rank1["history"]):
        assert h0["grpo/sampling_rounds"] == h1["grpo/sampling_rounds"] == 3
        assert h1["grpo/dropped_groups"] == 6 and h0["grpo/dropped_groups"] == 0
        assert h1["rollout/staleness"] <= 1.0
    weights = [[p["fingerprint"] for p in r["progress"]] for r in (rank0, rank1)]
    assert weights[0] == weights[1]  # the replicas' weights stay equal


def test_weights_under_names_the_worker_lacks_stop_the_run(tmp_path, tiny_model_dir, shapes_dir):
    """load_state_dict(strict=False) would skip them silently and the worker would sample with stale weights."""
    import torch

    from vlgrpo.rollout.split import SplitRollout
    from vlgrpo.rollout.weight_stream import WeightBuckets

    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "run", "rollout.placement=split")
    split = SplitRollout(cfg, "qwen2_5", {}, 1)
    try:
        split.update_weights([("model.no_such_layer.weight", torch.zeros(2))], 1)
        with pytest.raises(RuntimeError, match=r"version 1 hold 1 names the worker's model lacks.*no_such_layer"):
            split.collect(1)
    finally:
        split.close()
    # over several buckets the worker stops after the first, mid-sync: the trainer raises the worker's own error
    split = SplitRollout(cfg, "qwen2_5", {}, 1)
    try:
        bad = WeightBuckets.from_named([(f"model.no_such_layer_{i}.weight", torch.zeros(16)) for i in range(6)], 64)
        split.update_weights(bad, 1)  # announced: the buckets travel at the next collect
        with pytest.raises(RuntimeError, match=r"the rollout worker failed:(.|\n)*names the worker's model lacks"):
            split.collect(1)
    finally:
        split.close()
