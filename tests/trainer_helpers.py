"""Shared bits of the trainer tests: a tiny run config and a reward with variance on an untrained model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vlgrpo.config import Config, load_config

REWARD_MODULE = '''
def length(completion, **fields):
    """Longer completions score higher: gives every group reward variance even on a random policy."""
    return len(completion) / 10.0
'''


def write_reward_module(directory: Path) -> str:
    """A user reward file; returns its `file.py:function` spec for reward.recipe."""
    path = directory / "length_reward.py"
    path.write_text(REWARD_MODULE)
    return f"{path}:length"


def tiny_config(model_dir: str, data_dir: Path, run_dir: Path, *overrides: str) -> Config:
    base = [
        f"model.name_or_path={model_dir}",
        f"data.train={data_dir / 'train.jsonl'}",
        "data.answer_format=answer",
        "rollout.completions_per_prompt=4",
        "rollout.max_new_tokens=8",
        "train.prompts_per_step=2",
        "train.micro_batch_completions=4",
        "train.steps=2",
        "train.lr=1e-3",
        f"train.output_dir={run_dir}",
        "logging.progress_bar=false",
    ]
    return load_config(None, base + list(overrides))


def fault_run_config(directory: Path, *overrides: str) -> Path:
    """The config of the fault and restart runs (tiny model and shapes data in `directory`, the length reward, 4
    steps, a checkpoint every step), saved as directory/cfg.yaml -> its path."""
    from vlgrpo.config import save_config

    spec = write_reward_module(directory)
    cfg = tiny_config(
        str(directory / "model"),
        directory,
        directory / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.steps=4",
        "train.save_every=1",
        *overrides,
    )
    save_config(cfg, directory / "cfg.yaml")
    return directory / "cfg.yaml"


def run_ranks(
    script: Path, *args: str, port: int, timeout: int, env: dict | None = None, restarts: int = 0, nproc: int = 2
):
    """`torchrun --nproc_per_node NPROC [--max-restarts N] script args` on the CPU: one torch thread per rank,
    DeepSpeed on its CPU accelerator, `env` added. Returns (exit status, stderr). A run that outlives `timeout` (a rank
    waiting in a collective another never enters) is stopped, torchrun and every rank, and fails the test."""
    import pytest

    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    launch = ["--nproc_per_node", str(nproc), "--master_port", str(port), "--max-restarts", str(restarts)]
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, str(script), *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun stops its ranks (they run in sessions of their own)
        _, stderr = proc.communicate(timeout=60)
        pytest.fail(
            f"{nproc}-rank run still going after {timeout} s (a rank waiting for one that never comes?):\n"
            + stderr[-3000:]
        )
    return proc.returncode, stderr


def run_nodes(config: Path, *, port: int, timeout: int, env: dict | None = None, restarts: int = 0, nodes: int = 2):
    """`scripts/train_multinode.sh CONFIG` started `nodes` times on this machine, as on `nodes` nodes (NNODES, one
    CPU rank per node, MASTER_ADDR 127.0.0.1, the c10d rendezvous on `port`, MAX_RESTARTS `restarts`), sharing the
    config's run directory. A fault in VLGRPO_TEST_FAULT (`fault_worker.py`'s spec) is injected in the ranks
    (`trainer/inject/sitecustomize.py`), its moment written to fault_at.txt beside the config. Returns (each node's
    exit status, each node's stderr); nodes still running after `timeout` are stopped and fail the test."""
    import pytest

    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHON": sys.executable,
        "NNODES": str(nodes),
        "GPUS_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RDZV_ID": f"test{port}",
        "MAX_RESTARTS": str(restarts),
        "SKIP_DOCTOR": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(here / "trainer" / "inject"), str(here / "trainer"), str(here), os.environ.get("PYTHONPATH", "")]
        ),
        "VLGRPO_TEST_FAULT_AT": str(config.parent / "fault_at.txt"),
        **(env or {}),
    }
    script = here.parent / "scripts" / "train_multinode.sh"
    procs = [  # each node's launcher in a session of its own: stopped with everything it started
        subprocess.Popen(
            ["bash", str(script), str(config)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(nodes)
    ]
    out = []
    try:
        for p in procs:
            out.append(p.communicate(timeout=timeout)[1])
    except subprocess.TimeoutExpired:
        import signal

        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        err = [p.communicate(timeout=60)[1] for p in procs]
        pytest.fail(f"{nodes}-node run still going after {timeout} s:\n" + "\n---\n".join(e[-2000:] for e in err))
    return [p.returncode for p in procs], out
