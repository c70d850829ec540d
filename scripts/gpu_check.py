"""GPU validation in one command (driven by scripts/gpu_check.sh): the figures the CPU machines cannot measure.

On CUDA in bf16 with the HF engine it runs (1) 20 GRPO steps of the demo task with LoRA and with a full fine-tune,
reading seconds per phase (`timing/*`) and the vision cache's encoder calls (`vision/*`) from the trainer's own
metrics, and (2) the memory planner (`vlgrpo.memory`) against `torch.cuda.max_memory_allocated` for a randomly
initialised ~2 B Qwen2.5-VL built from a config (LoRA; full fine-tune with gradient checkpointing). It writes a
table to docs/gpu-validation.md. `--arch qwen3_vl` runs both on Qwen3-VL (DeepStack on; the ~2 B model in
Qwen3-VL-2B's layout) and writes docs/gpu-validation-qwen3_vl.md; `--arch qwen3_5` on Qwen3.5 (hybrid Gated DeltaNet,
Qwen3.5-2B's layout; install the `gpu` extra for its kernels). Everything goes through the package's own code:
`init_tiny`, `synth_dataset`, `build_state` + `Trainer`, `plan_input_from_config` + `plan`. `--dry-run` runs the same
path on the CPU at tiny sizes (fp32, no CUDA figures) and writes elsewhere; tests/test_gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gpu-validation.md"
TOLERANCE = 0.10
"""The planner's peak must be within 10 % of the measured peak."""
NOT_CHECKABLE = "not checkable there (the GPU image has no vLLM)"

# import name -> what needs it. Required ones stop the check; optional ones are reported.
REQUIRED = {
    "torch": "everything",
    "transformers": "the model",
    "tokenizers": "the local tokenizer",
    "peft": "the LoRA backend",
    "PIL": "the shapes images",
    "yaml": "configs",
    "numpy": "RNG state",
    "safetensors": "checkpoints",
    "torchvision": "the Qwen image processor",
}
OPTIONAL = {
    "qwen_vl_utils": "not used by this check",
    "math_verify": "math answers only (the demo task has none)",
    "vllm": "vLLM figures",
    "deepspeed": "ZeRO-3 (not measured here)",
}


@dataclass
class Sizes:
    """What one check runs. GPU: the demo task's own settings; dry run: the same path at CPU-test sizes."""

    dtype: str = "bfloat16"
    demo_steps: int = 20
    demo_samples: int = 200  # 160 training images: the second epoch (from step 11) is served by the vision cache
    demo_prompts: int = 16
    demo_completions: int = 8
    demo_new_tokens: int = 24
    demo_image: int = 56
    memory_steps: int = 2
    memory_prompts: int = 2
    memory_completions: int = 8
    memory_micro: int = 8
    memory_new_tokens: int = 128
    memory_image: int = 448  # 256 image tokens (Qwen3-VL's 32 px merged tokens: 196)
    memory_spec: dict | None = None
    """TinySpec fields of the memory model; None: the arch's ~2 B layout (MEMORY_SPECS), {}: the tiny default."""


MEMORY_SPECS = {
    "qwen2_5_vl": dict(
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        intermediate_size=8960,
        vision_hidden=1280,
        vision_depth=32,
        vision_heads=16,
        vision_intermediate=3420,
    ),  # ~2.0 B
    "qwen3_vl": dict(
        hidden_size=2048,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        intermediate_size=6144,
        vision_hidden=1024,
        vision_depth=24,
        vision_heads=16,
        vision_intermediate=4096,
        deepstack_visual_indexes=(5, 11, 17),
    ),  # Qwen3-VL-2B-Instruct's config.json sizes, ~2.1 B
    "qwen3_5": dict(
        hidden_size=2048,
        num_layers=24,
        num_heads=8,
        num_kv_heads=2,
        head_dim=256,
        intermediate_size=6144,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        vision_hidden=1024,
        vision_depth=24,
        vision_heads=16,
        vision_intermediate=4096,
    ),  # Qwen3.5-2B's sizes (18 Gated DeltaNet + 6 gated-attention layers), ~2.2 B with its own vocabulary
}
"""The ~2 B memory model of each arch the check runs (random weights; the vocabulary stays the tiny tokenizer's)."""
ARCHS = tuple(MEMORY_SPECS)


