"""The report of `vlgrpo plan`: the whole plan as plain data (the JSON of --json, every size in bytes) and the
readable table: one row per term in GB per GPU, the verdict per GPU type, warnings, suggestions and conventions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlgrpo.memory.checkpoint import (
    DEFAULT_SYNC_GBPS,
    DEFAULT_WRITE_GBPS,
    checkpoint_bytes,
    sync_bytes,
    sync_seconds,
    write_seconds,
)
from vlgrpo.memory.fit import GB, verdicts
from vlgrpo.memory.inputs import PlanInput
from vlgrpo.memory.planner import plan
from vlgrpo.memory.suggest import not_run_by_trainer, suggestions


def _inputs_dict(inp: PlanInput) -> dict[str, Any]:
    d = dataclasses.asdict(inp)
    d["offload"] = sorted(inp.offload)
    if inp.spec is not None:
        d["spec"]["params"] = {
            "vision": inp.spec.vision_params(),
            "merger": inp.spec.merger_params(),
            "language": inp.spec.language_params(),
            "total": inp.spec.total_params(),
            "active": inp.spec.active_params(),
        }
    return d


def build_report(
    inp: PlanInput,
    gpu_type: str = "A100-80GB",
    config_notes: list[str] | None = None,
    write_gbps: float = DEFAULT_WRITE_GBPS,
) -> dict[str, Any]:
    """The whole plan as plain data (every size in bytes): the JSON of `vlgrpo plan --json`. `config_notes` say how
    the run config was read (printed under the headline); `write_gbps` is the bandwidth the checkpoint's write time
    assumes."""
    result = plan(inp)
    total, trainable = result["counts"]["total_params"], result["counts"]["trainable_params"]
    ckpt = checkpoint_bytes(inp, total, trainable)
    return {
        "inputs": _inputs_dict(inp),
        "config_notes": list(config_notes or []),
        "counts": result["counts"],
        "per_gpu": result["per_gpu"],
        "cpu": result["cpu"],
        "conventions": result["conventions"],
        "warnings": result["warnings"],
        "not_run_by_trainer": not_run_by_trainer(inp),
        "verdicts": verdicts(inp, result["per_gpu"]),
        "suggestions": suggestions(inp, gpu_type),
        "checkpoint": {**ckpt, "write_gbps": write_gbps, "write_s": write_seconds(ckpt["total"], write_gbps)},
        "sync": sync_bytes(inp, total, trainable),
        "prefix_block": inp.spec.prefix_block_tokens(inp.dtype_bytes) if inp.spec and inp.engine == "vllm" else 0,
    }


# One row per term: (key, label). Phase totals follow.
_ROWS = [
    ("weights", "policy weights"),
    ("gradients", "gradients"),
    ("optimizer", "optimiser states"),
    ("model_states", "= model states"),
    ("zero3_gather", "ZeRO-3 gathered layer"),
    ("reference", "reference model"),
    ("reward_model", "reward model"),
    ("critic", "critic (PPO)"),
    ("activations", "activations (1 micro-batch)"),
    ("logits", "log-prob logits"),
    ("kept_prefill", "prompt prefill kept for the update"),
    ("zero3_rollout_gather", "ZeRO-3 weights gathered for rollout"),
    ("rollout_weights", "rollout engine weights"),
    ("kv_cache", "rollout KV cache"),
    ("vision_cache", "vision-feature cache"),
    ("overhead", "CUDA context + NCCL + slack"),
    ("train_phase", "peak in the update"),
    ("rollout_phase", "peak in the rollout"),
    ("total", "TOTAL need per GPU"),
]


_LABEL = 36  # width of the term column


def _gb(x: float) -> str:
    return f"{x / GB:8.2f}"


def _count(n: int) -> str:
    """A parameter count: 8.29 B, or 1.11 M for a tiny model."""
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _headline(report: dict[str, Any]) -> list[str]:
    i, c = report["inputs"], report["counts"]
    name = i["spec"]["name"] if i["spec"] else f"{_count(c['total_params'])} parameters (--params)"
    method = f"LoRA r={i['lora_rank']}" if i["lora_rank"] else f"full fine-tune of {', '.join(i['trainable'])}"
    source = f" (from {i['deepspeed_config']})" if i["deepspeed_config"] else ""
    spec = i["spec"]
    moe = ""
    if spec and spec.get("experts"):  # a token runs through k of the experts: its compute and activations
        moe = (
            f"; mixture of experts: {_count(spec['params']['active'])} active per token ({spec['experts']} experts, "
            f"top-{spec['experts_per_token']}), every expert's weights held; routing record "
            f"{spec['layers'] * spec['experts_per_token']} B per token"
        )
    return [
        f"model: {name}  ({_count(c['total_params'])} params, {c['trainable_params'] / 1e6:,.1f} M trainable{moe})",
        f"{method}; ZeRO-{i['zero_stage']} over {c['train_gpus']} training GPU(s) of {i['num_gpus']}; "
        f"{i['dtype_bytes']}-byte dtype; offload: {', '.join(i['offload']) or 'none'}{source}; beta={i['beta']}",
        f"per step and GPU: {i['prompts_per_step']} prompts x {i['completions_per_prompt']} completions; micro-batch "
        f"{i['micro_batch']}; tokens: {_prompt_parts(report)} + {i['completion_tokens']} completion; gradient "
        f"checkpointing {'on' if i['gradient_checkpointing'] else 'off'}; engine {i['engine']}"
        + (
            f" ({i['vllm_placement']}, gpu_memory_utilization={i['vllm_gpu_memory_utilization']})"
            if i["engine"] == "vllm"
            else ""
        ),
    ]


def _prompt_parts(report: dict[str, Any]) -> str:
    """The prompt's tokens by part: `64 text + 256 image` for one image; with several images or a video e.g.
    `64 text + 2 images x 256 + video 8 x 768 (16 frames) = 6720 prompt`."""
    i, parts = report["inputs"], report["counts"]["prompt_parts"]
    n = i["images_per_sample"]
    out = [f"{parts['text']} text"]
    if n == 1:
        out.append(f"{parts['images']} image")
    elif n > 1:
        out.append(f"{n} images x {i['image_tokens']}")
    if i["video_frames"]:
        groups = parts["video"] // i["video_frame_tokens"]
        out.append(f"video {groups} x {i['video_frame_tokens']} ({i['video_frames']} frames)")
    if parts["video_timestamps"]:
        out.append(f"{parts['video_timestamps']} timestamp")
    if n == 1 and not i["video_frames"]:
        return " + ".join(out)  # the one-image form
    return " + ".join(out) + f" = {report['counts']['prompt_tokens']} prompt"


def format_report(report: dict[str, Any]) -> str:
    """The readable table: one row per term in GB per GPU, verdicts per GPU type, suggestions."""
    rule = "-" * (_LABEL + 8)
    lines = _headline(report) + [f"note: {n}" for n in report["config_notes"]]
    lines += ["", f"{'term':<{_LABEL}}{'GB/GPU':>8}", rule]
    per_gpu = report["per_gpu"]
    for key, label in _ROWS:
        if key in ("train_phase", "total"):
            lines.append(rule)
        if per_gpu[key] or key in ("model_states", "total"):
            lines.append(f"{label:<{_LABEL}}{_gb(per_gpu[key])}")
    if report["inputs"]["engine"] == "vllm":
        lines.append(
            f"(vLLM reserves gpu_memory_utilization={report['inputs']['vllm_gpu_memory_utilization']} x "
            "capacity in the rollout: see each GPU type's peak below)"
        )
    cpu = report["cpu"]
    if cpu["per_rank"]:
        lines.append(f"{'CPU memory per rank / all':<{_LABEL}}{_gb(cpu['per_rank'])} / {cpu['all_ranks'] / GB:.2f}")
    lines += ["", f"{'GPU':<12}{'capacity':>10}{'peak':>10}{'headroom':>10}  verdict and why (GB)"]
    for name, v in report["verdicts"].items():
        verdict = "fits" if v["fits"] else "does NOT fit"
        lines.append(
            f"{name:<12}  {_gb(v['capacity_bytes'])}  {_gb(v['peak_bytes'])}  {_gb(v['headroom_bytes'])}  "
            f"{verdict}: {v['reason']}"
        )
    warnings = report["warnings"] + [f"{name}: {w}" for name, v in report["verdicts"].items() for w in v["warnings"]]
    lines += [f"warning: {w}" for w in warnings] + [f"note: {n}" for n in report["not_run_by_trainer"]]
    if report["suggestions"]:
        lines += ["", f"suggestions (to fit {report['suggestions'][0]['gpu_type']}):"]
        lines += [
            f"  peak {_gb(s['peak_bytes'])} GB  {'fits ' if s['fits'] else 'over '}  {s['change']}"
            for s in report["suggestions"]
        ]
    lines += ["", *_checkpoint_lines(report)]
    lines += ["", "conventions:"] + [f"  {k}: {v}" for k, v in report["conventions"].items()]
    return "\n".join(lines)


def _checkpoint_lines(report: dict[str, Any]) -> list[str]:
    """One checkpoint's size by part and its write time; the bytes of one weight sync."""
    c, s = report["checkpoint"], report["sync"]
    parts = ", ".join(f"{k} {c[k] / GB:.2f}" for k in ("weights", "optimizer", "adapter") if c[k])
    lines = [
        f"checkpoint: {c['total'] / GB:.2f} GB ({parts}); written in ~{c['write_s']:.0f} s at {c['write_gbps']:g} "
        "GB/s (the ranks share its checksums)"
    ]
    i = report["inputs"]
    if i["engine"] == "vllm":
        if i["adapter_sync"]:
            sync = f"weight sync to the rollout engine: the LoRA adapter alone, {s['adapter'] / 1e6:.1f} MB per step"
        else:
            what = "the merged layers" if s["adapter"] else "the trained weights"
            path = i["vllm_placement"]
            sync = (
                f"weight sync to the rollout engine: {s['full'] / GB:.2f} GB per step ({what}, in buckets of "
                f"{i['sync_bucket_mb']:g} MB; the whole model is {s['whole'] / GB:.2f} GB), ~"
                f"{sync_seconds(s['full'], path):.2f} s at a stated {DEFAULT_SYNC_GBPS[path]:g} GB/s"
                + (" over NCCL" if path == "split" else " in GPU memory")
                + (  # before buckets the split sent everything through a CPU buffer; colocated, everything in place
                    f" (before buckets: the whole model through a CPU buffer, ~{sync_seconds(s['whole'], 'host'):.1f}"
                    " s)"
                    if path == "split"
                    else f" (before buckets: the whole model, ~{sync_seconds(s['whole'], path):.2f} s)"
                )
            )
            if s["adapter"]:
                sync += f"; the adapter alone would be {s['adapter'] / 1e6:.1f} MB"
        lines.append(sync + (f": {i['sync_why']}" if i["sync_why"] else ""))
    if i["engine"] == "vllm":
        lines.append(
            "vLLM's multimodal processor cache: off (mm_processor_cache_gb=0; vLLM's default keeps up to 4 GiB of "
            "processed items per engine, with mm_input=embeds the images' embeddings, next to the trainer), and vLLM's "
            "caches emptied after each rollout"
            if i["vllm_placement"] == "colocate"
            else "vLLM's multimodal processor cache: vLLM's default (up to 4 GiB per engine), on the rollout side"
        )
    block = report["prefix_block"]
    if block:
        prompt = report["counts"]["prompt_tokens"]
        shared = prompt // block * block
        lines.append(
            f"vLLM prefix caching of a hybrid model: blocks of {block} tokens (a block's attention pages hold one "
            f"Gated DeltaNet layer's state; vlgrpo sets mamba_cache_mode=align): of a {prompt}-token "
            f"prompt, {shared} are reused by the group's other samples ({shared / max(prompt, 1):.0%}"
            + (
                "; a prompt shorter than a block reuses nothing: rollout/prefix_cache_hit_rate shows it)"
                if not shared
                else ")"
            )
        )
    return lines
