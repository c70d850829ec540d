"""`vlgrpo` command line: thin argparse wrappers over library functions (the top layer; nothing imports it).

Each command group lives in one `add_<group>_command(sub)` function that registers its parser and handler.
Heavy imports (torch, transformers) happen inside the handlers so `vlgrpo --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlgrpo", description="GRPO for Qwen-VL-style vision-language models")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # One line per command group; keep alphabetical.
    add_data_command(sub)
    add_demo_command(sub)
    add_model_command(sub)
    return parser


def add_model_command(sub) -> None:
    p = sub.add_parser("model", help="build or inspect models")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    tiny = msub.add_parser("init-tiny", help="build a tiny random Qwen-VL with a locally trained tokenizer")
    tiny.add_argument("--arch", choices=["qwen2_5_vl", "qwen2_vl"], default="qwen2_5_vl")
    tiny.add_argument("--out", required=True, help="directory to save the checkpoint and processor into")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(handler=_cmd_init_tiny)


def _cmd_init_tiny(args) -> int:
    from vlgrpo.models import count_parameters, init_tiny, load_model

    out = init_tiny(args.out, args.arch, seed=args.seed)
    counts = count_parameters(load_model(str(out)).model)
    print(f"tiny {args.arch} saved to {out}: {counts['total']:,} parameters ({counts['vision']:,} in the vision tower)")
    return 0


def add_data_command(sub) -> None:
    p = sub.add_parser("data", help="synthesise, convert and check datasets")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    synth = dsub.add_parser("synth", help="write the synthetic shapes task (PNG + train/val/test JSONL)")
    synth.add_argument("--out", required=True)
    synth.add_argument("--n", type=int, default=1000, help="number of samples over all splits (80/10/10)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--image-size", type=int, default=112, help="square image side in pixels")
    synth.add_argument("--kinds", default="count,colour,exist,ground", help="question kinds, comma-separated")
    synth.set_defaults(handler=_cmd_synth)


def _cmd_synth(args) -> int:
    from vlgrpo.data.synth import synth_dataset

    paths = synth_dataset(args.out, args.n, args.seed, args.image_size, tuple(args.kinds.split(",")))
    for split, path in paths.items():
        print(f"{split}: {sum(1 for _ in open(path))} samples -> {path}")
    return 0


def add_demo_command(sub) -> None:
    p = sub.add_parser("demo", help="tiny end-to-end run on the shapes task (CPU, minutes)")
    p.add_argument("--out", default="runs/demo", help="run directory")
    p.add_argument("--n", type=int, default=200, help="shapes samples to synthesise")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_cmd_demo)


def _cmd_demo(args) -> int:
    from vlgrpo.demo import run_demo

    run_demo(args.out, n_samples=args.n, seed=args.seed)
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
