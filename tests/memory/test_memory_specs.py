"""Model specs: parameter counts from the architecture formulas, config.json reading, names, LoRA, KV cache."""

import dataclasses
import json

import pytest

from vlgrpo.memory import MODEL_TABLE, PlanError, kv_cache_bytes, lora_params, resolve_model
from vlgrpo.memory.models import spec_from_config_json

# Published sizes (model cards / HF safetensors metadata), billions of parameters.
PUBLISHED = {
    "Qwen/Qwen2-VL-2B-Instruct": 2.21,
    "Qwen/Qwen2-VL-7B-Instruct": 8.29,
    "Qwen/Qwen2.5-VL-3B-Instruct": 3.75,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8.29,
    "Qwen/Qwen2.5-VL-32B-Instruct": 33.5,
    "Qwen/Qwen2.5-VL-72B-Instruct": 73.4,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_table_totals_match_published_sizes(name):
    total = MODEL_TABLE[name].total_params() / 1e9
    assert abs(total - PUBLISHED[name]) / PUBLISHED[name] < 0.02, total


def test_qwen2_5_vl_7b_exact_breakdown():
    s = MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]
    # per decoder layer: q 3584*3584+3584, k/v 3584*512+512 each, o 3584^2, MLP 3*3584*18944, 2 norms
    layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert s.language_params() == 28 * layer + 2 * 152064 * 3584 + 3584 == 7_615_616_512
    assert s.vision_params() == 631_975_680  # 32 ViT blocks of 19,702,200 + conv3d 3*2*14*14*1280
    assert s.merger_params() == 1280 + (5120 * 5120 + 5120) + (5120 * 3584 + 3584) == 44_574_464
    assert s.total_params() == 8_292_166_656  # equals transformers' own count on the meta device
    assert s.largest_layer_params() == 152064 * 3584  # embedding / lm_head


def test_tied_embeddings_count_once():
    s3 = MODEL_TABLE["Qwen/Qwen2.5-VL-3B-Instruct"]
    assert s3.tie_embeddings and s3.largest_layer_params() == 151936 * 2048
    layer = (2048 * 2048 + 2048) + 2 * (2048 * 256 + 256) + 2048 * 2048 + 3 * 2048 * 11008 + 2 * 2048
    assert s3.language_params() == 36 * layer + 151936 * 2048 + 2048


def test_qwen2_vl_vision_uses_layernorm_and_gelu_mlp():
    s = MODEL_TABLE["Qwen/Qwen2-VL-7B-Instruct"]
    block = 4 * 1280 + (1280 * 3840 + 3840) + (1280 * 1280 + 1280) + (1280 * 5120 + 5120) + (5120 * 1280 + 1280)
    assert s.vision_params() == 32 * block + 3 * 2 * 14 * 14 * 1280
    assert s.merger_params() == 2 * 1280 + (5120 * 5120 + 5120) + (5120 * 3584 + 3584)
    assert s.total_params() == 8_291_375_616


TINY_25 = {
    "model_type": "qwen2_5_vl",
    "tie_word_embeddings": False,
    "text_config": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
    },
    "vision_config": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
    },
}
TINY_2 = {  # older layout: text keys at the top level, Qwen2-VL vision keys (embed_dim, mlp_ratio)
    "model_type": "qwen2_vl",
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "vocab_size": 257,
    "tie_word_embeddings": True,
    "vision_config": {
        "depth": 2,
        "embed_dim": 32,
        "mlp_ratio": 2,
        "num_heads": 2,
        "hidden_size": 48,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_chans": 3,
    },
}


TINY_3 = {  # Qwen3-VL: explicit head_dim, q/k norms, learned positions, two DeepStack mergers, tied at the top level
    "model_type": "qwen3_vl",
    "tie_word_embeddings": True,
    "text_config": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "vocab_size": 300,
    },
    "vision_config": {
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 16,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0, 2],
    },
}
CLASSES = {
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", "Qwen3_5Config"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig"),
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLConfig"),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig"),
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeConfig"),
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig"),
}