DRY_RUN = Sizes(
    dtype="float32",
    demo_steps=2,
    demo_samples=20,
    demo_prompts=2,
    demo_completions=4,
    demo_new_tokens=8,
    memory_steps=1,
    memory_completions=4,
    memory_micro=4,
    memory_new_tokens=8,
    memory_image=112,
    memory_spec={},
)  # the tiny default spec


def check_imports() -> tuple[dict[str, str], list[str], list[str]]:
    """(versions of what imports, missing required, missing optional), each import tried once."""
    versions, missing, absent = {}, [], []
    for name in [*REQUIRED, *OPTIONAL]:
        try:
            versions[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception:  # noqa: BLE001 - a broken install is as missing as an absent one
            (missing if name in REQUIRED else absent).append(name)
    return versions, missing, absent


def environment(versions: dict[str, str]) -> dict[str, str]:
    import torch

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": "CPU (dry run)",
        "python": platform.python_version(),
        "vlgrpo commit": commit.stdout.strip() or "unknown",
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["device"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    for name in ("torch", "transformers", "peft", "tokenizers", "vllm", "deepspeed"):
        env[name] = versions.get(name, "absent")
    return env


# ---------------------------------------------------------------- runs


def _config(model_dir: Path, data_dir: Path, run_dir: Path, overrides: list[str]):
    from vlgrpo.config import load_config

    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.train={data_dir / 'train.jsonl'}",
            "data.answer_format=answer",
            f"train.output_dir={run_dir}",
            "train.resume=false",
            "logging.progress_bar=false",
            "eval.every_steps=0",
            *overrides,
        ],
    )


def _train(cfg) -> tuple[list[dict], int, int]:
    """Build the run state and train to train.steps as `vlgrpo train` does: (logged rows, longest prompt's text
    tokens, CUDA peak allocated bytes above what was allocated before, 0 on the CPU)."""
    import torch

    from vlgrpo.trainer.loop import Trainer
    from vlgrpo.trainer.state import build_state

    gc.collect()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    state = build_state(cfg, progress=False)
    try:
        history = Trainer(state).train()
        prompts = [state.rows.prompt(x).input_ids for x in state.data.samples]
        text = max(sum(1 for t in ids if t != state.image_token_id) for ids in prompts)
    finally:
        state.close()
    peak = torch.cuda.max_memory_allocated() - before if cuda else 0
    del state
    return history, text, peak


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def demo_run(backend: str, model_dir: Path, data_dir: Path, work: Path, sz: Sizes) -> dict:
    """`demo_steps` GRPO steps of the demo task (its prompts, G, lengths, lr, beta and reward recipe)."""
    from vlgrpo.demo.run import from_scratch

    d = from_scratch()
    B, G = sz.demo_prompts, sz.demo_completions
    cfg = _config(
        model_dir,
        data_dir,
        work / f"demo_{backend}",
        [
            f"train.backend={'lora' if backend == 'lora' else 'plain'}",
            f"model.dtype={sz.dtype}",
            f"train.steps={sz.demo_steps}",
            f"train.prompts_per_step={B}",
            f"rollout.completions_per_prompt={G}",
            f"train.micro_batch_completions={B * G}",
            f"train.lr={d.grpo_lr}",
            f"rollout.max_new_tokens={sz.demo_new_tokens}",
            "reward.recipe={accuracy: 1.0, format: 0.1}",
            f"grpo.beta={d.grpo_beta}",
        ],
    )
    t0 = time.perf_counter()
    history, _, peak = _train(cfg)
    later = history[1:] or history  # step 1 pays for CUDA kernels' first launch: timed apart
    phases = sorted({k for r in history for k in r if k.startswith("timing/") and k != "timing/step"})
    return {
        "backend": backend,
        "steps": len(history),
        "wall_s": time.perf_counter() - t0,
        "first_step_s": history[0]["timing/step"],
        "step_s": _mean(later, "timing/step"),
        "phases": {p: _mean(later, p) for p in phases},
        "encoder_calls": _mean(history, "vision/encoder_calls"),
        "images_encoded": _mean(history, "vision/images_encoded"),
        "hit_rate": _mean(history, "vision/hit_rate"),
        "reward_first": history[0].get("reward/total"),
        "reward_last": history[-1].get("reward/total"),
        "peak_gb": peak / 1e9,
    }


