"""A non-finite loss or gradient (here: a reward of 1e308, infinite once the rewards become a float32 tensor) skips
the optimiser step, on every rank alike, and is counted in train/nonfinite_steps; train.max_nonfinite_steps in a row
stop the run with one clear error and the last good checkpoint kept. Plain in one process; LoRA and ZeRO-3 on two
CPU ranks where only rank 1 sees the bad reward."""

from __future__ import annotations

import pytest
import torch
from test_distributed import _torchrun
from trainer_helpers import tiny_config

from vlgrpo.cli import main
from vlgrpo.config import save_config
from vlgrpo.models import load_model
from vlgrpo.trainer import run_training
from vlgrpo.trainer.checkpoint import checkpoint_dirs
from vlgrpo.trainer.metrics import read_metrics

REWARDS = '''
import os
from pathlib import Path


def _calls(name):
    """How many times `name` was called before in this rank (rewards are scored completion by completion, a
    group's G = 4 in a row)."""
    counter = Path(__file__).with_name(f"{name}-rank{os.environ.get('RANK', '0')}.txt")
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    return n


def huge(completion):
    """1e308 for the first completion of every group, 0 for the others: inf - inf in the advantage, a NaN loss."""
    return 1e308 if _calls("huge") % 4 == 0 else 0.0


def huge_in_step_one(completion):
    n = _calls("step_one")
    return 1e308 if n < 8 and n % 4 == 0 else len(completion) / 10.0


def huge_on_rank_one(completion):
    n = _calls("rank_one")
    return 1e308 if os.environ["RANK"] == "1" and n % 4 == 0 else len(completion) / 10.0
'''


def _config(tmp_path, model_dir, shapes_dir, reward: str, *extra: str):
    (tmp_path / "rewards.py").write_text(REWARDS)
    recipe = f"reward.recipe={{'{tmp_path}/rewards.py:{reward}': 1.0}}"
    return tiny_config(model_dir, shapes_dir, tmp_path / "run", recipe, "train.save_every=1", *extra)


def test_non_finite_steps_in_a_row_stop_the_run_with_the_weights_untouched(
    tmp_path, tiny_model_dir, shapes_dir, capsys
):
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir, "huge", "train.steps=4", "train.max_nonfinite_steps=2")
    save_config(cfg, tmp_path / "cfg.yaml")
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 2
    err = capsys.readouterr().err
    assert "error: stopped at step 2: the loss or gradient was NaN or infinite in 2 steps in a row" in err
    assert "train.max_nonfinite_steps=2" in err and "kept checkpoints: step_1" in err
    rows = read_metrics(tmp_path / "run")
    assert [(r["step"], r["train/nonfinite_steps"], r["train/loss"]) for r in rows] == [(1, 1, "nan"), (2, 2, "nan")]
    assert [p.name for p in checkpoint_dirs(tmp_path / "run")] == ["step_1"]  # nothing written at the stop
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step_1" / "backend.pt", weights_only=True)
    base = load_model(tiny_model_dir()).model.state_dict()
    assert all(torch.equal(saved["model"][n], base[n]) for n in base)  # no optimiser step was taken
    assert saved["optimizer"]["state"] == {} and saved["scheduler"]["last_epoch"] == 0


def test_a_non_finite_step_is_skipped_and_the_run_goes_on(tmp_path, tiny_model_dir, shapes_dir):
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir, "huge_in_step_one", "train.steps=3")
    history = run_training(cfg, progress=False)
    assert [h["train/nonfinite_steps"] for h in history] == [1.0, 1.0, 1.0]
    assert history[0]["train/loss"] != history[0]["train/loss"]  # NaN
    assert all(torch.isfinite(torch.tensor(h["train/loss"])) for h in history[1:])
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step_3" / "backend.pt", weights_only=True)
    assert saved["scheduler"]["last_epoch"] == 2  # steps 2 and 3 stepped, step 1 did not
    assert all(torch.isfinite(v).all() for v in saved["model"].values())


@pytest.mark.parametrize("backend, port", [("lora", 29531), ("zero3", 29532)])
def test_ranks_agree_to_skip_a_step_only_one_of_them_saw_non_finite(
    backend, port, tmp_path, tiny_model_dir, shapes_dir
):
    if backend == "zero3":
        pytest.importorskip("deepspeed")
    extra = ["train.backend=lora", "train.lora.rank=4"] if backend == "lora" else ["train.backend=zero3"]
    cfg = _config(tmp_path, tiny_model_dir(), shapes_dir, "huge_on_rank_one", "train.max_nonfinite_steps=3", *extra)
    save_config(cfg, tmp_path / "cfg.yaml")
    ranks = _torchrun(tmp_path, port, timeout=300)
    base = load_model(tiny_model_dir()).model.state_dict()
    for r, rank in enumerate(ranks):
        assert [h["train/nonfinite_steps"] for h in rank["history"]] == [1.0, 2.0], r
        assert [p["optimizer_steps"] for p in rank["progress"]] == [0, 0], r  # neither rank stepped, nor its LR
        weights = torch.load(tmp_path / f"weights_rank{r}.pt")
        assert all(torch.equal(weights[n], base[n]) for n in base if n in weights), r
    assert [r["train/nonfinite_steps"] for r in read_metrics(tmp_path / "run")] == [1.0, 2.0]


def test_zero3_counts_fp16_loss_scaler_skips_apart_from_non_finite_losses():
    """DeepSpeed's step as the ZeRO-3 backend reads it: a skipped fp16 step with finite losses is the loss scaler's
    (`loss_scale_skips`, a non-finite step but no streak); with a non-finite loss it is a non-finite step."""
    from types import SimpleNamespace

    from vlgrpo.trainer.zero3 import Zero3Backend

    engine = SimpleNamespace(
        global_steps=0, fp16_enabled=lambda: True, was_step_applied=lambda: False, get_global_grad_norm=lambda: None
    )
    backend = Zero3Backend.__new__(Zero3Backend)
    backend.engine, backend.skipped_steps, backend.loss_scale_skips = engine, 0, 0
    backend._backwards, backend._lr = 1, 1e-5
    for nonfinite_loss in (False, False, True):
        backend._pass_start, backend._nonfinite_loss = engine.global_steps, nonfinite_loss
        engine.global_steps += 1  # DeepSpeed counts the step it skipped
        backend.step()
    assert (backend.loss_scale_skips, backend.skipped_steps) == (2, 1)
