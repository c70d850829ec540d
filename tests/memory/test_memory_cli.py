"""`vlgrpo plan`: config mapping, JSON and table output, flags overriding the config, clear errors."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from vlgrpo.cli import main
from vlgrpo.config import ModelConfig, load_config
from vlgrpo.memory import MODEL_TABLE, PlanError
from vlgrpo.memory.from_config import image_tokens_for, plan_input_from_config

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
    assert a100.endswith("fits: rollout peak 55.73 GB <= 85.90 GB capacity") and "NOT" not in a100


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
    r = run_json(
        capsys,
        str(path),
        "--gpus",
        "4",
        "--lora-rank",
        "8",
        "--zero",
        "3",
        "--offload",
        "optimizer",
        "--image-size",
        "640x480",
        "--set",
        "rollout.engine=hf",
    )
    i = r["inputs"]
    assert (i["num_gpus"], i["lora_rank"], i["zero_stage"], i["offload"], i["engine"]) == (4, 8, 3, ["optimizer"], "hf")
    assert i["image_tokens"] == 391  # 640x480 -> smart_resize 644x476 -> 46x34 patches / 4


def test_local_model_directory(tmp_path, capsys):
    raw = {
        "model_type": "qwen2_5_vl",
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 300,
        },
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "out_hidden_size": 64},
    }
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
    cfg = load_config(
        None,
        [
            "model.name_or_path=qwen2-vl-2b",
            "train.backend=zero3",
            "train.zero3.offload_param=true",
            "train.zero3.offload_optimizer=true",
            "model.freeze_vision=false",
            "grpo.beta=0.1",
            "train.num_gpus=16",
        ],
    )
    inp = plan_input_from_config(cfg)
    assert (inp.zero_stage, inp.offload) == (3, frozenset({"optimizer", "param"}))
    assert inp.trainable == ("vision", "language")
    assert (inp.beta, inp.num_gpus, inp.lora_rank, inp.dtype_bytes) == (0.1, 16, None, 4)  # config default float32
    assert inp.spec is MODEL_TABLE["Qwen/Qwen2-VL-2B-Instruct"]
    plain = plan_input_from_config(
        load_config(None, ["model.name_or_path=qwen2-vl-2b", "train.zero3.offload_optimizer=true"])
    )
    assert plain.zero_stage == 0 and plain.offload == frozenset()  # zero3 keys only count with backend zero3


def test_image_tokens_follow_smart_resize_and_the_checkpoints_processor(tmp_path):
    hub = ModelConfig(name_or_path="Qwen/Qwen2.5-VL-7B-Instruct")
    assert image_tokens_for(448, 448, hub, Q7) == 256  # 32x32 patches, 2x2 merge
    assert image_tokens_for(1000, 1000, replace(hub, max_pixels=448 * 448), Q7) == 256  # max_pixels caps the area
    # a local checkpoint's processor bounds, as the trainer's processor applies them: 28 x 28 x 64 px -> 8 x 8 tokens
    size = {"shortest_edge": 3136, "longest_edge": 28 * 28 * 64}
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"size": size}}))
    assert image_tokens_for(448, 448, ModelConfig(name_or_path=str(tmp_path)), None) == 64
    assert image_tokens_for(448, 448, hub, replace(Q7, min_pixels=3136, max_pixels=28 * 28 * 16)) == 16  # spec's


@pytest.mark.parametrize(
    "argv",
    [
        ["--params", "7e9", "--critic"],
        ["--model", "qwen2.5-vl-3b", "--convention", "18-byte", "--zero", "3", "--gpus", "8"],
    ],
)
def test_table_renders_for_other_modes(capsys, argv):
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    assert "TOTAL need per GPU" in out and "conventions:" in out


# The memory keys of configs/qwen2_5_vl_7b_lora_8xa100.yaml and of the ZeRO-3 recipe, copied so that these pins do not
# move with the recipes (tests/test_configs.py plans the recipes themselves).
LORA_RECIPE = """\
model: {name_or_path: Qwen/Qwen2.5-VL-7B-Instruct, dtype: bfloat16, max_pixels: 401408, gradient_checkpointing: true}
data: {max_prompt_length: 768}
rollout: {engine: vllm, max_new_tokens: 512, vllm: {gpu_memory_utilization: 0.35}}
train: {backend: lora, num_gpus: 8, prompts_per_step: 4, lora: {rank: 64, alpha: 128}}
"""
ZERO3_ONE_GPU = LORA_RECIPE.replace("0.35", "0.4").replace(
    "train: {backend: lora, num_gpus: 8, prompts_per_step: 4, lora: {rank: 64, alpha: 128}}",
    "train: {backend: zero3, num_gpus: 1, prompts_per_step: 4}\ngrpo: {beta: 0.04}",
)


def verdict_rows(capsys, *argv) -> dict[str, str]:
    assert main(["plan", *argv]) == 0
    return {
        line.split()[0]: line
        for line in capsys.readouterr().out.splitlines()
        if line.split()[:1] and line.split()[0] in {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}
    }


def test_each_verdict_row_gives_its_reason(tmp_path, capsys):
    path = tmp_path / "lora.yaml"
    path.write_text(LORA_RECIPE)
    rows = verdict_rows(capsys, str(path))
    # A100-40GB: the peak would leave 5.09 GB, but vLLM's 16.58 GB of bf16 weights do not fit the 0.35 x 42.95 GB it
    # may take, so the engine cannot start: the row says that, not only "does NOT fit" next to a positive headroom
    assert Q7.total_params() * 2 == 16_584_333_312 and int(0.35 * 40960 * 2**20) == 15_032_385_536
    assert rows["A100-40GB"] == (
        "A100-40GB        42.95     37.86      5.09  does NOT fit: vLLM weights 16.58 GB > "
        "its budget 15.03 GB (gpu_memory_utilization 0.35 x 42.95 GB): the engine cannot start"
    )
    assert rows["A100-80GB"] == (
        "A100-80GB        85.90     52.89     33.01  fits: rollout peak 52.89 GB <= 85.90 GB capacity"
    )
    r = run_json(capsys, str(path))["verdicts"]
    assert (r["A100-80GB"]["peak_phase"], r["A100-80GB"]["fits"]) == ("rollout", True)
    assert r["A100-40GB"]["headroom_bytes"] > 5e9 and not r["A100-40GB"]["fits"]


def test_a_peak_over_the_capacity_names_its_phase(tmp_path, capsys):
    path = tmp_path / "zero3.yaml"
    path.write_text(ZERO3_ONE_GPU)
    rows = verdict_rows(capsys, str(path))
    # ZeRO-3 on one GPU shards nothing: 7.6 B trainable parameters x 16 B. vLLM claims 0.4 x capacity in the rollout,
    # so on A100-40GB the update peaks higher, on the larger cards the rollout does. Checkpointing forwards whole rows
    # but asks the LM head for the completion positions only (logits_to_keep): no prompt-sized logits, 154.05 GB
    assert rows["A100-40GB"].endswith("does NOT fit: update peak 154.05 GB > 42.95 GB capacity")
    assert rows["A100-80GB"] == (
        "A100-80GB        85.90    163.22    -77.32  does NOT fit: rollout peak 163.22 GB > 85.90 GB capacity"
    )


def test_bare_plan_plans_the_config_defaults(tmp_path, monkeypatch, capsys):
    """No config, no flags: the default model.name_or_path (runs/tiny-qwen2_5_vl) is not built in a fresh directory,
    so the plan is of the tiny model `vlgrpo model init-tiny` would build there, and it says so."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model: runs/tiny-qwen2_5_vl  (1.11 M params, 0.9 M trainable)")
    assert (
        "note: model.name_or_path=runs/tiny-qwen2_5_vl (the config default) is not built yet: planned the tiny "
        "qwen2_5_vl that `vlgrpo model init-tiny --out runs/tiny-qwen2_5_vl` builds there"
    ) in out
    assert "A100-80GB        85.90      4.35     81.55  fits: update peak 4.35 GB <= 85.90 GB capacity" in out
    r = run_json(capsys)
    # init-tiny's sizes with its BPE's target vocabulary of 512 (tied embeddings)
    assert r["counts"]["total_params"] == 1_111_488 and r["inputs"]["dtype_bytes"] == 2
    assert r["inputs"]["image_tokens"] == 64  # its processor caps images at 28 x 28 x 64 px: 8 x 8 tokens


