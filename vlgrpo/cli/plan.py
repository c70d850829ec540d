"""`vlgrpo plan`: the GPU memory planner (vlgrpo.memory) from a config, a hub name or flags; several images and a
video per prompt included. Part of the command line (cli.py registers it); a thin argparse wrapper.
"""

from __future__ import annotations

import json

from vlgrpo.config import CHOICES


def add_plan_command(sub) -> None:
    p = sub.add_parser("plan", help="per-GPU memory plan of a run: breakdown, verdict per GPU type, suggestions")
    p.add_argument(
        "config",
        nargs="?",
        help="run config YAML (default: the config defaults with bfloat16; their model, "
        "runs/tiny-qwen2_5_vl, is planned as `vlgrpo model init-tiny` builds it until it exists)",
    )
    p.add_argument("--model", help="hub name (e.g. qwen2.5-vl-7b) or a directory with config.json")
    p.add_argument("--params", type=float, help="plan model states for N trainable parameters, no model spec")
    p.add_argument("--largest-layer", type=float, help="with --params: largest layer's parameters (ZeRO-3 buffer)")
    p.add_argument("--gpus", type=int, help="GPUs of the run (train.num_gpus)")
    p.add_argument(
        "--zero",
        type=int,
        choices=[0, 1, 2, 3],
        help="ZeRO stage (default: from train.backend); "
        "1 and 2 are for comparison: the trainer runs 0 (plain, lora) and 3 (train.backend=zero3)",
    )
    p.add_argument("--lora-rank", type=int, help="plan LoRA with this rank (train.backend=lora)")
    p.add_argument(
        "--offload",
        help="comma list of optimizer, param, reference, reward; or none. The trainer "
        "offloads optimizer and param with ZeRO-3 only; the rest are for comparison",
    )
    p.add_argument("--dtype", choices=CHOICES["model.dtype"], help="model.dtype")
    p.add_argument("--optimizer-states", choices=["fp32", "bf16"], help="fp32 master + moments (default) or bf16")
    p.add_argument("--convention", choices=["16-byte", "18-byte"], help="18-byte: DeepSpeed's estimator convention")
    p.add_argument("--beta", type=float, help="KL coefficient (grpo.beta); > 0 keeps a reference model")
    p.add_argument("--reward-model-params", type=float, help="parameters of a neural reward model on each GPU")
    p.add_argument("--critic", action="store_true", help="add a PPO critic of the policy's size (comparison)")
    p.add_argument("--image-size", default="448x448", help="typical image WxH (default 448x448)")
    p.add_argument("--text-tokens", type=int, default=64, help="typical text tokens of a prompt (default 64)")
    p.add_argument("--images-per-sample", type=int, default=1, help="images of --image-size per prompt (default 1)")
    p.add_argument("--video-frames", type=int, default=0, help="frames of each prompt's video (default 0: none)")
    p.add_argument("--video-max-pixels", type=int, help="data.video.max_pixels (default: 768 tokens a frame)")
    p.add_argument("--video-size", help="typical video frame WxH (default: every frame at the max_pixels bound)")
    p.add_argument("--logits-chunk", type=int, help="completion tokens whose logits are live at once")
    p.add_argument("--gpu-type", default="A100-80GB", help="GPU the suggestions aim at (default A100-80GB)")
    p.add_argument(
        "--write-gbps",
        type=float,
        default=1.0,
        help="checkpoint write bandwidth in GB/s for its write time (default 1)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON with every term in bytes")
    p.set_defaults(handler=_cmd_plan)


def _cmd_plan(args) -> int:
    import dataclasses

    from vlgrpo.config import load_config
    from vlgrpo.memory.deepspeed_json import config_notes
    from vlgrpo.memory.flags import parse_image_size, parse_offload
    from vlgrpo.memory.from_config import judge_notes, plan_input_from_config, tool_notes, video_notes
    from vlgrpo.memory.report import build_report, format_report
    from vlgrpo.memory.tiny_spec import init_tiny_spec, unbuilt_default_model

    flags = {
        "model.name_or_path": args.model,
        "train.num_gpus": args.gpus,
        "grpo.beta": args.beta,
        "model.dtype": args.dtype or (None if args.config else "bfloat16"),
        "train.backend": "lora" if args.lora_rank else None,
        "train.lora.rank": args.lora_rank,
        "data.video.max_pixels": args.video_max_pixels,
    }
    overrides = [f"{k}={v}" for k, v in flags.items() if v is not None] + args.set
    cfg = load_config(args.config, overrides)
    spec, notes = None, config_notes(cfg)
    if not args.params and unbuilt_default_model(cfg):  # the default model before `vlgrpo model init-tiny` built it
        from vlgrpo.tiny import TinySpec

        spec, note = init_tiny_spec(TinySpec(), cfg)
        notes.insert(0, note)
    notes += video_notes(cfg, args.video_frames)
    inp = plan_input_from_config(
        cfg,
        params=int(args.params) if args.params else None,
        spec=spec,
        image_size=parse_image_size(args.image_size),
        text_tokens=args.text_tokens,
        images_per_sample=args.images_per_sample,
        video_frames=args.video_frames,
        video_size=parse_image_size(args.video_size, "--video-size") if args.video_size else None,
    )
    changes = {
        "zero_stage": args.zero,
        "offload": parse_offload(args.offload) if args.offload else None,
        # --zero plans DeepSpeed's ZeRO, whose mixed precision keeps an fp32 master copy and fp32 moments
        "optimizer_states": args.optimizer_states or ("fp32" if args.zero is not None else None),
        "convention": args.convention,
        "largest_layer": int(args.largest_layer) if args.largest_layer else None,
        "reward_model_params": int(args.reward_model_params) if args.reward_model_params else None,
        "critic": args.critic or None,
        "logits_chunk": args.logits_chunk,
    }
    inp = dataclasses.replace(inp, **{k: v for k, v in changes.items() if v is not None})
    notes += judge_notes(cfg, inp) + tool_notes(cfg, inp)
    report = build_report(inp, args.gpu_type, notes, args.write_gbps)
    print(json.dumps(report, indent=2, default=str) if args.json else format_report(report))
    return 0
