"""How a LoRA run's policy reaches a rollout engine that holds its own weights: the adapter alone or the merged
model, decided once from the config and the model's arch (the trainer, the vLLM engine and the planner ask here).
"""

from __future__ import annotations

from typing import Any

from vlgrpo.families import FAMILIES


def sync_mode(cfg: Any, arch: str | None) -> tuple[bool, str]:
    """(whether the policy reaches the engine as its LoRA adapter alone, why it does or why the merged weights go
    instead): the LoRA backend, vLLM, no adapter on the vision tower (vLLM would leave it out), and
    rollout.vllm.adapter_sync true, or null (the default) on an arch whose adapter vLLM has been shown to serve
    (`Family.vllm_lora`: a test measures the engine/trainer log-prob gap, `test_vllm_train.py`). `arch`: the model's
    (None: not known, so the adapter-only sync is not assumed)."""
    if not (cfg.train.stage == "grpo" and cfg.train.backend == "lora"):
        return False, "no LoRA adapter"
    if cfg.rollout.engine != "vllm":
        return False, "the hf engine in a split worker holds a plain model"
    if any(t.startswith("visual.") for t in cfg.train.lora.target_modules):
        return False, "vLLM leaves adapters on the vision tower out"
    wanted = cfg.rollout.vllm.adapter_sync
    if wanted is not None:
        return wanted, f"rollout.vllm.adapter_sync is {str(wanted).lower()}"
    if arch is None:
        return False, "rollout.vllm.adapter_sync null and the arch unknown: the adapter-only sync is not assumed"
    if FAMILIES[arch].vllm_lora:
        return True, f"vLLM serves {arch}'s LoRA adapter (measured)"
    return (
        False,
        f"rollout.vllm.adapter_sync null: vLLM serving {arch}'s LoRA adapter is not shown (set it true to try)",
    )