@pytest.mark.parametrize("arch,tokens", [("qwen2_5_vl", 64), ("qwen2_vl", 64), ("qwen3_vl", 49), ("qwen3_5", 49)])
def test_the_default_model_is_planned_as_init_tiny_builds_it(
    arch, tokens, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """Before and after `vlgrpo model init-tiny --out runs/tiny-qwen2_5_vl`: the same architecture, image tokens from
    the same processor bounds, the parameter count apart from the tokenizer's exact size. The tiny Qwen3-VL has 16 px
    patches (448 px capped at 28 x 28 x 64 px: 224 x 224 -> 7 x 7 tokens), learned positions and DeepStack mergers."""
    from vlgrpo.models import load_model

    monkeypatch.chdir(tmp_path)
    before = run_json(capsys, "--set", f"model.arch={arch}")
    built = Path(tiny_model_dir(arch))
    capsys.readouterr()  # what building it printed
    target = tmp_path / "runs" / "tiny-qwen2_5_vl"
    target.mkdir(parents=True)
    for name in ("config.json", "processor_config.json"):
        shutil.copy(built / name, target / name)
    after = run_json(capsys, "--set", f"model.arch={arch}")
    assert before["config_notes"] and after["config_notes"] == []
    real = sum(p.numel() for p in load_model(str(built), arch).model.parameters())
    vocab = json.loads((built / "config.json").read_text())["text_config"]["vocab_size"]
    assert after["counts"]["total_params"] == real
    assert before["counts"]["total_params"] == real + (512 - vocab) * 128  # tied embeddings, hidden 128
    assert before["inputs"]["image_tokens"] == after["inputs"]["image_tokens"] == tokens


def test_the_default_model_of_an_arch_the_planner_cannot_count_is_named():
    from vlgrpo.config import Config
    from vlgrpo.memory.tiny_spec import init_tiny_spec
    from vlgrpo.tiny import TinySpec

    cfg = Config()
    cfg.model.arch = "llava"  # not an accepted model.arch: only a hand-built config reaches the planner with it
    with pytest.raises(
        PlanError,
        match="model.arch=llava: the planner counts the parameters of qwen2_vl, qwen2_5_vl, .*qwen3_5_moe models",
    ):
        init_tiny_spec(TinySpec(), cfg)


Q3_8B = MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"]


def test_qwen3_vl_8b_lora_and_zero3_on_8_gpus(capsys):
    """`vlgrpo plan --model qwen3-vl-8b --gpus 8` with LoRA rank 64 and with ZeRO-3: the peaks this code computes,
    pinned (the config defaults otherwise: 2 prompts x 8 completions, 128 completion tokens, 448 px -> 196 tokens)."""
    lora = run_json(capsys, "--model", "qwen3-vl-8b", "--gpus", "8", "--lora-rank", "64")
    adapters = 64 * 36 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 12288))
    assert lora["counts"]["trainable_params"] == adapters == 174_587_904
    assert lora["per_gpu"]["weights"] == 8_767_123_696 * 2 + adapters * 4
    assert lora["inputs"]["image_tokens"] == 196  # 448 / 32 = 14 tokens a side
    assert lora["per_gpu"]["total"] == lora["per_gpu"]["train_phase"] == 44_270_576_096
    zero3 = run_json(capsys, "--model", "qwen3-vl-8b", "--gpus", "8", "--zero", "3")
    assert zero3["counts"]["trainable_params"] == Q3_8B.language_params() == 8_190_735_360
    assert zero3["per_gpu"]["zero3_gather"] == 151936 * 4096 * 2  # the embedding, gathered in bf16
    assert zero3["per_gpu"]["total"] == zero3["per_gpu"]["train_phase"] == 41_713_149_756
    rows = verdict_rows(capsys, "--model", "qwen3-vl-8b", "--gpus", "8", "--lora-rank", "64")
    assert rows["A100-80GB"] == (
        "A100-80GB        85.90     44.27     41.63  fits: update peak 44.27 GB <= 85.90 GB capacity"
    )
    assert rows["A100-40GB"].endswith("does NOT fit: update peak 44.27 GB > 42.95 GB capacity")
    rows = verdict_rows(capsys, "--model", "qwen3-vl-8b", "--gpus", "8", "--zero", "3")
    assert rows["A100-80GB"] == (
        "A100-80GB        85.90     41.71     44.19  fits: update peak 41.71 GB <= 85.90 GB capacity"
    )


