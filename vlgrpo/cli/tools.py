"""`vlgrpo cache | model | reward | export`: the utilities around a run - the vision-feature cache, the tiny model,
one reward scored by hand, the plain HF checkpoint. Part of the command line (cli.py registers them); thin argparse
wrappers over vlgrpo.vision_cache, vlgrpo.tiny, vlgrpo.rewards and vlgrpo.trainer.export.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlgrpo.config import CHOICES

ARCHS = [a for a in CHOICES["model.arch"] if a != "auto"]
BOX_FORMATS = [b for b in CHOICES["reward.box_format"] if b != "auto"]
"""The CLI's choices are the config's, which are the registries' (vlgrpo/registry.py); cli.py uses them too."""


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def add_cache_command(sub) -> None:
    p = sub.add_parser("cache", help="inspect or clear an on-disk vision-feature cache")
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    for action, text in (("stats", "entries, bytes and vision-weights versions"), ("clear", "delete every entry")):
        a = csub.add_parser(action, help=text)
        a.add_argument("dir", help="the cache directory (rollout.vision_cache_dir)")
        a.set_defaults(handler=_cmd_cache)


def _cmd_cache(args) -> int:
    from vlgrpo.vision_cache import clear_disk, disk_stats

    _print_json(disk_stats(args.dir) if args.cache_command == "stats" else clear_disk(args.dir))
    return 0


def add_model_command(sub) -> None:
    p = sub.add_parser("model", help="build or inspect models")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    tiny = msub.add_parser("init-tiny", help="build a tiny random Qwen-VL with a locally trained tokenizer")
    tiny.add_argument("--arch", choices=ARCHS, default="qwen2_5_vl")
    tiny.add_argument("--out", required=True, help="directory to save the checkpoint and processor into")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--calibrate-images",
        metavar="DIR",
        help="centre and scale the merger's output over the "
        "images in DIR (png/jpg/webp/bmp, up to 256; labels unused) so a fresh model learns to read them sooner",
    )
    tiny.set_defaults(handler=_cmd_init_tiny)


def _cmd_init_tiny(args) -> int:
    from vlgrpo.data.images import image_files
    from vlgrpo.models import count_parameters, load_model
    from vlgrpo.tiny import calibrate_merger, init_tiny

    images = image_files(args.calibrate_images) if args.calibrate_images else []  # fails before building anything
    out = init_tiny(args.out, args.arch, seed=args.seed)
    if images:
        stats = calibrate_merger(out, images[:256])
        print(
            f"merger calibrated on {min(len(images), 256)} images: feature std {stats['std_before']:.4f} -> "
            f"{stats['std_after']:.4f}"
        )
    counts = count_parameters(load_model(str(out)).model)
    print(f"tiny {args.arch} saved to {out}: {counts['total']:,} parameters ({counts['vision']:,} in the vision tower)")
    return 0


def add_reward_command(sub) -> None:
    p = sub.add_parser(
        "reward",
        help="score one completion against one sample (debug a reward recipe)",
        description="Print each reward component and the weighted total. Exit status 1 when a component failed.",
    )
    p.add_argument("--sample", required=True, help="a JSON row, or a JSONL file (see --index / --id)")
    p.add_argument("--index", type=int, default=0, help="0-based row of the JSONL file (default 0)")
    p.add_argument("--id", default=None, help="pick the JSONL row with this sample id instead of --index")
    p.add_argument("--completion", required=True, help="completion text; '-' reads stdin, '@path' reads a file")
    p.add_argument(
        "--recipe",
        default=None,
        help="a reward name (accuracy, format, iou, iou@0.75, giou, module:function or file.py:function "
        "for a user fn(completion, **sample_fields) -> float), an answer type, an inline mapping "
        "'{accuracy: 1, format: 0.5}', or a YAML file (a recipe mapping or a run config); "
        "default: the sample's answer-type recipe",
    )
    p.add_argument(
        "--model",
        default=None,
        help="an exported checkpoint or run directory: its vlgrpo.json (how the model was prompted) and "
        "processor give the answer format, box convention and resize geometry",
    )
    p.add_argument(
        "--box-format",
        choices=BOX_FORMATS,
        default=None,
        help="box convention of the completion (default: --model's, the config's, else qwen2_5)",
    )
    p.add_argument("--answer-format", choices=CHOICES["data.answer_format"], default=None)
    p.add_argument("--gate", action="store_true", help="count accuracy only when the format holds")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_cmd_reward)


def _cmd_reward(args) -> int:
    import dataclasses

    from vlgrpo.data.images import DEFAULT_GEOMETRY
    from vlgrpo.rewards import RewardContext, context_from_config
    from vlgrpo.rewards.explain import explain, format_report, load_sample, read_completion, read_recipe

    sample = load_sample(args.sample, args.index, args.id)
    recipe, cfg = read_recipe(args.recipe, sample.answer_type)
    # Without a run config the completion is read as Qwen2.5-VL output (the default model family), resized as the
    # released processors resize (the geometry rewards, doctor and prompts share).
    ctx = RewardContext(box_format="qwen2_5", geometry=DEFAULT_GEOMETRY)
    if cfg is not None:
        ctx = context_from_config(cfg, arch="qwen2_5_vl" if cfg.model.arch == "auto" else None)
    if args.model:
        ctx = _context_from_checkpoint(args.model, ctx)
    flags = {"box_format": args.box_format, "answer_format": args.answer_format, "gate_accuracy_on_format": args.gate}
    ctx = dataclasses.replace(ctx, **{k: v for k, v in flags.items() if v})
    report = explain(read_completion(args.completion), sample, recipe, ctx)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["failures"] else 0


def _context_from_checkpoint(model: str, ctx):
    """`ctx` with the answer format, box convention and geometry of a checkpoint's (or run's) prompt contract."""
    import dataclasses

    from vlgrpo.config import ConfigError
    from vlgrpo.config.contract import CONTRACT_FILE, read_contract
    from vlgrpo.data.images import checkpoint_geometry

    contract = read_contract(model)
    if contract is None:
        raise ConfigError(
            f"--model '{model}' holds no {CONTRACT_FILE}: give an export (`vlgrpo export`) or a run "
            "directory, or set --box-format / --answer-format yourself"
        )
    processor_dir = model  # an export holds its processor; a run directory names its base model
    if (Path(model) / "config.yaml").is_file():
        from vlgrpo.config import load_config

        processor_dir = load_config(Path(model) / "config.yaml").model.name_or_path
    geometry, _ = checkpoint_geometry(processor_dir, contract.min_pixels, contract.max_pixels)
    return dataclasses.replace(
        ctx, box_format=contract.box_format, answer_format=contract.answer_format, geometry=geometry
    )


def add_export_command(sub) -> None:
    p = sub.add_parser("export", help="write a plain HF checkpoint (LoRA merged) from a run directory")
    p.add_argument("run_dir", help="a run directory holding config.yaml and checkpoints/")
    p.add_argument("--out", required=True, help="directory for the HF checkpoint")
    p.set_defaults(handler=_cmd_export)


def _cmd_export(args) -> int:
    from vlgrpo.trainer.export import export_run

    out = export_run(args.run_dir, args.out)
    print(f"exported {args.run_dir} -> {out}")
    return 0
