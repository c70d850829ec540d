"""`vlgrpo` command line: thin argparse wrappers over library functions (the top layer; nothing imports it).

Each command group lives in one `add_<group>_command(sub)` function that registers its parser and handler: train,
eval and demo here; `data ...` in cli/data.py, `plan` in cli/plan.py, cache, model, reward and export in cli/tools.py.
Heavy imports (torch, transformers) happen inside the handlers so `vlgrpo --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys

from vlgrpo.cli.data import add_data_command
from vlgrpo.cli.plan import add_plan_command
from vlgrpo.cli.tools import (
    ARCHS,
    BOX_FORMATS,
    add_cache_command,
    add_export_command,
    add_model_command,
    add_reward_command,
)
from vlgrpo.config import CHOICES, EVAL_SUITES
from vlgrpo.registry import TOOL


def _emit(obj, as_json: bool, formatter) -> int:
    """Print a command's result as JSON (--json) or as its readable table."""
    print(json.dumps(obj, indent=2, default=str) if as_json else formatter(obj))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlgrpo", description="GRPO for Qwen-VL-style vision-language models")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # One line per command group; keep alphabetical.
    add_cache_command(sub)
    add_data_command(sub)
    add_demo_command(sub)
    add_eval_command(sub)
    add_export_command(sub)
    add_model_command(sub)
    add_plan_command(sub)
    add_reward_command(sub)
    add_train_command(sub)
    return parser


def add_demo_command(sub) -> None:
    p = sub.add_parser("demo", help="tiny end-to-end run on the shapes task: SFT, GRPO, eval, report (CPU, minutes)")
    p.add_argument("--out", help="run directory (default runs/demo, with --tools runs/demo-tools)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--base",
        help="base model: a shipped one under data/models/ (default shapes-tiny-qwen2_5_vl, "
        "caption-pretrained), a model directory, or init-tiny (random, built here)",
    )
    p.add_argument(
        "--arch",
        choices=ARCHS,
        help="the model family: init-tiny builds this one (default qwen2_5_vl); "
        "with another base it must be the base's own",
    )
    p.add_argument("--n", type=int, help="shapes samples to synthesise")
    p.add_argument("--sft-steps", type=int)
    p.add_argument("--grpo-steps", type=int)
    p.add_argument("--eval-samples", type=int, help="test samples per eval suite")
    p.add_argument(
        "--kinds",
        help="question kinds, comma-separated, of count,colour,exist,ground (default: all four), "
        "compare (two images), motion (a video), zoom (a tiny shape in a 4x image)",
    )
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="start from vlgrpo.demo.run.from_scratch(): a random tiny "
        "model, one-shape 56 px colour scenes, 300 SFT + 400 GRPO steps (other flags change them)",
    )
    p.add_argument("--max-shapes", type=int, help="shapes per image, 1..N (default 3)")
    p.add_argument("--image-size", type=int, help="image side in px (default 112, the base's pretraining size)")
    p.add_argument(
        "--tools",
        action="store_true",
        help="thinking with images (vlgrpo.demo.tools): the synth zoom task with the zoom-in tool and without it, "
        "same base, data, steps and seed, both arms reported side by side (15-20 min on 2 cores); takes --out, --seed, "
        "--base, --n, --sft-steps, --grpo-steps, --eval-samples",
    )
    p.set_defaults(handler=_cmd_demo)


def _cmd_demo(args) -> int:
    import dataclasses

    from vlgrpo.demo.run import DemoSettings, from_scratch, run_demo
    from vlgrpo.types import InputError

    given = {
        "n_samples": args.n,
        "sft_steps": args.sft_steps,
        "grpo_steps": args.grpo_steps,
        "eval_samples": args.eval_samples,
        "seed": args.seed,
        "base": args.base,
    }
    if args.tools:
        from vlgrpo.demo.tools import ToolDemoSettings, run_tool_demo

        others = [f for f in ("kinds", "from_scratch", "max_shapes", "image_size", "arch") if getattr(args, f)]
        if others:
            flags = ", ".join("--" + f.replace("_", "-") for f in others)
            raise InputError(f"demo --tools runs the zoom task on its own settings; it does not take {flags}")
        settings = dataclasses.replace(ToolDemoSettings(), **{k: v for k, v in given.items() if v is not None})
        run_tool_demo(args.out or "runs/demo-tools", settings)
        return 0
    given |= {
        "max_shapes": args.max_shapes,
        "arch": args.arch,
        "image_size": args.image_size,
        "kinds": tuple(args.kinds.split(",")) if args.kinds else None,
    }
    start = from_scratch() if args.from_scratch else DemoSettings()
    run_demo(args.out or "runs/demo", dataclasses.replace(start, **{k: v for k, v in given.items() if v is not None}))
    return 0


