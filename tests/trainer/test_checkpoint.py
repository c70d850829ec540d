"""Checkpoints that cannot be trusted are never loaded: a crafted pickle is refused with a clear error (resume and
`vlgrpo export`), a truncated or incomplete checkpoint is passed over for the newest one that verifies, a half-written
metrics line or a run killed before its first checkpoint never duplicates metric rows, and a checkpoint write that
fails (disk full, read-only) names the path and what was kept, leaving no partial directory behind; so does a
metrics row that cannot be appended."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.cli import main
from vlgrpo.config import Config
from vlgrpo.trainer import run_training
from vlgrpo.trainer.checkpoint import checkpoint_dirs
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.manifest import check_manifest, write_manifest
from vlgrpo.trainer.metrics import read_metrics
from vlgrpo.trainer.rundir import RunDirError
from vlgrpo.trainer.safe_state import CheckpointError
from vlgrpo.trainer.state import build_state


class Payload:
    """What an attacker pickles: unpickling it runs a shell command (here: creates a marker file)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _config(tmp_path, model_dir, shapes_dir, *extra: str):
    spec = write_reward_module(tmp_path)
    return tiny_config(
        model_dir, shapes_dir, tmp_path / "run", f"reward.recipe={{'{spec}': 1.0}}", "train.save_every=1", *extra
    )


def _trained(tmp_path, tiny_model_dir, shapes_dir, steps: int = 2):
    """A finished plain run of `steps` steps with a checkpoint after each (the newest two kept)."""
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir, f"train.steps={steps}")
    run_training(cfg, progress=False)
    return cfg, tmp_path / "run"


def _weights(state) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in state.backend.model.named_parameters()}


def test_a_crafted_pickle_is_refused_on_resume_and_export(tmp_path, tiny_model_dir, shapes_dir, capsys):
    cfg, run = _trained(tmp_path, tiny_model_dir, shapes_dir)
    newest, marker = run / "checkpoints" / "step_2", tmp_path / "code-ran"
    torch.save({"model": Payload(marker)}, newest / "backend.pt")
    write_manifest(newest, 2)  # the attacker rewrites the manifest too: checksums alone cannot catch this
    with pytest.raises(CheckpointError, match=r"step_2/backend.pt' was refused: loading it would unpickle posix.sys"):
        build_state(cfg, progress=False)
    assert main(["export", str(run), "--out", str(tmp_path / "export")]) == 2
    assert "backend.pt' was refused" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "export").exists()

    # the old file names, planted and listed: refused too, though vlgrpo would never read them
    torch.save({"model": Payload(marker)}, run / "checkpoints" / "step_1" / "rng_rank0.pt")
    write_manifest(run / "checkpoints" / "step_1", 1)
    newest.rename(run / "checkpoints" / "moved")
    with pytest.raises(CheckpointError, match=r"rng_rank0.pt' was refused"):
        build_state(cfg, progress=False)
    assert not marker.exists()


def test_run_state_is_json_and_weights_only_tensors(tmp_path, tiny_model_dir, shapes_dir):
    _, run = _trained(tmp_path, tiny_model_dir, shapes_dir)
    newest = run / "checkpoints" / "step_2"
    assert sorted(p.name for p in newest.iterdir()) == [
        "backend.pt",
        "config.json",
        "data_rank0.json",
        "manifest.json",
        "meta.json",
        "rng_rank0.json",
    ]
    assert json.loads((newest / "data_rank0.json").read_text())["index"] == 4  # 2 steps x 2 prompts
    assert len(json.loads((newest / "rng_rank0.json").read_text())["torch"]) == torch.get_rng_state().numel()
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(newest / "backend.pt")) == []
    assert check_manifest(newest) is None


