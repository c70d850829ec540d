"""`vlgrpo plan`'s checkpoint size, write time and bytes per weight sync: what each backend's checkpoint holds."""

import pytest

from vlgrpo.memory.checkpoint import checkpoint_bytes, sync_bytes, write_seconds
from vlgrpo.memory.inputs import PlanInput
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
        "full": 2 * (total - 160_000_000),
        "adapter": 640e6,
    }
    assert write_seconds(100e9, 2.0) == 50.0


def test_plan_prints_the_checkpoint_of_the_7b_zero3_recipe():
    report = build_report(PlanInput(params=8_000_000_000, dtype_bytes=2, zero_stage=3, num_gpus=8), write_gbps=2.0)
    assert report["checkpoint"]["total"] == 96e9 and report["checkpoint"]["write_s"] == pytest.approx(48.0)
    assert "checkpoint: 96.00 GB (optimizer 96.00); written in ~48 s at 2 GB/s" in format_report(report)
