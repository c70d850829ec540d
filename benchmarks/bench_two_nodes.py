"""Two nodes on one machine, a rank killed mid-run, repeated: how often both nodes restart and finish the run with
the uninterrupted run's metrics (#60). Each trial is `tests/trainer/test_two_nodes.py`'s scenario:
`scripts/train_multinode.sh` started twice (NNODES=2, one CPU rank each, c10d rendezvous, MAX_RESTARTS=1) on a
shared run directory, rank 1 SIGKILLed in its reward at step 3 of 4 (`--kill-rank`, `--kill-step`), compared with
one uninterrupted two-node run. Prints each trial's outcome and seconds, then the success count.

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_two_nodes.py [--trials 10] [--kill-rank 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # trainer_helpers.py: the launch

from trainer_helpers import fault_run_config, run_nodes  # noqa: E402

from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.tiny import init_tiny  # noqa: E402

KEYS = ("train/loss", "reward/total", "grpo/response_length", "train/grad_norm")


def trial(root: Path, base: Path, port: int, fault: str, restarts: int) -> tuple[list[int], list[dict], float]:
    """One two-node run in a fresh directory -> (exit statuses, metrics rows, seconds)."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root)
    config = fault_run_config(root)
    t0 = time.time()
    statuses, _ = run_nodes(config, port=port, timeout=600, env={"VLGRPO_TEST_FAULT": fault}, restarts=restarts)
    metrics = root / "run" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    return statuses, rows, time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--kill-step", type=int, default=3)
    ap.add_argument("--port", type=int, default=29600)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        synth_dataset(base, 40, seed=0, image_size=112)
        init_tiny(base / "model", "qwen2_5_vl", seed=0)
        statuses, clean, seconds = trial(Path(tmp) / "clean", base, args.port, "", 0)
        assert statuses == [0, 0] and len(clean) == 4, statuses
        print(f"uninterrupted two-node run: {seconds:.1f} s")
        wins = 0
        for i in range(args.trials):
            fault = f"{args.kill_rank}:{args.kill_step}:reward:kill"
            statuses, rows, seconds = trial(Path(tmp) / "trial", base, args.port + 1 + i, fault, 1)
            same = len(rows) == len(clean) and all(
                {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS} for a, b in zip(rows, clean)
            )
            ok = statuses == [0, 0] and same
            wins += ok
            outcome = "finished, metrics equal" if ok else f"exit {statuses}, {len(rows)} rows, equal: {same}"
            print(f"trial {i + 1}: {outcome} ({seconds:.1f} s)", flush=True)
        print(f"{wins} of {args.trials} killed-rank trials restarted on both nodes and matched the uninterrupted run")


if __name__ == "__main__":
    main()
