"""`rollout/split.py`'s device choice: each training rank's worker runs vLLM on a GPU of its own, the one
`vlgrpo plan` prices for it (the node's first GPUs train, rank k on cuda:k; the next ones run vLLM, one per rank)."""

import pytest

from vlgrpo.config import ConfigError
from vlgrpo.rollout.split import worker_gpu


def test_each_rank_gets_the_rollout_gpu_after_the_training_ones():
    assert [worker_gpu(k, 4, 4, [str(i) for i in range(8)]) for k in range(4)] == ["4", "5", "6", "7"]
    assert worker_gpu(0, 1, 1, ["0", "1"]) == "1"


def test_the_choice_indexes_the_gpus_the_trainer_sees():
    """Under CUDA_VISIBLE_DEVICES=6,7,2,3 rank 1 trains on cuda:1 (GPU 7), and its worker gets GPU 3."""
    assert worker_gpu(1, 2, 2, ["6", "7", "2", "3"]) == "3"
    assert worker_gpu(0, 2, 2, ["GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"]) == "GPU-c"  # UUIDs; GPU-e idles


@pytest.mark.parametrize("rollout_gpus, visible, message", [
    (2, [str(i) for i in range(8)], r"4 training rank\(s\) on this node need rollout.vllm.rollout_gpus=4 \(got 2\)"),
    (6, [str(i) for i in range(10)], r"need rollout.vllm.rollout_gpus=4 \(got 6\)"),  # two would idle
    (4, [str(i) for i in range(7)], "need 8 GPUs on this node, 7 are visible"),
])  # fmt: skip
def test_other_layouts_and_too_few_gpus_are_refused(rollout_gpus, visible, message):
    with pytest.raises(ConfigError, match=message):
        worker_gpu(0, 4, rollout_gpus, visible)
