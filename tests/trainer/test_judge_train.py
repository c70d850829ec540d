"""GRPO steps whose recipe includes `judge`, scored through a local OpenAI-compatible server: the judge's metrics in
every step, a later step's repeated answers taken from the cache, and a dead server stopping the run at its first
step with one line naming the endpoint (no checkpoint written, nothing trained on zeros)."""

from __future__ import annotations

import re

from judge_server import JudgeServer, Reply, prompt_text
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.cli import main
from vlgrpo.config import save_config
from vlgrpo.trainer import run_training
from vlgrpo.trainer.checkpoint import checkpoint_dirs


def even_answers(n: int, body: dict) -> Reply:
    """yes for an answer of even length: a verdict that varies within a group of an untrained model."""
    said = re.search(r"Model's answer: (.*)", prompt_text(body), re.DOTALL).group(1)
    return Reply("yes" if len(said) % 2 == 0 else "no")


def _judged(tmp_path, model_dir, shapes_dir, url: str, *extra: str):
    length = write_reward_module(tmp_path)
    return tiny_config(
        model_dir,
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{judge: 1.0, '{length}': 0.1}}",
        f"reward.judge.base_url={url}",
        "reward.judge.model=tiny-judge",
        *extra,
    )


def test_grpo_steps_score_through_the_judge(tmp_path, tiny_model_dir, shapes_dir):
    with JudgeServer(even_answers) as server:
        cfg = _judged(tmp_path, tiny_model_dir(), shapes_dir, server.url, "train.steps=2")
        history = run_training(cfg, progress=False)
        replies = [even_answers(i, body).text for i, body in enumerate(server.requests)]
    assert [h["reward/judge_failures"] for h in history] == [0.0, 0.0]
    for h in history:  # every completion of the step judged: by a request, or by the cache / a duplicate
        assert h["reward/judge_requests"] + h["reward/judge_cache_hits"] == 8
        assert 0.0 <= h["reward/judge"] <= 1.0 and h["reward/judge_latency_s"] > 0
    assert sum(h["reward/judge_requests"] for h in history) == len(server.requests) == len(replies)
    assert {b["model"] for b in server.requests} == {"tiny-judge"}


def test_a_dead_judge_stops_the_run_at_its_first_step(tmp_path, tiny_model_dir, shapes_dir, capsys):
    with JudgeServer(lambda n, body: Reply(status=503)) as server:
        cfg = _judged(
            tmp_path, tiny_model_dir(), shapes_dir, server.url, "reward.judge.retries=1", "reward.judge.backoff_s=0"
        )
        save_config(cfg, tmp_path / "cfg.yaml")
        assert main(["train", str(tmp_path / "cfg.yaml")]) == 2
        assert len(server.requests) in (14, 16)  # 8 completions (7 if two alike), two attempts each
    err = capsys.readouterr().err
    assert f"the judge at {server.url}/chat/completions could not score" in err
    assert "HTTP 503" in err and "reward.judge.max_failure_fraction=0.5" in err
    assert checkpoint_dirs(tmp_path / "run") == []


def test_a_missing_api_key_fails_before_the_model_loads(tmp_path, shapes_dir, capsys, monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    cfg = _judged(tmp_path, str(tmp_path / "no-model-here"), shapes_dir, "http://127.0.0.1:9/v1")
    cfg.reward.judge.api_key_env = "NO_SUCH_JUDGE_KEY"
    save_config(cfg, tmp_path / "cfg.yaml")
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 2
    assert "reward.judge.api_key_env names 'NO_SUCH_JUDGE_KEY', which is not set" in capsys.readouterr().err
