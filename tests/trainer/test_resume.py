"""Kill -9 mid-run, resume, and get exactly the metrics of an uninterrupted run: plain, LoRA and 2-rank ZeRO-3.

Each run is the production entry point (`python -m vlgrpo.cli train cfg.yaml`; ZeRO-3 under torchrun) in its own
process group, so SIGKILL takes the launcher and every rank at once, as a preempted job would lose them. The run to
be killed is held inside a step by its (user) reward function, so the kill lands mid-run however busy the machine is.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_config

from vlgrpo.config import save_config
from vlgrpo.trainer.checkpoint import checkpoint_dirs
from vlgrpo.trainer.safe_state import load_tensors

# The trainer tests' length reward, plus a hold: with VLGRPO_TEST_HOLD=<metrics.jsonl>:<K> in the environment it
# sleeps once K steps are logged, i.e. inside step K + 1, after checkpoint K is complete.
HELD_REWARD = """
import os
import time
from pathlib import Path


def length(completion, **fields):
    hold = os.environ.get("VLGRPO_TEST_HOLD")
    if hold:
        path, k = hold.rsplit(":", 1)
        while Path(path).exists() and len(Path(path).read_text().splitlines()) >= int(k):
            time.sleep(0.5)
    return len(completion) / 10.0
"""

LORA_BF16_SPLIT = [
    "train.backend=lora",
    "train.lora.rank=4",
    "train.lr=1e-2",
    "model.dtype=bfloat16",
    "rollout.placement=split",
    "rollout.max_staleness=0",
    "train.lr_schedule=cosine",  # the scheduler's position is part of the checkpoint
    "train.warmup_steps=1",
]
# backend -> (overrides, ranks, optimiser steps). Few steps keep the 2-rank ZeRO-3 case (3 launches) near a minute.
# The fp32 plain and LoRA cases are the bf16 ones' (same resume path, the fp32 master copy and the LoRA-only state on
# top), with their cosine schedules: one launch chain each less in the suite.
BACKENDS = {
    "zero3": (["train.backend=zero3", "train.lr_schedule=cosine", "train.warmup_steps=1"], 2, 4),
    # bf16 LoRA with the engine in a split worker: a weight sync after every step (its merge used to write the base)
    "lora-bf16-split": (LORA_BF16_SPLIT, 1, 6),
    # bf16 full weights: the fp32 master copy is part of the checkpoint
    "plain-bf16": (
        ["model.dtype=bfloat16", "train.lr=1e-3", "train.lr_schedule=cosine", "train.warmup_steps=2"],
        1,
        6,
    ),
    # Qwen3.5 (Gated DeltaNet layers) in bf16, LoRA on its linear-attention projections too, the engine split
    "qwen3_5-lora-bf16-split": (LORA_BF16_SPLIT, 1, 4),
    # a Qwen3-VL-MoE with adapters on its experts and the rollout's routing replayed (moe/* metrics equal too)
    "qwen3_vl_moe-lora-experts-replay": (
        ["train.backend=lora", "train.lora.experts=true", "train.routing_replay=rollout", "train.lr=1e-2"],
        1,
        4,
    ),
}
ARCH = {"qwen3_5-lora-bf16-split": "qwen3_5", "qwen3_vl_moe-lora-experts-replay": "qwen3_vl_moe"}
"""The cases that run another tiny model than the default Qwen2.5-VL one."""


def _launch(cfg_path, ranks: int, **extra_env: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DS_ACCELERATOR": "cpu",
        **extra_env,
    }
    cli = ["-m", "vlgrpo.cli", "train", str(cfg_path)]
    if ranks > 1:  # --standalone: a free rendezvous port per launch (the killed run's port may still be held)
        cli = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), *cli]
    return subprocess.Popen(
        [sys.executable, *cli], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )  # its own process group: killpg reaches every rank


def _finish(proc: subprocess.Popen) -> str:
    """Wait for a launch to succeed; returns its stdout."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


