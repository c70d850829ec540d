"""What a judge reward adds to a step, measured against a real model server: vLLM's OpenAI-compatible server (the CPU
build) serving a tiny Qwen2.5-VL, replies constrained to yes/no (structured outputs), started here unless
`--base-url` names one.

1. Tiny GRPO runs (2 prompts x 4 completions, `--steps` steps, the same seed) side by side: a recipe without the
   judge against the same recipe plus `judge`: the reward phase per step (`timing/reward`, median) and the judge's
   own figures (requests, cache hits, mean request latency, the time the step waited for the judge after the other
   components).
2. One step's batch scored three ways: the judge with an empty cache, the same batch again (every verdict from the
   cache) and with the cache off (reward.judge.cache_size=0): wall time of `score()`, requests sent.

Usage: .venv-vllm/bin/python benchmarks/bench_judge.py [--steps 4] [--base-url URL --model NAME]
Run it in the vLLM environment (make test-vllm builds it) when it starts the server itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from vlgrpo.config import load_config
from vlgrpo.config.judge import JudgeConfig
from vlgrpo.data.synth import synth_dataset
from vlgrpo.rewards import RewardContext, score
from vlgrpo.rewards.judge import Judge
from vlgrpo.tiny import init_tiny
from vlgrpo.trainer import run_training

CHOICE = {"structured_outputs": {"choice": ["yes", "no"]}}
LENGTH = "def length(completion):\n    return len(completion) / 10.0\n"


def serve(model_dir: Path, port: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--port", str(port)]
    cmd += ["--served-model-name", "tiny-judge", "--host", "127.0.0.1", "--enforce-eager", "--max-model-len", "2048"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2)
            print(f"vllm serve up in {time.monotonic() - t0:.0f} s at {url}")
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() - t0 > 300:
                raise SystemExit(
                    "vllm serve did not start (run this in the vLLM environment, or pass --base-url)"
                ) from None
            time.sleep(2)


def train(tmp: Path, model_dir: Path, data: Path, recipe: str, judge: list[str], steps: int, tag: str) -> list[dict]:
    cfg = load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.train={data / 'train.jsonl'}",
            "data.answer_format=answer",
            "rollout.completions_per_prompt=4",
            "rollout.max_new_tokens=8",
            "train.prompts_per_step=2",
            "train.micro_batch_completions=4",
            f"train.steps={steps}",
            f"train.output_dir={tmp / tag}",
            "logging.progress_bar=false",
            f"reward.recipe={recipe}",
            *judge,
        ],
    )
    return run_training(cfg, progress=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--base-url", help="a judge server already running (default: start vllm serve of a tiny model)")
    p.add_argument("--model", default="tiny-judge", help="its served model name")
    p.add_argument("--port", type=int, default=8432)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = init_tiny(tmp / "tiny", "qwen2_5_vl", seed=0)
        synth_dataset(tmp / "data", n=40, seed=0)
        data = tmp / "data"
        proc, url = (None, args.base_url) if args.base_url else serve(model_dir, args.port)
        try:
            (tmp / "length.py").write_text(LENGTH)
            length = f"'{tmp / 'length.py'}:length'"
            judge = [
                f"reward.judge.base_url={url}",
                f"reward.judge.model={args.model}",
                f"reward.judge.extra_body={CHOICE}",
            ]
            plain = train(tmp, model_dir, data, f"{{{length}: 1.0}}", [], args.steps, "plain")
            judged = train(tmp, model_dir, data, f"{{judge: 1.0, {length}: 1.0}}", judge, args.steps, "judged")
            report_runs(plain, judged)
            report_cache(url, args.model, data)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def report_runs(plain: list[dict], judged: list[dict]) -> None:
    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print(f"\n{'per step (median)':<34} {'no judge':>10} {'with judge':>11}")
    print(f"{'timing/reward (s)':<34} {med(plain, 'timing/reward'):>10.4f} {med(judged, 'timing/reward'):>11.4f}")
    print(f"{'timing/step (s)':<34} {med(plain, 'timing/step'):>10.3f} {med(judged, 'timing/step'):>11.3f}")
    for key in ("judge_requests", "judge_cache_hits", "judge_latency_s", "judge_wait_s", "judge_failures"):
        print(f"{'reward/' + key:<34} {'':>10} {med(judged, 'reward/' + key):>11.4f}")


def report_cache(url: str, model: str, data: Path) -> None:
    from vlgrpo.data.adapters import load_samples

    samples = load_samples(data / "train.jsonl").samples[:2]
    answers = ["red", "blue", "green", "a circle", "3", "two", "yes", "the square"]
    completions = [f"<answer>{a}</answer>" for a in answers for _ in range(2)]  # 8 distinct answers, each twice
    rows = [samples[(i // 2) % 2] for i in range(len(completions))]  # a repeat asks the same question

    def timed(ctx) -> tuple[float, float]:
        t0 = time.perf_counter()
        batch = score(completions, rows, {"judge": 1.0, "format": 0.5}, ctx)
        return time.perf_counter() - t0, batch.extra["reward/judge_requests"]

    print(f"\n{'one step of 16 completions':<34} {'score() s':>10} {'requests':>9}")
    for cache_size in (100_000, 0):
        settings = JudgeConfig(base_url=url, model=model, extra_body=CHOICE, cache_size=cache_size)
        ctx = RewardContext(answer_format="answer", judge=Judge(settings))
        for what in ("empty cache", "again"):
            seconds, requests = timed(ctx)
            label = f"cache {'on' if cache_size else 'off'}, {what}"
            print(f"{label:<34} {seconds:>10.4f} {requests:>9.0f}")
    no_judge = time.perf_counter()
    score(completions, rows, {"format": 0.5}, RewardContext(answer_format="answer"))
    print(f"{'no judge (format only)':<34} {time.perf_counter() - no_judge:>10.4f} {0:>9}")


if __name__ == "__main__":
    main()
