"""#50 item 10: does the zoom tool help on the synth `zoom` kind? The demo's pipeline from the shipped tiny base, run
twice with the same data, seeds and steps: without the tool (SFT on the answer, GRPO on one-turn answers) and with it
(`rollout.tools=[zoom_in] rollout.max_turns=2`: SFT on gold trajectories that zoom into the target's region,
`trainer/sft.py`; GRPO on two-turn rollouts). Both rewarded by accuracy alone. Each arm is evaluated greedily on the
held-out test split after SFT and after GRPO, with the tool where it trained with it: VQA accuracy, calls per sample,
mean crop area (share of the image). Results and their reading: dev/LOG.md.

Usage: OMP_NUM_THREADS=1 .venv/bin/python dev/zoom_tool.py OUT [--arms plain,tool] [--sft-steps 100]
       [--grpo-steps 30] [--grpo-prompts 4] [--reuse-sft]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from vlgrpo.demo.run import DemoSettings, build_model_and_data, resolve_base, stage_config
from vlgrpo.trainer import run_training
from vlgrpo.trainer.export import export_run

TOOL = ("rollout.tools=[zoom_in]", "rollout.max_turns=2")
COMMON = ("data.max_prompt_length=1500", "reward.recipe={accuracy: 1.0}")


def evaluate_arm(model_dir: Path, cfg, test: Path, s: DemoSettings, tools: bool) -> dict:
    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.evals.run import build_eval_data, evaluate
    from vlgrpo.models import load_model
    from vlgrpo.rewards import context_from_config
    from vlgrpo.rollout.hf import HFEngine
    from vlgrpo.rollout.turns import ToolRollout
    from vlgrpo.vision_cache import VisionCache

    lm = load_model(str(model_dir))
    ctx = context_from_config(cfg, lm.arch, ProcessorGeometry.from_processor(lm.processor))
    data = build_eval_data(str(test), ["vqa"], max_samples=s.eval_samples, ctx=ctx)
    engine = HFEngine(
        lm.model, lm.processor, VisionCache(lm.model, lm.processor), cfg.data.answer_format, ctx.box_format
    )
    decoder = ToolRollout(engine, ("zoom_in",), 2) if tools else engine
    result = evaluate(decoder, data, ctx, batch_prompts=32, max_new_tokens=s.max_new_tokens, progress=True)
    out = {"accuracy": result.metrics["eval/vqa/accuracy"]}
    if tools:
        stats = decoder.stats()
        out |= {k: stats[k] for k in ("tools/calls_per_sample", "tools/crop_area", "tools/errors", "tools/turns")}
    return out


def run_arm(arm: str, out: Path, s: DemoSettings, model_dir: Path, test: Path, reuse_sft: bool = False) -> dict:
    """One arm: SFT (or its saved model with `reuse_sft`), eval, GRPO, eval."""
    extra = (*COMMON, *(TOOL if arm == "tool" else ()))
    t0, root = time.time(), out / arm
    sft = stage_config(s, out, "sft", model_dir, (*extra, f"train.output_dir={root / 'sft'}"))
    if not (reuse_sft and (root / "sft_model" / "config.json").is_file()):
        run_training(sft)
        export_run(root / "sft", root / "sft_model")
    before = evaluate_arm(root / "sft_model", sft, test, s, arm == "tool")
    for stale in ("grpo", "grpo_model"):  # an earlier run's GRPO stage: this arm owns its directory
        shutil.rmtree(root / stale, ignore_errors=True)
    grpo = stage_config(s, out, "grpo", root / "sft_model", (*extra, f"train.output_dir={root / 'grpo'}"))
    history = run_training(grpo)
    export_run(root / "grpo", root / "grpo_model")
    after = evaluate_arm(root / "grpo_model", grpo, test, s, arm == "tool")
    keys = ("reward/total", "tools/calls_per_sample", "tools/crop_area", "timing/step")
    curve = {k: [round(h[k], 3) for h in history[:: max(1, len(history) // 10)] if k in h] for k in keys}
    return {"arm": arm, "sft": before, "grpo": after, "curve": curve, "wall_s": round(time.time() - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--arms", default="plain,tool")
    ap.add_argument("--samples", type=int, default=1500)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--grpo-steps", type=int, default=30)
    ap.add_argument("--grpo-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse-sft", action="store_true", help="an arm's SFT model saved in OUT by an earlier run")
    args = ap.parse_args()
    s = DemoSettings(
        kinds=("zoom",),
        n_samples=args.samples,
        answer_format="answer",
        sft_steps=args.sft_steps,
        grpo_steps=args.grpo_steps,
        grpo_prompts=args.grpo_prompts,
        max_new_tokens=args.max_new_tokens,
        eval_samples=150,
        val_every=0,
        seed=args.seed,
    )
    out = Path(args.out)
    if args.reuse_sft and (out / "model" / "config.json").is_file():  # the same base and data as that run
        model_dir, paths = out / "model", {k: out / "data" / f"{k}.jsonl" for k in ("train", "val", "test")}
    else:
        model_dir, paths = build_model_and_data(s, out, resolve_base(s.base))
    for arm in args.arms.split(","):
        result = run_arm(arm, out, s, model_dir, paths["test"], args.reuse_sft)
        print(json.dumps(result, indent=1), flush=True)
        (out / f"{arm}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