def _torch_counts(raw: dict, parts: bool = False):
    """(total, largest single module) of the transformers model built on the meta device; with `parts`, a dict that
    also holds the vision and merger parts as the trainer splits them (`trainer.backends.part_of`)."""
    torch = pytest.importorskip("torch")
    import transformers

    cls, cfg_cls = (getattr(transformers, n) for n in CLASSES[raw["model_type"]])
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    with torch.device("meta"):
        model = cls(cfg_cls(**kwargs))
    total = sum(dict((id(p), p.numel()) for p in model.parameters()).values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    if not parts:
        return total, largest
    visual = {n: p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}"}
    merger = sum(v for n, v in visual.items() if ".merger." in n or ".deepstack_merger_list." in n)
    return {"total": total, "largest": largest, "vision": sum(visual.values()) - merger, "merger": merger}


@pytest.mark.parametrize(
    "raw",
    [TINY_25, TINY_2, TINY_3, dict(TINY_3, tie_word_embeddings=False)],
    ids=["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_untied"],
)
def test_config_json_counts_equal_transformers(tmp_path, raw):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    spec = resolve_model(str(tmp_path))
    total, largest = _torch_counts(raw)
    assert spec.total_params() == total
    assert spec.largest_layer_params() == largest
    assert spec.name == str(tmp_path)


def test_config_json_reads_text_config_and_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_25))
    s = spec_from_config_json(tmp_path / "config.json")
    assert (s.hidden, s.layers, s.kv_heads, s.head_dim, s.vocab, s.tie_embeddings) == (64, 2, 2, 16, 300, False)
    assert (s.vision_hidden, s.vision_intermediate, s.family) == (32, 48, "qwen2_5_vl")
    s2 = spec_from_config_json(_write(tmp_path / "b", TINY_2))
    assert (s2.hidden, s2.kv_heads, s2.vision_hidden, s2.vision_intermediate) == (48, 1, 32, 64)
    assert s2.tie_embeddings


def _write(d, raw):
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    return d / "config.json"


def test_config_json_errors_name_the_file_and_key(tmp_path):
    bad = dict(TINY_25, text_config={k: v for k, v in TINY_25["text_config"].items() if k != "vocab_size"})
    with pytest.raises(PlanError, match=r"config.json' has no vocab_size"):
        spec_from_config_json(_write(tmp_path / "a", bad))
    accepted = "accepted: qwen2_vl, qwen2_5_vl, qwen3_vl"
    with pytest.raises(PlanError, match=rf"model_type 'llama' is not supported; {accepted}"):
        spec_from_config_json(_write(tmp_path / "b", {"model_type": "llama"}))


@pytest.mark.parametrize(
    "name", ["Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl-7b", "QWEN2.5-VL-7B-INSTRUCT", "Qwen2.5-VL-7B"]
)
def test_name_variants(name):
    assert resolve_model(name) is MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]


def test_unknown_name_lists_the_table():
    with pytest.raises(PlanError) as e:
        resolve_model("llava-1.5-7b")
    assert all(k in str(e.value) for k in MODEL_TABLE) and "--params" in str(e.value)


def test_lora_params_all_linear_rank_16():
    s = MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    # r * (in + out) per layer: q,o 2*(3584+3584), k,v 2*(3584+512), gate/up/down 3*(3584+18944)
    assert lora_params(s, 16, targets) == 16 * 28 * (2 * 7168 + 2 * 4096 + 3 * 22528) == 40_370_176
    assert lora_params(s, 8, ("q_proj", "v_proj")) == 8 * 28 * ((3584 + 3584) + (3584 + 512))
    assert lora_params(s, 4, ("qkv",)) == 4 * 32 * (1280 + 3840)
    with pytest.raises(PlanError, match="accepted: q_proj"):
        lora_params(s, 16, ("attn",))


def test_kv_cache_qwen2_5_vl_7b_8_by_4096():
    s = MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]
    assert (s.layers, s.kv_heads, s.head_dim) == (28, 4, 128)
    got = kv_cache_bytes(s.layers, s.kv_heads, s.head_dim, num_seqs=8, seq_len=4096, dtype_bytes=2)
    assert got == 2 * 8 * 28 * 4096 * 4 * 128 * 2 == 1_879_048_192


# The released Qwen3-VL config.json values the table must hold (sources: docs/memory.md, "Qwen3-VL sizes"), written
# as config.json writes them, so that the table, the config.json reader and transformers are checked against each
# other. Every size: head_dim 128, vocab 151936, 16 px patches, 2,304 learned positions, 16 vision heads.
def _qwen3_released(hidden, inter, layers, heads, tie, depth, hv, iv, deepstack) -> dict:
    return {
        "model_type": "qwen3_vl",
        "tie_word_embeddings": tie,
        "text_config": {
            "hidden_size": hidden,
            "intermediate_size": inter,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": tie,
        },
        "vision_config": {
            "depth": depth,
            "hidden_size": hv,
            "intermediate_size": iv,
            "num_heads": 16,
            "out_hidden_size": hidden,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": deepstack,
        },
    }


