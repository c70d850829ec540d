"""LoRA adapters for an engine that applies them itself (vLLM): when the policy travels as its adapter alone
(`adapter_sync`), the engine's LoRA settings, and where each version lives (a directory in PEFT's form,
adapter_config.json and adapter_model.safetensors, one per policy version under a temporary root). Imports no engine.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

from vlgrpo.rollout.base import Adapter, staleness

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts."""


def adapter_sync(cfg) -> bool:
    """Whether the policy reaches the engine as a LoRA adapter alone (`sync_mode`)."""
    return sync_mode(cfg)[0]


def sync_mode(cfg) -> tuple[bool, str]:
    """(whether a LoRA run's policy reaches the engine as its adapter alone, why it does or why the merged weights
    go instead): the LoRA backend, vLLM, no adapter on the vision tower (vLLM would leave it out), and
    rollout.vllm.adapter_sync true, or null (the default) on an arch whose adapter vLLM has been shown to serve
    (`Family.vllm_lora`: a test measures the engine/trainer log-prob gap, `test_vllm_train.py`)."""
    from vlgrpo.families import FAMILIES
    from vlgrpo.models import detect_arch

    if not (cfg.train.stage == "grpo" and cfg.train.backend == "lora"):
        return False, "no LoRA adapter"
    if cfg.rollout.engine != "vllm":
        return False, "the hf engine in a split worker holds a plain model"
    if any(t.startswith("visual.") for t in cfg.train.lora.target_modules):
        return False, "vLLM leaves adapters on the vision tower out"
    wanted = cfg.rollout.vllm.adapter_sync
    if wanted is not None:
        return wanted, f"rollout.vllm.adapter_sync is {str(wanted).lower()}"
    arch = detect_arch(cfg.model.name_or_path) if cfg.model.arch == "auto" else cfg.model.arch
    if FAMILIES[arch].vllm_lora:
        return True, f"vLLM serves {arch}'s LoRA adapter (measured)"
    return False, (
        f"rollout.vllm.adapter_sync null: vLLM serving {arch}'s LoRA adapter is not shown (set it true to try)"
    )


def engine_lora_kwargs(cfg) -> dict:
    """vLLM's LoRA arguments for a run with `adapter_sync` ({} otherwise): `max_loras` = max_staleness + 1, so the
    groups of older versions in flight finish on their own adapter; `max_lora_rank` the next rank vLLM accepts."""
    if not adapter_sync(cfg):
        return {}
    rank = next((r for r in LORA_RANKS if r >= cfg.train.lora.rank), cfg.train.lora.rank)
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": staleness(cfg) + 1}


class AdapterVersions:
    """The directories of the newest `keep` adapter versions (older ones are no longer in use); the root goes when the
    process exits."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._root: str | None = None
        self._dirs: list[str] = []

    def write(self, adapter: Adapter, version: int) -> str:
        """Version `version` of the adapter in PEFT's form; returns its directory."""
        from safetensors.torch import save_file

        if self._root is None:
            self._root = tempfile.mkdtemp(prefix="vlgrpo-adapters-")
            atexit.register(shutil.rmtree, self._root, True)
        path = os.path.join(self._root, f"v{version}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump(adapter.config, f)
        save_file(adapter.tensors, os.path.join(path, "adapter_model.safetensors"))
        self._dirs.append(path)
        while len(self._dirs) > self.keep:
            shutil.rmtree(self._dirs.pop(0), ignore_errors=True)
        return path
