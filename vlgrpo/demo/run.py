"""`vlgrpo demo`: the tiny end-to-end run on the shapes task, from a pretrained base to a report, on a laptop CPU.

1. the base model: the shipped pretrained tiny Qwen2.5-VL (`data/models/shapes-tiny-qwen2_5_vl`, pretrained on
captions and instructions by dev/pretrain_tiny.py, as real RL starts from a pretrained VLM), or
`base="init-tiny"`: a random one of any registered arch (`arch`) built here (merger calibrated on the training
images, labels unused; the route the tests take), 2. synthesise shapes data, 3. a short SFT cold start on the demo's
answer format (think_answer: the think part lists the shapes the question is about, then the answer), 4. evaluate,
5. GRPO from the SFT model (vision tower frozen: its features are cached across every step), 6. evaluate again on the
held-out test split, 7. write report.md, curves.png and summary.json. Orchestration only: every step is a library
call, each stage's resolved config is saved in its run directory.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlgrpo.config import Config, load_config
from vlgrpo.models import ARCHS, detect_arch
from vlgrpo.tiny import TinySpec
from vlgrpo.types import InputError

BASES = Path(__file__).resolve().parents[2] / "data" / "models"
"""Where the shipped base models live (the repository's top-level data/models/)."""
INIT_TINY = "init-tiny"


@dataclass
class DemoSettings:
    """Sizes of the demo, chosen for a ≤10-minute budget on a 2-core CPU (345–450 s measured on one such machine,
    whose speed drifts by up to nearly 2× over a day: docs/demo-seeds.md)."""

    base: str = "shapes-tiny-qwen2_5_vl"  # a name under data/models/, a model directory, or "init-tiny"
    arch: str = "auto"  # the base's own (config.json); init-tiny builds this arch, auto: qwen2_5_vl
    n_samples: int = 6000  # the 10 % test split holds 150 questions of each kind
    image_size: int = 112  # the size the base was pretrained at: 16 image tokens per image
    kinds: tuple[str, ...] = ("count", "colour", "exist", "ground")
    """Question kinds of `vlgrpo data synth`: count, colour, exist, ground on one image; compare (two images), motion
    (a video of frame files) and zoom (a tiny shape's colour in a 4x larger image), answered in text (first / second,
    left / right, a colour) and scored by the VQA suite."""
    max_shapes: int = 3
    answer_format: str = "think_answer"  # the SFT target thinks by listing the shapes asked about (meta.reasoning)
    thinking: str = "auto"  # data.thinking: Qwen3.5's template opens <think> unless off (off: answer-only formats)
    sft_steps: int = 120  # a cold start until the format holds (0.99 of test completions on seed 0; 100: 0.67)
    sft_prompts: int = 16
    sft_lr: float = 1e-3
    grpo_steps: int = 250
    grpo_prompts: int = 16
    completions_per_prompt: int = 8  # G, rollout.completions_per_prompt
    grpo_lr: float = 1.5e-4  # at 3e-4 one seed of five collapsed its existence answers to "no" (docs/demo-seeds.md)
    grpo_beta: float = 0.02
    max_new_tokens: int = 56  # a bbox_2d JSON answer in its tags is 33 tokens, with a think part of 3 names 49
    eval_samples: int = 450  # per suite: VQA 150 of each kind, grounding every box question (150), POPE 450
    val_every: int = 50  # GRPO steps between greedy evals of 100 val questions (0: none)
    seed: int = 0
    calibration_images: int = 256  # init-tiny only
    merger_std: float = 0.05  # init-tiny only
    spec: TinySpec = field(default_factory=TinySpec)  # init-tiny only


def from_scratch(**changes) -> DemoSettings:
    """The demo before the pretrained base (a random 1.1 M-parameter model, colour questions on one-shape 56 px
    scenes, 300 SFT + 400 GRPO steps): what benchmarks/bench_async.py measures, and the from-scratch route."""
    fields = {
        "base": INIT_TINY,
        "n_samples": 3000,
        "image_size": 56,
        "kinds": ("colour",),
        "max_shapes": 1,
        "answer_format": "answer",
        "thinking": "off",  # an answer-only target: a template that would open <think> (Qwen3.5) closes it empty
        "sft_steps": 300,
        "grpo_steps": 400,
        "max_new_tokens": 24,
        "eval_samples": 200,
        "grpo_lr": 3e-4,
    }
    return DemoSettings(**{**fields, **changes})


ONE_IMAGE_KINDS = ("count", "colour", "exist", "ground")
"""The kinds asked about one image: POPE's probes are built from their scenes (compare, motion and zoom rows have
none)."""


def demo_suites(kinds: tuple[str, ...]) -> list[str]:
    """The eval suites of the demo's before/after report: VQA for every kind answered in text (count, colour, exist,
    compare, motion), grounding for ground, POPE when a one-image kind gives it scenes to probe."""
    one_image = set(kinds) & set(ONE_IMAGE_KINDS)
    return ["vqa"] * bool(set(kinds) - {"ground"}) + ["grounding"] * ("ground" in kinds) + ["pope"] * bool(one_image)


def video_settings(s: DemoSettings) -> list[str]:
    """data.video for a demo with motion videos: frames at the image size (`image_size`² px, as its images), not
    qwen-vl-utils' 128-token minimum, which would blow a 56 px frame up to 316 px (at least 128 tokens a frame
    instead of 4)."""
    return [f"data.video.max_pixels={s.image_size**2}"] if "motion" in s.kinds else []


def stage_config(s: DemoSettings, out: Path, stage: str, model_dir: Path, extra: tuple[str, ...] = ()) -> Config:
    """The run config of one demo stage ("sft" or "grpo") on `model_dir`, `extra` overrides last (benchmarks and
    tuning scripts build their variants of the demo with it)."""
    data = out / "data"
    common = [
        f"model.name_or_path={model_dir}",
        f"data.train={data / 'train.jsonl'}",
        f"data.val={data / 'val.jsonl'}",
        f"data.test={data / 'test.jsonl'}",
        f"data.answer_format={s.answer_format}",
        f"data.thinking={s.thinking}",
        f"train.seed={s.seed}",
        f"train.output_dir={out / stage}",
        "train.resume=false",
        "logging.progress_bar=true",
        *video_settings(s),
    ]
    if stage == "sft":  # vision tower and merger frozen: trained at this lr they collapse to one constant output
        return load_config(
            None,
            common
            + [
                "train.stage=sft",
                f"train.steps={s.sft_steps}",
                f"train.prompts_per_step={s.sft_prompts}",
                f"train.micro_batch_completions={s.sft_prompts}",
                f"train.lr={s.sft_lr}",
                "train.lr_schedule=constant",
                "train.warmup_steps=50",
                "model.freeze_vision=true",
                "model.freeze_merger=true",
                *extra,
            ],
        )
    return load_config(
        None,
        common
        + [
            f"train.steps={s.grpo_steps}",
            f"train.prompts_per_step={s.grpo_prompts}",
            f"rollout.completions_per_prompt={s.completions_per_prompt}",
            f"train.micro_batch_completions={s.grpo_prompts * s.completions_per_prompt}",
            f"train.lr={s.grpo_lr}",
            f"rollout.max_new_tokens={s.max_new_tokens}",
            f"reward.recipe={{accuracy: 1.0, format: 0.1{', iou: 1.0' * ('ground' in s.kinds)}}}",  # iou: box questions
            f"grpo.beta={s.grpo_beta}",  # small KL to the SFT policy: measured (grpo/kl) and keeps the policy near it
            f"eval.every_steps={s.val_every}",
            "eval.max_samples=100",  # the val-split curve of report.md
            f"eval.suites=[{'vqa' if set(s.kinds) - {'ground'} else 'grounding'}]",
            *extra,
        ],
    )


def evaluate_model(model_dir: Path, cfg: Config, test: Path, s: DemoSettings, suites: list[str]):
    """The demo's held-out eval of a checkpoint: `suites` on `test`, prompted and sampled as `cfg` trained it (its
    tools too, with `eval/tools/*` in the metrics)."""
    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.evals.run import build_eval_data, evaluate
    from vlgrpo.evals.suite import PopeOptions
    from vlgrpo.models import load_model
    from vlgrpo.policy.prompt import PromptSettings
    from vlgrpo.rewards import context_from_config
    from vlgrpo.rollout.build import build_engine
    from vlgrpo.vision_cache import VisionCache

    lm = load_model(str(model_dir))
    ctx = context_from_config(cfg, lm.arch, ProcessorGeometry.from_processor(lm.processor))
    probes = min(3, s.max_shapes)  # POPE asks about `probes` present + `probes` absent objects per image
    pope = PopeOptions(per_image=probes, min_objects=probes)
    data = build_eval_data(str(test), suites, max_samples=s.eval_samples, pope=pope, ctx=ctx)
    prompt = PromptSettings.from_config(cfg, ctx.box_format, lm.processor)
    engine = build_engine("hf", lm, VisionCache(lm.model, lm.processor), prompt, batch_prompts=32)  # as trained
    result = evaluate(engine, data, ctx, batch_prompts=32, max_new_tokens=s.max_new_tokens, progress=True)
    if prompt.tools:  # the multi-turn rollout's counts, named as the in-loop eval names them
        result.metrics |= {f"eval/{k}": v for k, v in engine.stats().items() if k.startswith("tools/")}
    return result


def resolve_base(base: str, arch: str = "auto") -> Path | None:
    """The base model directory for `DemoSettings.base`; None for "init-tiny" (built by the demo). An `arch` other
    than auto must be the base's own."""
    if base == INIT_TINY:
        return None
    for cand in (Path(base), BASES / base):
        if (cand / "config.json").is_file():
            _check_arch(cand, base, arch)
            return cand
    shipped = sorted(p.name for p in BASES.glob("*") if (p / "config.json").is_file()) if BASES.is_dir() else []
    raise InputError(
        f"--base {base!r}: no model directory there (no config.json) nor under {BASES}; accepted: a "
        f"model directory, {INIT_TINY!r}, or a shipped base: {', '.join(shipped) or 'none found'}"
    )


def _check_arch(model_dir: Path, base: str, arch: str) -> None:
    found = detect_arch(str(model_dir))
    if arch not in ("auto", found):
        raise InputError(
            f"--arch {arch} with --base {base}: that base is a {found} model; for a {arch} demo use "
            f"--base {INIT_TINY} (a random tiny {arch} built here) or a {arch} model directory"
        )


def _tiny_arch(s: DemoSettings) -> str:
    """The arch init-tiny builds for the demo."""
    return "qwen2_5_vl" if s.arch == "auto" else s.arch


def row_image_files(row: dict) -> list[str]:
    """Every image file of a written row: its image, its images, its video's frames (a list, or a mapping's
    `frames`)."""
    video = row.get("video")
    frames = video if isinstance(video, list) else (video or {}).get("frames") or []
    return [p for p in [row.get("image"), *(row.get("images") or []), *frames] if isinstance(p, str)]


def build_model_and_data(s: DemoSettings, out: Path, base: Path | None) -> tuple[Path, dict]:
    """Stages 1-2: the base model (`base` copied, or with None a random tiny one with its merger calibrated on the
    training images) and the shapes data."""
    from vlgrpo.data.synth import synth_dataset
    from vlgrpo.models import count_parameters, load_model
    from vlgrpo.tiny import calibrate_merger, init_tiny

    shutil.rmtree(out / "model", ignore_errors=True)
    if base is None:
        print(f"[1/6] building a random tiny {_tiny_arch(s)} in {out / 'model'}")
        model_dir = init_tiny(out / "model", _tiny_arch(s), spec=s.spec, seed=s.seed)
    else:
        print(f"[1/6] base model: {base} (pretrained; copied to {out / 'model'})")
        model_dir = Path(shutil.copytree(base, out / "model"))
    print(f"      {count_parameters(load_model(str(model_dir)).model)['total']:,} parameters")
    print(f"[2/6] synthesising {s.n_samples} shapes samples ({s.image_size} px) in {out / 'data'}")
    paths = synth_dataset(out / "data", s.n_samples, s.seed, s.image_size, s.kinds, s.max_shapes)
    if base is None:
        rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
        images = sorted({p for row in rows for p in row_image_files(row)})
        stats = calibrate_merger(model_dir, [out / "data" / p for p in images[: s.calibration_images]], s.merger_std)
        print(
            f"      merger calibrated on {min(len(images), s.calibration_images)} training images (labels unused): "
            f"feature std {stats['std_before']:.4f} -> {stats['std_after']:.4f}"
        )
    return model_dir, paths


def run_demo(out_dir: str | Path, settings: DemoSettings | None = None) -> dict:
    """Run every stage and return the summary (also written to out_dir/summary.json)."""
    from vlgrpo.evals.run import make_evaluator, write_outputs
    from vlgrpo.trainer import run_training
    from vlgrpo.trainer.export import export_run

    s = settings or DemoSettings()
    out, t0 = Path(out_dir), time.time()
    if s.arch != "auto" and s.arch not in ARCHS:
        raise InputError(f"--arch {s.arch!r}: accepted auto, {', '.join(ARCHS)}")
    base = resolve_base(s.base, s.arch)  # a wrong --base or --arch fails before anything in out_dir is replaced
    for stale in ("sft", "grpo", "sft_model", "grpo_model", "eval_sft", "eval_grpo"):
        shutil.rmtree(out / stale, ignore_errors=True)  # the demo owns its directory
    model_dir, paths = build_model_and_data(s, out, base)
    suites = demo_suites(s.kinds)

    print(f"[3/6] SFT cold start: {s.sft_steps} steps x {s.sft_prompts} samples")
    sft_cfg = stage_config(s, out, "sft", model_dir)
    sft_history = run_training(sft_cfg)
    export_run(out / "sft", out / "sft_model")
    print("[4/6] evaluating the SFT model on the held-out test split")
    before = evaluate_model(out / "sft_model", sft_cfg, paths["test"], s, suites)
    write_outputs(before, out / "eval_sft")

    print(f"[5/6] GRPO: {s.grpo_steps} steps x {s.grpo_prompts} prompts x {s.completions_per_prompt} completions")
    grpo_cfg = stage_config(s, out, "grpo", out / "sft_model")
    grpo_history = run_training(grpo_cfg, evaluator=make_evaluator(grpo_cfg) if s.val_every else None)
    export_run(out / "grpo", out / "grpo_model")
    print("[6/6] evaluating the GRPO model on the held-out test split")
    after = evaluate_model(out / "grpo_model", grpo_cfg, paths["test"], s, suites)
    write_outputs(after, out / "eval_grpo")

    summary = _summary(s, detect_arch(str(model_dir)), before.metrics, after.metrics, grpo_history, time.time() - t0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    from vlgrpo.demo.report import write_report

    write_report(out, summary, sft_history, grpo_history, before.metrics, after.metrics)
    print(
        f"done in {summary['wall_seconds']:.0f} s: test accuracy {summary['sft_test_accuracy']} (SFT) -> "
        f"{summary['grpo_test_accuracy']} (GRPO); report: {out / 'report.md'}"
    )
    return summary


COLLAPSE_WINDOW = 50
"""GRPO steps over which the summary's collapse indicators (entropy, KL, response length) are averaged."""


def _summary(s: DemoSettings, arch: str, before: dict, after: dict, grpo_history: list[dict], seconds: float) -> dict:
    def mean(rows: list[dict], key: str) -> float:
        vals = [h[key] for h in rows if isinstance(h.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else 0.0

    last = grpo_history[-COLLAPSE_WINDOW:]
    return {
        "sft_test_accuracy": before.get("eval/vqa/accuracy"),  # None: only `ground` questions in the kinds
        "grpo_test_accuracy": after.get("eval/vqa/accuracy"),
        "sft_grounding_acc50": before.get("eval/grounding/acc50"),  # None: no `ground` questions in the kinds
        "grpo_grounding_acc50": after.get("eval/grounding/acc50"),
        "sft_pope_f1": before.get("eval/pope/f1"),
        "grpo_pope_f1": after.get("eval/pope/f1"),
        "sft_pope_yes_ratio": before.get("eval/pope/yes_ratio"),
        "grpo_pope_yes_ratio": after.get("eval/pope/yes_ratio"),
        **{
            f"{stage}_accuracy_{kind}": metrics.get(f"eval/vqa/accuracy_task_shapes/{kind}")
            for stage, metrics in (("sft", before), ("grpo", after))
            for kind in s.kinds
            if kind != "ground"
        },
        "base": s.base,
        "arch": arch,
        "seed": s.seed,
        "kinds": list(s.kinds),
        "steps": {"sft": s.sft_steps, "grpo": s.grpo_steps},
        "final_grpo_entropy": mean(last, "grpo/entropy"),  # the collapse indicators: last COLLAPSE_WINDOW steps
        "final_grpo_kl": mean(last, "grpo/kl"),
        "final_response_length": mean(last, "grpo/response_length"),
        "initial_response_length": mean(grpo_history[:5], "grpo/response_length"),  # sampled by the SFT policy
        "collapse_window": len(last),
        "wall_seconds": round(seconds, 1),
        "sft": {k: v for k, v in before.items()},
        "grpo": {k: v for k, v in after.items()},
    }
