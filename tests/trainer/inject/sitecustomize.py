"""Imported by every Python process started with this folder on PYTHONPATH (`trainer_helpers.run_nodes`): in a rank
torchrun started (RANK set), the fault of VLGRPO_TEST_FAULT is injected as `fault_worker.py` injects it, its moment
written to VLGRPO_TEST_FAULT_AT. So `scripts/train_multinode.sh` runs exactly as a user runs it, with the fault."""

import os
from pathlib import Path

if os.environ.get("VLGRPO_TEST_FAULT") and "RANK" in os.environ:
    from fault_worker import inject

    inject(os.environ["VLGRPO_TEST_FAULT"], Path(os.environ["VLGRPO_TEST_FAULT_AT"]))
