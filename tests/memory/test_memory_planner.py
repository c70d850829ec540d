"""Planner arithmetic: the 16-byte rule, the three-models GRPO estimate, DeepSpeed's estimators, activations,
rollout terms, verdicts and suggestions. Every expected value is computed by hand in the test."""

import os
from dataclasses import replace

import pytest

from vlgrpo.memory import GPU_TYPES, MODEL_TABLE, PlanError, PlanInput, plan, suggestions, verdicts
from vlgrpo.memory.fit import peak_on

GB = 10**9
Q7 = MODEL_TABLE["Qwen/Qwen2.5-VL-7B-Instruct"]
ALL_PARTS = ("vision", "merger", "language")


def states(inp: PlanInput) -> int:
    return plan(inp)["per_gpu"]["model_states"]


def test_sixteen_bytes_per_parameter_rule():
    base = PlanInput(params=7_000_000_000, dtype_bytes=2, num_gpus=1)
    assert states(base) == 112 * GB  # plain data parallel: 2 + 2 + 12 bytes, nothing sharded
    d8 = replace(base, num_gpus=8)
    assert states(d8) == 112 * GB  # ZeRO-0 replicates everything
    assert states(replace(d8, zero_stage=1)) == 38.5 * GB  # 2P + 2P + 12P/8
    assert states(replace(d8, zero_stage=2)) == 26.25 * GB  # 2P + (2 + 12)P/8
    assert states(replace(d8, zero_stage=3)) == 14 * GB  # 16P/8
    assert "16-byte convention" in plan(d8)["conventions"]["model_states"]


def test_fp32_weights_also_make_16_bytes_without_a_master_copy():
    p = plan(PlanInput(params=1_000_000_000, dtype_bytes=4))["per_gpu"]
    assert (p["weights"], p["gradients"], p["optimizer"]) == (4 * GB, 4 * GB, 8 * GB)


def test_three_models_grpo_estimate():
    inp = PlanInput(
        params=7_000_000_000, dtype_bytes=2, optimizer_states="bf16", beta=0.04, reward_model_params=7_000_000_000
    )
    g = plan(inp)["per_gpu"]
    assert g["weights"] + g["reference"] + g["reward_model"] == 42 * GB  # actor + reference + reward, bf16
    assert g["optimizer"] == 28 * GB  # two bf16 moments
    assert g["gradients"] == 14 * GB
    assert g["model_states"] + g["reference"] + g["reward_model"] == 84 * GB
    off = plan(replace(inp, offload=frozenset({"reference", "reward", "optimizer"})))
    g2 = off["per_gpu"]
    assert g2["model_states"] + g2["reference"] + g2["reward_model"] == 28 * GB
    assert (off["cpu"]["optimizer"], off["cpu"]["reference"], off["cpu"]["reward_model"]) == (28 * GB, 14 * GB, 14 * GB)


def test_no_reference_for_lora_or_beta_zero():
    full = PlanInput(spec=Q7, beta=0.04)
    assert plan(full)["per_gpu"]["reference"] == Q7.total_params() * 2
    assert plan(replace(full, beta=0.0))["per_gpu"]["reference"] == 0
    assert plan(replace(full, lora_rank=16))["per_gpu"]["reference"] == 0  # adapter disabled = reference
    z3 = plan(replace(full, zero_stage=3, num_gpus=8))["per_gpu"]["reference"]
    assert z3 == Q7.total_params() * 2 // 8


def test_lora_states_are_fp32_adapters_on_a_frozen_base():
    g = plan(PlanInput(spec=Q7, lora_rank=16))["per_gpu"]
    adapters = 40_370_176
    assert g["weights"] == Q7.total_params() * 2 + adapters * 4
    assert (g["gradients"], g["optimizer"]) == (adapters * 4, adapters * 8)


def test_freeze_flags_pick_the_trainable_parts():
    g = plan(PlanInput(spec=Q7, trainable=("merger",)))["per_gpu"]
    assert g["gradients"] == Q7.merger_params() * 2 and g["optimizer"] == Q7.merger_params() * 12
    with pytest.raises(PlanError, match="accepted: vision, merger, language"):
        plan(PlanInput(spec=Q7, trainable=("lm",)))


# DeepSpeed's estimators count 18 B per parameter for ZeRO-2/3 states (bf16 + fp32 grads, fp32 master, two fp32
# moments) plus 4 B x the largest layer for ZeRO-3.
DS_MODELS = ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-72B-Instruct"]