QWEN3_RELEASED = {
    "Qwen/Qwen3-VL-2B-Instruct": _qwen3_released(2048, 6144, 28, 16, True, 24, 1024, 4096, [5, 11, 17]),
    "Qwen/Qwen3-VL-4B-Instruct": _qwen3_released(2560, 9728, 36, 32, True, 24, 1024, 4096, [5, 11, 17]),
    "Qwen/Qwen3-VL-8B-Instruct": _qwen3_released(4096, 12288, 36, 32, False, 27, 1152, 4304, [8, 16, 24]),
    "Qwen/Qwen3-VL-32B-Instruct": _qwen3_released(5120, 25600, 64, 64, False, 27, 1152, 4304, [8, 16, 24]),
}
# transformers' own count of Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config.json)) on the meta device
# (transformers 5.20; test_qwen3_vl_counts_equal_transformers recounts them). The 8B's agrees with its published
# 8.77 B (16.33 GiB of bf16 weights).
QWEN3_PARAMS = {
    "Qwen/Qwen3-VL-2B-Instruct": 2_127_532_032,
    "Qwen/Qwen3-VL-4B-Instruct": 4_437_815_808,
    "Qwen/Qwen3-VL-8B-Instruct": 8_767_123_696,
    "Qwen/Qwen3-VL-32B-Instruct": 33_357_390_064,
}


@pytest.mark.parametrize("name", sorted(QWEN3_PARAMS))
def test_qwen3_vl_table_is_the_released_config(name, tmp_path):
    spec = MODEL_TABLE[name]
    assert spec.total_params() == QWEN3_PARAMS[name]
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_RELEASED[name]))
    from_json = resolve_model(str(tmp_path))
    assert from_json == dataclasses.replace(spec, name=str(tmp_path))  # every field, DeepStack mergers included


@pytest.mark.parametrize("name", sorted(QWEN3_PARAMS))
def test_qwen3_vl_counts_equal_transformers(name):
    """Whole model, vision / merger parts as the trainer splits them (DeepStack mergers with the merger) and the
    largest module, from transformers' modeling file itself."""
    counts = _torch_counts(QWEN3_RELEASED[name], parts=True)
    spec = MODEL_TABLE[name]
    assert counts == {
        "total": QWEN3_PARAMS[name],
        "largest": spec.largest_layer_params(),
        "vision": spec.vision_params(),
        "merger": spec.merger_params(),
    }


def test_qwen3_vl_8b_exact_breakdown():
    s = MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"]
    # decoder layer: q, o 4096 x 4096 and k, v 4096 x 1024 without biases, q_norm + k_norm over head_dim 128, SwiGLU,
    # two RMSNorms; untied lm_head
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096
    assert s.language_params() == 36 * layer + 2 * 151936 * 4096 + 4096 == 8_190_735_360
    # ViT block: two LayerNorms (weight + bias), qkv and proj with biases, GELU MLP 1152 -> 4304 -> 1152 with biases;
    # conv3d 3 x 2 x 16 x 16 with a bias; 2,304 learned positions
    block = 4 * 1152 + (1152 * 3456 + 3456) + (1152 * 1152 + 1152) + (1152 * 4304 + 4304) + (4304 * 1152 + 1152)
    assert s.vision_params() == 27 * block + (3 * 2 * 16 * 16 * 1152 + 1152) + 2304 * 1152 == 415_891_440
    # the merger (LayerNorm over 1152, then 4608 -> 4608 -> 4096) and 3 DeepStack mergers (LayerNorm over 4608)
    linears = (4608 * 4608 + 4608) + (4608 * 4096 + 4096)
    assert s.merger_params() == 2 * 1152 + linears + 3 * (2 * 4608 + linears) == 160_496_896
    assert s.total_params() == 8_767_123_696 and s.largest_layer_params() == 151936 * 4096
    assert (s.patch, s.merge, s.deepstack_mergers, s.tie_embeddings) == (16, 2, 3, False)