def _metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # wall-clock, process memory and the in-memory vision cache (cold after a restart, no disk cache here) are
    # properties of the process, not of the training state; everything else must match exactly
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/", "vision/"))} for r in rows]


def _tree(root: int) -> dict[int, int]:
    """pid -> process group of `root` and all its descendants, read from /proc."""
    info: dict[int, tuple[int, int]] = {}  # pid -> (parent, group)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
        except OSError:
            continue  # exited meanwhile
        info[int(stat.parent.name)] = (int(fields[1]), int(fields[2]))
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        tree[pid] = info.get(pid, (0, pid))[1]
        todo += [child for child, (parent, _) in info.items() if parent == pid]
    return tree


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_when_held(proc: subprocess.Popen, run_dir, k: int, ranks: int) -> None:
    """Once checkpoint K is complete (the run is then held in step K + 1), SIGKILL the launcher and every rank.

    torchrun starts each rank in a session (process group) of its own: killing the launcher's group alone leaves the
    ranks running on, writing checkpoints and metrics next to the resumed run. Every group of the tree is killed."""
    deadline = time.time() + 300
    metrics = Path(run_dir) / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        logged = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        if [p.name for p in checkpoint_dirs(run_dir)][-1:] == [f"step_{k}"] and logged >= k:  # held: row K written
            break  # (checkpoint K alone came too early: a kill before step K's row lost it, metrics [1, 3, 4])
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
    assert [p.name for p in checkpoint_dirs(run_dir)][-1:] == [f"step_{k}"], "checkpoint K never appeared"
    tree = _tree(proc.pid)
    if ranks > 1:
        assert len(set(tree.values())) >= 1 + ranks  # the launcher's group and one per rank
    for group in set(tree.values()):
        os.killpg(group, signal.SIGKILL)
    proc.communicate(timeout=60)  # EOF on its pipes: no rank holds them any more
    deadline = time.time() + 60
    while any(_alive(p) for p in tree) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in tree), "a process of the killed run survived"


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(backend, tmp_path, tiny_model_dir, shapes_dir):
    if backend == "zero3":
        pytest.importorskip("deepspeed")
    overrides, ranks, steps = BACKENDS[backend]
    (tmp_path / "held_reward.py").write_text(HELD_REWARD)
    spec = f"{tmp_path / 'held_reward.py'}:length"
    configs = {}
    for name in ("straight", "killed"):
        cfg = tiny_config(
            tiny_model_dir(ARCH.get(backend, "qwen2_5_vl")),
            shapes_dir,
            tmp_path / name,
            f"reward.recipe={{'{spec}': 1.0}}",
            f"train.steps={steps}",
            "train.save_every=1",
            "grpo.beta=0.04",
            *overrides,
        )
        configs[name] = tmp_path / f"{name}.yaml"
        save_config(cfg, configs[name])

    _finish(_launch(configs["straight"], ranks))

    k = steps // 2
    victim = _launch(configs["killed"], ranks, VLGRPO_TEST_HOLD=f"{tmp_path / 'killed' / 'metrics.jsonl'}:{k}")
    _kill_when_held(victim, tmp_path / "killed", k, ranks)

    resumed = _finish(_launch(configs["killed"], ranks))  # not held: the hold is an environment variable
    assert f"resumed from {tmp_path / 'killed' / 'checkpoints' / f'step_{k}'} (step {k})" in resumed
    assert [r["step"] for r in _metrics(tmp_path / "killed")] == list(range(1, steps + 1))
    assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "straight")
    if ranks == 1:  # and the trained weights themselves, bit for bit (adapter, model, fp32 master copies, moments)
        last = [
            d / "checkpoints" / f"step_{steps}" / "backend.pt" for d in (tmp_path / "straight", tmp_path / "killed")
        ]
        straight, killed = (load_tensors(p) for p in last)
        assert _tensors_equal(straight, killed)


def _tensors_equal(a, b) -> bool:
    """Two nested containers of tensors and plain values, equal bit for bit."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b
