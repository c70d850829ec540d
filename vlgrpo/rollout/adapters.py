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

from vlgrpo.config.sync import sync_mode as config_sync_mode
from vlgrpo.rollout.base import Adapter, staleness

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts."""


def adapter_sync(cfg) -> bool:
    """Whether the policy reaches the engine as a LoRA adapter alone (`sync_mode`)."""
    return sync_mode(cfg)[0]


def sync_mode(cfg) -> tuple[bool, str]:
    """`config.sync.sync_mode` for the run's model, its arch read from the checkpoint when model.arch is auto."""
    from vlgrpo.models import detect_arch

    lora_on_vllm = (
        cfg.train.backend == "lora" and cfg.rollout.engine == "vllm" and cfg.rollout.vllm.adapter_sync is None
    )
    arch = cfg.model.arch
    if arch == "auto":
        arch = detect_arch(cfg.model.name_or_path) if lora_on_vllm else None
    return config_sync_mode(cfg, arch)


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
