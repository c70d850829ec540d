"""`vlgrpo plan`: config mapping, JSON and table output, flags overriding the config, clear errors."""

import json

import pytest

from vlgrpo.cli import main
from vlgrpo.config import load_config
from vlgrpo.memory import MODEL_TABLE
from vlgrpo.memory.report import image_tokens_for, plan_input_from_config

Q7 = MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]
LORA_8XA100 = """\
model: {name_or_path: Qwen/Qwen2.5-VL-7B-Instruct, dtype: bfloat16, gradient_checkpointing: true}
train: {backend: lora, num_gpus: 8, prompts_per_step: 2, micro_batch_completions: 4, lora: {rank: 16}}
rollout: {engine: vllm, completions_per_prompt: 8, max_new_tokens: 512, vllm: {gpu_memory_utilization: 0.4}}
grpo: {beta: 0.04}
"""


def run_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_lora_7b_config_on_8_gpus_fits_a100_80gb(tmp_path, capsys):
    path = tmp_path / "lora7b.yaml"
    path.write_text(LORA_8XA100)
    r = run_json(capsys, str(path))
    g, adapters = r["per_gpu"], 40_370_176
    assert r["inputs"]["lora_rank"] == 16 and r["inputs"]["num_gpus"] == 8 and r["inputs"]["image_tokens"] == 256
    assert g["weights"] == Q7.total_params() * 2 + adapters * 4
    assert g["model_states"] == g["weights"] + adapters * (4 + 8)
    assert g["reference"] == 0  # LoRA: the reference is the base with the adapter disabled
    per_token = 2 * 28 * 4 * 128 * 2
    assert g["kv_cache"] == per_token * 2 * (64 + 256 + 8 * 512)  # B (P + G C): prompt shared within a group
    assert g["rollout_weights"] == Q7.total_params() * 2  # merged weights in vLLM
    assert r["verdicts"]["A100-80GB"]["fits"] and r["verdicts"]["A100-80GB"]["headroom_bytes"] > 0
    assert r["suggestions"] == []  # it fits the default target, nothing to suggest
    assert set(r["verdicts"]) == {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}

    assert main(["plan", str(path)]) == 0
    table = capsys.readouterr().out
    assert "LoRA r=16" in table and "rollout KV cache" in table
    a100 = next(line for line in table.splitlines() if line.startswith("A100-80GB"))
    assert a100.endswith("fits") and "NOT" not in a100


def test_params_flag_gives_model_states(capsys):
    for zero, expected in [(0, 112e9), (1, 38.5e9), (2, 26.25e9), (3, 14e9)]:
        r = run_json(capsys, "--params", "7e9", "--gpus", "8", "--zero", str(zero))
        assert r["per_gpu"]["model_states"] == expected
        assert r["inputs"]["dtype_bytes"] == 2  # no config file: plan a bf16 GPU run


def test_three_models_from_the_command_line(capsys):
    common = ["--params", "7e9", "--beta", "0.04", "--reward-model-params", "7e9", "--optimizer-states", "bf16"]
    g = run_json(capsys, *common)["per_gpu"]
    assert g["model_states"] + g["reference"] + g["reward_model"] == 84e9
    g = run_json(capsys, *common, "--offload", "reference,reward,optimizer")["per_gpu"]
    assert g["model_states"] + g["reference"] + g["reward_model"] == 28e9


def test_flags_override_the_config(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(LORA_8XA100)
    r = run_json(capsys, str(path), "--gpus", "4", "--lora-rank", "8", "--zero", "3", "--offload", "optimizer",
                 "--image-size", "640x480", "--set", "rollout.engine=hf")
    i = r["inputs"]
    assert (i["num_gpus"], i["lora_rank"], i["zero_stage"], i["offload"], i["engine"]) == (4, 8, 3, ["optimizer"], "hf")
    assert i["image_tokens"] == 391  # 640x480 -> smart_resize 644x476 -> 46x34 patches / 4


def test_local_model_directory(tmp_path, capsys):
    raw = {"model_type": "qwen2_5_vl", "text_config": {"hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300},
           "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "out_hidden_size": 64}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    r = run_json(capsys, "--model", str(tmp_path))
    assert r["inputs"]["spec"]["name"] == str(tmp_path) and r["inputs"]["spec"]["hidden"] == 64
    assert r["counts"]["total_params"] == r["inputs"]["spec"]["params"]["total"]


def test_errors_are_one_line(capsys):
    assert main(["plan", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "Qwen/Qwen2.5-VL-72B-Instruct" in err and "--params" in err
    assert main(["plan", "--params", "1e9", "--offload", "gpu"]) == 2
    assert "accepted: optimizer, param, reference, reward" in capsys.readouterr().err
    assert main(["plan", "--params", "1e9", "--image-size", "big"]) == 2
    assert "WIDTHxHEIGHT" in capsys.readouterr().err


def test_config_mapping_backends_and_freezing():
    cfg = load_config(None, ["model.name_or_path=qwen2-vl-2b", "train.backend=zero3", "train.zero3.offload_param=true",
                             "train.zero3.offload_optimizer=true", "model.freeze_vision=false", "grpo.beta=0.1",
                             "train.num_gpus=16"])
    inp = plan_input_from_config(cfg)
    assert (inp.zero_stage, inp.offload) == (3, frozenset({"optimizer", "param"}))
    assert inp.trainable == ("vision", "language")
    assert (inp.beta, inp.num_gpus, inp.lora_rank, inp.dtype_bytes) == (0.1, 16, None, 4)  # config default float32
    assert inp.spec is MODEL_TABLE["Qwen/Qwen2-VL-2B-Instruct"]
    plain = plan_input_from_config(load_config(None, ["model.name_or_path=qwen2-vl-2b",
                                                      "train.zero3.offload_optimizer=true"]))
    assert plain.zero_stage == 0 and plain.offload == frozenset()  # zero3 keys only count with backend zero3


def test_image_tokens_follow_smart_resize():
    assert image_tokens_for(448, 448, None, None) == 256  # 32x32 patches, 2x2 merge
    assert image_tokens_for(1000, 1000, None, 448 * 448) == 256  # max_pixels caps the area


@pytest.mark.parametrize("argv", [["--params", "7e9", "--critic"], ["--model", "qwen2.5-vl-3b", "--convention",
                                                                   "18-byte", "--zero", "3", "--gpus", "8"]])
def test_table_renders_for_other_modes(capsys, argv):
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    assert "TOTAL need per GPU" in out and "conventions:" in out
