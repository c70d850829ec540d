"""Asynchronous rollouts, measured: the demo task and model, the same seed and optimiser steps, three ways side by side
in one run: synchronous with one torch thread, synchronous with two, and split (`rollout.placement=split`: the
trainer and a rollout worker, one thread each). Per seed: the demo's SFT cold start once (from the shipped pretrained
base, `vlgrpo demo`'s defaults), then each GRPO run from that model.

Reports steps per second (1 / the median `timing/step` after the first step, which includes the worker's start; the
median, since a stray process on the machine shows up as a few slow steps), the one-thread synchronous phase times
(medians), the ideal overlap bound `1 / max(rollout, rest of the step)` from them, each side's idle
fraction in the split run, the mean response length (the work per step: a run whose completions are shorter is
faster for a reason that is not the overlap) and held-out VQA accuracy after GRPO. The last line is one JSON object.
Each mode runs `--repeats` times per seed in mirrored order (sync1 sync2 split split sync2 sync1) and its steps are
pooled: this machine's speed drifts by up to 2x over minutes, and the mirror spreads a drift over the modes alike.

Usage: python benchmarks/bench_async.py [--seeds 0,1,2] [--grpo-steps 40] [--prompts 2] [--grpo-lr 1.5e-4] [--beta 0]
                                     [--repeats 2] [--grpo-set train.backend=lora]
The defaults are the configuration of docs/scaling-out.md: 2 prompts x 8 completions per step and no reference pass,
so that the rollout is about half of a one-thread synchronous step, at half the demo's GRPO learning rate.
Time nothing else on the machine while it runs (it needs both cores). `--from-scratch --modes sync1,split --repeats 1
--grpo-steps 400 --prompts 16 --max-new-tokens 24` compares held-out accuracy only on the earlier from-scratch demo
(`demo.run.from_scratch()`, colour questions): accuracy does not depend on timing, since the split run's staleness
pattern is fixed by max_staleness.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import torch

from vlgrpo.demo.run import (
    DemoSettings,
    build_model_and_data,
    evaluate_model,
    from_scratch,
    resolve_base,
    stage_config,
)
from vlgrpo.trainer import run_training
from vlgrpo.trainer.export import export_run
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

SETTINGS: list[str] = []
"""--set overrides, applied to the SFT and every GRPO stage (e.g. data.answer_format=think_answer grpo.beta=0)."""
GRPO_SETTINGS: list[str] = []
"""--grpo-set overrides, applied to the GRPO stages only (e.g. train.backend=lora: LoRA from the SFT model)."""
MODES = {"sync1": (1, []), "sync2": (2, []), "split": (1, ["rollout.placement=split", "rollout.max_staleness=1"])}


def grpo_run(
    s: DemoSettings, out: Path, sft_model: Path, mode: str, threads: int, extra: list[str], timings_only: bool = False
) -> dict:
    """One GRPO run from the SFT model; returns its timings and held-out accuracy (not with `timings_only`: a
    repeat, whose weights are the first run's, since every mode is deterministic)."""
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = "1"  # a split worker (spawned) takes one thread
    shutil.rmtree(out / mode, ignore_errors=True)  # a rerun measures afresh (the SFT model is kept and reused)
    cfg = stage_config(
        s,
        out,
        "grpo",
        sft_model,
        (
            *SETTINGS,
            *GRPO_SETTINGS,
            f"train.output_dir={out / mode}",
            "eval.every_steps=0",
            "logging.progress_bar=false",
            "train.save_every=0",
            *extra,
        ),
    )
    state = build_state(cfg, progress=False)
    try:
        history = Trainer(state).train()
    finally:
        state.close()
    later = history[1:]  # step 1 includes the worker's model load
    if timings_only:
        return {"later": later}
    export_run(out / mode, out / f"{mode}_model")
    torch.set_num_threads(1)  # the held-out eval is not timed: one thread, as every mode's
    result = evaluate_model(out / f"{mode}_model", cfg, out / "data" / "test.jsonl", s, ["vqa"])
    return summarise(later) | {"accuracy": result.metrics["eval/vqa/accuracy"]}


def summarise(later: list[dict]) -> dict:
    """Timings of the steps after the first (of every repeat of a mode, pooled)."""

    def mean(key: str) -> float:
        return statistics.fmean(h.get(key, 0.0) for h in later)

    step = statistics.median(h["timing/step"] for h in later)
    rollout = [h.get("timing/rollout", 0.0) for h in later]  # the trainer's own rollout (0 with split placement)
    return {
        "steps_per_s": 1 / step,
        "step_s": step,
        "rollout_s": statistics.median(rollout),
        "rest_s": statistics.median(h["timing/step"] - r for h, r in zip(later, rollout)),
        "trainer_idle": mean("timing/rollout_wait") / mean("timing/step"),
        "worker_idle": mean("timing/rollout_worker_idle") / mean("timing/step"),
        "length": mean("grpo/response_length"),
        "sync_s": statistics.median(h.get("timing/sync", 0.0) for h in later),
        "sync_mb": mean("sync/bytes") / 1e6,
        "worker_receive_s": statistics.median(h.get("timing/rollout_worker_receive", 0.0) for h in later),
        "later": later,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument(
        "--from-scratch",
        action="store_true",
        help="the earlier demo: a random tiny model, colour questions (demo.run.from_scratch())",
    )
    ap.add_argument("--grpo-steps", type=int, default=40)
    ap.add_argument("--sft-steps", type=int, help="default: the demo's")
    ap.add_argument("--completions", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per mode and seed, in mirrored order (sync1 sync2 split split sync2 sync1): the machine's "
        "speed drifts over minutes, and the mirror spreads the drift over the modes alike",
    )
    ap.add_argument(
        "--grpo-lr",
        type=float,
        help="GRPO learning rate; default 1.5e-4, the demo's (3e-4 at 2 prompts a step collapsed two of "
        "five seeds' synchronous runs within 40 steps; --from-scratch: its own, 3e-4)",
    )
    ap.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="grpo.beta (the demo's is 0.02; 0: no reference pass, so the rollout is about half a step)",
    )
    ap.add_argument("--max-new-tokens", type=int, help="default: the demo's")
    ap.add_argument("--out", default="runs/bench_async")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}; speed figures need all three")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every stage, e.g. data.answer_format=think_answer (repeatable)",
    )
    ap.add_argument(
        "--grpo-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for the GRPO stages only, e.g. train.backend=lora (repeatable)",
    )
    args = ap.parse_args()
    SETTINGS.extend([f"grpo.beta={args.beta}", *args.set])
    GRPO_SETTINGS.extend(args.grpo_set)
    rows = {}
    for seed in [int(x) for x in args.seeds.split(",")]:
        s = from_scratch() if args.from_scratch else DemoSettings()
        s = dataclasses.replace(
            s,
            seed=seed,
            sft_steps=args.sft_steps or s.sft_steps,
            grpo_steps=args.grpo_steps,
            completions_per_prompt=args.completions,
            grpo_prompts=args.prompts,
            grpo_lr=args.grpo_lr or (s.grpo_lr if args.from_scratch else 1.5e-4),
            max_new_tokens=args.max_new_tokens or s.max_new_tokens,
            val_every=0,
        )
        out = Path(args.out) / f"seed{seed}"
        torch.set_num_threads(2)
        model_dir, _ = build_model_and_data(s, out, resolve_base(s.base))
        sft_cfg = stage_config(s, out, "sft", model_dir, tuple(SETTINGS))
        if not (out / "sft_model").is_dir():
            run_training(sft_cfg)
            export_run(out / "sft", out / "sft_model")
        modes = args.modes.split(",")
        order = [m for r in range(args.repeats) for m in (modes if r % 2 == 0 else modes[::-1])]
        for mode in order:
            threads, extra = MODES[mode]
            if (seed, mode) not in rows:
                rows[(seed, mode)] = grpo_run(s, out, out / "sft_model", mode, threads, extra)
            else:  # a repeat: its steps join the first run's (the same work: every mode is deterministic)
                later = (
                    rows[(seed, mode)]["later"]
                    + grpo_run(s, out, out / "sft_model", mode, threads, extra, timings_only=True)["later"]
                )
                rows[(seed, mode)] |= summarise(later)
        for mode in modes:
            shown = {k: v for k, v in rows[(seed, mode)].items() if k != "later"}
            print(f"seed {seed} {mode}: {json.dumps(shown)}", file=sys.stderr)
    seeds = sorted({k[0] for k in rows})

    def avg(mode: str, key: str) -> float:
        return statistics.fmean(rows[(s, mode)][key] for s in seeds)

    accuracy = {mode: avg(mode, "accuracy") for mode in args.modes.split(",")}
    for mode in accuracy:
        per_seed = " / ".join(f"{rows[(s, mode)]['accuracy']:.3f}" for s in seeds)
        print(f"held-out accuracy {mode}: {per_seed} (seeds {seeds}), mean {accuracy[mode]:.3f}")
    if set(accuracy) != set(MODES):
        print(
            json.dumps(
                {f"{m}_accuracy": a for m, a in accuracy.items()}
                | {"seeds": seeds, "grpo_steps": args.grpo_steps, "settings": SETTINGS}
            )
        )
        return
    rollout, rest, step1 = avg("sync1", "rollout_s"), avg("sync1", "rest_s"), avg("sync1", "step_s")
    ideal = 1 / max(rollout, rest)
    print(
        f"{'mode':<7} {'steps/s':>8} {'step s':>7} {'trainer idle':>13} {'worker idle':>12} {'length':>7} "
        f"{'accuracy':>9}"
    )
    for mode in MODES:
        print(
            f"{mode:<7} {avg(mode, 'steps_per_s'):8.3f} {avg(mode, 'step_s'):7.3f} "
            f"{avg(mode, 'trainer_idle'):13.2f} {avg(mode, 'worker_idle'):12.2f} {avg(mode, 'length'):7.1f} "
            f"{avg(mode, 'accuracy'):9.3f}"
        )
    print(
        f"one-thread synchronous step {step1:.3f} s: rollout {rollout:.3f} s, rest {rest:.3f} s (medians); "
        f"ideal split bound {ideal:.3f} steps/s"
    )
    for seed in seeds:
        one, two, split = (rows[(seed, m)] for m in MODES)
        print(
            f"seed {seed}: split / faster synchronous = "
            f"{split['steps_per_s'] / max(one['steps_per_s'], two['steps_per_s']):.2f}x, "
            f"split / its ideal = {split['steps_per_s'] * max(one['rollout_s'], one['rest_s']):.0%}"
        )
    print(
        f"weight sync: split {avg('split', 'sync_mb'):.1f} MB a step; {avg('split', 'sync_s') * 1e3:.1f} ms in the "
        "trainer's sync phase (the plan: the buckets travel at its next collect), "
        f"{avg('split', 'worker_receive_s') * 1e3:.1f} ms receiving and loading them in the worker"
    )
    faster = max(avg("sync1", "steps_per_s"), avg("sync2", "steps_per_s"))
    print(
        f"split / faster synchronous = {avg('split', 'steps_per_s') / faster:.2f}x; split / ideal = "
        f"{avg('split', 'steps_per_s') / ideal:.0%}"
    )
    print(
        json.dumps(
            {
                "sync1_steps_per_s": avg("sync1", "steps_per_s"),
                "sync2_steps_per_s": avg("sync2", "steps_per_s"),
                "split_steps_per_s": avg("split", "steps_per_s"),
                "ideal_split_steps_per_s": ideal,
                "sync_accuracy": avg("sync1", "accuracy"),
                "split_accuracy": avg("split", "accuracy"),
                "seeds": seeds,
                "grpo_steps": args.grpo_steps,
                "settings": SETTINGS + GRPO_SETTINGS,
                "sync_s": {m: avg(m, "sync_s") for m in MODES},
                "sync_mb": {m: avg(m, "sync_mb") for m in MODES},
                "split_worker_receive_s": avg("split", "worker_receive_s"),
            }
        )
    )


if __name__ == "__main__":
    main()
