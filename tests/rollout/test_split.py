"""`rollout/split.py`'s device choice: each training rank's worker runs vLLM on a GPU of its own, the one
`vlgrpo plan` prices for it (the node's first GPUs train, rank k on cuda:k; the next ones run vLLM, one per rank);
and how the weights travel to the worker."""

import io
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from vlgrpo.config import ConfigError
from vlgrpo.rollout.split import pack_weights, unpack_weights, worker_gpu


def test_weights_travel_as_one_buffer_per_dtype_and_come_back_equal():
    weights = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5, 6).t(),
        "c": torch.arange(7, dtype=torch.int64),
        "d": torch.randn(2, 2).to(torch.bfloat16),
        "e": torch.randn(4),
    }
    layout, flats = pack_weights(weights.items())
    assert {dtype: t.numel() for dtype, t in flats.items()} == {
        torch.float32: 12 + 30 + 4,
        torch.int64: 7,
        torch.bfloat16: 4,
    }
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump((layout, flats))  # what the queue does: one shared-memory segment per buffer
    back = unpack_weights(*ForkingPickler.loads(buffer.getvalue()))
    assert list(back) == list(weights)
    for name, t in weights.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name  # the transposed one too
    weights["a"].add_(1.0)  # the trainer updates its own in place: the sent copy keeps the old values
    assert not torch.equal(back["a"], weights["a"])
    assert unpack_weights(*pack_weights([])) == {}


def test_each_rank_gets_the_rollout_gpu_after_the_training_ones():
    assert [worker_gpu(k, 4, 4, [str(i) for i in range(8)]) for k in range(4)] == ["4", "5", "6", "7"]
    assert worker_gpu(0, 1, 1, ["0", "1"]) == "1"


def test_the_choice_indexes_the_gpus_the_trainer_sees():
    """Under CUDA_VISIBLE_DEVICES=6,7,2,3 rank 1 trains on cuda:1 (GPU 7), and its worker gets GPU 3."""
    assert worker_gpu(1, 2, 2, ["6", "7", "2", "3"]) == "3"
    assert worker_gpu(0, 2, 2, ["GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"]) == "GPU-c"  # UUIDs; GPU-e idles


@pytest.mark.parametrize(
    "rollout_gpus, visible, message",
    [
        (
            2,
            [str(i) for i in range(8)],
            r"4 training rank\(s\) on this node need rollout.vllm.rollout_gpus=4 \(got 2\)",
        ),
        (6, [str(i) for i in range(10)], r"need rollout.vllm.rollout_gpus=4 \(got 6\)"),  # two would idle
        (4, [str(i) for i in range(7)], "need 8 GPUs on this node, 7 are visible"),
    ],
)
def test_other_layouts_and_too_few_gpus_are_refused(rollout_gpus, visible, message):
    with pytest.raises(ConfigError, match=message):
        worker_gpu(0, 4, rollout_gpus, visible)
