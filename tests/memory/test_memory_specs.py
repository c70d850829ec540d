"""Model specs: parameter counts from the architecture formulas, config.json reading, names, LoRA, KV cache."""

import json

import pytest

from vlgrpo.memory import MODEL_TABLE, PlanError, kv_cache_bytes, lora_params, resolve_model
from vlgrpo.memory.specs import spec_from_config_json

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
    "text_config": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 300},
    "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
}
TINY_2 = {  # older layout: text keys at the top level, Qwen2-VL vision keys (embed_dim, mlp_ratio)
    "model_type": "qwen2_vl", "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 257, "tie_word_embeddings": True,
    "vision_config": {"depth": 2, "embed_dim": 32, "mlp_ratio": 2, "num_heads": 2, "hidden_size": 48,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3},
}


def _torch_counts(raw: dict) -> tuple[int, int]:
    """(total, largest single module) of the transformers model built on the meta device."""
    torch = pytest.importorskip("torch")
    import transformers

    cls, cfg_cls = ((transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig)
                    if raw["model_type"] == "qwen2_5_vl" else
                    (transformers.Qwen2VLForConditionalGeneration, transformers.Qwen2VLConfig))
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    with torch.device("meta"):
        model = cls(cfg_cls(**kwargs))
    total = sum(dict((id(p), p.numel()) for p in model.parameters()).values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@pytest.mark.parametrize("raw", [TINY_25, TINY_2], ids=["qwen2_5_vl", "qwen2_vl"])
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
    with pytest.raises(PlanError, match=r"model_type 'llama' is not supported; accepted: qwen2_vl, qwen2_5_vl"):
        spec_from_config_json(_write(tmp_path / "b", {"model_type": "llama"}))


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl-7b", "QWEN2.5-VL-7B-INSTRUCT",
                                  "Qwen2.5-VL-7B"])
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