def memory_run(mode: str, model_dir: Path, data_dir: Path, work: Path, sz: Sizes) -> dict:
    """Train a few steps of the ~2 B model; compare the planner's peak with the allocator's."""
    from vlgrpo.memory import plan, plan_input_from_config

    S = sz.memory_image
    extra = (
        ["train.backend=lora", "train.lora.rank=16"]
        if mode == "lora"
        else ["train.backend=plain", "model.gradient_checkpointing=true"]
    )
    cfg = _config(
        model_dir,
        data_dir,
        work / f"memory_{mode}",
        [
            *extra,
            f"model.dtype={sz.dtype}",
            f"model.max_pixels={S * S}",
            f"train.steps={sz.memory_steps}",
            f"train.prompts_per_step={sz.memory_prompts}",
            f"rollout.completions_per_prompt={sz.memory_completions}",
            f"train.micro_batch_completions={sz.memory_micro}",
            f"rollout.max_new_tokens={sz.memory_new_tokens}",
            "grpo.beta=0.04",
            f"rollout.vision_cache_bytes={16 * 2**20}",
            "reward.recipe={format: 1.0}",
        ],
    )
    history, text_tokens, peak = _train(cfg)
    # the allocator sees no CUDA context, NCCL buffers or slack: the planner's `overhead` term is left out
    inp = dataclasses.replace(plan_input_from_config(cfg, image_size=(S, S), text_tokens=text_tokens), overhead_bytes=0)
    planned = plan(inp)
    g, counts = planned["per_gpu"], planned["counts"]
    ratio, ok = compare(peak, g["total"])
    return {
        "mode": mode,
        "params": counts["total_params"],
        "trainable": counts["trainable_params"],
        "image_tokens": inp.image_tokens,
        "text_tokens": text_tokens,
        "response_length": _mean(history, "grpo/response_length"),
        "planned_gb": g["total"] / 1e9,
        "train_phase_gb": g["train_phase"] / 1e9,
        "rollout_phase_gb": g["rollout_phase"] / 1e9,
        "measured_gb": peak / 1e9 if peak else None,
        "ratio": ratio,
        "within": ok,
    }


def compare(measured: int, planned: int, tolerance: float = TOLERANCE) -> tuple[float | None, bool | None]:
    """(measured / planned, within tolerance); (None, None) when nothing was measured (no CUDA)."""
    if not measured:
        return None, None
    ratio = measured / planned
    return ratio, abs(ratio - 1) <= tolerance


def build_inputs(work: Path, sz: Sizes, device: str, arch: str = "qwen2_5_vl") -> dict[str, Path]:
    """The demo's tiny `arch` model and data, and the ~2 B one (random init on `device`, saved in the run dtype)."""
    from vlgrpo.data.synth import synth_dataset
    from vlgrpo.demo.run import from_scratch
    from vlgrpo.tiny import TinySpec, init_tiny

    d = from_scratch()
    S = sz.memory_image
    big = TinySpec(
        **(MEMORY_SPECS[arch] if sz.memory_spec is None else sz.memory_spec), min_pixels=28 * 28 * 4, max_pixels=S * S
    )
    synth_dataset(work / "demo_data", sz.demo_samples, d.seed, sz.demo_image, d.kinds, d.max_shapes)
    synth_dataset(work / "memory_data", 20, d.seed, S, d.kinds, d.max_shapes)
    return {
        "demo_model": init_tiny(work / "demo_model", arch, d.spec, seed=d.seed),
        "demo_data": work / "demo_data",
        "memory_data": work / "memory_data",
        "memory_model": init_tiny(work / "memory_model", arch, big, seed=0, dtype=sz.dtype, device=device),
    }


# ---------------------------------------------------------------- the report


