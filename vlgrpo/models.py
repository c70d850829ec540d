"""Load a Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 policy and its processor through one function.

What a real checkpoint needs: the supported archs (`ARCHS`; their classes are named in `vlgrpo.families`), telling a
checkpoint's arch, loading its processor and model, the vision placeholders a policy must never sample, eval mode and
parameter counts. The tiny local model (tests, demo) is built in `vlgrpo.tiny` and loads through this same path as a
7B checkpoint. Knows nothing of training, rollout, rewards or the tiny model.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vlgrpo.data.prompts import VISION_PLACEHOLDERS
from vlgrpo.families import FAMILIES, arch_by_name, family
from vlgrpo.registry import MODEL_ARCH
from vlgrpo.types import InputError

ARCHS = tuple(name for name in MODEL_ARCH.names if name != "auto")

# What the registry's model.arch lines load (vlgrpo.registry.MODEL_ARCH): each arch's row of the family table, which
# names its transformers model and processor classes. The rest of the pipeline reads what differs from the model
# itself (DeepStack maps, `get_rope_index`, q/k norms) or from the same table (box convention, geometry, video).
QWEN2_VL = FAMILIES["qwen2_vl"]
QWEN2_5_VL = FAMILIES["qwen2_5_vl"]
QWEN3_VL = FAMILIES["qwen3_vl"]
QWEN3_5 = FAMILIES["qwen3_5"]
QWEN3_VL_MOE = FAMILIES["qwen3_vl_moe"]
QWEN3_5_MOE = FAMILIES["qwen3_5_moe"]


class ModelLoadError(InputError):
    """A checkpoint that cannot be loaded as a Qwen-VL policy; the message says what was found."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    processor: object
    arch: str
    path: str


def detect_arch(name_or_path: str) -> str:
    """A registered arch (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5 and the MoE qwen3_vl_moe, qwen3_5_moe) from a local
    config.json's model_type, else from the hub id's name (`vlgrpo.families.arch_by_name`)."""
    cfg = Path(name_or_path) / "config.json"
    if cfg.is_file():
        model_type = json.loads(cfg.read_text()).get("model_type", "")
        if model_type in ARCHS:
            return model_type
        raise ModelLoadError(f"{cfg}: model_type '{model_type}' is not supported; accepted: {', '.join(ARCHS)}")
    arch = arch_by_name(name_or_path)  # Qwen/Qwen2.5-VL-7B-Instruct -> qwen2_5_vl, Qwen/Qwen3.5-35B-A3B -> qwen3_5_moe
    if arch is not None:
        return arch
    raise ModelLoadError(
        f"cannot tell the architecture of '{name_or_path}': no config.json there and the name names none of "
        f"{', '.join(ARCHS)}; set model.arch explicitly"
    )


def arch_classes(arch: str):
    """The transformers (model class, processor class) of a registered arch (vlgrpo.registry.MODEL_ARCH)."""
    import transformers as tf

    row = MODEL_ARCH.load(arch)  # its vlgrpo.families.Family
    return getattr(tf, row.model_class), getattr(tf, row.processor_class)


def load_processor(name_or_path: str, arch: str = "auto", min_pixels: int | None = None, max_pixels: int | None = None):
    """The checkpoint's processor through the explicit Qwen class (AutoProcessor can silently return a tokenizer)."""
    arch = detect_arch(name_or_path) if arch == "auto" else arch
    _, processor_cls = arch_classes(arch)
    processor = processor_cls.from_pretrained(name_or_path)
    ip = processor.image_processor
    if min_pixels is not None or max_pixels is not None:
        ip.size = {
            "shortest_edge": int(min_pixels if min_pixels is not None else ip.size["shortest_edge"]),
            "longest_edge": int(max_pixels if max_pixels is not None else ip.size["longest_edge"]),
        }
        if ip.size["shortest_edge"] > ip.size["longest_edge"]:
            raise ModelLoadError(f"model.min_pixels ({min_pixels}) must not exceed model.max_pixels ({max_pixels})")
    return processor


def load_model(
    name_or_path: str,
    arch: str = "auto",
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Policy + processor from a local directory or hub id; the same path for the tiny model and a 7B."""
    arch = detect_arch(name_or_path) if arch == "auto" else arch
    if arch not in ARCHS:
        raise ModelLoadError(f"model.arch '{arch}' is not supported; accepted: auto, {', '.join(ARCHS)}")
    if dtype == "float16" and family(arch).hybrid_attention:
        raise ModelLoadError(
            f"model.dtype=float16 with {arch} ({name_or_path}): its Gated DeltaNet layers overflow in fp16 (NaN "
            "gradient norms, the decay's exp and the recurrent state); use model.dtype=bfloat16 (or float32)"
        )
    model_cls, _ = arch_classes(arch)
    model = model_cls.from_pretrained(
        name_or_path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
    ).to(device)
    patches_as_products(model)
    processor = load_processor(name_or_path, arch, min_pixels, max_pixels)
    return LoadedModel(model=model, processor=processor, arch=arch, path=str(name_or_path))


def patches_as_products(model: torch.nn.Module) -> int:
    """Run each patch-embedding convolution of the vision tower (a Conv3d whose stride is its kernel, applied to
    inputs of exactly one patch: Qwen-VL's [patches, 3, 2, 14 or 16, 14 or 16]) as the matrix product it is, [patches,
    3 x 2 x p x p] @ its weight flattened: the same sums in another order (1e-7 apart in fp32); the tiny Qwen2.5-VL's
    tower on two 448 px images 46.7 -> 41.6 ms on one CPU thread (the convolution alone ran at 25 GFLOP/s). Its weight
    and state dict are the convolution's; inputs of another shape run the convolution. -> how many were replaced."""
    count = 0
    for module in model.modules():
        if (
            isinstance(module, torch.nn.Conv3d)
            and tuple(module.stride) == tuple(module.kernel_size)
            and module.padding in ((0, 0, 0), "valid")
            and tuple(module.dilation) == (1, 1, 1)
            and module.groups == 1
            and "forward" not in module.__dict__
        ):
            module.forward = functools.partial(_patch_product, module)
            count += 1
    return count


def _patch_product(conv: torch.nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    if tuple(x.shape[2:]) != tuple(conv.kernel_size):
        return conv._conv_forward(x, conv.weight, conv.bias)
    out = F.linear(x.reshape(x.shape[0], -1), conv.weight.reshape(conv.out_channels, -1), conv.bias)
    return out.view(x.shape[0], conv.out_channels, 1, 1, 1)


def placeholder_token_ids(tokenizer) -> list[int]:
    """Ids of the vision placeholder tokens a policy must never sample."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in VISION_PLACEHOLDERS]
    unk = getattr(tokenizer, "unk_token_id", None)
    return sorted({i for i in ids if i is not None and i != unk})


@contextmanager
def eval_mode(model: torch.nn.Module):
    """Eval mode (dropout off) for a no-grad pass, the previous mode restored afterwards: the trainer's old and
    reference log-probs, the HF engine's decoding and the in-loop eval. Eval mode also keeps the KV cache and the
    shared-prefix forward, which gradient checkpointing in train mode would silently drop."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def is_visual(name: str) -> bool:
    """True for a parameter of the vision tower (merger included) of a Qwen-VL, under any wrapper's prefix."""
    return ".visual." in f".{name}"


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Parameter counts of the vision tower (merger included) and the rest."""
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if is_visual(n))
    return {"total": total, "vision": vision, "language": total - vision}
