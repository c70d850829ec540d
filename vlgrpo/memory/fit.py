"""Does a plan fit: the peak of each phase on a card of a given capacity (vLLM claims its budget up front), whether
the rollout engine can start, and a verdict with its reason on each GPU type (suggestions that make it fit: `suggest`).
"""

from __future__ import annotations

import math
from typing import Any

from vlgrpo.memory.inputs import PlanInput

GB = 10**9  # decimal gigabyte: every printed "GB"
MIB = 2**20

# Total memory nvidia-smi reports for each card (the CUDA context is counted separately as `overhead`).
GPU_TYPES: dict[str, int] = {
    "A100-40GB": 40960 * MIB,
    "A100-80GB": 81920 * MIB,
    "H100-80GB": 81559 * MIB,
    "H200-141GB": 143771 * MIB,
}


def vllm_budget(inp: PlanInput, capacity: int) -> int:
    """Bytes vLLM claims on a card of `capacity` (its weights and KV blocks must fit in them)."""
    return int(inp.vllm_gpu_memory_utilization * capacity)


def phase_peaks_on(inp: PlanInput, per_gpu: dict[str, int], capacity: int) -> dict[str, int]:
    """Peak bytes of the update and of the rollout on a card of `capacity` (split placement: the rollout's on the
    vLLM GPUs).

    vLLM takes gpu_memory_utilization x capacity up front (weights + KV blocks) whatever the batch needs; with
    sleep mode it frees that during the update, without it the budget stays taken.
    """
    update, rollout = per_gpu["train_phase"], per_gpu["rollout_phase"]
    if inp.engine != "vllm":
        return {"update": update, "rollout": rollout}
    budget = vllm_budget(inp, capacity)
    if inp.vllm_placement == "split":
        return {"update": update, "rollout": per_gpu["overhead"] + budget}
    resident = rollout - per_gpu["rollout_weights"] - per_gpu["kv_cache"]
    return {"update": update + (0 if inp.vllm_sleep else budget), "rollout": resident + budget}


def peak_on(inp: PlanInput, per_gpu: dict[str, int], capacity: int) -> tuple[int, bool, list[str]]:
    """Peak bytes on a card of `capacity` (the larger phase), whether the rollout engine can start, and warnings."""
    peak = max(phase_peaks_on(inp, per_gpu, capacity).values())
    if inp.engine != "vllm":
        return peak, True, []
    budget = vllm_budget(inp, capacity)
    weights, kv = per_gpu["rollout_weights"], per_gpu["kv_cache"]
    warnings, startable = [], weights < budget
    if not startable:
        warnings.append(
            f"vLLM weights ({weights / GB:.1f} GB) exceed its budget ({budget / GB:.1f} GB): raise "
            f"rollout.vllm.gpu_memory_utilization above {weights / capacity:.2f}"
        )
    elif weights + kv > budget:
        u = math.ceil((weights + kv) / capacity * 20) / 20
        fix = f"rollout.vllm.gpu_memory_utilization={u:.2f} would hold them all" if u <= 1 else "lower B or G"
        warnings.append(
            f"KV cache of every sequence needs {kv / GB:.1f} GB, vLLM's budget leaves "
            f"{(budget - weights) / GB:.1f} GB: it will run fewer sequences at once (slower, not OOM); " + fix
        )
    return peak, startable, warnings


def verdict_reason(inp: PlanInput, per_gpu: dict[str, int], capacity: int) -> tuple[str, str]:
    """(the phase that peaks, why the run fits or not) on a card of `capacity`, with the numbers compared: the
    larger phase peak against the whole capacity (no margin), and vLLM's weights against its budget."""
    phases = phase_peaks_on(inp, per_gpu, capacity)
    phase = max(phases, key=phases.__getitem__)
    peak = phases[phase]
    over = [] if peak <= capacity else [f"{phase} peak {peak / GB:.2f} GB > {capacity / GB:.2f} GB capacity"]
    weights, budget = per_gpu["rollout_weights"], vllm_budget(inp, capacity)
    if inp.engine == "vllm" and weights >= budget:  # peak_on's startable test
        sign = ">" if weights > budget else ">="
        over.append(
            f"vLLM weights {weights / GB:.2f} GB {sign} its budget {budget / GB:.2f} GB "
            f"(gpu_memory_utilization {inp.vllm_gpu_memory_utilization} x {capacity / GB:.2f} GB): "
            "the engine cannot start"
        )
    return phase, "; ".join(over) or f"{phase} peak {peak / GB:.2f} GB <= {capacity / GB:.2f} GB capacity"


def verdicts(inp: PlanInput, per_gpu: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Fit, headroom (capacity - peak), the phase that peaks and the reason, on each GPU type."""
    out = {}
    for name, capacity in GPU_TYPES.items():
        peak, startable, warnings = peak_on(inp, per_gpu, capacity)
        phase, reason = verdict_reason(inp, per_gpu, capacity)
        out[name] = {
            "fits": peak <= capacity and startable,
            "headroom_bytes": capacity - peak,
            "capacity_bytes": capacity,
            "peak_bytes": peak,
            "peak_phase": phase,
            "reason": reason,
            "warnings": warnings,
        }
    return out
