"""What identifies vision features besides the image: the vision tower (its class, config and weights) and the image
processor's settings. The cache's key is (image sha256, these fingerprints); the backends fingerprint their tower here
too (ZeRO-3 with its gather). Knows the model only through its `visual` module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json

import torch

from vlgrpo.data.images import ProcessorGeometry


def find_visual(model: torch.nn.Module) -> torch.nn.Module:
    """The vision tower (`visual`, mergers inside) of a Qwen2-VL / 2.5-VL / 3-VL model, bare or wrapped (peft, DDP)."""
    for path in ("model.visual", "visual", "base_model.model.model.visual", "module.model.visual"):
        obj = model
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.Module):
            return obj
    candidates = [(n, m) for n, m in model.named_modules() if n.split(".")[-1] == "visual"]
    if candidates:
        return min(candidates, key=lambda nm: len(nm[0]))[1]
    raise ValueError(f"{type(model).__name__} has no `visual` module: expected a Qwen2-VL / 2.5-VL / 3-VL model")


def vision_fingerprint(model: torch.nn.Module, gather=None) -> str:
    """sha256 over the vision tower's class and config (arch, DeepStack layers, windows: what shapes the features
    besides the weights) and the names, dtypes, shapes and bytes of its parameters and buffers (16 hex chars).

    `gather(params)`: a context manager that makes partitioned parameters whole (ZeRO-3 backends pass theirs).
    """
    visual = find_visual(model)
    h = hashlib.sha256()
    h.update(f"{type(visual).__name__}|{_vision_config(visual)}|".encode())
    with gather(list(visual.parameters())) if gather is not None else contextlib.nullcontext():
        for name, t in sorted(visual.state_dict(keep_vars=True).items()):
            if gather is None and (hasattr(t, "ds_numel") or hasattr(t, "ds_id")):
                raise ValueError(
                    f"vision parameter '{name}' is partitioned (DeepSpeed ZeRO-3): pass gather= (a context manager "
                    "that gathers parameters) or a precomputed VisionCache(fingerprint=...)"
                )
            t = t.detach()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _vision_config(visual: torch.nn.Module) -> str:
    """The tower's own config as sorted JSON, without the generic keys every transformers config carries (version,
    dtype, label maps, output switches) and private ones (attention implementation)."""
    config = getattr(visual, "config", None)
    if config is None:
        return ""
    from transformers import PretrainedConfig

    generic = set(PretrainedConfig().to_dict()) - {"model_type"}
    own = {k: v for k, v in config.to_dict().items() if k not in generic and not k.startswith("_")}
    return json.dumps(own, sort_keys=True, default=str)


def processor_fingerprint(processor) -> str:
    """Hash of every image-processor setting that changes the features: geometry, normalisation, resampling. Given
    a video processor, its normalisation (video keys add it: frames are resized before it sees them)."""
    ip = getattr(processor, "image_processor", processor)
    extra = {
        k: _jsonable(getattr(ip, k, None))
        for k in (
            "image_mean",
            "image_std",
            "rescale_factor",
            "do_rescale",
            "do_normalize",
            "do_convert_rgb",
            "resample",
        )
    }
    blob = json.dumps({"geometry": ProcessorGeometry.from_processor(processor).fingerprint(), **extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [float(x) for x in v]
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