@pytest.mark.parametrize("name", DS_MODELS)
@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_matches_deepspeed_estimators(name, gpus):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as ds3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as ds2

    spec = MODEL_TABLE[name]
    total, largest = spec.total_params(), spec.largest_layer_params()
    per_node, nodes = min(gpus, 8), max(1, gpus // 8)
    inp = PlanInput(spec=spec, trainable=ALL_PARTS, dtype_bytes=2, convention="18-byte", num_gpus=gpus)
    cases = [
        (3, frozenset(), ds3(total, largest, per_node, nodes, cpu_offload=False)[1]),
        (
            3,
            frozenset({"optimizer"}),
            ds3(total, largest, per_node, nodes, cpu_offload=True, cpu_offload_params=False)[1],
        ),
        (
            3,
            frozenset({"optimizer", "param"}),
            ds3(total, largest, per_node, nodes, cpu_offload=True, cpu_offload_params=True)[1],
        ),
        (2, frozenset(), ds2(total, per_node, nodes, cpu_offload=False)[1]),
        (2, frozenset({"optimizer"}), ds2(total, per_node, nodes, cpu_offload=True)[1]),
    ]
    for stage, offload, expected in cases:
        g = plan(replace(inp, zero_stage=stage, offload=offload))["per_gpu"]
        ours = g["model_states"] + g["zero3_gather"]
        assert abs(ours - expected) <= 0.01 * expected, (stage, sorted(offload), ours, expected)
    conv = plan(replace(inp, zero_stage=3))["conventions"]
    assert conv["model_states"].startswith("18-byte") and "4 B" in conv["zero3_gather"]


def test_eighteen_byte_zero3_by_hand():
    g = plan(
        PlanInput(
            params=8_000_000_000,
            largest_layer=500_000_000,
            dtype_bytes=2,
            convention="18-byte",
            zero_stage=3,
            num_gpus=8,
        )
    )["per_gpu"]
    assert g["model_states"] == 18 * GB and g["zero3_gather"] == 2 * GB  # 18 * 8e9 / 8, 4 * 5e8


def test_activations_and_logits_by_hand():
    inp = PlanInput(spec=Q7, micro_batch=4, text_tokens=64, image_tokens=256, completion_tokens=512)
    g = plan(inp)["per_gpu"]
    # T = 832; per token per layer 2 * (6*3584 + 2*512 + 4*18944) = 196,608 B
    assert g["activations"] == 196_608 * 4 * 832 * 28 == 18_320_719_872
    assert g["logits"] == 4 * 512 * 152064 * (2 + 4 + 4)
    ck = plan(replace(inp, gradient_checkpointing=True, logits_chunk=128))["per_gpu"]
    assert ck["activations"] == 2 * 3584 * 4 * 832 * 28 + 196_608 * 4 * 832  # layer inputs + one layer
    # checkpointing forwards whole rows but asks the LM head for the completion positions only (logits_to_keep)
    assert ck["logits"] == 4 * 128 * 152064 * 10


def test_trainable_vit_adds_its_activations():
    s = MODEL_TABLE["Qwen/Qwen2-VL-2B-Instruct"]
    inp = PlanInput(spec=s, trainable=ALL_PARTS, micro_batch=1, text_tokens=0, image_tokens=4, completion_tokens=4)
    lm = 2 * (6 * 1536 + 2 * 256 + 4 * 8960) * 8 * 28  # T = 8 tokens, 28 layers
    vit = 2 * (8 * 1280 + 2 * 5120) * 16 * 32  # 4 image tokens = 16 patches, GELU MLP saves 2 x 5120
    assert plan(inp)["per_gpu"]["activations"] == lm + vit
    assert plan(replace(inp, trainable=("language",)))["per_gpu"]["activations"] == lm


def test_rollout_kv_cache_hf_and_vllm_prefix_sharing():
    inp = PlanInput(
        spec=Q7,
        prompts_per_step=1,
        completions_per_prompt=8,
        text_tokens=3840,
        image_tokens=0,
        completion_tokens=256,
        max_prompt_length=4096,
    )
    per_token = 2 * 28 * 4 * 128 * 2
    hf = plan(inp)["per_gpu"]
    assert hf["kv_cache"] == per_token * (3840 + 8 * 256)  # the shared-prefix decode: one prompt KV per group
    assert hf["kv_cache"] < 1_879_048_192 == per_token * 8 * 4096  # not 8 sequences x 4096 tokens
    assert hf["rollout_weights"] == 0  # HF generates with the policy's own weights
    v = plan(replace(inp, engine="vllm"))["per_gpu"]
    assert v["kv_cache"] == per_token * (3840 + 8 * 256)  # prefix caching: prompt stored once per group
    assert v["rollout_weights"] == Q7.total_params() * 2
    split = plan(replace(inp, engine="vllm", vllm_placement="split", num_gpus=8, rollout_gpus=2))
    assert split["counts"]["train_gpus"] == 6
    assert split["per_gpu"]["kv_cache"] == per_token * 3 * (3840 + 8 * 256)  # 6 ranks' prompts over 2 GPUs
    # multi-turn on the HF engine: each trajectory's KV (its prompt's copy too) is kept from turn to turn
    turns = plan(replace(inp, turn_kv=True))["per_gpu"]
    assert turns["kv_cache"] == per_token * (3840 + 8 * (3840 + 256))


def test_a_kept_prefill_holds_the_steps_prompt_activations_in_both_phases():
    """train.prefill_once on: the step's B prompts' activations (`activation_bytes` of B rows of the prompt's tokens,
    hand-computed here for Qwen2.5-VL-7B's shapes) are held through the rollout and the update."""
    inp = PlanInput(spec=Q7, prompts_per_step=2, text_tokens=1000, image_tokens=0, completion_tokens=256)
    off, on = plan(inp)["per_gpu"], plan(replace(inp, kept_prefill=True))["per_gpu"]
    per_token = 4 * 3584 + 2 * 3584 + 2 * 512 + 4 * 18944  # norm/q/MLP inputs, q + attention out, k + v, MLP
    assert off["kept_prefill"] == 0
    assert on["kept_prefill"] == 2 * per_token * 2 * 1000 * 28  # bf16, 2 prompts, 1000 tokens, 28 layers
    assert on["rollout_phase"] - off["rollout_phase"] == on["kept_prefill"]
    assert on["train_phase"] - off["train_phase"] == on["kept_prefill"]


def test_vllm_colocated_peak_takes_its_budget():
    inp = PlanInput(spec=Q7, lora_rank=16, engine="vllm", vllm_gpu_memory_utilization=0.4, num_gpus=8)
    g = plan(inp)["per_gpu"]
    cap = GPU_TYPES["A100-80GB"]
    peak, startable, _ = peak_on(inp, g, cap)
    resident = g["weights"] + g["optimizer"] + g["vision_cache"] + g["overhead"]
    assert startable and peak == max(g["train_phase"], resident + int(0.4 * cap))
    no_sleep, _, _ = peak_on(replace(inp, vllm_sleep=False), g, cap)
    assert no_sleep == max(g["train_phase"] + int(0.4 * cap), resident + int(0.4 * cap))
    _, ok, warnings = peak_on(replace(inp, vllm_gpu_memory_utilization=0.1), g, cap)
    assert not ok and "raise rollout.vllm.gpu_memory_utilization" in warnings[0]


def test_zero3_rollout_gathers_weights_on_training_gpus():
    inp = PlanInput(spec=Q7, zero_stage=3, num_gpus=8, engine="vllm", vllm_gpu_memory_utilization=0.4)
    g = plan(inp)["per_gpu"]
    vision = (Q7.vision_params() + Q7.merger_params()) * 2  # bf16 tower + merger: all vLLM needs the trainer for
    assert g["zero3_rollout_gather"] == vision * 7 // 8  # minus the 1/8 shard already resident
    resident = sum(
        g[k] for k in ("weights", "optimizer", "reference", "reward_model", "critic", "vision_cache", "overhead")
    )
    assert g["rollout_phase"] == resident + g["zero3_rollout_gather"] + g["rollout_weights"] + g["kv_cache"]
    peak, _, _ = peak_on(inp, g, GPU_TYPES["A100-80GB"])
    assert peak >= resident + g["zero3_rollout_gather"] + int(0.4 * GPU_TYPES["A100-80GB"])
    hf = plan(replace(inp, engine="hf"))["per_gpu"]  # the HF engine decodes with the whole gathered policy
    assert hf["zero3_rollout_gather"] == Q7.total_params() * 2 * 7 // 8
    assert plan(replace(inp, zero_stage=2))["per_gpu"]["zero3_rollout_gather"] == 0
    split = replace(inp, vllm_placement="split", rollout_gpus=4)
    assert plan(split)["per_gpu"]["zero3_rollout_gather"] == 0  # nothing encodes or decodes on training GPUs


def test_verdicts_and_headroom():
    inp = PlanInput(params=7_000_000_000, num_gpus=8, zero_stage=3, vision_cache_bytes=0, overhead_bytes=GB)
    v = verdicts(inp, plan(inp)["per_gpu"])
    # rollout phase peaks: 1.75 GB weight shard + 10.5 GB optimiser + 1 GB overhead + 12.25 GB (the other 7/8 of the
    # 14 GB bf16 policy, gathered for HF decoding) = 25.5 GB; training peaks at 14 + 1 = 15 GB
    assert v["A100-40GB"] == {
        "fits": True,
        "headroom_bytes": GPU_TYPES["A100-40GB"] - int(25.5 * GB),
        "capacity_bytes": 40960 * 2**20,
        "peak_bytes": int(25.5 * GB),
        "peak_phase": "rollout",
        "reason": "rollout peak 25.50 GB <= 42.95 GB capacity",
        "warnings": [],
    }
    big = replace(inp, zero_stage=0)  # 112 GB of model states + 1 GB overhead
    v = verdicts(big, plan(big)["per_gpu"])
    assert [k for k, x in v.items() if x["fits"]] == ["H200-141GB"]
    assert v["A100-80GB"]["headroom_bytes"] == 81920 * 2**20 - 113 * GB
    # the whole capacity is compared, no margin: 113 GB against 81920 MiB = 85.90 GB
    assert v["A100-80GB"]["reason"] == "update peak 113.00 GB > 85.90 GB capacity"


def test_verdict_reasons_name_the_phase_and_vllms_budget():
    # LoRA 7B, vLLM colocated at 0.2: its budget on A100-80GB is 0.2 x 85.90 = 17.18 GB, more than the 16.58 GB of
    # bf16 weights; on A100-40GB it is 8.59 GB, so the engine cannot start whatever the peak
    inp = PlanInput(spec=Q7, lora_rank=16, engine="vllm", vllm_gpu_memory_utilization=0.2, num_gpus=8)
    g = plan(inp)["per_gpu"]
    v = verdicts(inp, g)
    assert not v["A100-40GB"]["fits"] and v["A100-40GB"]["headroom_bytes"] > 0
    assert v["A100-40GB"]["reason"] == (
        "vLLM weights 16.58 GB > its budget 8.59 GB (gpu_memory_utilization 0.2 x 42.95 GB): the engine cannot start"
    )
    assert v["A100-80GB"]["fits"] and v["A100-80GB"]["peak_phase"] == "update"  # the update outweighs 17.18 GB
    # without sleep mode vLLM keeps its budget through the update: the update peaks higher by exactly that budget
    awake = verdicts(replace(inp, vllm_sleep=False), g)["A100-80GB"]
    assert awake["peak_bytes"] == g["train_phase"] + int(0.2 * GPU_TYPES["A100-80GB"])
    assert awake["reason"] == f"update peak {awake['peak_bytes'] / GB:.2f} GB <= 85.90 GB capacity"


def test_suggestions_when_it_does_not_fit():
    inp = PlanInput(spec=Q7, num_gpus=8, beta=0.04, micro_batch=8, completion_tokens=512)
    assert not verdicts(inp, plan(inp)["per_gpu"])["A100-80GB"]["fits"]
    out = suggestions(inp, "A100-80GB")
    changes = {s["change"]: s for s in out}
    # only what the trainer runs: no ZeRO-1/2, no offloading outside ZeRO-3, no reference offload
    assert {
        "model.gradient_checkpointing=true",
        "train.micro_batch_completions=4",
        "train.backend=lora train.lora.rank=16",
        "train.backend=zero3",
        "train.backend=zero3 train.zero3.offload_optimizer=true",
    } == set(changes)
    assert changes["train.backend=lora train.lora.rank=16"]["peak_bytes"] < plan(inp)["per_gpu"]["total"]
    assert any(s["fits"] for s in out)
    assert suggestions(replace(inp, lora_rank=16, gradient_checkpointing=True), "A100-80GB") == []
    with pytest.raises(PlanError, match="accepted: A100-40GB"):
        suggestions(inp, "V100")


def test_greedy_combination_when_no_single_change_fits():
    # vLLM over 8-way tensor parallelism: with the HF engine ZeRO-3 would gather all 147 GB of bf16 weights to decode
    inp = PlanInput(
        spec=MODEL_TABLE["Qwen/Qwen2.5-VL-72B-Instruct"],
        num_gpus=8,
        completion_tokens=512,
        engine="vllm",
        tensor_parallel=8,
    )
    out = suggestions(inp, "A100-80GB")
    assert not any(s["fits"] for s in out[:-1])
    combo = out[-1]
    assert combo["fits"] and combo["peak_bytes"] <= GPU_TYPES["A100-80GB"]
    # ZeRO-3 shards the 147 GB of bf16 weights; the optimiser goes to the CPU; checkpointing cuts activations
    assert set(combo["overrides"]) == {
        "train.backend=zero3",
        "model.gradient_checkpointing=true",
        "train.zero3.offload_optimizer=true",
    }
    assert combo["change"] == " ".join(combo["overrides"])


def test_bad_inputs_are_named():
    with pytest.raises(PlanError, match="--offload param needs ZeRO-3"):
        plan(PlanInput(params=10, offload=frozenset({"param"})))
    with pytest.raises(PlanError, match="give a model"):
        plan(PlanInput())
    with pytest.raises(PlanError, match="no training GPUs"):
        plan(PlanInput(params=10, engine="vllm", vllm_placement="split", num_gpus=2, rollout_gpus=2))
    with pytest.raises(PlanError, match="accepted: fp32, bf16"):
        plan(PlanInput(params=10, optimizer_states="int8"))


def test_prompt_longer_than_max_prompt_length_warns():
    w = plan(PlanInput(spec=Q7, text_tokens=900, image_tokens=256, max_prompt_length=1024))["warnings"]
    assert w and "exceeds data.max_prompt_length=1024" in w[0]


Q3_8B = MODEL_TABLE["Qwen/Qwen3-VL-8B-Instruct"]


def test_qwen3_activations_count_the_query_width_and_the_qk_norms():
    inp = PlanInput(spec=Q3_8B, micro_batch=4, text_tokens=64, image_tokens=196, completion_tokens=512)
    g = plan(inp)["per_gpu"]
    # T = 772; per token per layer 2 B x (4h + 2q + 2kv + 4I + q + kv): the q_norm / k_norm inputs on top of Qwen2's
    per_token = 2 * (4 * 4096 + 2 * 4096 + 2 * 1024 + 4 * 12288 + 4096 + 1024)
    assert per_token == 161_792
    assert g["activations"] == per_token * 4 * 772 * 36
    ck = plan(replace(inp, gradient_checkpointing=True))["per_gpu"]
    assert ck["activations"] == 2 * 4096 * 4 * 772 * 36 + per_token * 4 * 772
    q4 = MODEL_TABLE["Qwen/Qwen3-VL-4B-Instruct"]  # query width 32 x 128 = 4096 on a 2560 hidden size
    g4 = plan(replace(inp, spec=q4, gradient_checkpointing=False))["per_gpu"]
    assert g4["activations"] == 2 * (4 * 2560 + 3 * 4096 + 3 * 1024 + 4 * 9728) * 4 * 772 * 36


def test_qwen3_step_features_hold_the_deepstack_maps():
    inp = PlanInput(spec=Q3_8B, prompts_per_step=4, image_tokens=196, vision_cache_bytes=0)
    # the merged embeddings and 3 DeepStack maps per image token, each [N, 4096] in bf16
    assert plan(inp)["per_gpu"]["vision_cache"] == 4 * 196 * 4096 * 2 * (1 + 3)
    assert plan(replace(inp, spec=Q7))["per_gpu"]["vision_cache"] == 4 * 196 * 3584 * 2  # no DeepStack


def test_qwen3_zero3_rollout_gathers_the_deepstack_mergers_too():
    inp = PlanInput(spec=Q3_8B, zero_stage=3, num_gpus=8, engine="vllm")
    tower = 415_891_440 + 160_496_896  # ViT + position table + patch embedding; merger + 3 DeepStack mergers
    assert plan(inp)["per_gpu"]["zero3_rollout_gather"] == tower * 2 * 7 // 8