def test_qwen3_vl_small_sizes_tie_their_embeddings():
    s2, s4 = MODEL_TABLE["Qwen/Qwen3-VL-2B-Instruct"], MODEL_TABLE["Qwen/Qwen3-VL-4B-Instruct"]
    assert s2.tie_embeddings and s4.tie_embeddings
    # 4B: 32 heads x 128 = 4096 query width on a 2560 hidden size (Qwen3 states head_dim; it is not hidden / heads)
    layer = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 2 * 128 + 3 * 2560 * 9728 + 2 * 2560
    assert s4.language_params() == 36 * layer + 151936 * 2560 + 2560  # one embedding matrix


def test_qwen3_vl_kv_cache_per_token():
    s = MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"]
    # 36 layers x 8 KV heads x 128 x (K, V) x bf16 = 147,456 B = 144 KiB per token
    assert kv_cache_bytes(s.layers, s.kv_heads, s.head_dim, 1, 1, 2) == 2 * 36 * 8 * 128 * 2 == 144 * 1024


@pytest.mark.parametrize("name", ["qwen3-vl-8b", "Qwen/Qwen3-VL-8B-Instruct", "QWEN3-VL-8B-INSTRUCT"])
def test_qwen3_vl_name_variants(name):
    assert resolve_model(name) is MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"]


def _moe_released(dense: dict, model_type: str, **text) -> dict:
    """A released MoE config.json: its dense sibling's, routed experts in every layer."""
    return {**dense, "model_type": model_type, "text_config": {**dense["text_config"], **text}}


@pytest.mark.parametrize("name", ["Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3.5-35B-A3B"])
def test_moe_table_is_the_released_config_and_counts_equal_transformers(name, tmp_path):
    """Total, active, largest module, vision and merger of the two MoE recipes' models, against transformers' own
    modules on the meta device; the routing record of a token is k bytes per layer."""
    raw = MOE_RELEASED[name]
    spec = MODEL_TABLE[name]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert resolve_model(str(tmp_path)) == dataclasses.replace(spec, name=str(tmp_path))
    assert resolve_model(name.removeprefix("Qwen/").lower()) is spec
    counts = _torch_counts(raw, parts=True)
    assert counts == {
        "total": spec.total_params(),
        "largest": spec.largest_layer_params(),
        "vision": spec.vision_params(),
        "merger": spec.merger_params(),
    }
    experts = spec.layers * spec.experts * 3 * spec.hidden * spec.moe_intermediate
    idle = experts * (spec.experts - spec.experts_per_token) // spec.experts
    assert spec.active_params() == spec.total_params() - idle
    assert 3.5e9 < spec.active_params() < 4.0e9 and spec.routing_bytes(1000) == 1000 * spec.layers * 8


# The released Qwen3.5 config.json values (sources: docs/memory.md, "Qwen3.5 sizes"): head_dim 256, vocab 248,320,
# Gated DeltaNet in 3 of 4 layers with 16 key heads of 128 and value heads of 128; Qwen3-VL's tower, no DeepStack.
def _qwen3_5_released(hidden, inter, layers, heads, kv, v_heads, tie, depth, hv, iv) -> dict:
    return {
        "model_type": "qwen3_5",
        "tie_word_embeddings": tie,
        "text_config": {
            "hidden_size": hidden,
            "intermediate_size": inter,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": 256,
            "vocab_size": 248320,
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": v_heads,
            "linear_value_head_dim": 128,
            "tie_word_embeddings": tie,
        },
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": depth,
            "hidden_size": hv,
            "intermediate_size": iv,
            "num_heads": 16,
            "out_hidden_size": hidden,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
        },
    }


