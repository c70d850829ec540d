"""`vlgrpo demo --tools`: thinking with images on a CPU, two arms from the same base, data, steps and seed.

The synth `zoom` kind (`data/synth.py`: the colour of a small shape in a named cell of an 896 px image, which the tiny
base's processor squeezes 4x) is answered by

- the tool arm: SFT cold start on gold trajectories (a zoom-in call on the named cell, the tool's crop, the answer:
  `train.stage=sft` with `rollout.tools=[zoom_in]`), then GRPO on two-turn rollouts with the zoom tool;
- the plain arm: SFT on the answer, then GRPO on one-turn answers.

Both are rewarded by accuracy alone and evaluated greedily on the held-out test split after SFT and after GRPO, the
tool arm with its tool: accuracy, calls per sample, tool errors, and the share of crops that hold the asked-about shape
(`crop_hits`). report.md gives both arms side by side and three trajectories with their crops. Orchestration only, as
`demo/run.py`, whose stage configs and base resolution it shares.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from vlgrpo.demo.run import DemoSettings, build_model_and_data, resolve_base, stage_config

TOOL_SETTINGS = ("rollout.tools=[zoom_in]", "rollout.max_turns=2")
ARMS = ("tool", "plain")


@dataclass
class ToolDemoSettings:
    """Sizes of the tool demo: both arms took 1,100 s on a 2-core CPU shared with other jobs (the tool arm's GRPO
    steps 13 s each, its SFT steps ~2 s: ~900-token prompts); figures and their reading in
    docs/thinking-with-images.md."""

    base: str = "shapes-tiny-qwen2_5_vl"
    n_samples: int = 1200  # 960 train, 120 test rows
    image_size: int = 112  # cells of 224 px: an 896 px image
    sft_steps: int = 120  # 60 left the call unlearnt (loss 1.0)
    sft_prompts: int = 16
    sft_lr: float = 1e-3
    grpo_steps: int = 40
    grpo_prompts: int = 8  # 4: seed 1 gained 7.5 points, seed 0 lost 15 (dev/LOG.md)
    completions_per_prompt: int = 8
    grpo_lr: float = 2e-4  # 3e-4 and 5e-4 collapsed to no call and no answer within 10 steps (dev/LOG.md)
    grpo_beta: float = 0.05  # KL to the SFT policy: without it one seed of three lost its calls' form (dev/LOG.md)
    temperature: float = 0.7  # at 1.0 sampled calls break their JSON (issue 59's probes: 7-18 of 32 malformed)
    max_new_tokens: int = 100  # a call on a cell is 84 tokens of the base's character-level tokenizer
    eval_samples: int = 120
    seed: int = 0

    def demo(self) -> DemoSettings:
        """The shared stage settings (`demo.run.stage_config`)."""
        return DemoSettings(
            base=self.base,
            n_samples=self.n_samples,
            image_size=self.image_size,
            kinds=("zoom",),
            answer_format="answer",
            thinking="off",
            sft_steps=self.sft_steps,
            sft_prompts=self.sft_prompts,
            sft_lr=self.sft_lr,
            grpo_steps=self.grpo_steps,
            grpo_prompts=self.grpo_prompts,
            completions_per_prompt=self.completions_per_prompt,
            grpo_lr=self.grpo_lr,
            grpo_beta=self.grpo_beta,
            max_new_tokens=self.max_new_tokens,
            eval_samples=self.eval_samples,
            val_every=0,
            seed=self.seed,
        )


def arm_overrides(arm: str, s: ToolDemoSettings, root: Path, stage: str) -> tuple[str, ...]:
    """The config overrides of one arm's stage: the tool (tool arm), accuracy as the only reward, the sampling
    temperature, and the arm's own run directory."""
    return (
        *(TOOL_SETTINGS if arm == "tool" else ()),
        "data.max_prompt_length=1200",  # the tools' schema is ~750 tokens of the base's tokenizer
        "reward.recipe={accuracy: 1.0}",
        f"rollout.temperature={s.temperature}",
        f"train.output_dir={root / stage}",
    )


def crop_hits(samples, texts: list[str], box_format: str, geometry) -> tuple[int, int]:
    """(calls whose crop holds the sample's `meta.target` box whole, calls that crop) over the first zoom call of
    each completion text, its box read as the tool reads it (`tools/zoom.crop_box`)."""
    from vlgrpo.rollout.tools.calls import ToolCallError, first_tool_call
    from vlgrpo.rollout.tools.zoom import ZoomError, crop_box

    hits = total = 0
    for s, text in zip(samples, texts):
        call, target = first_tool_call(text), (s.meta or {}).get("target")
        if call is None or isinstance(call, ToolCallError) or not target or not s.image_size:
            continue
        box = call.arguments.get("bbox_2d")
        try:
            x1, y1, x2, y2 = crop_box(tuple(float(v) for v in box), box_format, s.image_size, geometry)
        except (ZoomError, TypeError, ValueError):
            continue
        total += 1
        hits += x1 <= target[0] and y1 <= target[1] and target[2] <= x2 and target[3] <= y2
    return hits, total


