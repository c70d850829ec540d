"""Suggestions of `vlgrpo plan`: single config changes that lower the per-GPU peak, then a greedy combination.

Every suggestion is a list of `key=value` config overrides that the trainer runs: applied to the run config they give
exactly the input that was planned. A run with a DeepSpeed JSON (train.zero3.deepspeed_config) takes offload from that
file and ignores train.zero3.offload_*, so there offload is suggested as an edit of the file (`DEEPSPEED_JSON`).
Pure arithmetic on `PlanInput`s, like the planner; no torch, no config tree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlgrpo.memory.fit import GPU_TYPES, peak_on
from vlgrpo.memory.inputs import PlanInput, train_gpus
from vlgrpo.memory.planner import plan
from vlgrpo.memory.specs import PlanError
from vlgrpo.memory.terms import trainer_optimizer_states

Candidate = tuple[tuple[str, ...], PlanInput]

DEEPSPEED_JSON = "train.zero3.deepspeed_config:"
"""Prefix of a change that edits the DeepSpeed JSON instead of a config key: `<prefix><dotted JSON key>=<value>`.
Under the train.zero3 prefix, so `merge_overrides` drops it with the other train.zero3 keys when the backend changes."""


def offload_change(inp: PlanInput, target: str) -> tuple[str, ...]:
    """Offload `target` (optimizer or param) the way the trainer reads it: in the DeepSpeed JSON when the run has one,
    else with train.zero3.offload_<target>=true."""
    if inp.deepspeed_config:
        return (f"{DEEPSPEED_JSON}zero_optimization.offload_{target}.device=cpu",)
    return (f"train.zero3.offload_{target}=true",)


def not_run_by_trainer(inp: PlanInput) -> list[str]:
    """What in the planned input itself the trainer does not run (the `vlgrpo plan` flags that exist for comparison)."""
    notes = []
    if inp.zero_stage in (1, 2):
        notes.append(
            f"ZeRO-{inp.zero_stage} is planned for comparison: the trainer runs ZeRO-0 (train.backend=plain "
            "or lora) and ZeRO-3 (train.backend=zero3)"
        )
    if inp.lora_rank and inp.zero_stage == 3:
        notes.append("LoRA with ZeRO-3 is planned for comparison: train.backend is either lora or zero3")
    no_offload = {"reference", "reward"} | ({"optimizer"} if inp.zero_stage != 3 else set())
    if inp.offload & no_offload:
        notes.append(
            f"--offload {','.join(sorted(inp.offload & no_offload))} is planned for comparison: the trainer "
            "offloads only with train.backend=zero3 (train.zero3.offload_optimizer / offload_param)"
        )
    if inp.engine == "vllm" and inp.vllm_placement == "split" and inp.rollout_gpus != train_gpus(inp):
        notes.append(
            f"rollout.placement=split with {inp.rollout_gpus} vLLM GPU(s) for {train_gpus(inp)} training "
            "GPU(s) is planned for comparison: the trainer runs one vLLM engine per training rank, on a GPU "
            "of its own (rollout.vllm.rollout_gpus = half of train.num_gpus)"
        )
    return notes


def candidates(inp: PlanInput) -> list[Candidate]:
    """Single changes that lower the peak, cheapest in speed first: (config overrides and `DEEPSPEED_JSON` edits,
    changed input)."""
    rep, c = dataclasses.replace, []
    if not inp.gradient_checkpointing and inp.spec is not None:
        c.append((("model.gradient_checkpointing=true",), rep(inp, gradient_checkpointing=True)))
    if inp.micro_batch > 1 and inp.micro_batch % 2 == 0:
        half = inp.micro_batch // 2
        c.append(((f"train.micro_batch_completions={half}",), rep(inp, micro_batch=half)))
    full = not inp.lora_rank  # the trainer has no LoRA + ZeRO-3 backend: ZeRO-3 means a full fine-tune
    zero3 = {"zero_stage": 3, "optimizer_states": trainer_optimizer_states("zero3", inp.dtype_bytes)}
    if full and inp.zero_stage != 3:
        if train_gpus(inp) > 1:
            c.append((("train.backend=zero3",), rep(inp, **zero3)))
        # ZeRO-Offload: optimiser states in CPU memory, on any number of GPUs (train.backend=zero3 is the only
        # backend that offloads)
        c.append(
            (
                ("train.backend=zero3", *offload_change(inp, "optimizer")),
                rep(inp, **zero3, offload=inp.offload | {"optimizer"}),
            )
        )
    if full and inp.spec is not None:
        c.append(
            (
                ("train.backend=lora", "train.lora.rank=16"),
                rep(
                    inp,
                    lora_rank=16,
                    zero_stage=0,
                    offload=inp.offload - {"optimizer", "param"},
                    optimizer_states=trainer_optimizer_states("lora", inp.dtype_bytes),
                ),
            )
        )
    for target in ("optimizer", "param"):
        if inp.zero_stage == 3 and target not in inp.offload:
            c.append((offload_change(inp, target), rep(inp, offload=inp.offload | {target})))
    if inp.engine == "vllm" and inp.vllm_placement == "colocate" and inp.num_gpus % 2 == 0 and inp.tensor_parallel == 1:
        r = inp.num_gpus // 2  # the split the trainer runs: one vLLM GPU (one engine) per training rank
        c.append(
            (
                ("rollout.placement=split", f"rollout.vllm.rollout_gpus={r}"),
                rep(inp, vllm_placement="split", rollout_gpus=r),
            )
        )
    return c


def merge_overrides(steps: list[tuple[str, ...]]) -> tuple[str, ...]:
    """Overrides of several changes in order (a later value of a key replaces an earlier one); keys of a backend
    section (`train.lora.*`, `train.zero3.*`) are dropped when the final train.backend is another one."""
    merged: dict[str, str] = {}
    for overrides in steps:
        for item in overrides:
            key, value = item.split("=", 1)
            merged.pop(key, None)  # re-insert: the dict keeps the order of the latest change
            merged[key] = value
    backend = merged.get("train.backend")
    if backend is not None:
        merged = {
            k: v
            for k, v in merged.items()
            if not k.startswith(("train.lora.", "train.zero3.")) or k.startswith(f"train.{backend}.")
        }
    return tuple(f"{k}={v}" for k, v in merged.items())


def _entry(
    changes: tuple[str, ...], peak: int, cap: int, gpu_type: str, deepspeed_config: str | None
) -> dict[str, Any]:
    """One suggestion: config overrides, edits of the DeepSpeed JSON (dotted key -> value), and both in words."""
    overrides = [c for c in changes if not c.startswith(DEEPSPEED_JSON)]
    edits = dict(c.removeprefix(DEEPSPEED_JSON).split("=", 1) for c in changes if c.startswith(DEEPSPEED_JSON))
    words = " ".join(overrides)
    if edits:  # e.g. in configs/ds_zero3_bf16.json set zero_optimization.offload_optimizer.device to "cpu"
        in_json = f"in {deepspeed_config} set " + ", ".join(f'{k} to "{v}"' for k, v in edits.items())
        words = f"{words} + {in_json}" if words else in_json
    return {
        "change": words or "nothing helps enough",
        "overrides": overrides,
        "deepspeed_json": {"file": deepspeed_config, "set": edits} if edits else None,
        "peak_bytes": peak,
        "fits": peak <= cap,
        "gpu_type": gpu_type,
    }


def suggestions(inp: PlanInput, gpu_type: str) -> list[dict[str, Any]]:
    """When the plan does not fit `gpu_type`: each single change with its new peak, then (when none of them fits) a
    greedy combination of changes, each time the one that lowers the peak most."""
    if gpu_type not in GPU_TYPES:
        raise PlanError(f"GPU type {gpu_type!r}; accepted: {', '.join(GPU_TYPES)}")
    cap = GPU_TYPES[gpu_type]

    def peak(x: PlanInput) -> int:
        p, startable, _ = peak_on(x, plan(x)["per_gpu"], cap)
        return p if startable else cap + p  # an engine that cannot start never fits

    if peak(inp) <= cap:
        return []
    out = [_entry(changes, peak(alt), cap, gpu_type, inp.deepspeed_config) for changes, alt in candidates(inp)]
    if any(o["fits"] for o in out):
        return out
    steps: list[tuple[str, ...]] = []
    current = inp
    while peak(current) > cap:
        options = [(peak(alt), o, alt) for o, alt in candidates(current)]
        best = min(options, key=lambda o: o[0], default=None)
        if best is None or best[0] >= peak(current):
            break
        steps.append(best[1])
        current = best[2]
    out.append(_entry(merge_overrides(steps), peak(current), cap, gpu_type, inp.deepspeed_config))
    return out
