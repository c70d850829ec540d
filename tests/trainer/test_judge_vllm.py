"""The judge reward against a real model server: vLLM's OpenAI-compatible server (the CPU build, `make test-vllm`)
serving a tiny Qwen2.5-VL, started by the test as a subprocess. Its replies are constrained to yes/no with vLLM's
structured outputs (reward.judge.extra_body), so the random tiny model gives verdicts the parser reads: a GRPO run
whose recipe includes `judge` scores through it, a verdict equals the server's own reply to the same request, a
repeated answer comes from the cache, and the image reaches the judge (send_image)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.config.judge import JudgeConfig
from vlgrpo.rewards import RewardContext, score
from vlgrpo.rewards.judge import Judge
from vlgrpo.trainer import run_training

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

PORT = 8431
CHOICE = {"structured_outputs": {"choice": ["yes", "no"]}}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """`vllm serve` of the tiny model on 127.0.0.1:PORT as `tiny-judge`; stopped after the module."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_dir("qwen2_5_vl")]
    cmd += ["--served-model-name", "tiny-judge", "--host", "127.0.0.1", "--port", str(PORT), "--enforce-eager"]
    cmd += ["--max-model-len", "2048", "--limit-mm-per-prompt", '{"image": 1, "video": 0}']
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{PORT}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail(f"vllm serve did not start: {proc.stderr.read()[-3000:]}")
                time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _judge(url: str, **settings) -> Judge:
    return Judge(JudgeConfig(base_url=url, model="tiny-judge", extra_body=CHOICE, timeout_s=60, **settings))


def test_a_verdict_is_the_servers_reply_and_repeats_come_from_the_cache(server, samples):
    judge = _judge(server, send_image=True)
    ctx = RewardContext(answer_format="answer", judge=judge)
    sample = samples[0]
    completions = ["<answer>red</answer>", "<answer>2</answer>", "<answer>red</answer>"]
    batch = score(completions, [sample] * 3, {"judge": 1.0}, ctx)
    assert batch.extra["reward/judge_failures"] == 0 and batch.extra["reward/judge_requests"] == 2
    assert [v.reply for v in batch.verdicts][0] in ("yes", "no") and batch.verdicts[2].cached
    body = json.dumps(judge.body(completions[1], sample, ctx.answer_fallback)).encode()
    assert body.count(b"data:image/png;base64,") == 1  # the image went with the question
    request = urllib.request.Request(f"{server}/chat/completions", body, {"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]["message"]["content"]
    assert batch.verdicts[1].reply == reply and batch.components["judge"][1] == float(reply == "yes")
    again = score(completions, [sample] * 3, {"judge": 1.0}, ctx)
    assert again.components == batch.components and again.extra["reward/judge_requests"] == 0


def test_grpo_steps_score_through_vllm_serve(server, tmp_path, tiny_model_dir, shapes_dir):
    length = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir("qwen2_5_vl"),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{judge: 1.0, '{length}': 0.1}}",
        f"reward.judge.base_url={server}",
        "reward.judge.model=tiny-judge",
        f"reward.judge.extra_body={CHOICE}",
    )
    history = run_training(cfg, progress=False)
    for h in history:
        assert h["reward/judge_failures"] == 0 and h["reward/judge_requests"] + h["reward/judge_cache_hits"] == 8
        assert h["reward/judge"] in {k / 8 for k in range(9)}  # eight 0/1 verdicts
        print(
            f"step {h['step']}: judge {h['reward/judge']:.3f}, {h['reward/judge_requests']:.0f} requests, "
            f"latency {h['reward/judge_latency_s']:.3f} s, wait {h['reward/judge_wait_s']:.3f} s"
        )
