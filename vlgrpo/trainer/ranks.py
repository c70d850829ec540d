"""The data-parallel ranks' collectives: this process's rank, counts and values reduced or gathered over every rank,
the union batch's normalisers and the plain/LoRA gradient all-reduce. Each is the value itself in a single process;
under NCCL the collective's tensor lives on this rank's GPU. Every wait marks the watchdog's `waiting_for_ranks`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlgrpo.trainer.watchdog import waiting_for_ranks


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Data parallelism for the plain and LoRA backends: all-reduce (mean) the accumulated gradients once per
    optimiser step, flattened into one buffer. Each rank's loss is normalised by the whole batch's count over all
    ranks divided by the world size (`global_normalisers`), so this mean is the gradient of the union batch's loss,
    as DeepSpeed's own mean is under ZeRO-3."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with waiting_for_ranks("the gradient all-reduce"):
        dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p, g in zip(params, grads):
        p.grad = flat[offset : offset + g.numel()].view_as(p).clone()
        offset += g.numel()


def rank_world() -> tuple[int, int]:
    """This process's data-parallel rank and the number of ranks ((0, 1) in a single process)."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _collective_device() -> str:
    """Where a collective's tensor must live: this rank's GPU under NCCL, the CPU under gloo."""
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def _reduce(values: torch.Tensor, op) -> torch.Tensor:
    """`values` (a CPU tensor) reduced over the data-parallel ranks with `op`, on the device the backend needs; the
    tensor itself in a single process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    t = values.to(_collective_device())
    with waiting_for_ranks("an all-reduce of counts"):
        dist.all_reduce(t, op=op)
    return t.cpu()


def max_over_ranks(value: int) -> int:
    """The largest `value` over the data-parallel ranks (the value itself in a single process): lets every rank run
    the same number of collective rounds, e.g. dynamic sampling's top-ups."""
    return int(_reduce(torch.tensor([value], dtype=torch.long), dist.ReduceOp.MAX).item())


def sum_over_ranks(values: list[int]) -> list[int]:
    """Each of `values` summed over the data-parallel ranks (the values themselves in a single process)."""
    return [int(v) for v in _reduce(torch.tensor(values, dtype=torch.long), dist.ReduceOp.SUM).tolist()]


def sum_tensor_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """A float tensor summed over the data-parallel ranks, in float64 (itself, as float64, in a single process):
    the reducer the pure GRPO functions take for statistics of the union batch (batch-scaled advantages)."""
    return _reduce(values.detach().double().cpu(), dist.ReduceOp.SUM)


def gather_from_ranks(obj: object) -> list:
    """Every rank's `obj` (picklable), in rank order; `[obj]` in a single process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    with waiting_for_ranks("a gather of checksums"):
        dist.all_gather_object(out, obj)
    return out


def global_normalisers(loss_mask: torch.Tensor) -> tuple[float, float]:
    """(tokens, sequences) that this rank's loss divides by: the counts of the whole optimiser batch summed over
    every rank, divided by the number of ranks.

    The ranks' gradients are averaged (`average_gradients`; DeepSpeed does the same), so a loss of
    sum_local / (count_all / world) on each rank gives the gradient of sum_all / count_all: the update of one
    process on the union of the ranks' batches, whatever each rank's share of the tokens. A rank's own count
    instead would give the mean of per-rank token means, which weighs a rank of short completions up (DAPO's
    token-level loss; TRL's `num_items_in_batch`, verl's global token count)."""
    world = rank_world()[1]
    mask = loss_mask.detach().cpu()
    tokens, sequences = sum_tensor_over_ranks(torch.tensor([float(mask.sum()), float(mask.shape[0])])).tolist()
    return tokens / world, sequences / world


def from_rank0(value: int) -> int:
    """Rank 0's `value` on every rank (the value itself in a single process): a decision rank 0 took alone, e.g.
    which checkpoint verified."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.long, device=_collective_device())
    dist.broadcast(t, src=0)
    return int(t.item())