def evaluate_arm(model_dir: Path, cfg, test: Path, s: ToolDemoSettings) -> dict:
    """Greedy accuracy on the test split (`demo.run.evaluate_model`: prompted and decoded as `cfg` trains, its tools
    included), the tool arm's counts and its `crop_hits`, and the eval result (predictions, crops) for the report."""
    from vlgrpo.data.adapters import load_samples
    from vlgrpo.data.images import checkpoint_geometry
    from vlgrpo.demo.run import evaluate_model

    result = evaluate_model(model_dir, cfg, test, s.demo(), ["vqa"])
    metrics = result.metrics
    out = {"accuracy": metrics["eval/vqa/accuracy"]}
    if "eval/tools/calls_per_sample" in metrics:
        out |= {k: metrics[f"eval/tools/{k}"] for k in ("calls_per_sample", "errors", "crop_area")}
        texts = {row["id"]: row["completion"] for row in result.predictions}
        samples = [x for x in load_samples(test).samples if x.id in texts]
        geometry, _ = checkpoint_geometry(str(model_dir))
        hits, total = crop_hits(samples, [texts[x.id] for x in samples], result.info["box_format"], geometry)
        out["crop_hits"] = hits / total if total else 0.0
    return out | {"result": result}


def run_arm(arm: str, out: Path, s: ToolDemoSettings, model_dir: Path, test: Path) -> dict:
    """One arm: SFT, eval, GRPO, eval -> {"sft": ..., "grpo": ..., "history": GRPO metrics, "seconds": ...}."""
    from vlgrpo.evals.run import write_outputs
    from vlgrpo.trainer import run_training
    from vlgrpo.trainer.export import export_run

    d, root, t0 = s.demo(), out / arm, time.time()
    for stale in ("sft", "sft_model", "grpo", "grpo_model"):
        shutil.rmtree(root / stale, ignore_errors=True)
    what = "gold trajectories (call, crop, answer)" if arm == "tool" else "the answer"
    print(f"[{arm}] SFT on {what}: {s.sft_steps} steps x {s.sft_prompts} rows")
    sft = stage_config(d, out, "sft", model_dir, arm_overrides(arm, s, root, "sft"))
    run_training(sft)
    export_run(root / "sft", root / "sft_model")
    before = evaluate_arm(root / "sft_model", sft, test, s)
    write_outputs(before.pop("result"), root / "eval_sft")
    print(f"[{arm}] GRPO: {s.grpo_steps} steps x {s.grpo_prompts} prompts x {s.completions_per_prompt}")
    grpo = stage_config(d, out, "grpo", root / "sft_model", arm_overrides(arm, s, root, "grpo"))
    history = run_training(grpo)
    export_run(root / "grpo", root / "grpo_model")
    after = evaluate_arm(root / "grpo_model", grpo, test, s)
    write_outputs(after.pop("result"), root / "eval_grpo")
    print(f"[{arm}] test accuracy {before['accuracy']:.3f} (SFT) -> {after['accuracy']:.3f} (GRPO)")
    return {"sft": before, "grpo": after, "history": history, "seconds": round(time.time() - t0, 1)}


def run_tool_demo(out_dir: str | Path, settings: ToolDemoSettings | None = None, arms=ARMS) -> dict:
    """Both arms on one base and dataset -> the summary (also out_dir/summary.json); report.md beside it."""
    s = settings or ToolDemoSettings()
    out, t0 = Path(out_dir), time.time()
    base = resolve_base(s.base)
    model_dir, paths = build_model_and_data(s.demo(), out, base)
    results = {arm: run_arm(arm, out, s, model_dir, paths["test"]) for arm in arms}
    summary = {
        "seed": s.seed,
        "settings": vars(s),
        **{f"{arm}_{stage}": r[stage] for arm, r in results.items() for stage in ("sft", "grpo")},
        "grpo_seconds_per_step": {
            arm: round(sum(h.get("timing/step", 0.0) for h in r["history"]) / max(len(r["history"]), 1), 2)
            for arm, r in results.items()
        },
        "wall_seconds": round(time.time() - t0, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    from vlgrpo.demo.report import write_tool_report

    write_tool_report(out, summary)
    print(f"done in {summary['wall_seconds']:.0f} s; report: {out / 'report.md'}")
    return summary