QWEN3_5_RELEASED = {
    "Qwen/Qwen3.5-0.8B": _qwen3_5_released(1024, 3584, 24, 8, 2, 16, True, 12, 768, 3072),
    "Qwen/Qwen3.5-2B": _qwen3_5_released(2048, 6144, 24, 8, 2, 16, True, 24, 1024, 4096),
    "Qwen/Qwen3.5-4B": _qwen3_5_released(2560, 9216, 32, 16, 4, 32, True, 24, 1024, 4096),
    "Qwen/Qwen3.5-9B": _qwen3_5_released(4096, 12288, 32, 16, 4, 32, False, 27, 1152, 4304),
    "Qwen/Qwen3.5-27B": _qwen3_5_released(5120, 17408, 64, 24, 4, 48, False, 27, 1152, 4304),
}
MOE_RELEASED = {  # their config.json text keys (the 35B's have no dense intermediate_size)
    "Qwen/Qwen3-VL-30B-A3B-Instruct": _moe_released(
        _qwen3_released(2048, 6144, 48, 32, False, 27, 1152, 4304, [8, 16, 24]),
        "qwen3_vl_moe",
        num_key_value_heads=4,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    ),
    "Qwen/Qwen3.5-35B-A3B": _moe_released(
        _qwen3_5_released(2048, 0, 40, 16, 2, 32, False, 27, 1152, 4304),
        "qwen3_5_moe",
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
}
for _raw in MOE_RELEASED.values():
    _raw["text_config"] = {k: v for k, v in _raw["text_config"].items() if v != 0}  # no dense MLP width
# transformers' own count of Qwen3_5ForConditionalGeneration(Qwen3_5Config(**config.json)) on the meta device
# (transformers 5.20.2; the checkpoints' MTP layer is not part of the model transformers builds)
QWEN3_5_PARAMS = {
    "Qwen/Qwen3.5-0.8B": 852_985_920,
    "Qwen/Qwen3.5-2B": 2_213_241_664,
    "Qwen/Qwen3.5-4B": 4_539_265_536,
    "Qwen/Qwen3.5-9B": 9_409_813_744,
    "Qwen/Qwen3.5-27B": 27_356_728_560,
}


@pytest.mark.parametrize("name", sorted(QWEN3_5_PARAMS))
def test_qwen3_5_table_is_the_released_config_and_counts_equal_transformers(name, tmp_path):
    spec = MODEL_TABLE[name]
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_5_RELEASED[name]))
    assert resolve_model(str(tmp_path)) == dataclasses.replace(spec, name=str(tmp_path))
    counts = _torch_counts(QWEN3_5_RELEASED[name], parts=True)
    assert counts == {
        "total": QWEN3_5_PARAMS[name],
        "largest": spec.largest_layer_params(),
        "vision": spec.vision_params(),
        "merger": spec.merger_params(),
    }


def test_qwen3_5_9b_exact_breakdown_state_and_lora():
    s = resolve_model("qwen3.5-9b")
    assert s is MODEL_TABLE["Qwen/Qwen3.5-9B"]
    assert (s.layers, s.linear_layers, s.attention_layers, s.deepstack_mergers) == (32, 24, 8, 0)
    h = 4096
    # gated attention: q_proj 4096 -> 2 x 16 x 256 (query and gate), k, v 4096 -> 4 x 256, o 4096 -> 4096, q/k norms
    attention = h * 8192 + 2 * h * 1024 + 4096 * h + 2 * 256
    # Gated DeltaNet: qkv 4096 -> 2 x 2048 + 4096, z 4096 -> 4096, b and a 4096 -> 32, conv 8192 x 4, dt_bias and A_log
    # (32 each), the gated norm over 128, out_proj 4096 -> 4096
    linear = h * 8192 + h * 4096 + 2 * h * 32 + 8192 * 4 + 2 * 32 + 128 + 4096 * h
    assert s.linear_attention_params() == linear
    rest = 3 * h * 12288 + 2 * h
    assert s.language_params() == 8 * attention + 24 * linear + 32 * rest + 2 * 248320 * h + h
    # a sequence's state: 24 layers x (32 heads x 128 x 128 fp32 recurrent + 8192 x 4 bf16 conv) = 48.75 MiB
    assert s.state_bytes_per_sequence(2) == 24 * (32 * 128 * 128 * 4 + 8192 * 4 * 2) == 51_904_512
    # KV for the 8 attention layers only: 8 x 2 x 4 x 256 x bf16 = 32 KiB per token
    assert kv_cache_bytes(s.attention_layers, s.kv_heads, s.head_dim, 1, 1, 2) == 32 * 1024
    # LoRA: attention names on the 8 attention layers (q_proj's output is query + gate), Gated DeltaNet names on the
    # 24 linear ones, the MLP on all 32
    assert lora_params(s, 16, ("q_proj",)) == 16 * 8 * (h + 8192)
    assert lora_params(s, 16, ("in_proj_qkv", "out_proj")) == 16 * 24 * ((h + 8192) + (4096 + h))
    assert lora_params(s, 16, ("down_proj",)) == 16 * 32 * (12288 + h)
    assert lora_params(MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"], 16, ("in_proj_qkv",)) == 0  # no such layer there
