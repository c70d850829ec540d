"""Two nodes as one run, on one machine: `scripts/train_multinode.sh` started twice, as on two nodes (NNODES=2, one
CPU rank per node, gloo, torchrun's c10d rendezvous), sharing a run directory, a fault injected in one rank
(`trainer_helpers.run_nodes`). Each node's torchrun counts only the restarts its own ranks caused, so these runs
check that every rank of both nodes numbers its attempt alike (`trainer.group.launch_attempt`: the rendezvous'
round)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from trainer_helpers import fault_run_config, run_nodes


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir, shapes_dir):
    shutil.copytree(tiny_model_dir(), tmp_path / "model")
    shutil.copytree(shapes_dir, tmp_path, dirs_exist_ok=True)  # train.jsonl and images/ beside the config
    return tmp_path


def _launch(directory, port: int, fault: str, *overrides: str, restarts: int = 0, timeout: int = 240):
    """-> (the nodes' exit statuses, their stderr, seconds from the injected fault to the end; None without one)."""
    statuses, errs = run_nodes(
        fault_run_config(directory, *overrides),
        port=port,
        timeout=timeout,
        env={"VLGRPO_TEST_FAULT": fault},
        restarts=restarts,
    )
    end, at = time.time(), directory / "fault_at.txt"
    return statuses, errs, (end - float(at.read_text()) if at.is_file() else None)


def _weights(directory) -> dict:
    """The last checkpoint's policy weights (step 4)."""
    return torch.load(directory / "run" / "checkpoints" / "step_4" / "backend.pt", map_location="cpu")["model"]


def test_a_rank_killed_on_one_node_restarts_both_nodes_to_the_uninterrupted_runs_results(run_dir, tmp_path_factory):
    """#60 item 2(a): rank 1 SIGKILLed in its reward at step 3, MAX_RESTARTS=1. Both nodes restart the same attempt
    (before: the killed rank's node started attempt 1, the other attempt 0; rank 0 read the dead attempt's gloo
    addresses, "Connection refused", and both nodes exited 1 at step 2 of 4), resume from step 2's checkpoint and end
    with the metrics and the weights of an uninterrupted two-node run."""
    clean = tmp_path_factory.mktemp("clean")
    for name in ("model", "images", "train.jsonl"):
        (shutil.copytree if (run_dir / name).is_dir() else shutil.copy)(run_dir / name, clean / name)
    statuses, errs, _ = _launch(clean, 29571, "")
    assert statuses == [0, 0], errs
    statuses, errs, _ = _launch(run_dir, 29572, "1:3:reward:kill", restarts=1)
    assert statuses == [0, 0], [e[-3000:] for e in errs]
    assert (run_dir / "fault_at.txt").is_file() and not any("Connection refused" in e for e in errs)
    keys = ("train/loss", "reward/total", "grpo/response_length", "train/grad_norm")
    rows = [[json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines()] for d in (clean, run_dir)]
    assert [r["step"] for r in rows[1]] == [1, 2, 3, 4]
    for a, b in zip(*rows, strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["step"]
    ours, theirs = _weights(run_dir), _weights(clean)
    assert ours.keys() == theirs.keys() and ours
    assert all(ours[k].equal(theirs[k]) for k in ours)


def test_a_permanent_failure_on_one_node_stops_both_nodes_once(run_dir):
    """#60 item 2(b): rank 1 (one node) fails for good at step 2 (an InputError), MAX_RESTARTS=2: the failing attempt
    records it in the shared run directory and the restarted ranks of both nodes stop at once, before any step
    (before: the other node's torchrun had not counted a restart, its rank started "attempt 0" and cleared the record,
    and the failure was replayed)."""
    statuses, errs, _ = _launch(run_dir, 29573, "1:2:reward:input", restarts=2)
    assert all(s != 0 for s in statuses)
    assert all("not replayed: attempt 0 of this launch failed" in e for e in errs), errs  # each node's ranks
    assert sum(e.count("error: injected permanent fault on rank 1") for e in errs) == 1, errs  # raised once


def test_a_blocked_rank_on_one_node_is_named_before_any_collective_times_out(run_dir):
    """#60 item 2(c): rank 1 blocks in its reward at step 2; the watchdog (train.fault_timeout_s=8) names it and
    both nodes stop long before the process group's timeout (train.dist_timeout_s=120)."""
    statuses, errs, seconds = _launch(
        run_dir, 29574, "1:2:reward:block", "train.fault_timeout_s=8", "train.dist_timeout_s=120"
    )
    err = "\n".join(errs)
    assert all(s != 0 for s in statuses)
    assert "rank 1 made no progress for" in err and "in step 2, phase 'reward'" in err
    assert seconds < 8 + 30, seconds
