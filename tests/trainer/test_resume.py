import json
import os
import signal
import subprocess
import sys
import time

from vlgrpo.config import save_config

from trainer_helpers import tiny_config, write_reward_module

STEPS = 6


def _launch(cfg_path, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-m", "vlgrpo.cli", "train", str(cfg_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def _metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # wall-clock, process memory and the in-memory vision cache (cold after a restart, no disk cache here) are
    # properties of the process, not of the training state; everything else must match exactly
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/", "vision/"))} for r in rows]


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    configs = {}
    for name in ("straight", "killed"):
        cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / name, f"reward.recipe={{'{spec}': 1.0}}",
                          f"train.steps={STEPS}", "train.save_every=1", "grpo.beta=0.04", "train.warmup_steps=2",
                          "train.lr_schedule=cosine")
        configs[name] = tmp_path / f"{name}.yaml"
        save_config(cfg, configs[name])

    straight = _launch(configs["straight"])
    assert straight.wait(timeout=600) == 0, straight.stderr.read().decode()[-2000:]

    victim = _launch(configs["killed"])
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    assert victim.poll() is None, "the run finished before it could be killed"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    done = sorted((tmp_path / "killed" / "checkpoints").glob("step_*"))
    assert done and int(done[-1].name.split("_")[1]) < STEPS  # really killed mid-way

    resumed = _launch(configs["killed"])
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-2000:]
    assert [r["step"] for r in _metrics(tmp_path / "killed")] == list(range(1, STEPS + 1))
    assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "straight")