def test_qwen3_vl_local_directory_is_planned_like_the_table(tmp_path, capsys):
    """A Qwen3-VL checkpoint directory: counts from its config.json, image tokens from its processor file, else the
    released Qwen3-VL processor's 16 px geometry (not Qwen2.5-VL's 14 px: 448 px would give 256 tokens)."""
    released = {
        "model_type": "qwen3_vl",
        "tie_word_embeddings": False,  # Qwen3-VL-8B-Instruct's config.json
        "text_config": {
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "patch_size": 16,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24],
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(released))
    r = run_json(capsys, "--model", str(tmp_path), "--gpus", "8", "--lora-rank", "64")
    table = run_json(capsys, "--model", "qwen3-vl-8b", "--gpus", "8", "--lora-rank", "64")
    assert r["counts"] == table["counts"] and r["per_gpu"] == table["per_gpu"]
    assert r["inputs"]["image_tokens"] == 196
    size = {"shortest_edge": 65536, "longest_edge": 32 * 32 * 64}  # a processor capped at 64 tokens
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16, "merge_size": 2, "size": size}))
    assert run_json(capsys, "--model", str(tmp_path))["inputs"]["image_tokens"] == 64


def test_a_moe_model_is_planned_with_its_active_parameters_and_expert_adapters(capsys):
    """Qwen3-VL-30B-A3B with LoRA: every expert's weights are held (31.07 B), a token runs 3.89 B; adapters on the
    experts add r x 128 x (3 h + 3 I) per layer."""
    from vlgrpo.memory import MODEL_TABLE
    from vlgrpo.memory.specs import lora_params

    s = MODEL_TABLE["Qwen/Qwen3-VL-30B-A3B-Instruct"]
    assert main(["plan", "--model", "Qwen/Qwen3-VL-30B-A3B-Instruct", "--gpus", "8", "--lora-rank", "16"]) == 0
    out = capsys.readouterr().out
    assert "31.08 B params" in out and "3.89 B active per token (128 experts, top-8)" in out  # 31.07 B + the adapters
    assert "routing record 384 B per token" in out  # 48 layers x top-8, a byte each
    attention = lora_params(s, 16, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert lora_params(s, 16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj")) == attention  # no dense MLP
    assert lora_params(s, 16, (), experts=True) == 16 * 128 * (3 * 2048 + 3 * 768) * 48


def test_qwen3_5_9b_lora_and_zero3_on_8_gpus(capsys):
    """`vlgrpo plan --model qwen3.5-9b --gpus 8` with LoRA rank 64 (the default targets: the Gated DeltaNet
    projections included) and with ZeRO-3: the peaks this code computes, pinned, and the rollout term holding the KV
    of the 8 attention layers and a fixed state per sequence for the 24 Gated DeltaNet ones."""
    from vlgrpo.memory import MODEL_TABLE

    s = MODEL_TABLE["Qwen/Qwen3.5-9B"]
    lora = run_json(capsys, "--model", "qwen3.5-9b", "--gpus", "8", "--lora-rank", "64")
    attention = 8 * ((4096 + 8192) + 2 * (4096 + 1024) + (4096 + 4096))  # q_proj: query and gate
    linear = 24 * ((4096 + 8192) + (4096 + 4096) + 2 * (4096 + 32) + (4096 + 4096))
    mlp = 32 * 3 * (4096 + 12288)
    assert lora["counts"]["trainable_params"] == 64 * (attention + linear + mlp) == 173_113_344
    assert lora["per_gpu"]["weights"] == 9_409_813_744 * 2 + 173_113_344 * 4
    prompts, g = lora["inputs"]["prompts_per_step"], lora["inputs"]["completions_per_prompt"]
    prompt = lora["inputs"]["text_tokens"] + lora["inputs"]["image_tokens"]  # one image, no video
    tokens = prompts * (prompt + g * lora["inputs"]["completion_tokens"])
    assert lora["per_gpu"]["kv_cache"] == tokens * 8 * 2 * 4 * 256 * 2 + prompts * (g + 1) * s.state_bytes_per_sequence(
        2
    )
    assert lora["per_gpu"]["total"] == 46_891_121_120
    zero3 = run_json(capsys, "--model", "qwen3.5-9b", "--gpus", "8", "--zero", "3")
    assert zero3["counts"]["trainable_params"] == s.language_params() == 8_953_803_264
    assert zero3["per_gpu"]["zero3_gather"] == 248320 * 4096 * 2  # the embedding, gathered in bf16
    assert zero3["per_gpu"]["total"] == 45_357_526_716
    for argv in (("--lora-rank", "64"), ("--zero", "3")):
        rows = verdict_rows(capsys, "--model", "qwen3.5-9b", "--gpus", "8", *argv)
        assert " fits: update peak" in rows["A100-80GB"] and "does NOT fit" in rows["A100-40GB"]


def test_plan_prices_a_judge_per_step(capsys):
    """8 GPUs x 4 prompts x 8 completions = 256 requests; a prompt: the template's 9 characters outside its
    placeholders (2 tokens at 4 characters a token) + 64 question tokens + 100 completion tokens = 166."""
    recipe = ["--set", "reward.recipe={judge: 1.0}", "--set", "reward.judge.base_url=http://judge:8000/v1"]
    judge = ["--set", "reward.judge.model=big", "--set", "reward.judge.prompt=Q {question} A {answer} R {response}."]
    argv = ["plan", "configs/qwen2_5_vl_7b_lora_8xa100.yaml", "--set", "rollout.max_new_tokens=100", *recipe, *judge]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "judge (big at http://judge:8000/v1): at most 256 requests per step (4 prompts x 8 completions x 8 " in out
    assert "each of about 166 prompt tokens and up to 16 reply tokens: about 42,496 tokens prefilled" in out
    assert main(["plan", "configs/qwen2_5_vl_7b_lora_8xa100.yaml"]) == 0 and "judge" not in capsys.readouterr().out


def test_plan_prices_tool_turns(capsys):
    """rollout.max_turns=5 at 512 new tokens a turn and 256-token images (448 px, the default plan image): 5 x 512
    sampled + 4 tool responses x (256 crop tokens + 24 markup + 64 text) = 3,936 tokens after the prompt, priced in
    every term."""
    tools = ["--set", "rollout.tools=[zoom_in]", "--set", "rollout.max_turns=5", "--set", "rollout.engine=hf"]
    assert main(["plan", "configs/qwen2_5_vl_7b_lora_8xa100.yaml", "--json", *tools]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["completion_tokens"] == 3936
    assert main(["plan", "configs/qwen2_5_vl_7b_lora_8xa100.yaml", *tools]) == 0
    assert "rollout.max_turns=5: 3,936 tokens after the prompt planned (5 x 512 sampled + 4 tool responses" in (
        capsys.readouterr().out
    )
