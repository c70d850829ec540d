"""Load a Qwen2-VL / Qwen2.5-VL policy and its processor through one function, and build the tiny local model.

The tiny model (tests, demo) is a real Qwen-VL architecture with a tokenizer trained here and the real Qwen
processor classes, saved with `save_pretrained` so it loads through the same path as a 7B checkpoint.
Knows nothing of training, rollout or rewards.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from vlgrpo.data.prompts import SPECIAL_TOKENS, VISION_PLACEHOLDERS
from vlgrpo.registry import MODEL_ARCH
from vlgrpo.types import InputError

ARCHS = tuple(name for name in MODEL_ARCH.names if name != "auto")


@dataclass(frozen=True)
class ArchSpec:
    """A supported model family: its transformers model and processor classes (named, imported on use)."""

    model_class: str
    processor_class: str


QWEN2_VL = ArchSpec("Qwen2VLForConditionalGeneration", "Qwen2VLProcessor")
QWEN2_5_VL = ArchSpec("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor")

# Qwen2-VL/2.5-VL chat template (images as <|vision_start|><|image_pad|><|vision_end|>, default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ModelLoadError(InputError):
    """A checkpoint that cannot be loaded as a Qwen-VL policy; the message says what was found."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    processor: object
    arch: str
    path: str


def detect_arch(name_or_path: str) -> str:
    """qwen2_vl or qwen2_5_vl from a local config.json's model_type (or the hub id's name)."""
    cfg = Path(name_or_path) / "config.json"
    if cfg.is_file():
        model_type = json.loads(cfg.read_text()).get("model_type", "")
        if model_type in ARCHS:
            return model_type
        raise ModelLoadError(f"{cfg}: model_type '{model_type}' is not supported; accepted: {', '.join(ARCHS)}")
    low = name_or_path.lower().replace(".", "_").replace("-", "_")
    if "qwen2_5_vl" in low:
        return "qwen2_5_vl"
    if "qwen2_vl" in low:
        return "qwen2_vl"
    raise ModelLoadError(
        f"cannot tell the architecture of '{name_or_path}': no config.json there and the name names neither "
        f"Qwen2-VL nor Qwen2.5-VL; set model.arch explicitly ({', '.join(ARCHS)})"
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


def _tokenizer_corpus() -> list[str]:
    """Text the tiny BPE is trained on: the shapes task's words, digits, JSON boxes and the answer format."""
    from vlgrpo.data.synth import COLOURS, SHAPES

    words = [*COLOURS, *SHAPES, *(s + "s" for s in SHAPES), "yes", "no", "shape", "shapes", "image", "there"]
    lines = [
        "You are a helpful assistant.",
        "How many red shapes are there? What colour is the triangle? Is there a blue circle in the image?",
        "Locate the green square. Answer with the bounding box. Answer with a number. Answer yes or no.",
        "<think>I count the shapes.</think><answer>3</answer>",
        '<answer>[{"bbox_2d": [12, 40, 96, 120], "label": "green square"}]</answer>',
        "<|object_ref_start|>green square<|object_ref_end|><|box_start|>(120,80),(300,260)<|box_end|>",
        "The answer is \\boxed{4}. Answer: B. (A) (B) (C) (D) zero one two three four five six seven eight",
        "0 1 2 3 4 5 6 7 8 9 , . : ; ! ? [ ] { } ( ) \" ' - + = / \\ * # < > _",
    ]
    return lines * 20 + [" ".join(words)] * 50 + [f"{a} {b}" for a in COLOURS for b in SHAPES] * 5


def build_tiny_tokenizer(out_dir: Path, vocab_size: int = 512):
    """Byte-level BPE trained locally with `tokenizers`, wrapped as a Qwen2 tokenizer (left padding saved)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),  # Qwen splits digits one by one
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    tokenizer = Qwen2TokenizerFast(
        tokenizer_file=str(out_dir / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        padding_side="left",  # set in the constructor: set afterwards it is not saved
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass
class TinySpec:
    """Sizes of the tiny model. Defaults give ~1.5 M parameters and learn the shapes task on 2 CPU cores."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    vision_hidden: int = 64
    vision_depth: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 128
    vocab_size: int = 512
    rope_theta: float = 10000.0  # the language model's M-RoPE base (see pretrain_tiny.default_spec for a small one)
    mrope_section: tuple[int, int, int] | None = None  # (temporal, height, width) frequency pairs; None: 1/4, 3/8, 3/8
    min_pixels: int = 28 * 28 * 4
    max_pixels: int = 28 * 28 * 64


def _tiny_config(arch: str, spec: TinySpec, tokenizer):
    import transformers as tf

    head_dim = spec.hidden_size // spec.num_heads
    half = head_dim // 2  # mrope_section must sum to head_dim / 2: (temporal, height, width)
    mrope = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    if spec.mrope_section is not None:
        mrope = [int(n) for n in spec.mrope_section]
        if len(mrope) != 3 or min(mrope) < 1 or sum(mrope) != half:
            raise ValueError(f"TinySpec.mrope_section {spec.mrope_section}: give 3 positive frequency-pair counts "
                             f"(temporal, height, width) summing to head_dim / 2 = {half}")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta, "mrope_section": mrope},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    if arch == "qwen2_5_vl":
        vision = dict(
            depth=spec.vision_depth, hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads, out_hidden_size=spec.hidden_size, window_size=112,
            fullatt_block_indexes=[spec.vision_depth - 1],
        )  # fmt: skip
        cfg_cls = tf.Qwen2_5_VLConfig
    else:
        vision = dict(
            depth=spec.vision_depth, embed_dim=spec.vision_hidden, hidden_size=spec.hidden_size,
            num_heads=spec.vision_heads, mlp_ratio=spec.vision_intermediate // spec.vision_hidden,
        )  # fmt: skip
        cfg_cls = tf.Qwen2VLConfig
    return cfg_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def init_tiny(
    out_dir: str | Path, arch: str = "qwen2_5_vl", spec: TinySpec | None = None, seed: int = 0,
    dtype: str = "float32", device: str = "cpu",
) -> Path:
    """Build a randomly initialised tiny Qwen-VL with its processor and save it as a HF checkpoint.

    `spec` can make it large too (scripts/gpu_check.py builds a ~2 B one); `device` is where the random init runs
    (a GPU initialises billions of weights in seconds) and `dtype` what is saved."""
    import transformers as tf

    if arch not in ARCHS:
        raise ModelLoadError(f"--arch '{arch}' is not supported; accepted: {', '.join(ARCHS)}")
    spec = spec or TinySpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out, spec.vocab_size)
    image_processor = tf.Qwen2VLImageProcessor(
        size={"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    )
    video_processor = tf.Qwen2VLVideoProcessor()
    model_cls, processor_cls = _classes(arch)
    processor = processor_cls(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(_tiny_config(arch, spec, tokenizer)).to(getattr(torch, dtype))
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
    last = lm.model.model.visual.merger.mlp[-1]
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
