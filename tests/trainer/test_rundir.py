"""One run per output directory: a second run is refused while the first lives, naming its PID; a run killed with
SIGKILL leaves no stale lock. A directory that cannot be written is named before anything runs."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_resume import HELD_REWARD, _launch
from trainer_helpers import tiny_config

from vlgrpo.config import save_config
from vlgrpo.trainer.checkpoint import checkpoint_dirs
from vlgrpo.trainer.metrics import read_metrics
from vlgrpo.trainer.rundir import RunDirError
from vlgrpo.trainer.state import build_state


def test_a_second_run_on_a_locked_directory_is_refused_until_the_first_dies(tmp_path, tiny_model_dir, shapes_dir):
    (tmp_path / "held_reward.py").write_text(HELD_REWARD)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        "train.steps=3",
        "train.save_every=1",
        f"reward.recipe={{'{tmp_path / 'held_reward.py'}:length': 1.0}}",
    )
    save_config(cfg, tmp_path / "cfg.yaml")
    metrics = tmp_path / "run" / "metrics.jsonl"
    first = _launch(tmp_path / "cfg.yaml", 1, VLGRPO_TEST_HOLD=f"{metrics}:1")  # held inside step 2
    try:
        deadline = time.time() + 300
        while not checkpoint_dirs(tmp_path / "run") and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)  # checkpoint 1 complete: the run is now held inside step 2
        assert first.poll() is None, first.stderr.read().decode()[-2000:]
        with pytest.raises(RunDirError, match=rf"'{tmp_path / 'run'}' is in use by another run \(pid {first.pid} on "):
            build_state(cfg, progress=False)
        assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]  # the second run wrote nothing
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # its own process group (start_new_session)
        first.communicate(timeout=60)
    state = build_state(cfg, progress=False)  # the OS dropped the dead run's lock: no stale lock to clear
    assert state.step == 1  # and it resumes the killed run
    state.close()


def test_an_output_dir_that_cannot_be_written_is_named(tmp_path, tiny_model_dir, shapes_dir):
    (tmp_path / "file").write_text("not a directory")
    cfg = tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "file" / "run")
    with pytest.raises(RunDirError, match=rf"train.output_dir '{tmp_path / 'file' / 'run'}' is not writable"):
        build_state(cfg, progress=False)


def test_a_permanent_failure_stops_the_restarts_of_its_launch_only(tmp_path, monkeypatch):
    from vlgrpo.trainer.rundir import PERMANENT_FAILURE, mark_permanent_failure, refuse_replay

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    mark_permanent_failure(tmp_path, ValueError("disk full"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(RunDirError, match="not replayed: attempt 0 of this launch failed .*ValueError: disk full"):
        refuse_replay(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # a new launch: the user may have fixed it
    refuse_replay(tmp_path)
    assert not (tmp_path / PERMANENT_FAILURE).exists()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    refuse_replay(tmp_path)  # nothing recorded: a restart after a killed rank goes ahead


def test_the_launch_attempt_of_several_nodes_is_the_rendezvous_round_not_the_nodes_restart_count(monkeypatch):
    """One node: torchrun's restart count. Several nodes: the c10d rendezvous' round read from its store (the state
    torch keeps under torch.rendezvous.<run id>), whatever this node's own count says; without the endpoint, an
    error that says what to set."""
    import pickle
    from base64 import b64encode
    from datetime import timedelta
    from types import SimpleNamespace

    import torch

    from vlgrpo.trainer.group import LaunchError, launch_attempt

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # this node's ranks did not fail
    monkeypatch.delenv("GROUP_WORLD_SIZE", raising=False)
    assert launch_attempt() == 0
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.delenv("VLGRPO_RDZV_ENDPOINT", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    with pytest.raises(LaunchError, match="needs VLGRPO_RDZV_ENDPOINT=host:port, torchrun's --rdzv-endpoint"):
        launch_attempt()
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    state = SimpleNamespace(round=3)  # what the round's reader takes from torch's pickled _RendezvousState
    server.set("torch.rendezvous.job7", b64encode(pickle.dumps(state)).decode())
    monkeypatch.setenv("VLGRPO_RDZV_ENDPOINT", f"127.0.0.1:{server.port}")
    assert launch_attempt() == 3
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another")  # no rendezvous of that id: said so, not guessed
    with pytest.raises(LaunchError, match="cannot read the restart attempt from the c10d rendezvous"):
        launch_attempt()


@pytest.mark.parametrize(
    "error, recorded",
    [
        ("vlgrpo.config.schema:ConfigError", True),
        ("vlgrpo.trainer.loop:NonFiniteError", True),
        ("vlgrpo.trainer.rundir:RunDirError", True),  # a full disk
        ("vlgrpo.rewards.judge:JudgeError", False),  # the judge server is down
        ("vlgrpo.vision_cache.entry:CacheDirError", False),  # the cache's share is unmounted for a while
        ("builtins:TimeoutError", False),  # a read that timed out on a network file system
    ],
)
def test_only_a_failure_a_restart_would_repeat_is_recorded_as_permanent(tmp_path, monkeypatch, error, recorded):
    """#60 item 6: every InputError used to be recorded, a judge server that was down and a vanished cache directory
    too, so the restarts that exist for them stopped at once."""
    import importlib

    import vlgrpo.trainer as trainer
    from vlgrpo.trainer.rundir import PERMANENT_FAILURE

    module, name = error.split(":")
    cls = getattr(importlib.import_module(module), name)

    def fails(*_):
        raise cls(f"injected {name}")

    monkeypatch.setattr(trainer, "_train", fails)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.delenv("GROUP_WORLD_SIZE", raising=False)
    with pytest.raises(cls, match=f"injected {name}"):
        trainer.run_training(None, run_dir=tmp_path)
    assert (tmp_path / PERMANENT_FAILURE).exists() is recorded
