"""The tiny local Qwen-VL, so tests and the demo never download anything: its parts (a byte-level BPE trained here,
the chat template, the sizes (`TinySpec`) and the transformers config and processors of each arch), `init_tiny`,
which assembles them with the real Qwen model and processor classes and saves a randomly initialised checkpoint
with `save_pretrained` (so it loads through `vlgrpo.models.load_model`, the same path as a 7B), and
`calibrate_merger`, the data-dependent init of such a random model's merger.

Sits above `vlgrpo.models` (it uses its arch classes and loader); nothing the trainer or the rollout runs on a real
checkpoint imports it. Knows nothing of training or rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vlgrpo.data.prompts import SPECIAL_TOKENS
from vlgrpo.families import GATED_DELTANET, family
from vlgrpo.models import ARCHS, ModelLoadError, arch_classes, load_model
from vlgrpo.types import InputError

# Qwen2-VL/2.5-VL chat template (images as <|vision_start|><|image_pad|><|vision_end|>, videos as the same with
# <|video_pad|>, default system prompt). The tiny Qwen3-VL shares it: its markers are the same tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3_5_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}",
)
"""The tiny Qwen3.5's: the released Qwen3.5 template's generation prompt, which opens <think> unless
enable_thinking is false (then an empty block, closed)."""


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
    min_pixels: int = 28 * 28 * 4
    max_pixels: int = 28 * 28 * 64
    deepstack_visual_indexes: tuple[int, ...] = (0, 1)
    """Qwen3-VL only: the vision blocks whose output feeds a DeepStack merger (one map per index, added to the
    hidden states of language-model layer 0, 1, ... at the image tokens). Each must be < vision_depth."""
    tie_word_embeddings: bool = True
    """The LM head shares the token embedding (Qwen2/2.5-VL 2B-3B and Qwen3-VL 2B-4B do; 7B/8B and up do not)."""
    head_dim: int | None = None
    """Attention head size; None: hidden_size / num_heads, except Qwen3.5, whose default is 64: vLLM's CPU
    attention kernels accept no smaller head (a 7B's is 128, Qwen3.5's full attention 256)."""
    linear_num_key_heads: int = 2
    """Qwen3.5 only: Gated DeltaNet key heads (the 9B: 16); its value heads are linear_num_value_heads (the 9B: 32)."""
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    """Qwen3.5 only: the Gated DeltaNet key and value head sizes (the 9B: 128). vLLM's CPU kernels want multiples of
    32 for the value head and refuse 32 for the key head: 64 is the smallest both accept."""
    linear_value_head_dim: int = 64
    full_attention_interval: int = 4
    """Qwen3.5 only: every this-many-th layer is full (gated) attention, the others Gated DeltaNet (3 : 1)."""
    num_experts: int = 4
    """Mixture-of-experts archs only: routed experts per layer (Qwen3-VL-30B-A3B: 128, Qwen3.5-35B-A3B: 256)."""
    experts_per_token: int = 2
    """The router's top-k (30B-A3B: 8, 35B-A3B: 8)."""
    moe_intermediate_size: int = 96
    """One expert's MLP width (30B-A3B: 768, 35B-A3B: 512)."""
    shared_expert_intermediate_size: int = 96
    """Qwen3.5-MoE only: the gated shared expert's MLP width (35B-A3B: 512)."""

    def attention_head_dim(self, arch: str) -> int:
        if self.head_dim is not None:
            return self.head_dim
        return 64 if family(arch).gated_attention else self.hidden_size // self.num_heads


def _mrope_section(arch: str, half: int) -> list[int]:
    """(temporal, height, width) M-RoPE frequency pairs summing to the rotary dims / 2 = `half`: about 1/4, 3/8, 3/8
    (Qwen2/2.5-VL's 16, 24, 24 of 64), 3/8, 5/16, 5/16 for Qwen3-VL's interleaved M-RoPE (its 24, 20, 20 of 64), or
    11/32, 11/32, 10/32 for Qwen3.5's (its 11, 11, 10 of the 32 rotary pairs of a 256-dim head)."""
    fam = family(arch)
    if fam.gated_attention:  # Qwen3.5
        part = round(half * 11 / 32)
        return [part, part, half - 2 * part]
    part = half // 3 if fam.qwen3 else half * 3 // 8
    return [half - 2 * part, part, part]


