"""`vlgrpo data ...`: synth (the shapes task), convert (other projects' formats), pope (probes), doctor (pre-flight
checks). Part of the command line (cli.py registers it); thin argparse wrappers over vlgrpo.data and vlgrpo.evals.
"""

from __future__ import annotations

import json
import sys


def add_data_command(sub) -> None:
    p = sub.add_parser("data", help="synthesise, convert and check datasets")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    synth = dsub.add_parser("synth", help="write the synthetic shapes task (PNG + train/val/test JSONL)")
    synth.add_argument("--out", required=True)
    synth.add_argument("--n", type=int, default=1000, help="number of samples over all splits (80/10/10)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--image-size", type=int, default=112, help="square image side in pixels")
    synth.add_argument(
        "--kinds",
        default="count,colour,exist,ground",
        help="question kinds, comma-separated: count, colour, exist, ground (one image each; the "
        "default), compare (two images), motion (a video of frame PNGs), zoom (a tiny shape in a 4x image)",
    )
    synth.add_argument("--max-shapes", type=int, default=6, help="most shapes per scene (1-6)")
    synth.set_defaults(handler=_cmd_synth)
    _add_data_convert(dsub)
    _add_data_pope(dsub)
    _add_data_doctor(dsub)


def _cmd_synth(args) -> int:
    from vlgrpo.data.synth import synth_dataset

    paths = synth_dataset(args.out, args.n, args.seed, args.image_size, tuple(args.kinds.split(",")), args.max_shapes)
    for split, path in paths.items():
        print(f"{split}: {sum(1 for _ in open(path))} samples -> {path}")
    return 0


def _add_data_convert(dsub) -> None:
    from vlgrpo.data.presets import PRESETS
    from vlgrpo.registry import DATA_PRESET

    p = dsub.add_parser(
        "convert",
        help="rewrite a dataset in another project's shape (LLaVA, chat messages, R1-V, EasyR1) as JSONL",
        description="Reads SRC through a preset (or a column mapping), infers each row's answer_type (numbers, option "
        "letters, yes/no, math, boxes), converts boxes to original-image pixels (a box row's image_size is read from "
        "the image header when not given) and writes vlgrpo JSONL with image paths relative to OUT, so it moves with "
        "its images; embedded images go to OUT_images/; rows without an id get '<SRC stem>-<row>'. Prints what was "
        "inferred, assumed and skipped (several turns, several videos, no image) by row; rows with several images or "
        "a video are kept, every image, video and frame path written relative to OUT. Rows that are malformed or "
        "whose image, video or frame file is missing are listed and not written, with exit status 1. Presets: "
        + "; ".join(f"{o.name}: {o.help}" for o in DATA_PRESET.options.values() if o.target),
    )
    p.add_argument("source", help="a .json / .jsonl file, a .parquet file or a saved HF dataset directory")
    p.add_argument("--preset", choices=list(PRESETS), help="the row shape of SRC (data.preset in a run config)")
    p.add_argument(
        "--columns",
        help="renames target=source,... applied first; without --preset the targets are row "
        "fields, e.g. question=problem,answer=solution,image=img (data.columns)",
    )
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--image-root", help="directory the rows' image paths are relative to (default: SRC's directory)")
    p.add_argument(
        "--split",
        help="split of a saved DatasetDict (default: train when it holds one, else a published benchmark's own, "
        "e.g. MathVista's testmini, else the first of test, testmini, validation, val it holds)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (every row number)")
    p.set_defaults(handler=_cmd_data_convert)


def _cmd_data_convert(args) -> int:
    from vlgrpo.data.convert import conversion_summary, convert_dataset, format_summary
    from vlgrpo.data.presets import parse_columns
    from vlgrpo.types import InputError

    if not args.preset and not args.columns:
        raise InputError("vlgrpo data convert needs --preset NAME or --columns target=source,...")
    from vlgrpo.evals.source import CONVERT_SPLITS, resolve_source

    columns = parse_columns(args.columns) if args.columns else None
    preset = args.preset or "none"
    source = resolve_source(args.source, split=args.split, preset=preset, columns=columns, order=CONVERT_SPLITS)
    result = convert_dataset(args.source, args.out, preset, columns, args.image_root, source.split or "train")
    summary = conversion_summary(result)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary, args.source, args.out))
    return 1 if summary["invalid"] or summary["missing_images"] else 0


