"""Load a Qwen2-VL / Qwen2.5-VL / Qwen3-VL policy and its processor through one function, and build the tiny local
model.

The tiny model (tests, demo) is a real Qwen-VL architecture with a tokenizer trained here and the real Qwen
processor classes (its parts: `vlgrpo.tiny`), saved with `save_pretrained` so it loads through the same path as a 7B
checkpoint. Knows nothing of training, rollout or rewards.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from vlgrpo.data.prompts import VISION_PLACEHOLDERS
from vlgrpo.registry import MODEL_ARCH
from vlgrpo.tiny import CHAT_TEMPLATE, TinySpec, build_tiny_tokenizer, tiny_config, tiny_processors
from vlgrpo.types import InputError

ARCHS = tuple(name for name in MODEL_ARCH.names if name != "auto")


@dataclass(frozen=True)
class ArchSpec:
    """A supported model family: its transformers model and processor classes (named, imported on use).

    The rest of the pipeline reads what differs from the model itself: the vision tower's DeepStack maps from its
    output (`vision_cache`), the patch size from the processor (`ProcessorGeometry`), `get_rope_index` and the
    attention's q/k norms from the modules (`rollout.inputs`, `rollout.decode`); the box convention is
    `rewards.boxes.ARCH_BOX_FORMAT`."""

    model_class: str
    processor_class: str


QWEN2_VL = ArchSpec("Qwen2VLForConditionalGeneration", "Qwen2VLProcessor")
QWEN2_5_VL = ArchSpec("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor")
QWEN3_VL = ArchSpec("Qwen3VLForConditionalGeneration", "Qwen3VLProcessor")


class ModelLoadError(InputError):
    """A checkpoint that cannot be loaded as a Qwen-VL policy; the message says what was found."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    processor: object
    arch: str
    path: str


def detect_arch(name_or_path: str) -> str:
    """A registered arch (qwen2_vl, qwen2_5_vl, qwen3_vl) from a local config.json's model_type (or the hub id's
    name)."""
    cfg = Path(name_or_path) / "config.json"
    if cfg.is_file():
        model_type = json.loads(cfg.read_text()).get("model_type", "")
        if model_type in ARCHS:
            return model_type
        raise ModelLoadError(f"{cfg}: model_type '{model_type}' is not supported; accepted: {', '.join(ARCHS)}")
    low = name_or_path.lower().replace(".", "_").replace("-", "_")
    named = [arch for arch in ARCHS if arch in low]  # Qwen/Qwen2.5-VL-7B-Instruct -> qwen/qwen2_5_vl_7b_instruct
    if len(named) == 1:
        return named[0]
    raise ModelLoadError(
        f"cannot tell the architecture of '{name_or_path}': no config.json there and the name names none of "
        f"{', '.join(ARCHS)}; set model.arch explicitly"
    )


def _classes(arch: str):
    """(model class, processor class) of a registered arch (vlgrpo.registry.MODEL_ARCH)."""
    import transformers as tf

    spec = MODEL_ARCH.load(arch)
    return getattr(tf, spec.model_class), getattr(tf, spec.processor_class)


def load_processor(name_or_path: str, arch: str = "auto", min_pixels: int | None = None, max_pixels: int | None = None):
    """The checkpoint's processor through the explicit Qwen class (AutoProcessor can silently return a tokenizer)."""
    arch = detect_arch(name_or_path) if arch == "auto" else arch
    _, processor_cls = _classes(arch)
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
    model_cls, _ = _classes(arch)
    model = model_cls.from_pretrained(
        name_or_path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
    ).to(device)
    processor = load_processor(name_or_path, arch, min_pixels, max_pixels)
    return LoadedModel(model=model, processor=processor, arch=arch, path=str(name_or_path))


def placeholder_token_ids(tokenizer) -> list[int]:
    """Ids of the vision placeholder tokens a policy must never sample."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in VISION_PLACEHOLDERS]
    unk = getattr(tokenizer, "unk_token_id", None)
    return sorted({i for i in ids if i is not None and i != unk})


# ---------------------------------------------------------------- the tiny local model


def init_tiny(
    out_dir: str | Path, arch: str = "qwen2_5_vl", spec: TinySpec | None = None, seed: int = 0,
    dtype: str = "float32", device: str = "cpu",
) -> Path:
    """Build a randomly initialised tiny Qwen-VL with its processor and save it as a HF checkpoint.

    `spec` can make it large too (scripts/gpu_check.py builds a ~2 B one); `device` is where the random init runs
    (a GPU initialises billions of weights in seconds) and `dtype` what is saved."""
    if arch not in ARCHS:
        raise ModelLoadError(f"--arch '{arch}' is not supported; accepted: {', '.join(ARCHS)}")
    spec = spec or TinySpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out, spec.vocab_size)
    image_processor, video_processor = tiny_processors(arch, spec)
    model_cls, processor_cls = _classes(arch)
    processor = processor_cls(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(tiny_config(arch, spec, tokenizer)).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


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


def calibrate_merger(model_dir: str | Path, images: list[str | Path], target_std: float = 0.05) -> dict[str, float]:
    """Data-dependent init of a *random* model's merger output layer (LSUV-style), saved in place.

    Over `images` (no labels), the merger's last Linear is shifted and rescaled so the image features it emits have
    mean zero and a mean per-dimension std of `target_std`. A random vision tower maps every image close to one common
    direction (two shapes scenes differ by about a third of the feature norm), so the language model first sees image
    tokens that barely vary and needs many more steps to start reading them; a pretrained checkpoint's merger is
    already aligned and never needs this. Returns the feature mean norm and std before and after.
    """
    if not images:
        raise InputError("calibrate_merger: no images given")
    from vlgrpo.data.images import load_image

    lm = load_model(str(model_dir))
    last = [m for m in lm.model.model.visual.merger.modules() if isinstance(m, torch.nn.Linear)][-1]
    outputs: list[torch.Tensor] = []
    hook = last.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach()))
    try:
        with torch.no_grad():
            for start in range(0, len(images), 32):
                batch = [load_image(p) for p in images[start : start + 32]]
                inputs = lm.processor.image_processor(images=batch, return_tensors="pt")
                lm.model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
    finally:
        hook.remove()
    feats = torch.cat(outputs).float()
    mean, std = feats.mean(0), feats.std(0).mean()
    scale = target_std / float(std)
    with torch.no_grad():
        last.weight.mul_(scale)
        last.bias.sub_(mean.to(last.bias.dtype)).mul_(scale)
    lm.model.save_pretrained(str(model_dir))
    return {"mean_norm_before": float(mean.norm()), "std_before": float(std), "std_after": target_std}
