"""The GRPO update over trajectories that call the zoom tool, against the one-turn update on the same prompts, on the
shipped tiny Qwen2.5-VL (`data/models/shapes-tiny-qwen2_5_vl`, the demo's base: a character-level tokenizer, so the
tools' schema alone is ~750 prompt tokens). One step's forward and backward of the policy log-probs
(`completion_logprobs`, as the trainer's update calls it) over B prompts x G rows, side by side:

- one turn: each row the answer alone (what a run without tools trains on), or a text as many tokens long as a tool
  row (the turns' cost without their structure);
- tool rows, shared prefix: each row a call, the crop back as a tool-response turn, then the answer; the prompt
  prefilled once per group and the turns packed after it (`policy/packed.py`, `CompletionImages`);
- tool rows, whole rows: the same trajectories forwarded row by row, prompt included (the path before; what gradient
  checkpointing still takes).

The trajectories are the HF engine's own (`ToolRollout`), their turns scripted so every row has the same shape.
Median of `--repeats` after one warm-up. Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_tool_update.py
[--prompts 4] [--group 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tool_model.py: scripted engine turns

from tool_model import CALL, scripted  # noqa: E402

from vlgrpo.data.adapters import load_samples  # noqa: E402
from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.demo.run import BASES  # noqa: E402
from vlgrpo.policy import forward  # noqa: E402
from vlgrpo.policy.prompt import forbidden_mask, vocab_size  # noqa: E402
from vlgrpo.rollout.base import SamplingParams  # noqa: E402
from vlgrpo.rollout.hf import HFEngine  # noqa: E402
from vlgrpo.rollout.turns import ToolRollout  # noqa: E402
from vlgrpo.trainer.batch import attach_crops, make_batch  # noqa: E402
from vlgrpo.vision_cache import VisionCache  # noqa: E402

ANSWER = "<answer>red</answer>"


def batch_of(lm, samples, group: int, turns: list[list[str]], max_turns: int):
    """The trainer's batch of `samples` x `group` rows rolled out with scripted `turns` (the tools' prompts)."""
    model, processor = lm.model, lm.processor
    tok = processor.tokenizer
    cache = VisionCache(model, processor)
    engine = HFEngine(model, processor, cache, box_format="qwen2_5", decode=scripted(tok, turns))
    groups = ToolRollout(engine, ("zoom_in",), max_turns).generate(
        samples, SamplingParams(max_new_tokens=64, completions_per_prompt=group)
    )
    feats = cache.get_rows([p.sources for p in engine.build_prompts(samples)])
    forbidden = forbidden_mask(tok, vocab_size(model))
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    batch = make_batch(groups, feats, tok.pad_token_id, image_id, forbidden.nonzero().flatten().tolist())
    attach_crops(batch, groups, cache)
    return batch, feats, forbidden


def step_seconds(model, batch, feats, forbidden, repeats: int) -> float:
    """Median seconds of one forward + backward of the masked log-probs."""
    times = []
    for k in range(repeats + 1):
        model.zero_grad()
        t0 = time.perf_counter()
        logp = forward.completion_logprobs(model, batch.batch, feats, forbidden)
        (-(logp * batch.loss_mask).sum()).backward()
        if k:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from vlgrpo.models import load_model

    lm = load_model(str(BASES / "shapes-tiny-qwen2_5_vl"))
    lm.model.train()
    with tempfile.TemporaryDirectory() as tmp:
        synth_dataset(Path(tmp) / "shapes", 40, seed=0, image_size=112)
        samples = load_samples(Path(tmp) / "shapes" / "train.jsonl").samples[: args.prompts]
        one = batch_of(lm, samples, args.group, [[ANSWER]], 1)
        tool = batch_of(lm, samples, args.group, [[CALL.format(0, 0, 56, 56)], [ANSWER]], 2)
        length = int(tool[0].batch.completion_mask.sum(1).max())
        tok = lm.processor.tokenizer
        filler = "a" * max(0, length - len(tok(CALL.format(0, 0, 56, 56) + ANSWER)["input_ids"]) - 1)
        long = batch_of(lm, samples, args.group, [[CALL.format(0, 0, 56, 56) + filler + ANSWER]], 1)
        t_one = step_seconds(lm.model, *one, args.repeats)
        t_long = step_seconds(lm.model, *long, args.repeats)
        t_shared = step_seconds(lm.model, *tool, args.repeats)
        packed = forward.supports_text_decoder
        forward.supports_text_decoder = lambda m: False  # the whole-row path (as before the packed pass took crops)
        try:
            t_whole = step_seconds(lm.model, *tool, args.repeats)
        finally:
            forward.supports_text_decoder = packed
    b = tool[0].batch
    print(
        f"{args.prompts} prompts x {args.group} rows; prompt {b.prompt_ids.shape[1]} tokens; tool rows "
        f"{int(b.completion_mask.sum(1).max())} tokens ({int(b.tool_mask.sum(1).max())} of them the tool's), "
        f"one-turn rows {int(one[0].batch.completion_mask.sum(1).max())} (the answer) or "
        f"{int(long[0].batch.completion_mask.sum(1).max())} (text as long as a tool row)"
    )
    print(f"{'update (forward + backward)':36}{'s (median)':>12}{'x one turn':>12}{'x same length':>15}")
    rows = (
        ("one turn, the answer", t_one),
        ("one turn, as long as a tool row", t_long),
        ("tool rows, shared prefix", t_shared),
        ("tool rows, whole rows", t_whole),
    )
    for name, t in rows:
        print(f"{name:36}{t:>12.3f}{t / t_one:>12.2f}{t / t_long:>15.2f}")


if __name__ == "__main__":
    main()