def _add_data_doctor(dsub) -> None:
    from vlgrpo.data.presets import PRESETS

    p = dsub.add_parser(
        "doctor",
        help="pre-flight checks of a dataset (or of every split of a run config); exit 1 on errors",
        description="Opens every image and checks rows, image tokens against data.max_prompt_length, image "
        "placeholders, image_size, boxes, gold answers against the configured reward, duplicate ids, the answer "
        "distribution and, for a run config, that each of eval.suites has data to run on. Prints a summary table; "
        "exit status 1 when any error is found (warnings alone exit 0).",
    )
    p.add_argument("target", help="a run config YAML (checks data.train/val/test and eval.data) or one dataset")
    p.add_argument("--split", help="comma list of the config's splits to check: train, val, test, eval")
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        help="the rows are in another project's shape, converted as training converts them (data.preset)",
    )
    p.add_argument(
        "--columns", help="renames target=source,... applied first, as in `vlgrpo data convert` (data.columns)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. data.max_prompt_length=512 or model.max_pixels=401408 (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (first 100 findings per check)")
    p.add_argument("--examples", type=int, default=5, help="findings shown per check in the table (default 5)")
    p.add_argument("--workers", type=int, default=8, help="threads that decode images (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_cmd_data_doctor)


def _cmd_data_doctor(args) -> int:
    from vlgrpo.data.doctor_report import format_report
    from vlgrpo.data.presets import parse_columns
    from vlgrpo.evals.run import in_loop_eval_problem
    from vlgrpo.preflight import diagnose

    splits = [s.strip() for s in args.split.split(",") if s.strip()] if args.split else None
    overrides = list(args.set) + [f"data.preset={args.preset}"] * bool(args.preset)
    if args.columns:  # JSON is YAML: the mapping goes through the config loader like any override
        overrides.append("data.columns=" + json.dumps(parse_columns(args.columns)))
    report = diagnose(
        args.target,
        overrides,
        splits,
        not args.no_progress and sys.stderr.isatty(),
        args.workers,
        eval_check=in_loop_eval_problem,
    )  # the in-loop eval's suites, as `vlgrpo train` checks them
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report, args.examples))
    return 1 if report.errors else 0


def _add_data_pope(dsub) -> None:
    from vlgrpo.evals.pope.build import SOURCE_FORMATS, TEMPLATE

    p = dsub.add_parser(
        "pope",
        help="build POPE probe files (random / popular / adversarial) from per-image object lists",
        description="Writes {name}_pope_{split}.jsonl in POPE's format (question_id, image, text, label) plus "
        "{name}_pope_build.json. Images with fewer than --min-objects distinct objects are skipped and counted.",
    )
    p.add_argument(
        "--source",
        required=True,
        help="COCO instances JSON, POPE's objects JSONL, or a Sample dataset (e.g. shapes train.jsonl)",
    )
    p.add_argument("--format", choices=SOURCE_FORMATS, default="auto")
    p.add_argument("--out", required=True, help="directory for the question files")
    p.add_argument("--name", default="pope", help="file prefix (default: pope)")
    p.add_argument("--n-images", type=int, default=500, help="images per split (default 500; 0 = all eligible)")
    p.add_argument("--per-image", type=int, default=3, help="yes and no questions per image (default 3 + 3)")
    p.add_argument("--min-objects", type=int, default=3, help="skip images with fewer distinct objects (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--template", default=TEMPLATE, help=f"question with {{object}} (default: {TEMPLATE!r})")
    p.add_argument("--split", default="train", help="split to read when the source is a saved HF DatasetDict")
    p.set_defaults(handler=_cmd_data_pope)


def _cmd_data_pope(args) -> int:
    from vlgrpo.evals.pope.build import build_pope, read_object_lists, write_pope

    images = read_object_lists(args.source, args.format, split=args.split)
    pope = build_pope(images, args.n_images or None, args.per_image, args.min_objects, args.seed, args.template)
    paths = write_pope(pope, args.out, args.name)
    print(
        f"{pope.read} images read, {pope.skipped} skipped (< {args.min_objects} distinct objects), "
        f"{len(pope.images)} selected"
    )
    for split, path in paths.items():
        yes = sum(r["label"] == "yes" for r in pope.questions[split])
        print(f"{split}: {len(pope.questions[split])} questions ({yes} yes) -> {path}")
    return 0
