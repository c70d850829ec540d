"""Faults on 2 CPU ranks (gloo) under torchrun, launched as a user launches `vlgrpo train`: one rank raises or
blocks in one phase; every rank is out within the bound, with a non-zero exit, the failing rank named, and no
process left behind. A blocked rank named by the watchdog, a permanent failure not replayed and a killed rank's
restart run on two nodes (`test_two_nodes.py`, through the launch script); the configured collective timeout of
every group is read back in `test_distributed.py`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from trainer_helpers import fault_run_config, run_ranks

WORKER = Path(__file__).with_name("fault_worker.py")


def _launch(
    tmp_path, port: int, fault: str, *overrides: str, timeout: int = 180, restarts: int = 0
) -> tuple[int, str, float | None]:
    """(exit status, stderr, seconds from the injected fault to the end of torchrun; None without a fault)."""
    status, stderr = run_ranks(
        WORKER,
        str(fault_run_config(tmp_path, *overrides)),
        port=port,
        timeout=timeout,
        env={"VLGRPO_TEST_FAULT": fault},
        restarts=restarts,
    )
    end = time.time()
    fault_file = tmp_path / "fault_at.txt"
    fault_at = float(fault_file.read_text()) if fault_file.is_file() else None
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "cfg.yaml")], capture_output=True, text=True).stdout
    assert not left.strip(), f"processes left running: {left}"
    return status, stderr, None if fault_at is None else end - fault_at


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


def _rows_with_bad_ones(run_dir, bad_at: set[int], n: int = 8) -> None:
    """train.jsonl: the first n number rows, those at `bad_at` (0-based) pointing at a missing image."""
    import json

    rows = [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["answer_type"] == "number"][:n]
    for i in bad_at:
        rows[i]["image"] = "images/missing.png"
    (run_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_rank_whose_share_has_no_usable_row_stops_every_rank(run_dir):
    """Rank 1 draws rows 1, 3, 5, 7 (every other row): all missing. It stops with the rows named and its rank, and
    torchrun stops rank 0 at once (before: rank 0 waited for it until the process group's timeout)."""
    _rows_with_bad_ones(run_dir, {1, 3, 5, 7})
    status, err, _ = _launch(run_dir, 29558, "", "train.save_every=0")
    assert status != 0
    assert "no usable row in rank 1's share (one row in 2): all 4 rows were skipped: image_missing 4" in err


def test_skipped_rows_are_every_ranks_summed(run_dir):
    """One missing image in each rank's share (rows 2 and 3): data/skipped_rows counts both, on the logging rank."""
    import json

    _rows_with_bad_ones(run_dir, {2, 3})
    assert _launch(run_dir, 29559, "", "train.steps=2", "train.save_every=0")[0] == 0
    rows = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    counts = [r["data/skipped_rows"] for r in rows]
    assert counts == sorted(counts) and counts[-1] == 2.0  # rank 0's alone would be 1: both shares drew theirs


def test_a_checkpoint_one_rank_cannot_write_is_never_the_newest(run_dir):
    """Disk full on rank 1 while it writes step 2's checkpoint: every rank stops with the error, rank 0 naming rank
    1; step_1 stays the newest checkpoint and the partial step_2 is removed."""
    status, err, seconds = _launch(run_dir, 29560, "1:2:save:enospc")
    assert status != 0 and seconds < 60
    assert "could not write checkpoint step_2" in err and "[Errno 28] No space left on device (rank 1)" in err
    assert "rank 1 could not write its part" in err  # rank 0's line
    ckpts = sorted(p.name for p in (run_dir / "run" / "checkpoints").iterdir())
    assert ckpts == ["step_1"]


def test_a_finished_run_is_not_failed_by_the_interpreters_teardown(run_dir):
    """A rank's interpreter teardown aborts (as freeing DeepSpeed's gloo groups at exit now and then did: SIGABRT,
    "terminate called without an active exception", after a run that completed): the ranks leave before it, the
    run succeeds and its metrics and checkpoints are all there."""
    import json

    status, err, _ = _launch(run_dir, 29563, "1:1:update:abort_at_exit", "train.steps=2")
    assert status == 0, err[-2000:]
    rows = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sorted(p.name for p in (run_dir / "run" / "checkpoints").iterdir()) == ["step_1", "step_2"]


def test_a_killed_rank_without_restarts_ends_the_run_at_once(run_dir):
    """SIGKILL of rank 1 mid-step, no restarts: torchrun stops rank 0 at once; nothing is left running and the
    newest checkpoint (step 2) is what a rerun resumes from."""
    status, err, seconds = _launch(run_dir, 29562, "1:3:reward:kill")
    assert status != 0 and seconds < 30, seconds
    assert sorted(p.name for p in (run_dir / "run" / "checkpoints").iterdir())[-1] == "step_2"
    print(f"killed rank: every rank out {seconds:.1f} s after the kill")
