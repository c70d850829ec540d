"""The tiny local Qwen-VL's parts: a byte-level BPE trained here, the chat template, the sizes (`TinySpec`) and the
transformers config of each arch, so tests and the demo never download anything.

`models.init_tiny` assembles them with the real Qwen model and processor classes. Knows nothing of loading,
training or rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vlgrpo.data.prompts import SPECIAL_TOKENS

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
    mrope_section: tuple[int, int, int] | None = None
    """(temporal, height, width) frequency pairs summing to head_dim / 2; None: about 1/4, 3/8, 3/8 (Qwen2/2.5-VL's
    16, 24, 24 of 64), or 3/8, 5/16, 5/16 for Qwen3-VL's interleaved M-RoPE (its 24, 20, 20 of 64)."""
    min_pixels: int = 28 * 28 * 4
    max_pixels: int = 28 * 28 * 64
    deepstack_visual_indexes: tuple[int, ...] = (0, 1)
    """Qwen3-VL only: the vision blocks whose output feeds a DeepStack merger (one map per index, added to the
    hidden states of language-model layer 0, 1, ... at the image tokens). Each must be < vision_depth."""
    tie_word_embeddings: bool = True
    """The LM head shares the token embedding (Qwen2/2.5-VL 2B-3B and Qwen3-VL 2B-4B do; 7B/8B and up do not)."""


def _mrope_section(arch: str, spec: TinySpec, half: int) -> list[int]:
    if spec.mrope_section is None:
        part = half // 3 if arch == "qwen3_vl" else half * 3 // 8
        return [half - 2 * part, part, part]
    mrope = [int(n) for n in spec.mrope_section]
    if len(mrope) != 3 or min(mrope) < 1 or sum(mrope) != half:
        raise ValueError(f"TinySpec.mrope_section {spec.mrope_section}: give 3 positive frequency-pair counts "
                         f"(temporal, height, width) summing to head_dim / 2 = {half}")  # fmt: skip
    return mrope


def _vision_config(arch: str, spec: TinySpec) -> dict:
    if arch == "qwen3_vl":
        bad = [i for i in spec.deepstack_visual_indexes if not 0 <= i < spec.vision_depth]
        if bad:
            raise ValueError(f"TinySpec.deepstack_visual_indexes {list(spec.deepstack_visual_indexes)}: {bad} not "
                             f"a vision block (0 .. vision_depth - 1 = {spec.vision_depth - 1})")  # fmt: skip
        return dict(
            depth=spec.vision_depth, hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads, out_hidden_size=spec.hidden_size, patch_size=16,
            num_position_embeddings=256, deepstack_visual_indexes=list(spec.deepstack_visual_indexes),
        )  # fmt: skip
    if arch == "qwen2_5_vl":
        return dict(
            depth=spec.vision_depth, hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads, out_hidden_size=spec.hidden_size, window_size=112,
            fullatt_block_indexes=[spec.vision_depth - 1],
        )  # fmt: skip
    return dict(
        depth=spec.vision_depth, embed_dim=spec.vision_hidden, hidden_size=spec.hidden_size,
        num_heads=spec.vision_heads, mlp_ratio=spec.vision_intermediate // spec.vision_hidden,
    )  # fmt: skip


def tiny_config(arch: str, spec: TinySpec, tokenizer):
    """The transformers config of a tiny `arch` (qwen2_vl, qwen2_5_vl or qwen3_vl) sized by `spec`."""
    import transformers as tf

    head_dim = spec.hidden_size // spec.num_heads
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta,
            "mrope_section": _mrope_section(arch, spec, head_dim // 2)}  # fmt: skip
    if arch == "qwen3_vl":
        rope["mrope_interleaved"] = True  # as the released config.json says; transformers always interleaves
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
    if arch == "qwen3_vl":
        text["head_dim"] = head_dim  # Qwen3 states it (default 128), Qwen2 derives it from the hidden size
    cfg_cls = {"qwen3_vl": tf.Qwen3VLConfig, "qwen2_5_vl": tf.Qwen2_5_VLConfig, "qwen2_vl": tf.Qwen2VLConfig}[arch]
    return cfg_cls(
        text_config=text,
        vision_config=_vision_config(arch, spec),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )


def tiny_processors(arch: str, spec: TinySpec) -> tuple:
    """(image processor, video processor) of a tiny `arch`: Qwen3-VL's 16 px patches (a merged token covers 32 px)
    normalised to [-1, 1] as its released preprocessor_config.json says; Qwen2/2.5-VL's 14 px with CLIP's mean/std."""
    import transformers as tf

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    if arch == "qwen3_vl":
        image = tf.Qwen2VLImageProcessor(size=size, patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3)
        return image, tf.Qwen3VLVideoProcessor()
    return tf.Qwen2VLImageProcessor(size=size), tf.Qwen2VLVideoProcessor()