@pytest.mark.parametrize("damage", ["truncated", "missing", "no manifest"])
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(damage, tmp_path, tiny_model_dir, shapes_dir, capsys):
    cfg, run = _trained(tmp_path, tiny_model_dir, shapes_dir, steps=3)
    newest = run / "checkpoints" / "step_3"
    if damage == "truncated":
        data = (newest / "backend.pt").read_bytes()
        (newest / "backend.pt").write_bytes(data[: len(data) // 3])
    elif damage == "missing":
        (newest / "rng_rank0.json").unlink()
    else:
        (newest / "manifest.json").unlink()
    state = build_state(cfg, progress=False)
    out = capsys.readouterr().out
    assert state.step == 2 and f"resumed from {run / 'checkpoints' / 'step_2'} (step 2)" in out
    reason = {"truncated": "backend.pt has", "missing": "rng_rank0.json is missing", "no manifest": "no manifest"}
    assert f"checkpoint {newest} is not usable: " in out and reason[damage] in out and "Falling back to step_2" in out
    assert [r["step"] for r in read_metrics(run)] == [1, 2]  # step 3 is logged again by the resumed run
    assert [p.name for p in checkpoint_dirs(run)] == ["step_2"]  # the damaged one was moved aside, kept
    assert len(list((run / "checkpoints").glob("rejected-step_3-*"))) == 1
    Trainer(state).train()
    state.close()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert check_manifest(run / "checkpoints" / "step_3") is None  # written afresh


def test_no_verified_checkpoint_is_an_error_that_changes_nothing(tmp_path, tiny_model_dir, shapes_dir):
    cfg, run = _trained(tmp_path, tiny_model_dir, shapes_dir)
    for ckpt in checkpoint_dirs(run):
        (ckpt / "meta.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"no checkpoint under .* verifies \(step_2: meta.json has 2 bytes"):
        build_state(cfg, progress=False)
    assert [p.name for p in checkpoint_dirs(run)] == ["step_1", "step_2"]


def test_a_half_written_metrics_line_is_dropped_on_resume(tmp_path, tiny_model_dir, shapes_dir):
    _, run = _trained(tmp_path, tiny_model_dir, shapes_dir)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "train/lo')  # the run was killed while writing step 3's row
    more = _config(tmp_path, tiny_model_dir(), shapes_dir, "train.steps=3")
    run_training(more, progress=False)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


def test_a_run_killed_before_its_first_checkpoint_never_duplicates_metric_rows(tmp_path, tiny_model_dir, shapes_dir):
    assert Config().train.save_every > 0  # checkpoints by default: a killed run resumes near where it stopped
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir, "train.save_every=0")
    run_training(cfg, progress=False)
    for ckpt in checkpoint_dirs(tmp_path / "run"):  # as if killed before the end-of-run checkpoint
        ckpt.rename(ckpt.with_name(".tmp-" + ckpt.name))
    run_training(cfg, progress=False)  # starts over from step 0
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EROFS, "Read-only file system"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"),
    ],
)
def test_a_checkpoint_write_that_fails_names_the_path_and_what_was_kept(
    failure, tmp_path, tiny_model_dir, shapes_dir, monkeypatch
):
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir, "train.steps=3")
    real_save, calls = torch.save, []

    def save_until_full(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) > 1:  # step 1's checkpoint fits, step 2's does not
            raise failure
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_full)
    with pytest.raises(RunDirError) as e:
        run_training(cfg, progress=False)
    run, msg = tmp_path / "run", str(e.value)
    reason = "[Errno" if isinstance(failure, OSError) else "inline_container"
    assert "could not write checkpoint step_2" in msg and reason in msg and ".tmp-step_2" in msg
    assert "Kept: step_1" in msg and "resume continues from step_1" in msg
    assert not list((run / "checkpoints").glob(".tmp-*"))  # no partial directory left behind
    monkeypatch.setattr(torch, "save", real_save)
    run_training(cfg, progress=False)  # space freed: resumes from step 1 and finishes
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


def test_a_metrics_row_that_cannot_be_written_names_the_file(tmp_path, tiny_model_dir, shapes_dir, monkeypatch):
    real_open = Path.open

    def full_disk(self, mode="r", *args, **kwargs):
        if self.name == "metrics.jsonl" and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full_disk)
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir)
    with pytest.raises(RunDirError, match=r"metrics of step 1 to '.*run/metrics.jsonl': \[Errno 28\] No space left"):
        run_training(cfg, progress=False)


def test_ranks_hash_their_share_of_a_checkpoint_and_reach_one_verdict(tmp_path, monkeypatch):
    """On N ranks each hashes every N-th file (a 7B ZeRO-3 checkpoint is ~100 GB: rank 0 alone took minutes while the
    others waited); the manifest equals the one a single process writes, and every rank returns the same verdict.
    Two ranks as threads, gathering through a barrier."""
    import threading

    from vlgrpo.trainer import manifest

    directory = tmp_path / "step_3"
    (directory / "zero3").mkdir(parents=True)
    for k in range(5):
        (directory / "zero3" / f"part{k}.pt").write_bytes(bytes([k]) * (1000 + k))
    hashed: dict[str, list[str]] = {}
    hash_all = manifest._hash_all

    def recording(d, names):
        hashed.setdefault(threading.current_thread().name, []).extend(names)
        return hash_all(d, names)

    monkeypatch.setattr(manifest, "_hash_all", recording)
    slots, barrier = [None, None], threading.Barrier(2)

    def gather_of(rank):
        def gather(obj):
            slots[rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        return gather

    def on_two_ranks(fn):
        results = [None, None]

        def run(rank):
            results[rank] = fn((rank, 2), gather_of(rank))

        threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return results

    on_two_ranks(lambda share, gather: manifest.write_manifest(directory, 3, share, gather))
    names = sorted(f"zero3/part{k}.pt" for k in range(5))
    assert hashed == {"rank0": names[0::2], "rank1": names[1::2]}
    two_ranks = (directory / "manifest.json").read_text()
    manifest.write_manifest(directory, 3)  # one process
    assert (directory / "manifest.json").read_text() == two_ranks
    assert on_two_ranks(lambda share, gather: manifest.check_manifest(directory, share, gather)) == [None, None]
    (directory / "zero3" / "part3.pt").write_bytes(b"\xff" * 1003)  # same size, other bytes: rank 1's file
    verdicts = on_two_ranks(lambda share, gather: manifest.check_manifest(directory, share, gather))
    assert verdicts == ["zero3/part3.pt does not match its checksum in manifest.json"] * 2
    # #60 item 7: on NFS rank 1's listing can lag (part0 not seen yet): rank 0's listing decides what each hashes,
    # so no file goes unhashed (before: rank 0 failed with a KeyError, not reported as a checkpoint error)
    (directory / "manifest.json").unlink()
    files = manifest._files

    def lagging(d):
        seen = files(d)
        return seen[1:] if threading.current_thread().name == "rank1" else seen

    monkeypatch.setattr(manifest, "_files", lagging)
    on_two_ranks(lambda share, gather: manifest.write_manifest(directory, 3, share, gather))
    assert sorted(json.loads((directory / "manifest.json").read_text())["files"]) == names
