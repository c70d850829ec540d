"""Whether a run's update takes the rollout's prompt prefill with its graph (`policy.kept_prefill`), decided once from
the config (the trainer and the planner ask here).
"""

from __future__ import annotations

from typing import Any


def prefill_once(cfg: Any, device_type: str = "cuda") -> tuple[bool, str]:
    """(whether it does, why or why not) for a run training on `device_type`. It can when the update's weights are
    the ones the rollout prefilled with and its prompt pass would be the same computation: the colocated HF engine
    shares the trainer's module, one update pass per batch (grpo.num_iterations 1: the weights move only after it),
    the whole module in this process (plain or lora: ZeRO-3 gathers the weights only around the rollout), no
    gradient checkpointing (the update then runs whole rows), a frozen tower (a trainable one is re-encoded with
    autograd for the update) and no tools (a multi-turn rollout prefills turn by turn). train.prefill_once auto
    takes it on the CPU only: it holds the step's prompt activations from the prefill through the decode, which on a
    GPU at 7B is tens of GB (`vlgrpo plan` counts it with on)."""
    t, r, m = cfg.train, cfg.rollout, cfg.model
    if t.prefill_once == "off":
        return False, "train.prefill_once is off"
    if t.prefill_once == "auto" and device_type != "cpu":
        return False, "train.prefill_once auto keeps it to the CPU (the prompts' activations held through the decode)"
    trainable_tower = (
        any(name.startswith("visual.") for name in t.lora.target_modules)
        if t.backend == "lora"
        else not (m.freeze_vision and m.freeze_merger)
    )
    why_not = [
        (t.stage != "grpo", f"train.stage {t.stage}"),
        (r.engine != "hf", f"rollout.engine {r.engine} holds its own weights"),
        (r.placement == "split", "rollout.placement split samples in another process"),
        (bool(r.tools), "rollout.tools: the rollout prefills turn by turn"),
        (cfg.grpo.num_iterations != 1, "grpo.num_iterations > 1: the weights move between the update's passes"),
        (t.backend not in ("plain", "lora"), f"train.backend {t.backend} gathers the weights only for the rollout"),
        (m.gradient_checkpointing, "model.gradient_checkpointing: the update runs whole rows"),
        (trainable_tower, "a trainable vision tower: the update re-encodes the images with autograd"),
    ]
    for failed, why in why_not:
        if failed:
            return False, why
    return True, "the update's prompt pass is the rollout's prefill"
