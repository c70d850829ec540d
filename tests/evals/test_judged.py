"""`vlgrpo eval --judge`: the suites' answers also scored by the judge model, through a local OpenAI-compatible
server: exact judge scores and rows on scripted answers (boxes left out), a dead judge stopping the eval with the
endpoint named, and the command end to end on the tiny model with a config file's reward.judge."""

from __future__ import annotations

import json

import pytest
from judge_server import JudgeServer, Reply
from test_run import ScriptedEngine, _scripted_set

from vlgrpo.cli import main
from vlgrpo.config import load_config, save_config
from vlgrpo.config.judge import JudgeConfig
from vlgrpo.evals.run import evaluate
from vlgrpo.rewards import RewardContext
from vlgrpo.rewards.judge import Judge, JudgeError
from vlgrpo.types import InputError


def _ctx(url: str, **settings) -> RewardContext:
    return RewardContext(box_format="qwen2", judge=Judge(JudgeConfig(base_url=url, model="judge", **settings)))


def test_judge_scores_every_suite_with_a_gold_answer():
    data, engine = _scripted_set()
    with JudgeServer() as server:  # yes when the answer read equals the gold answer
        result = evaluate(engine, data, _ctx(server.url), progress=False, judge=True)
        assert len(server.requests) == 6  # 2 vqa + 4 pope; the box of grounding is IoU's
    m = result.metrics
    assert m["eval/vqa/judge_score"] == 0.5  # 3 = 3, blue != red
    # the server's rule is exact equality: "Yes" = yes; "Yes, there is" != no; "No" != yes; "No, there is not." != no
    assert m["eval/pope/judge_score"] == 0.25
    assert "eval/grounding/judge_score" not in m and result.info["judge"]["judged"] == {"vqa": 2, "pope": 4}
    rows = {r["id"]: r for r in result.predictions}
    assert (rows["n"]["judge_score"], rows["n"]["judge_reply"], rows["n"]["judge_error"]) == (1.0, "Yes.", None)
    assert rows["t"]["judge_reply"] == "No, it differs." and "judge_score" not in rows["g"]
    assert result.info["judge"]["failures"] == 0 and result.info["judge"]["requests"] == 6


def test_a_dead_judge_stops_the_eval_and_no_judge_is_refused():
    data, engine = _scripted_set()
    with JudgeServer(lambda n, body: Reply(status=500)) as server:
        with pytest.raises(JudgeError, match="could not score 6 of 6"):
            evaluate(engine, data, _ctx(server.url, retries=0), progress=False, judge=True)
    with pytest.raises(InputError, match="--judge needs a judge"):
        evaluate(ScriptedEngine(engine.answers), data, RewardContext(box_format="qwen2"), progress=False, judge=True)


def test_cli_eval_judge_with_a_config_file(tiny_model_dir, shapes_dir, tmp_path, capsys):
    with JudgeServer(lambda n, body: Reply("yes")) as server:
        cfg = load_config(None, [f"reward.judge.base_url={server.url}", "reward.judge.model=judge"])
        save_config(cfg, tmp_path / "judge.yaml")
        out = tmp_path / "eval"
        argv = ["eval", "--model", tiny_model_dir("qwen2_5_vl"), "--suite", "vqa", "--data"]
        argv += [str(shapes_dir / "test.jsonl"), "--out", str(out), "--max-new-tokens", "4", "--no-progress"]
        assert main([*argv, "--judge", str(tmp_path / "judge.yaml")]) == 0
        requests = len(server.requests)
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["metrics"]["eval/vqa/judge_score"] == 1.0 and doc["info"]["judge"]["requests"] == requests > 0
    assert "eval/vqa/judge_score" in capsys.readouterr().out
    assert main([*argv, "--judge"]) == 2  # a checkpoint directory has no run config to take a judge from
    assert "--judge without a config file needs --model to be a run directory" in capsys.readouterr().err
