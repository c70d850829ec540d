"""`vlgrpo plan`'s checkpoint size, write time and bytes per weight sync: what each backend's checkpoint holds."""

import pytest

from vlgrpo.memory.checkpoint import checkpoint_bytes, sync_bytes, write_seconds
from vlgrpo.memory.inputs import PlanInput
from vlgrpo.memory.models import resolve_model
from vlgrpo.memory.report import build_report, format_report


def test_each_backend_checkpoints_what_it_keeps():
    total, trainable = 8_000_000_000, 7_000_000_000  # 1 B frozen (the vision tower)
    plain = checkpoint_bytes(PlanInput(params=1, dtype_bytes=2), total, trainable)
    # the whole bf16 model + fp32 master + two fp32 moments of the trainable weights
    assert plain == {"weights": 16e9, "adapter": 0, "optimizer": 84e9, "total": 100e9}
    fp32 = checkpoint_bytes(PlanInput(params=1, dtype_bytes=4), total, trainable)
    assert fp32["optimizer"] == 56e9  # no master copy: the weights are fp32 already
    zero3 = checkpoint_bytes(PlanInput(params=1, dtype_bytes=2, zero_stage=3), total, trainable)
    assert zero3 == {"weights": 2e9, "adapter": 0, "optimizer": 84e9, "total": 86e9}  # DeepSpeed's 12 B partitions
    lora = checkpoint_bytes(PlanInput(params=1, dtype_bytes=2, lora_rank=64), total, 160_000_000)
    assert lora == {"weights": 0, "adapter": 640e6, "optimizer": 1280e6, "total": 1920e6}  # never the base
    assert sync_bytes(PlanInput(params=1, dtype_bytes=2, lora_rank=64), total, 160_000_000) == {
        "full": 2 * (total - 160_000_000),  # without a spec: the whole base, an upper bound
        "whole": 2 * (total - 160_000_000),
        "adapter": 640e6,
    }
    assert write_seconds(100e9, 2.0) == 50.0


def test_a_sync_sends_what_changes_the_trained_weights_or_the_merged_blocks():
    """The bucketed sync (rollout.weight_stream): a full fine-tune's trainable weights; LoRA's merged layers, the
    language model's blocks without its embeddings; the whole model only as the figure before buckets."""
    full = sync_bytes(PlanInput(params=1, dtype_bytes=2), 8_000_000_000, 7_000_000_000)
    assert full == {"full": 14e9, "whole": 16e9, "adapter": 0}
    spec = resolve_model("Qwen/Qwen3.5-9B")
    lora = sync_bytes(PlanInput(spec=spec, dtype_bytes=2, lora_rank=64), spec.total_params(), 1)
    blocks = spec.language_params() - spec.vocab * spec.hidden * (1 if spec.tie_embeddings else 2) - spec.hidden
    assert lora["full"] == 2 * blocks and lora["whole"] == 2 * (spec.total_params() - 1)


@pytest.mark.parametrize(
    "name, block", [("Qwen/Qwen3.5-9B", 528), ("Qwen/Qwen3.5-27B", 800), ("Qwen/Qwen2.5-VL-7B-Instruct", 0)]
)
def test_the_prefix_cache_block_of_a_hybrid_is_vllms(name, block):
    """vLLM sizes a hybrid's block so its attention pages hold one Gated DeltaNet layer's state (the 9B: 528 tokens,
    the size users of Qwen3.5 report as the smallest that caches anything); a dense model has no such floor."""
    assert resolve_model(name).prefix_block_tokens(2) == block


def test_plan_prints_the_checkpoint_of_the_7b_zero3_recipe():
    report = build_report(PlanInput(params=8_000_000_000, dtype_bytes=2, zero_stage=3, num_gpus=8), write_gbps=2.0)
    assert report["checkpoint"]["total"] == 96e9 and report["checkpoint"]["write_s"] == pytest.approx(48.0)
    assert "checkpoint: 96.00 GB (optimizer 96.00); written in ~48 s at 2 GB/s" in format_report(report)


def test_plan_says_what_share_of_a_prompt_a_hybrids_prefix_cache_reuses():
    """The 9B recipe's 260-token prompt is shorter than a block: vLLM's prefix cache shares nothing of it between a
    group's samples, and `vlgrpo plan` says so (the hit rate is `rollout/prefix_cache_hit_rate` in a run)."""
    from pathlib import Path

    from vlgrpo.config import load_config
    from vlgrpo.memory.from_config import plan_input_from_config

    recipe = Path(__file__).parents[2] / "configs" / "qwen3_5_9b_lora_8xa100.yaml"
    text = format_report(build_report(plan_input_from_config(load_config(str(recipe)))))
    assert "vLLM prefix caching of a hybrid model: blocks of 528 tokens" in text
    assert "of a 260-token prompt, 0 are reused by the group's other samples (0%; a prompt shorter than a block" in text
    assert "vLLM's multimodal processor cache: off (mm_processor_cache_gb=0;" in text  # the recipe is colocated
    dense = Path(__file__).parents[2] / "configs" / "qwen2_5_vl_7b_zero3_8xa100.yaml"
    assert "prefix caching of a hybrid" not in format_report(
        build_report(plan_input_from_config(load_config(str(dense))))
    )