def add_eval_command(sub) -> None:
    from vlgrpo.evals.pope.score import PARSERS

    p = sub.add_parser(
        "eval",
        help="evaluate a model (POPE, grounding, VQA) or score an existing predictions file",
        description="`vlgrpo eval --model PATH_OR_RUN --data FILE --out DIR` decodes greedily and writes metrics.json, "
        "predictions.jsonl and report.md; `vlgrpo eval score ...` scores predictions made elsewhere.",
    )
    p.add_argument("--model", help="HF checkpoint directory, run directory (config.yaml + checkpoints/) or hub id")
    p.add_argument(
        "--suite",
        dest="suites",
        default="pope,grounding,vqa",
        help=f"comma list of {', '.join(EVAL_SUITES)} (default pope,grounding,vqa)",
    )
    p.add_argument("--data", help="Sample dataset (or a POPE question file); default for a run: data.test/data.val")
    p.add_argument(
        "--split",
        help="split of a dataset saved as a DatasetDict (default: a published benchmark's own, e.g. MathVista's "
        "testmini; else the first of test, testmini, validation, val, train it holds)",
    )
    p.add_argument("--out", dest="eval_out", help="output directory (default: eval_out)")
    p.add_argument("--max-samples", type=int, help="at most N samples per suite (POPE: about N questions per split)")
    p.add_argument("--pope-parser", choices=PARSERS, default="pope")
    p.add_argument("--pope-data", help="POPE question file or saved dataset (default: probes built from --data)")
    p.add_argument(
        "--pope-splits",
        help="comma list of random, popular, adversarial (default: random when built, every split of a POPE file)",
    )
    p.add_argument("--pope-images", type=int, help="images to build POPE probes from (default: from --max-samples)")
    p.add_argument("--pope-per-image", type=int, default=3, help="yes (and no) questions per image (default 3)")
    p.add_argument("--pope-min-objects", type=int, default=3, help="skip images with fewer objects (default 3)")
    p.add_argument(
        "--answer-format",
        choices=CHOICES["data.answer_format"],
        help="default: the checkpoint's (run directory, vlgrpo.json), else think_answer",
    )
    p.add_argument("--box-format", choices=BOX_FORMATS, help="default: the checkpoint's, else the model family's")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        help="new tokens per completion (default: the run's "
        "rollout.max_new_tokens, or the export's vlgrpo.json; else 128)",
    )
    p.add_argument("--batch-prompts", type=int, default=8, help="prompts decoded together (default 8)")
    p.add_argument("--dtype", choices=CHOICES["model.dtype"], default="float32")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--vision-cache-dir", help="on-disk vision-feature cache (reused across evals of one model)")
    p.add_argument(
        "--engine",
        choices=CHOICES["rollout.engine"],
        default="hf",
        help="greedy decoder: hf (transformers, default) or vllm (needs vllm; same predictions, faster)",
    )
    p.add_argument(
        "--engine-kwargs",
        type=json.loads,
        default=None,
        help="JSON keyword arguments of vllm.LLM, e.g. '{\"enforce_eager\": true}'",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="vLLM's share of the GPU (default 0.8)")
    p.add_argument(
        "--judge",
        nargs="?",
        const="",
        metavar="CONFIG",
        help="also score the answers with the judge model of CONFIG's reward.judge (default: the run directory's), "
        "as training rewarded them: eval/<suite>/judge_score",
    )
    p.add_argument(
        "--tools",
        help=f"comma list of tools the model may call: {', '.join(TOOL.names)}, module:function or "
        "file.py:function; or none. Multi-turn, either engine (default: a run directory's rollout.tools, else none)",
    )
    p.add_argument(
        "--max-turns",
        type=int,
        help="turns a sample may take with tools (default: the run's rollout.max_turns, else 5)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # Actions are subcommands; without one, the flags above run the model (handler _cmd_eval_run).
    esub = p.add_subparsers(dest="eval_command", required=False, metavar="ACTION")
    p.set_defaults(handler=_cmd_eval_run)
    score = esub.add_parser(
        "score",
        help="score predictions produced anywhere (POPE's JSONL: question_id, text, label, split)",
        description="text = the model's answer, label = yes/no, split optional. Prints per-split accuracy, "
        "precision, recall, f1, yes_ratio (of the predictions) and the unknown count.",
    )
    score.add_argument("--suite", choices=["pope"], required=True)
    score.add_argument("--pred", required=True, help="predictions JSONL")
    score.add_argument(
        "--parser",
        choices=PARSERS,
        default="pope",
        help="pope: the original rule (default); vlmevalkit: yes/no/unknown; strict: exactly yes/no",
    )
    score.add_argument("--split", default="all", help="split name for rows without a 'split' key (default: all)")
    score.add_argument("--json", action="store_true", help="print JSON: per split accuracy, precision, ...")
    score.set_defaults(handler=_cmd_eval_score)


def _cmd_eval_run(args) -> int:
    if not args.model:
        print(
            "error: pass --model to evaluate a model (`vlgrpo eval --model DIR --data FILE --out DIR`) or choose an "
            "action, e.g. `vlgrpo eval score --suite pope --pred FILE` (see vlgrpo eval --help)",
            file=sys.stderr,
        )
        return 2
    from vlgrpo.evals.offline import run_eval

    result = run_eval(eval_request(args))
    for key, value in result.metrics.items():
        print(f"{key:<48} {value:.4f}")
    print(f"wrote metrics.json, predictions.jsonl, report.md to {args.eval_out or 'eval_out'}")
    return 0


def eval_request(args):
    """`vlgrpo eval`'s flags as an EvalRequest: parsed, nothing decided (`evals/request.py` decides)."""
    from vlgrpo.evals.request import EngineOptions, EvalRequest
    from vlgrpo.evals.suite import PopeOptions

    tools = None if args.tools is None else tuple(t.strip() for t in args.tools.split(",") if t.strip() != "none")
    pope = PopeOptions(
        args.pope_data,
        tuple(args.pope_splits.split(",")) if args.pope_splits else None,
        args.pope_images,
        args.pope_per_image,
        args.pope_min_objects,
        args.pope_parser,
    )
    engine = EngineOptions(
        args.engine,
        args.dtype,
        args.device,
        args.batch_prompts,
        args.engine_kwargs or {},
        args.gpu_memory_utilization,
        args.vision_cache_dir,
    )
    return EvalRequest(
        args.model,
        args.eval_out or "eval_out",
        args.suites,
        args.data,
        args.split,
        args.max_samples,
        args.max_new_tokens,
        args.answer_format,
        args.box_format,
        tools,
        args.max_turns,
        args.judge,
        pope,
        engine,
        not args.no_progress,
    )


def _cmd_eval_score(args) -> int:
    from vlgrpo.evals.pope.score import format_report, read_predictions, score_predictions

    result = {
        "suite": args.suite,
        "pred": args.pred,
        **score_predictions(read_predictions(args.pred, args.split), args.parser),
    }
    return _emit(result, args.json, format_report)


def add_train_command(sub) -> None:
    p = sub.add_parser("train", help="run GRPO (or the SFT cold start) from a config file")
    p.add_argument("config", help="YAML file holding only what differs from the defaults")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-5 grpo.beta=0.04")
    p.add_argument("--out", help="run directory (default: train.output_dir)")
    p.set_defaults(handler=_cmd_train)


def _cmd_train(args) -> int:
    from vlgrpo.config import load_config
    from vlgrpo.trainer import run_training

    cfg = load_config(args.config, args.overrides)
    evaluator = None
    if cfg.eval.every_steps:  # POPE / grounding / VQA on the training model every N steps
        from vlgrpo.evals.run import make_evaluator

        evaluator = make_evaluator(cfg)  # selects its data now: a suite without any stops before the model loads
    history = run_training(cfg, args.out, evaluator=evaluator)
    if history:
        last = history[-1]
        shown = {
            k: round(v, 4) for k, v in last.items() if k.startswith(("reward/", "train/loss")) and isinstance(v, float)
        }
        print(f"finished step {last['step']}: {shown}")
    from vlgrpo.trainer.group import exit_rank, launched_as_rank

    if launched_as_rank():  # the run is complete: nothing in the interpreter's teardown may turn it into a failure
        exit_rank(0)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from vlgrpo.types import InputError

    try:
        return int(args.handler(args) or 0)
    except InputError as e:  # bad config/data/image/checkpoint: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
