"""Weights to a rollout engine in fixed-size buckets: only the tensors that can change (the trainable ones; with LoRA,
the merged layers), the next bucket packed while the previous one travels, each bucket loaded as it arrives.

A sync is planned once (`plan_buckets`: which tensors, in which bucket, at which byte offset) from the tensors' names,
dtypes and shapes, which do not change during a run; every sync then moves the same buckets (`WeightBuckets`: the
plan and where each bucket's tensors come from, ZeRO-3 gathering a bucket at once). A colocated engine reads the
trainer's tensors in place, bucket by bucket. Where the engine runs in a process of its own (rollout.placement=split)
the trainer and its worker form a process group of two (`PairGroup`: gloo on the CPU, NCCL where both sides hold a
GPU): the trainer packs each bucket into one of two byte buffers and sends it, packing bucket i+1 while bucket i is in
flight (`send_buckets`); the worker receives into one of two buffers and loads bucket i while bucket i+1 arrives
(`receive_buckets`).

What a sync moved goes into the step's metrics (`SyncStats`; its time is `timing/sync`). Knows nothing of backends,
engines or configs.
"""

from __future__ import annotations

import datetime
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from vlgrpo import heartbeat

ALIGN = 64
"""Byte alignment of each tensor in a bucket: a view of any dtype starts aligned."""

POLL_S = 1.0
"""How often a side blocked in a transfer checks that the other is alive (and beats the watchdog)."""

TIMEOUT_S = 3 * 3600.0
"""The pair's store and group timeout: a send waits for the worker to finish the batch it samples, which at 7B can
take minutes; a dead peer is noticed within POLL_S instead (`_watched`)."""


@dataclass(frozen=True)
class Entry:
    """One tensor's place in its bucket."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """Bytes from the bucket's start (a multiple of ALIGN)."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Bucket:
    entries: tuple[Entry, ...]
    nbytes: int
    """The buffer this bucket takes: its last entry's end."""

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @property
    def payload(self) -> int:
        """The bytes of its tensors (without alignment gaps)."""
        return sum(e.nbytes for e in self.entries)


Spec = tuple[str, torch.dtype, tuple[int, ...]]
"""(name, dtype, shape) of one tensor a sync moves."""


def _module(name: str) -> str:
    return name.rpartition(".")[0]


def with_siblings(specs: Iterable[Spec], changing: set[str]) -> list[Spec]:
    """The specs a sync moves, in their order: each changing tensor, the other tensors of its module (a bias beside
    its weight) and of its sibling modules (the modules beside it in the same parent: q/k/v/o_proj and the norms of
    an attention block, gate/up/down_proj of an MLP, a Gated DeltaNet's input projections).

    vLLM reloads in place layer by layer, and its layers fuse siblings (qkv_proj from q, k and v; gate_up_proj): a
    layer that receives nothing keeps its weights, one that receives all its parts is rebuilt from them, and one that
    receives some takes the path vLLM keeps for padded layers (it rebuilds the layer on fresh memory, then loads what
    came). On the CPU build that path kept the unsent parts (2026-12-06: a q/v-only sync left k_proj as it was), but
    nothing in vLLM promises it; a sync of whole sibling groups never takes it. LoRA on q_proj and v_proj alone sends
    k_proj and the biases too (a few MB at 7B)."""
    specs = list(specs)
    modules = {_module(n) for n in changing}
    parents = {_module(m) for m in modules}
    return [
        s for s in specs if _module(s[0]) in modules or (s[0].count(".") >= 2 and _module(_module(s[0])) in parents)
    ]