def _vision_config(arch: str, spec: TinySpec) -> dict:
    fam = family(arch)
    if fam.qwen3:  # Qwen3.5: Qwen3-VL's tower without DeepStack
        tower = dict(
            depth=spec.vision_depth,
            hidden_size=spec.vision_hidden,
            intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads,
            out_hidden_size=spec.hidden_size,
            patch_size=fam.patch_size,
            num_position_embeddings=256,
        )
        if not fam.deepstack:
            return tower
        bad = [i for i in spec.deepstack_visual_indexes if not 0 <= i < spec.vision_depth]
        if bad:
            raise ValueError(
                f"TinySpec.deepstack_visual_indexes {list(spec.deepstack_visual_indexes)}: {bad} not "
                f"a vision block (0 .. vision_depth - 1 = {spec.vision_depth - 1})"
            )
        return {**tower, "deepstack_visual_indexes": list(spec.deepstack_visual_indexes)}
    if arch == "qwen2_5_vl":
        return dict(
            depth=spec.vision_depth,
            hidden_size=spec.vision_hidden,
            intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads,
            out_hidden_size=spec.hidden_size,
            window_size=112,
            fullatt_block_indexes=[spec.vision_depth - 1],
        )
    return dict(
        depth=spec.vision_depth,
        embed_dim=spec.vision_hidden,
        hidden_size=spec.hidden_size,
        num_heads=spec.vision_heads,
        mlp_ratio=spec.vision_intermediate // spec.vision_hidden,
    )


def tiny_config(arch: str, spec: TinySpec, tokenizer):
    """The transformers config of a tiny `arch` (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5 or their MoE siblings) sized
    by `spec`."""
    import transformers as tf

    fam = family(arch)
    head_dim = spec.attention_head_dim(arch)
    rotary = head_dim // 4 if fam.gated_attention else head_dim  # Qwen3.5 rotates a quarter of each head
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta, "mrope_section": _mrope_section(arch, rotary // 2)}
    if fam.qwen3:
        rope["mrope_interleaved"] = True  # as the released config.json says; transformers always interleaves
    if fam.gated_attention:
        rope["partial_rotary_factor"] = 0.25
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=4096,
        rope_parameters=rope,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    if fam.qwen3:
        text["head_dim"] = head_dim  # Qwen3 states it (default 128), Qwen2 derives it from the hidden size
    if fam.hybrid_attention:
        text.update(
            linear_num_key_heads=spec.linear_num_key_heads,
            linear_num_value_heads=spec.linear_num_value_heads,
            linear_key_head_dim=spec.linear_key_head_dim,
            linear_value_head_dim=spec.linear_value_head_dim,
            layer_types=[
                "full_attention" if (i + 1) % spec.full_attention_interval == 0 else GATED_DELTANET
                for i in range(spec.num_layers)
            ],
        )
    if fam.dense is not None:  # top-k routed experts in every layer (Qwen3.5-MoE: beside a gated shared expert)
        text.update(
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.experts_per_token,
            moe_intermediate_size=spec.moe_intermediate_size,
            norm_topk_prob=True,  # as released; transformers' router always renormalises, vLLM reads the key
        )
        if fam.hybrid_attention:
            text["shared_expert_intermediate_size"] = spec.shared_expert_intermediate_size
    return getattr(tf, fam.config_class)(
        text_config=text,
        vision_config=_vision_config(arch, spec),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )


def tiny_processors(arch: str, spec: TinySpec) -> tuple:
    """(image processor, video processor) of a tiny `arch`: Qwen3-VL's and Qwen3.5's 16 px patches (a merged token
    covers 32 px) normalised to [-1, 1] as their released preprocessor_config.json says; Qwen2/2.5-VL's 14 px with
    CLIP's mean/std."""
    import transformers as tf

    fam = family(arch)
    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    if fam.qwen3:
        image = tf.Qwen2VLImageProcessor(
            size=size, patch_size=fam.patch_size, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        return image, tf.Qwen3VLVideoProcessor()
    return tf.Qwen2VLImageProcessor(size=size), tf.Qwen2VLVideoProcessor()


def init_tiny(
    out_dir: str | Path,
    arch: str = "qwen2_5_vl",
    spec: TinySpec | None = None,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
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
    template = QWEN3_5_CHAT_TEMPLATE if family(arch).thinking_template else CHAT_TEMPLATE
    tokenizer.chat_template = template
    image_processor, video_processor = tiny_processors(arch, spec)
    model_cls, processor_cls = arch_classes(arch)
    processor = processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=template,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(tiny_config(arch, spec, tokenizer)).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


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
