"""The DeepSpeed JSON of a zero3 run (train.zero3.deepspeed_config), read as the trainer reads it: what it offloads
and the settings in it that the plan does not follow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlgrpo.config import Config
from vlgrpo.memory.specs import PlanError


def read_deepspeed_json(path: str) -> dict[str, Any]:
    """The DeepSpeed JSON of train.zero3.deepspeed_config, read from the current directory as the trainer does."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(
            f"train.zero3.deepspeed_config: cannot read '{path}' ({e}); a relative path is read from the "
            "current directory, as the trainer does"
        ) from None


def deepspeed_offload(ds: dict[str, Any]) -> frozenset[str]:
    """What a DeepSpeed JSON offloads: zero_optimization.offload_optimizer / offload_param with a device other than
    none (cpu, or nvme: planned as CPU memory)."""
    zero = ds.get("zero_optimization") or {}
    return frozenset(
        t
        for t in ("optimizer", "param")
        if str((zero.get(f"offload_{t}") or {}).get("device", "none")).lower() != "none"
    )


def zero3_offload(cfg: Config) -> frozenset[str]:
    """What the zero3 backend offloads: the DeepSpeed JSON's settings when train.zero3.deepspeed_config names one
    (`trainer.zero3.ds_config` then ignores train.zero3.offload_*), else those two keys."""
    z = cfg.train.zero3
    if z.deepspeed_config:
        return deepspeed_offload(read_deepspeed_json(z.deepspeed_config))
    return frozenset(t for t, on in (("optimizer", z.offload_optimizer), ("param", z.offload_param)) if on)


def config_notes(cfg: Config) -> list[str]:
    """JSON settings of a zero3 run's DeepSpeed file that the plan does not follow. (train.zero3.offload_* beside
    that file is a config error: `config/load.py` refuses it, since the file is what DeepSpeed runs.)"""
    t = cfg.train
    path = t.zero3.deepspeed_config
    if t.backend != "zero3" or not path:
        return []
    ds = read_deepspeed_json(path)
    notes = []
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage != 3:
        notes.append(
            f"{path} sets zero_optimization.stage={stage}: the zero3 backend is built for stage 3, which is "
            "what is planned; set it to 3"
        )
    precision = [
        name for key, name in (("bf16", "bfloat16"), ("fp16", "float16")) if (ds.get(key) or {}).get("enabled")
    ]
    if precision and precision[0] != cfg.model.dtype:
        notes.append(
            f"{path} enables {precision[0]} but model.dtype={cfg.model.dtype}: DeepSpeed computes in "
            f"{precision[0]}, the plan uses model.dtype; make the two agree"
        )
    return notes