def plan_buckets(specs: Iterable[Spec], bucket_bytes: int) -> list[Bucket]:
    """Buckets of at most `bucket_bytes`, in the order of `specs`. A sibling group (the tensors under one parent
    module, consecutive in a model's order) starts a new bucket rather than straddle two, unless it is larger than a
    bucket; a tensor larger than a bucket travels alone. (A receiver holds two buffers: a fused vLLM layer whose
    parts are in one bucket is complete before that bucket's buffer is reused.)"""
    if bucket_bytes <= 0:
        raise ValueError(f"rollout.sync_bucket_mb must be > 0, got {bucket_bytes} bytes")
    specs = list(specs)
    groups: list[list[Spec]] = []
    for spec in specs:
        key = _module(_module(spec[0]))
        if groups and _module(_module(groups[-1][-1][0])) == key:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    buckets: list[Bucket] = []
    entries: list[Entry] = []
    end = 0

    def close() -> None:
        nonlocal entries, end
        if entries:
            buckets.append(Bucket(tuple(entries), end))
        entries, end = [], 0

    for group in groups:
        size = sum(-(-Entry(n, d, tuple(sh), 0).nbytes // ALIGN) * ALIGN for n, d, sh in group)
        if entries and size <= bucket_bytes and -(-end // ALIGN) * ALIGN + size > bucket_bytes:
            close()  # the group fits a bucket of its own: it does not straddle two
        for name, dtype, shape in group:
            entry = Entry(name, dtype, tuple(int(x) for x in shape), -(-end // ALIGN) * ALIGN)
            if entries and entry.offset + entry.nbytes > bucket_bytes:
                close()
                entry = Entry(entry.name, entry.dtype, entry.shape, 0)
            entries.append(entry)
            end = entry.offset + entry.nbytes
    close()
    return buckets


def buffer_bytes(buckets: list[Bucket]) -> int:
    """What each of a side's two buffers holds: the largest bucket."""
    return max((b.nbytes for b in buckets), default=0)


@dataclass
class WeightBuckets:
    """One sync's weights: the plan, and `tensors_of(bucket)`, which yields a bucket's tensors in its order (valid
    until the next bucket is asked for: ZeRO-3 gathers a bucket for the time its tensors are read). Iterating it gives
    (name, tensor) pairs, bucket by bucket, for an engine that reads them in place."""

    buckets: list[Bucket]
    tensors_of: Callable[[Bucket], Iterable[Tensor]]

    @classmethod
    def from_named(cls, named: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> WeightBuckets:
        """Buckets over tensors already at hand (a resumed state, a test)."""
        tensors = {name: t.detach() for name, t in named}
        buckets = plan_buckets(((n, t.dtype, tuple(t.shape)) for n, t in tensors.items()), bucket_bytes)
        return cls(buckets, lambda bucket: [tensors[n] for n in bucket.names])

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for bucket in self.buckets:
            for entry, t in zip(bucket.entries, self.tensors_of(bucket), strict=True):
                yield entry.name, t
            heartbeat.beat("weight sync bucket")

    @property
    def nbytes(self) -> int:
        return sum(b.payload for b in self.buckets)

    @property
    def tensors(self) -> int:
        return sum(len(b.entries) for b in self.buckets)


@dataclass
class SyncStats:
    """What one sync moved (its time is the step's `timing/sync`)."""

    bytes: int = 0
    tensors: int = 0
    buckets: int = 0

    @classmethod
    def of(cls, weights: WeightBuckets) -> SyncStats:
        return cls(weights.nbytes, weights.tensors, len(weights.buckets))

    def metrics(self) -> dict[str, float]:
        return {
            "sync/bytes": float(self.bytes),
            "sync/tensors": float(self.tensors),
            "sync/buckets": float(self.buckets),
        }


def pack(bucket: Bucket, tensors: Iterable[Tensor], buffer: Tensor) -> None:
    """Copy `tensors` (the bucket's, in its order, from any device) into `buffer` (uint8) at their offsets."""
    for entry, t in zip(bucket.entries, tensors, strict=True):
        if t.dtype != entry.dtype or tuple(t.shape) != entry.shape:
            raise ValueError(
                f"weight {entry.name!r} is {t.dtype} {tuple(t.shape)}; the sync was planned for {entry.dtype} "
                f"{entry.shape}"
            )
        buffer[entry.offset : entry.offset + entry.nbytes].view(entry.dtype).copy_(t.detach().reshape(-1))


def unpack(bucket: Bucket, buffer: Tensor) -> dict[str, Tensor]:
    """The bucket's tensors as views of `buffer` (valid until the buffer is reused)."""
    return {e.name: buffer[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape) for e in bucket.entries}


# ---------------------------------------------------------------- two processes


def host_store():
    """The trainer's side of a pair's rendezvous: a TCP store on a free port of this host (`store.port`)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    return dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timeout)


class PairGroup:
    """A process group of two over `store` (`host_store` on the trainer, rank 0; the worker, rank 1, joins it by
    address): gloo for CPU buffers, NCCL where `device` is a GPU. Forming it blocks until both sides have joined."""

    def __init__(self, store, rank: int, device: str = "cpu", timeout_s: float = TIMEOUT_S) -> None:
        import torch.distributed as dist

        self.store, self.rank, self.peer, self.device = store, rank, 1 - rank, torch.device(device)
        prefixed = dist.PrefixStore("vlgrpo-weights", store)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self.group = dist.ProcessGroupNCCL(prefixed, rank, 2, dist.ProcessGroupNCCL.Options())
        else:
            self.group = dist.ProcessGroupGloo(prefixed, rank, 2, datetime.timedelta(seconds=timeout_s))
        self._buffers: list[Tensor] = []

    @classmethod
    def join(cls, host: str, port: int, device: str = "cpu", timeout_s: float = TIMEOUT_S) -> PairGroup:
        """The worker's side."""
        import torch.distributed as dist

        store = dist.TCPStore(host, port, 2, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(store, 1, device, timeout_s)

    def buffers(self, nbytes: int) -> list[Tensor]:
        """This side's two byte buffers, grown to `nbytes` when needed (kept between syncs)."""
        if not self._buffers or self._buffers[0].numel() < nbytes:
            self._buffers = [torch.empty(nbytes, dtype=torch.uint8, device=self.device) for _ in range(2)]
        return self._buffers


def _watched(fn: Callable, alive: Callable[[], bool], what: str, dead: str):
    """`fn()`, which blocks on the peer, on a thread of its own; meanwhile every POLL_S the peer is checked (`alive`;
    a dead one raises `dead`) and the watchdog hears `what`. A side whose peer died stops with an error instead of
    waiting out a store's or a group's timeout."""
    out, failed, done = [], [], threading.Event()

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="vlgrpo-weights", daemon=True).start()
    while not done.wait(POLL_S):
        if not alive():
            raise RuntimeError(dead)
        heartbeat.beat(what)
    if failed:
        raise RuntimeError(f"{what} failed: {failed[0]}") from failed[0]
    return out[0]


def form_pair(make: Callable[[], PairGroup], alive: Callable[[], bool], peer: str) -> PairGroup:
    """`make()`: one side of a PairGroup, which forms when the other side joins (`peer` names it in errors)."""
    return _watched(make, alive, "the weights' process group forming", f"{peer} died before the weights' group formed")


def _wait(work, alive: Callable[[], bool], what: str) -> None:
    """A transfer (a gloo send completes only once the peer receives: a worker still sampling the batch before is
    waited for here)."""
    _watched(work.wait, alive, what, f"the peer process died during {what}")


def send_buckets(pair: PairGroup, weights: WeightBuckets, alive: Callable[[], bool]) -> None:
    """Send every bucket to the peer: bucket i+1 is packed into the other buffer while bucket i is in flight."""
    buffers = pair.buffers(buffer_bytes(weights.buckets))
    in_flight: list = [None, None]
    for i, bucket in enumerate(weights.buckets):
        slot = i % 2
        if in_flight[slot] is not None:  # the buffer's previous bucket must have left before it is overwritten
            _wait(in_flight[slot], alive, "weight sync to the rollout worker")
        buffer = buffers[slot][: bucket.nbytes]
        pack(bucket, weights.tensors_of(bucket), buffer)
        if buffer.is_cuda:
            torch.cuda.current_stream().synchronize()  # NCCL sends on its own stream
        in_flight[slot] = pair.group.send([buffer], pair.peer, 0)
        heartbeat.beat("weight sync to the rollout worker")
    for work in in_flight:
        if work is not None:
            _wait(work, alive, "weight sync to the rollout worker")


def receive_buckets(pair: PairGroup, buckets: list[Bucket], alive: Callable[[], bool]) -> Iterator[dict]:
    """Each bucket's tensors (views, valid until the next bucket is asked for), bucket i+1 arriving while the caller
    loads bucket i."""
    if not buckets:
        return
    buffers = pair.buffers(buffer_bytes(buckets))
    pending = [None, None]

    def post(i: int) -> None:
        pending[i % 2] = pair.group.recv([buffers[i % 2][: buckets[i].nbytes]], pair.peer, 0)

    post(0)
    for i, bucket in enumerate(buckets):
        _wait(pending[i % 2], alive, "weight sync from the trainer")
        if i + 1 < len(buckets):
            post(i + 1)  # into the other buffer, whose bucket the caller has loaded
        yield unpack(bucket, buffers[i % 2])
