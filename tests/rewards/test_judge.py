"""The judge reward against a local OpenAI-compatible server: scores, batching, the cache, and every injected fault
(delays past the timeout, a trickled body, 500s, 429, 404, garbage) bounded in time, counted and never a crash; a
step in which most completions fail stops with an error naming the endpoint."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import time

import pytest
from judge_server import JudgeServer, Reply, completion_json, grader, prompt_text

from vlgrpo.config import Config, ConfigError, validate
from vlgrpo.config.judge import JudgeConfig
from vlgrpo.rewards import RewardContext, score
from vlgrpo.rewards.explain import explain, format_report
from vlgrpo.rewards.judge import Judge, JudgeError, parse_score
from vlgrpo.types import Sample

SAMPLES = [Sample(f"s{i}", f"What is shown {i}?", answer=gold, answer_type="text") for i, gold in enumerate("ab")]


def ctx_for(url: str, **settings) -> RewardContext:
    settings = {"timeout_s": 5.0, "retries": 0, "backoff_s": 0.0, **settings}
    return RewardContext(
        answer_format="answer", judge=Judge(JudgeConfig(base_url=url, model="judge-model", **settings))
    )


@pytest.mark.parametrize(
    "reply, parser, pattern, value",
    [
        ("Yes.", "yes_no", "", 1.0),
        ("no", "yes_no", "", 0.0),
        ("Yes at first, but no: it differs", "yes_no", "", 0.0),  # the last word decides
        ("Score: 0.75", "number", "", 0.75),
        ("3 reasons; final 1", "number", "", 1.0),
        ("Judgement: 1\nreason", "regex", r"Judgement:\s*(\d)", 1.0),
        ("Verdict: YES", "regex", r"Verdict:\s*(\w+)", 1.0),
    ],
)
def test_parse_score(reply, parser, pattern, value):
    assert parse_score(reply, parser, pattern) == value


@pytest.mark.parametrize(
    "reply, parser, pattern",
    [("maybe", "yes_no", ""), ("Score: 7", "number", ""), ("none", "number", ""), ("Judgement: x", "regex", r"J:(\d)")],
)
def test_parse_score_refuses(reply, parser, pattern):
    with pytest.raises(ValueError):
        parse_score(reply, parser, pattern)


@pytest.mark.parametrize(
    "judge, message",
    [
        ({}, "reward.judge.base_url and reward.judge.model"),
        ({"base_url": "localhost:8000", "model": "m"}, "must start with http"),
        ({"base_url": "http://h/v1", "model": "m", "prompt": "{question} {gold}"}, "placeholder(s) ['gold']"),
        ({"base_url": "http://h/v1", "model": "m", "parser": "regex"}, "parser=regex needs a pattern"),
        ({"base_url": "http://h/v1", "model": "m", "parser": "regex", "regex": "(unclosed"}, "not a regular expr"),
        ({"base_url": "http://h/v1", "model": "m", "timeout_s": 0}, "reward.judge.timeout_s' must be > 0"),
        ({"base_url": "http://h/v1", "model": "m", "parser": "score"}, "use one of: yes_no, number, regex"),
    ],
)
def test_config_refuses(judge, message):
    cfg = Config()
    cfg.reward.recipe = {"judge": 1.0, "format": 0.5}
    cfg.reward.judge = JudgeConfig(**judge)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(cfg)


def test_scores_batched_deduplicated_and_cached():
    completions = ["<answer>a</answer>", "<answer>b</answer>", "<answer>a</answer>", "<answer>b</answer>"]
    samples = [SAMPLES[0], SAMPLES[0], SAMPLES[1], SAMPLES[1]]
    with JudgeServer() as server:
        ctx = ctx_for(server.url)
        batch = score(completions, samples, {"judge": 1.0, "format": 0.5}, ctx)
        assert batch.components["judge"] == [1.0, 0.0, 0.0, 1.0]
        assert batch.total == [1.5, 0.5, 0.5, 1.5]
        assert len(server.requests) == 4 and batch.extra["reward/judge_requests"] == 4
        asked = sorted(prompt_text(r).splitlines()[1:4] for r in server.requests)  # they arrive in any order
        assert asked[0] == ["Question: What is shown 0?", "Reference answer: a", "Model's answer: a"]
        assert {(r["model"], r["temperature"]) for r in server.requests} == {("judge-model", 0.0)}
        # a group repeating an answer sends it once; a later step asks nothing it asked before
        again = score(completions + completions[:1], samples + samples[:1], {"judge": 1.0}, ctx)
        assert again.components["judge"] == [1.0, 0.0, 0.0, 1.0, 1.0] and len(server.requests) == 4
        assert again.extra["reward/judge_cache_hits"] == 5 and again.extra["reward/judge_requests"] == 0
        assert again.metrics()["reward/judge"] == pytest.approx(0.6)


def test_runs_concurrently_bounded_by_max_concurrency():
    slow = lambda n, body: Reply("yes", delay=0.4)  # noqa: E731
    completions = [f"<answer>{i}</answer>" for i in range(8)]
    with JudgeServer(slow) as server:
        t0 = time.monotonic()
        batch = score(completions, [SAMPLES[0]] * 8, {"judge": 1.0}, ctx_for(server.url, max_concurrency=8))
        parallel = time.monotonic() - t0
        t0 = time.monotonic()
        score([c + " " for c in completions], [SAMPLES[0]] * 8, {"judge": 1.0}, ctx_for(server.url, max_concurrency=2))
        waves = time.monotonic() - t0
    assert batch.components["judge"] == [1.0] * 8
    assert parallel < 1.2 < 1.5 < waves  # 8 at once: one 0.4 s wave; two at a time: four waves


def test_timeouts_are_bounded_counted_and_stop_a_dead_step():
    hang = lambda n, body: Reply("yes", delay=3.0)  # noqa: E731
    with JudgeServer(hang) as server:
        ctx = ctx_for(server.url, timeout_s=0.3, retries=1, backoff_s=0.1, max_failure_fraction=1.0)
        t0 = time.monotonic()
        batch = score(["<answer>a</answer>", "<answer>b</answer>"], SAMPLES, {"judge": 1.0, "format": 1.0}, ctx)
        elapsed = time.monotonic() - t0
        assert elapsed < 1.5, elapsed  # two attempts of 0.3 s and a 0.1 s backoff, concurrently
        assert batch.components["judge"] == [0.0, 0.0] and batch.components["format"] == [1.0, 1.0]
        assert batch.extra["reward/judge_failures"] == 2 and batch.extra["reward/judge_retries"] == 2
        assert [f[1] for f in batch.failures] == ["judge", "judge"]
        assert "no reply within reward.judge.timeout_s=0.3 (after 2 attempts)" in batch.failures[0][2]
        strict = dataclasses.replace(
            ctx, judge=Judge(dataclasses.replace(ctx.judge.settings, max_failure_fraction=0.5))
        )
        with pytest.raises(JudgeError, match=f"the judge at {server.url}/chat/completions could not score 2 of 2"):
            score(["<answer>a</answer>", "<answer>b</answer>"], SAMPLES, {"judge": 1.0}, strict)


def test_a_trickled_body_is_cut_at_the_timeout():
    trickle = lambda n, body: Reply("yes", trickle=0.05)  # noqa: E731 - ~90 bytes: 4.5 s
    with JudgeServer(trickle) as server:
        t0 = time.monotonic()
        batch = score(["x"], SAMPLES[:1], {"judge": 1.0}, ctx_for(server.url, timeout_s=0.5, max_failure_fraction=1))
        assert time.monotonic() - t0 < 1.5
        assert batch.verdicts[0].error.startswith("no reply within reward.judge.timeout_s=0.5")


def test_server_errors_are_retried_with_backoff_client_errors_are_not():
    flaky = lambda n, body: Reply("yes") if n >= 2 else Reply(status=500 if n == 0 else 429)  # noqa: E731
    with JudgeServer(flaky) as server:
        batch = score(["<answer>a</answer>"], SAMPLES[:1], {"judge": 1.0}, ctx_for(server.url, retries=2))
        assert batch.components["judge"] == [1.0] and batch.extra["reward/judge_retries"] == 2
        assert batch.verdicts[0].attempts == 3 and len(server.requests) == 3
    missing = lambda n, body: Reply(status=404)  # noqa: E731
    with JudgeServer(missing) as server:
        ctx = ctx_for(server.url, retries=3, max_failure_fraction=1.0)
        batch = score(["<answer>a</answer>"], SAMPLES[:1], {"judge": 1.0}, ctx)
        assert len(server.requests) == 1 and batch.verdicts[0].error.startswith("HTTP 404")


@pytest.mark.parametrize(
    "reply, error",
    [
        (Reply("I cannot tell"), "unparseable reply: no yes/no"),
        (Reply(raw=b"<html>bad gateway</html>"), "not an OpenAI chat completion"),
        (Reply(raw=b'{"choices": []}'), "not an OpenAI chat completion"),
    ],
)
def test_garbage_scores_zero_is_counted_and_not_cached(reply, error):
    with JudgeServer(lambda n, body: reply) as server:
        ctx = ctx_for(server.url, retries=2, max_failure_fraction=1.0)
        for _ in range(2):  # a failure is not cached: the next step asks again
            batch = score(["<answer>a</answer>"], SAMPLES[:1], {"judge": 1.0}, ctx)
            assert batch.components["judge"] == [0.0] and batch.verdicts[0].error.startswith(error)
        assert len(server.requests) == 2  # and not retried: the server answered


def test_api_key_from_the_named_variable_and_the_image(tmp_path, monkeypatch):
    image = tmp_path / "img.png"
    image.write_bytes(b"\x89PNG fake bytes")
    sample = Sample("s", "Colour?", answer="red", answer_type="text", image=str(image))
    with JudgeServer() as server:
        ctx = ctx_for(server.url, api_key_env="JUDGE_KEY", send_image=True, system="Be strict.")
        with pytest.raises(Exception, match="reward.judge.api_key_env names 'JUDGE_KEY', which is not set"):
            score(["red"], [sample], {"judge": 1.0}, ctx)
        monkeypatch.setenv("JUDGE_KEY", "sk-test")
        assert score(["red"], [sample], {"judge": 1.0}, ctx).components["judge"] == [1.0]  # no tags: the whole text
        body = server.requests[0]
        assert server.headers[0]["Authorization"] == "Bearer sk-test"
        assert body["messages"][0] == {"role": "system", "content": "Be strict."}
        url = body["messages"][1]["content"][0]["image_url"]["url"]
        assert url == "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()


def test_explain_shows_the_raw_reply_and_the_score():
    with JudgeServer() as server:
        ctx = ctx_for(server.url)
        report = explain("<think>t</think><answer>b</answer>", SAMPLES[0], {"judge": 1.0}, ctx)
        assert report["judge"]["reply"] == "No, it differs." and report["judge"]["score"] == 0.0
        assert "judge reply: 'No, it differs.' -> score 0" in format_report(report)
    with JudgeServer(lambda n, body: Reply("unsure")) as server:  # one failure of one: reported, not raised
        report = explain("<answer>a</answer>", SAMPLES[0], {"judge": 1.0}, ctx_for(server.url))
        assert report["judge"]["reply"] == "unsure" and report["failures"][0]["component"] == "judge"


def test_recipe_without_a_judge_is_refused():
    with pytest.raises(Exception, match="no judge is configured: set reward.judge.base_url"):
        score(["a"], SAMPLES[:1], {"judge": 1.0}, RewardContext())


def test_grader_helper_reads_the_default_prompt():
    assert grader(0, {"messages": [{"content": "Reference answer: x\nModel's answer: X"}]}).text == "Yes."
    assert completion_json("no").startswith(b'{"choices"')


def test_cli_reward_prints_the_judge_reply(tmp_path, capsys):
    from vlgrpo.cli import main
    from vlgrpo.config import load_config, save_config

    with JudgeServer() as server:
        cfg = load_config(
            None, [f"reward.judge.base_url={server.url}", "reward.judge.model=m", "data.answer_format=answer"]
        )
        cfg.reward.recipe = {"judge": 1.0, "format": 0.5}
        save_config(cfg, tmp_path / "cfg.yaml")
        (tmp_path / "img.png").write_bytes(b"not read: the judge sends no image here")
        row = json.dumps({"id": "q", "question": "Colour?", "answer": "red", "answer_type": "text"})
        row = row[:-1] + f', "image": "{tmp_path / "img.png"}", "image_size": [4, 4]}}'
        argv = [
            "reward",
            "--sample",
            row,
            "--completion",
            "<answer>red</answer>",
            "--recipe",
            str(tmp_path / "cfg.yaml"),
        ]
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "  Model's answer: red" in out and "judge reply: 'Yes.' -> score 1" in out
    assert next(line.split() for line in out.splitlines() if line.startswith("total")) == ["total", "1.5000"]


def test_the_batch_bound_catches_a_request_that_never_returns(monkeypatch):
    """Even a request stuck where no socket timeout reaches (here: the worker itself sleeps) leaves the step after
    the bound of its attempts: one attempt of 0.2 s + 1 s of slack."""
    ctx = ctx_for("http://127.0.0.1:9/v1", timeout_s=0.2, max_failure_fraction=1.0)
    monkeypatch.setattr(ctx.judge, "judge_one", lambda data, headers: time.sleep(3))
    t0 = time.monotonic()
    batch = score(["a"], SAMPLES[:1], {"judge": 1.0}, ctx)
    assert 1.1 < time.monotonic() - t0 < 2.0
    assert batch.verdicts[0].error == "no reply within the step's bound of the judge's timeouts"
