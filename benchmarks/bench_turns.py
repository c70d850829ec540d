"""Multi-turn rollouts with the zoom-in tool on the HF engine, each trajectory's state kept from turn to turn
against every turn's prompt prefilled whole (`ToolRollout(reuse_turns=...)`), on the tiny Qwen2.5-VL taught to call
the tool (`tests/tool_model.py`), or the tiny Qwen3.5 (`--arch qwen3_5`: its Gated DeltaNet states kept with the
attention KV): the same trajectories (checked), side by side per rollout: prefill tokens, decode tokens,
vision-encoder calls (a fresh vision cache per rollout: the prompts' images and each distinct crop) and wall time
(median of `--repeats`).

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_turns.py [--arch qwen2_5_vl] [--prompts 8] [--group 4]
       [--turns 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tool_model.py: the taught tiny model

from tool_model import teach_tool_call  # noqa: E402

from vlgrpo.data.adapters import load_samples  # noqa: E402
from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.models import load_model  # noqa: E402
from vlgrpo.rollout.base import SamplingParams  # noqa: E402
from vlgrpo.rollout.hf import HFEngine  # noqa: E402
from vlgrpo.rollout.turns import ToolRollout  # noqa: E402
from vlgrpo.tiny import init_tiny  # noqa: E402
from vlgrpo.vision_cache import VisionCache  # noqa: E402

TEACH = {"qwen2_5_vl": dict(steps=90, lr=1.5e-3), "qwen3_5": dict(steps=60, lr=3e-3)}
"""Teacher-forcing that makes each tiny model call the tool (the tests' settings)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="qwen2_5_vl", choices=sorted(TEACH))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        synth_dataset(Path(tmp) / "shapes", 40, seed=0, image_size=112)
        samples = load_samples(Path(tmp) / "shapes" / "train.jsonl").samples[: args.prompts]
        lm = load_model(init_tiny(Path(tmp) / "tiny", args.arch, seed=0))
        run(args, samples, lm)


def run(args, samples, lm) -> None:
    losses = teach_tool_call(lm.model, lm.processor, samples[:1], **TEACH[args.arch])
    print(f"taught to call the tool: loss {losses[0]:.2f} -> {losses[-1]:.3f}")
    model, processor = lm.model.eval(), lm.processor
    params = SamplingParams(
        completions_per_prompt=args.group, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0
    )
    rows, outputs = {}, {}
    for reuse in (False, True):
        times = []
        for _ in range(args.repeats):
            engine = HFEngine(model, processor, VisionCache(model, processor), box_format="plain", batch_prompts=64)
            tools = ToolRollout(engine, ("zoom_in",), args.turns, reuse_turns=reuse)
            t0 = time.perf_counter()
            outputs[reuse] = tools.generate(samples, params)
            times.append(time.perf_counter() - t0)
            stats = tools.stats()
        rows[reuse] = (stats, statistics.median(times))
    pairs = [(a, b) for ga, gb in zip(outputs[False], outputs[True]) for a, b in zip(ga.completions, gb.completions)]
    same = all(a.token_ids == b.token_ids for a, b in pairs)
    gap = max((abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs) if not math.isnan(x)), default=0)
    (whole, t_whole), (kept, t_kept) = rows[False], rows[True]
    print(
        f"\n{args.prompts} prompts x {args.group} completions, up to {args.turns} turns, "
        f"{whole['tools/calls_per_sample']:.2f} calls per sample, {whole['tools/turns']:.2f} turns per sample"
    )
    print(f"{'':28}{'prefilled whole':>18}{'KV kept':>12}")
    for key in ("rollout/prefill_tokens", "rollout/decode_tokens", "rollout/encoder_calls"):
        print(f"{key:28}{whole[key]:>18,.0f}{kept[key]:>12,.0f}")
    print(f"{'wall s (median)':28}{t_whole:>18.2f}{t_kept:>12.2f}")
    print(f"same tokens: {same}; largest log-prob difference {gap:.1e}")


if __name__ == "__main__":
    main()