def _f(x, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def _demo_table(demo: list[dict]) -> list[str]:
    head = [
        "| figure | " + " | ".join("LoRA (r=16)" if r["backend"] == "lora" else "full fine-tune" for r in demo) + " |",
        "|---" * (len(demo) + 1) + "|",
    ]
    rows = [
        ("steps run", "steps", "{}"),
        ("wall time of the run (s, model load included)", "wall_s", "{:.1f}"),
        ("first step (s)", "first_step_s", "{:.3f}"),
        ("seconds per step (mean of steps 2+)", "step_s", "{:.3f}"),
    ]
    lines = [f"| {label} | " + " | ".join(_f(r[k], fmt) for r in demo) + " |" for label, k, fmt in rows]
    for phase in sorted({p for r in demo for p in r["phases"]}):
        lines.append(
            f"| `{phase}` (s per step, steps 2+) | " + " | ".join(_f(r["phases"].get(phase)) for r in demo) + " |"
        )
    more = [
        ("`vision/encoder_calls` per step", "encoder_calls", "{:.2f}"),
        ("`vision/images_encoded` per step", "images_encoded", "{:.2f}"),
        ("`vision/hit_rate` (mean)", "hit_rate", "{:.2f}"),
        ("`reward/total` first → last step", None, None),
        ("peak allocated (GB)", "peak_gb", "{:.2f}"),
    ]
    for label, k, fmt in more:
        cells = [f"{_f(r['reward_first'])} → {_f(r['reward_last'])}" if k is None else _f(r[k], fmt) for r in demo]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return head + lines


def _memory_table(memory: list[dict]) -> list[str]:
    lines = [
        "| run | parameters (trainable) | tokens: image + text + completion (mean sampled) | planned peak GB "
        "(update / rollout) | measured GB | measured / planned | within 10 % |",
        "|---" * 7 + "|",
    ]
    for m in memory:
        name = "LoRA r=16, no checkpointing" if m["mode"] == "lora" else "full fine-tune, gradient checkpointing"
        within = "n/a (no CUDA)" if m["within"] is None else ("yes" if m["within"] else "**NO — planner miss**")
        lines.append(
            f"| {name} | {m['params'] / 1e9:.3f} B ({m['trainable'] / 1e6:,.1f} M) | {m['image_tokens']} + "
            f"{m['text_tokens']} + {_f(m['response_length'], '{:.0f}')} | {m['planned_gb']:.2f} "
            f"({m['train_phase_gb']:.2f} / {m['rollout_phase_gb']:.2f}) | {_f(m['measured_gb'], '{:.2f}')} | "
            f"{_f(m['ratio'])} | {within} |"
        )
    return lines


def render(
    env: dict,
    absent: list[str],
    demo: list[dict],
    memory: list[dict],
    seconds: float,
    sz: Sizes,
    arch: str = "qwen2_5_vl",
) -> str:
    """The markdown of docs/gpu-validation.md (another arch: docs/gpu-validation-<arch>.md)."""
    how = (f" --arch {arch}" if arch != "qwen2_5_vl" else "") + (
        " --dry-run (CPU, tiny sizes: not a GPU record)" if sz is DRY_RUN else ""
    )
    name = {"qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL (DeepStack on)", "qwen3_5": "Qwen3.5 (hybrid)"}[arch]
    lines = [
        "# GPU validation",
        "",
        f"Recorded by `scripts/gpu_check.sh`{how} in {seconds:.0f} s.",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines += [
        f"| optional, absent | {', '.join(absent) or 'none'} |",
        "",
        f"## GRPO on the demo task: {sz.demo_steps} steps, HF engine, {sz.dtype}",
        "",
        f"{sz.demo_prompts} prompts x {sz.demo_completions} completions per step, {sz.demo_new_tokens} new "
        f"tokens, {sz.demo_image} px images, the demo's tiny {name} (random init, no SFT: the figures are "
        "speed, not accuracy). `timing/*` and `vision/*` are the trainer's own metrics (metrics.jsonl).",
        "",
    ]
    lines += _demo_table(demo)
    lines += [
        "",
        "## Memory planner against `torch.cuda.max_memory_allocated`",
        "",
        f"A randomly initialised {name} built from a config (no download), {sz.dtype}, "
        f"{sz.memory_prompts} prompts x {sz.memory_completions} completions, micro-batch {sz.memory_micro}, "
        f"beta 0.04, {sz.memory_steps} step(s). Planned: `plan_input_from_config` of the same config with the "
        "measured prompt length, without the `overhead` term (CUDA context and slack, which the allocator does "
        f"not see). A ratio outside 1 ± {TOLERANCE:.0%} is a planner miss and is shown as one.",
        "",
    ]
    lines += _memory_table(memory)
    lines += ["", "## vLLM", "", "| figure | value |", "|---|---|"]
    for figure in (
        "rollout throughput with vLLM",
        "weight sync into vLLM (s)",
        "`rollout/logprob_abs_diff`",
        "memory planner with `rollout.engine=vllm`",
    ):
        lines.append(f"| {figure} | {NOT_CHECKABLE if 'vllm' in absent else 'not measured by this check'} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- driving


def arch_doc(arch: str) -> Path:
    """Where a GPU run of `arch` writes its record."""
    return DOC if arch == "qwen2_5_vl" else DOC.with_name(f"gpu-validation-{arch}.md")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--dry-run", action="store_true", help="the same path on the CPU at tiny sizes, fp32, no GPU figures"
    )
    p.add_argument("--arch", choices=ARCHS, default="qwen2_5_vl", help="the model family both parts run on")
    p.add_argument(
        "--out",
        help=f"markdown to write (default {DOC.relative_to(REPO)}, another arch's "
        "docs/gpu-validation-ARCH.md; dry run: WORK/gpu-validation-dry-run.md, never a docs "
        "file)",
    )
    p.add_argument("--work", default="/tmp/vlgrpo-gpu-check", help="scratch directory (emptied first)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """0: written, every figure within tolerance; 1: written, a planner miss; 2: could not run (says why)."""
    args = _args(argv)
    sz, work, doc = (DRY_RUN if args.dry_run else Sizes()), Path(args.work), arch_doc(args.arch)
    out = Path(args.out) if args.out else (work / "gpu-validation-dry-run.md" if args.dry_run else doc)
    if args.dry_run and out.resolve() in (DOC.resolve(), doc.resolve()):
        print(
            f"[gpu_check] a dry run does not overwrite {out.resolve().relative_to(REPO)}: pass another --out",
            file=sys.stderr,
        )
        return 2
    versions, missing, absent = check_imports()
    print(f"[gpu_check] found: {', '.join(f'{k} {v}' for k, v in versions.items())}")
    if absent:
        print(f"[gpu_check] optional, absent: {', '.join(f'{n} ({OPTIONAL[n]})' for n in absent)}")
    if missing:
        print(
            f"[gpu_check] cannot run: missing {', '.join(f'{n} (needed for {REQUIRED[n]})' for n in missing)}. "
            "Install them, or carry their wheels in a folder: WHEELS=folder scripts/gpu_check.sh",
            file=sys.stderr,
        )
        return 2
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("[gpu_check] no CUDA device here: run on a GPU machine, or use --dry-run on the CPU", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    paths = build_inputs(work, sz, "cpu" if args.dry_run else "cuda", args.arch)
    print(f"[gpu_check] models and data built in {time.perf_counter() - t0:.0f} s")
    demo = []
    for backend in ("lora", "full"):
        demo.append(demo_run(backend, paths["demo_model"], paths["demo_data"], work, sz))
        print(f"[gpu_check] demo task, {backend}: {demo[-1]['step_s']:.3f} s/step")
    memory = []
    for mode in ("lora", "full"):
        memory.append(memory_run(mode, paths["memory_model"], paths["memory_data"], work, sz))
        print(
            f"[gpu_check] memory, {mode}: planned {memory[-1]['planned_gb']:.2f} GB, measured "
            f"{_f(memory[-1]['measured_gb'], '{:.2f}')} GB"
        )
    text = render(environment(versions), absent, demo, memory, time.perf_counter() - t0, sz, args.arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text + f"\n[gpu_check] written to {out}")
    return 0 if all(m["within"] is not False for m in memory) else 1


if __name__ == "__main__":
    sys.exit(main())
