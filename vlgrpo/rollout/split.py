"""`rollout.placement=split`: the rollout engine in a process of its own, sampling the next batches while the trainer
updates (the "4 + 4 GPUs" layout; here one CPU process per side).

The trainer submits each step's prompts ahead of time (`submit`) and collects the groups when it trains that step
(`collect`). Weights flow the other way after every optimiser step (`update_weights`), tagged with the policy
version; every group carries the version that sampled it. One FIFO queue carries both, so the order in which the
trainer sends them is the order the worker sees: a request submitted before the weights of version v is sampled with
an older version. The trainer submits at most `max_staleness + 1` steps ahead, so no group is more than
`max_staleness` versions old when it is trained: the worker waits (on the queue) rather than sample too early, and
nothing is dropped; it also checks every request's minimum version. With max_staleness = 0 a step's request follows
the weights of the step before: the same weights, prompts and seeds as a colocated run, hence the same completions.

The worker holds its own model copy, engine (`vlgrpo.registry.ENGINE`) and vision cache; a new version invalidates the
cache when the vision weights changed. With a frozen tower the trainer encodes a batch's images when it submits them
(while the worker samples the batch before) and the features travel with the request: the worker's cache adopts them,
so the encoder runs once per image in all, on the trainer's side of the overlap. A trainable tower's features are of
one version: the worker encodes with the weights it holds. Weights travel in buckets over a process group of the two
(`weight_stream`: gloo here, NCCL between two GPUs), only the ones that change, each bucket loaded as it arrives; the
queue carries the plan. A LoRA adapter (vLLM applies it) travels through the queue as one flat buffer per dtype
(`pack_weights`). An engine with weights of its own (vLLM) gets every version too; it runs on a GPU of its own when
the trainer names one (`worker_gpu`), else on the CPU. Each data-parallel rank starts its own worker and feeds it its
own prompts, seeds and (full, gathered) weights. Knows nothing of losses, optimisers or checkpoints.
"""

from __future__ import annotations

import math
import os
import queue
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.multiprocessing as mp
from torch import Tensor

from vlgrpo import heartbeat
from vlgrpo.config import ConfigError
from vlgrpo.policy.prompt import PromptInputs
from vlgrpo.rollout.base import Adapter, SamplingParams
from vlgrpo.rollout.weight_stream import (
    PairGroup,
    WeightBuckets,
    form_pair,
    host_store,
    receive_buckets,
    send_buckets,
)
from vlgrpo.types import RolloutGroup, Sample

POLL_S = 1.0
"""How often a blocked side checks that the other is still alive."""


@dataclass
class Collected:
    """What the worker sampled for one step."""

    groups: list[RolloutGroup]
    version: int
    """Policy version (optimiser steps) of the weights that sampled it."""
    stats: dict[str, float] = field(default_factory=dict)
    """The worker engine's `rollout/*` counters for this request."""
    worker_idle_s: float = 0.0
    """Seconds the worker waited for work or weights since its previous result."""
    worker_receive_s: float = 0.0
    """Seconds the worker spent receiving and loading weights since its previous result."""


class SplitRollout:
    """The trainer's handle on the rollout worker process."""

    holds_own_weights = True

    def __init__(
        self, cfg, box_format: str, weights: dict[str, Tensor], max_staleness: int, gpu: str | None = None
    ) -> None:
        ctx = mp.get_context("spawn")
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.max_staleness = max_staleness
        self.policy_version = 0
        self.pending: dict[tuple[int, int], int] = {}
        """Submitted (step, round) not yet collected -> their required minimum version."""
        self.ready: dict[tuple[int, int], Collected] = {}
        self._worker_state: dict[str, Tensor] | None = None
        self._unsent: WeightBuckets | None = None
        """Weights announced to the worker (their plan is queued) and not sent yet: they go at the next collect."""
        self.bucket_bytes = int(cfg.rollout.sync_bucket_mb * 2**20)
        # the weights' process group of two: NCCL where the trainer and the worker's vLLM each hold a GPU, else gloo
        device = f"cuda:{torch.cuda.current_device()}" if gpu is not None and torch.cuda.is_available() else "cpu"
        store = host_store()
        self.process = ctx.Process(
            target=_worker_main,
            args=(cfg, box_format, self.requests, self.results, gpu, store.port, device != "cpu"),
            name="vlgrpo-rollout",
            daemon=True,
        )
        self.process.start()
        self._pair: PairGroup | None = None
        self._make_pair = lambda: PairGroup(store, 0, device)  # formed at the first sync that sends weights
        self.requests.put(("weights", 0, []))
        if weights:
            self.update_weights(weights.items(), 0)

    # ---- trainer side
    def submit(
        self,
        step: int,
        samples: list[Sample],
        params: SamplingParams,
        round_no: int = 0,
        features: tuple | None = None,
        prompts: list[PromptInputs] | None = None,
    ) -> None:
        """Queue the prompts of training step `step` (1-based), to be sampled with version >= step-1-max_staleness.
        Round 0 is the step's batch, submitted ahead; a dynamic-sampling top-up round (`round_no` >= 1) is submitted
        when the trainer finds the batch short, and queues behind what was submitted before it. `features`: the
        trainer's `VisionCache.handover` of the samples' images (frozen tower), adopted by the worker's cache;
        `prompts`: the samples' prompts as the trainer's rows built them (None: the worker's engine builds them)."""
        need = max(0, step - 1 - self.max_staleness)
        self.pending[(step, round_no)] = need
        self.requests.put(("generate", (step, round_no), samples, params, need, features, prompts))

    def collect(self, step: int, round_no: int = 0) -> Collected:
        """The groups of step `step` (round `round_no`), waiting for the worker if they are not there yet. The weights
        announced since the last collect travel first (`update_weights`)."""
        self._send_weights()
        key = (step, round_no)
        while key not in self.ready:
            self._receive(block=True)
        self.pending.pop(key, None)
        return self.ready.pop(key)

    def queue_depth(self) -> int:
        """Results sampled and waiting for the trainer (drained from the pipe without blocking)."""
        while self._receive(block=False):
            pass
        return len(self.ready)

    def update_weights(
        self, named_params: WeightBuckets | Iterable[tuple[str, Tensor]] | Adapter | None, version: int
    ) -> None:
        """Announce the trainer's weights, tagged `version`: their plan goes through the queue now, the buckets over
        the pair's process group at the next collect (`_send_weights`). A LoRA adapter alone, for a worker's vLLM that
        applies it, goes through the queue."""
        self.policy_version = version
        self._send_weights()  # (a version announced and not sent yet goes first)
        if isinstance(named_params, Adapter):
            self.requests.put(("adapter", version, named_params.config, pack_weights(named_params.tensors.items())))
            return
        weights = named_params
        if not isinstance(weights, WeightBuckets):
            weights = WeightBuckets.from_named(weights or [], self.bucket_bytes)
        self.requests.put(("weights", version, weights.buckets))
        self._unsent = weights if weights.buckets else None

    def _send_weights(self) -> None:
        """The buckets announced by `update_weights`, if not sent yet. They travel at the next collect rather than at
        once: the worker receives when it has finished the batch it samples, and meanwhile the trainer submits (and
        encodes) the next batch, which the queue puts behind the weights. Nothing changes the weights in between: the
        next update starts after that collect."""
        weights, self._unsent = self._unsent, None
        if weights is None:
            return
        try:
            send_buckets(self._group(), weights, self.process.is_alive)
        except RuntimeError:  # the worker stopped mid-sync: its own error says why (raised by _receive), if it sent one
            deadline = time.monotonic() + 5 * POLL_S
            while time.monotonic() < deadline:
                self._receive(block=True)
            raise

    def _group(self) -> PairGroup:
        if self._pair is None:
            self._pair = form_pair(self._make_pair, self.process.is_alive, "the rollout worker")
        return self._pair

    def worker_weights(self) -> dict[str, Tensor]:
        """The worker's HF copy of the weights (all of them), once it has taken every message sent before: what
        the tests compare with the trainer's, tensor for tensor."""
        self._send_weights()
        self.requests.put(("state",))
        while self._worker_state is None:
            self._receive(block=True)
        state, self._worker_state = self._worker_state, None
        return state

    def stats(self) -> dict[str, float]:
        """Nothing here: the worker's `rollout/*` counters arrive with each collected step (`Collected.stats`)."""
        return {}

    def reset_stats(self) -> None:
        pass

    def close(self) -> None:
        if self.process.is_alive():
            if self._unsent is not None:  # the last step's weights: the worker waits for them before it reads "stop"
                try:
                    self._send_weights()
                except RuntimeError:
                    pass  # it stops or is killed below either way
            self.requests.put(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def _receive(self, block: bool) -> bool:
        try:
            message = self.results.get(timeout=POLL_S) if block else self.results.get_nowait()
        except queue.Empty:
            if not self.process.is_alive():
                raise RuntimeError(
                    f"the rollout worker process died (exit code {self.process.exitcode}); the "
                    "trainer cannot continue without it"
                ) from None
            return False
        if message[0] == "error":
            raise RuntimeError(f"the rollout worker failed:\n{message[1]}")
        if message[0] == "state":
            self._worker_state = message[1]
            return True
        _, key, groups, version, stats, idle, receive_s = message
        self.ready[key] = Collected(groups, version, stats, idle, receive_s)
        return True


def pack_weights(named: Iterable[tuple[str, Tensor]]) -> tuple[list[tuple[str, torch.dtype, tuple, int]], dict]:
    """Copies of the weights in one flat CPU buffer per dtype, and where each tensor lies in it. Through the queue a
    tensor is one shared-memory segment: a model's hundreds of tensors cost the trainer tens of milliseconds a step
    to share one by one (measured on the tiny model: 105 tensors 35-65 ms, one buffer 10-16 ms)."""
    items = [(name, t.detach()) for name, t in named]
    layout, sizes = [], {}
    for name, t in items:
        offset = sizes.get(t.dtype, 0)
        layout.append((name, t.dtype, tuple(t.shape), offset))
        sizes[t.dtype] = offset + t.numel()
    flats = {dtype: torch.empty(n, dtype=dtype) for dtype, n in sizes.items()}
    for (_, dtype, _, offset), (_, t) in zip(layout, items):
        flats[dtype][offset : offset + t.numel()].copy_(t.reshape(-1))  # from any device
        heartbeat.beat("weight sync to the rollout worker")
    return layout, flats


def unpack_weights(layout: list[tuple[str, torch.dtype, tuple, int]], flats: dict) -> dict[str, Tensor]:
    """The named tensors of `pack_weights`, as views of its buffers."""
    return {name: flats[dtype][offset : offset + math.prod(shape)].view(shape) for name, dtype, shape, offset in layout}


# ---------------------------------------------------------------- the worker process


def worker_gpu(local_rank: int, local_ranks: int, rollout_gpus: int, visible: list[str]) -> str:
    """The GPU (a CUDA_VISIBLE_DEVICES entry) on which local rank `local_rank`'s worker runs vLLM. The node's first
    `local_ranks` visible GPUs train (torchrun's rank k on cuda:k), the next `rollout_gpus` run vLLM, one per rank: the
    split layout `vlgrpo plan` prices (D training GPUs, each vLLM GPU serving B x D / rollout_gpus prompts)."""
    if rollout_gpus != local_ranks:
        raise ConfigError(
            f"rollout.placement=split runs one vLLM engine per training rank, on a GPU of its own: "
            f"{local_ranks} training rank(s) on this node need rollout.vllm.rollout_gpus={local_ranks} "
            f"(got {rollout_gpus})"
        )
    if len(visible) < local_ranks + rollout_gpus:
        raise ConfigError(
            f"{local_ranks} training rank(s) and rollout.vllm.rollout_gpus={rollout_gpus} need "
            f"{local_ranks + rollout_gpus} GPUs on this node, {len(visible)} are visible "
            f"(CUDA_VISIBLE_DEVICES={','.join(visible)!r})"
        )
    return visible[local_ranks + local_rank]


def _worker_main(cfg, box_format: str, requests, results, gpu: str | None, port: int, nccl: bool) -> None:
    if gpu is not None:  # before anything in this process initialises CUDA: vLLM and the vision tower see only it
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        join = lambda: PairGroup.join("127.0.0.1", port, "cuda:0" if nccl else "cpu")  # noqa: E731
        _serve(cfg, box_format, requests, results, "cpu" if gpu is None else "cuda", join)
    except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it
        results.put(("error", traceback.format_exc()))


def _serve(cfg, box_format: str, requests, results, device: str, join) -> None:
    from vlgrpo.models import load_model
    from vlgrpo.policy.prompt import PromptSettings
    from vlgrpo.rollout.build import build_engine
    from vlgrpo.vision_cache import VisionCache, find_visual

    # one thread: the worker shares the CPUs with its trainer (one worker per data-parallel rank), and a spawned
    # process would otherwise take OMP_NUM_THREADS afresh, or every core when it is unset
    torch.set_num_threads(1)
    m = cfg.model
    lm = load_model(m.name_or_path, m.arch, m.dtype, m.attn_implementation, m.min_pixels, m.max_pixels)
    lm.model.eval().requires_grad_(False)
    find_visual(lm.model).to(device)  # vLLM's GPU, if any: the HF copy encodes images there; its decoder idles (vLLM)
    trainable_vision = not (m.freeze_vision and m.freeze_merger)
    cache = VisionCache(lm.model, lm.processor, cfg.rollout.vision_cache_bytes, trainable=trainable_vision)
    # the trainer's engine, built as the colocated one is: with tools, the worker runs them and returns trajectories
    prompt = PromptSettings.from_config(cfg, box_format, lm.processor)
    engine = build_engine(cfg.rollout.engine, lm, cache, prompt, run=cfg)
    buffers = {name for name, _ in lm.model.named_buffers()}
    version, idle_since, idle, receive_s = -1, time.perf_counter(), 0.0, 0.0
    pair = None  # the weights' process group with the trainer, formed at the first sync that sends any
    while True:
        message = _next_request(requests)
        if message[0] == "stop":
            return
        if message[0] == "weights":
            _, version, buckets = message
            t0 = time.perf_counter()
            if buckets and pair is None:
                pair = form_pair(join, _trainer_alive, "the trainer")
            received = _received(lm.model, buffers, version, receive_buckets(pair, buckets, _trainer_alive))
            cache.set_step(version)  # a trainable tower: features of older weights are dropped (keyed by version)
            if buckets and engine.holds_own_weights:  # vLLM reloads each bucket as it arrives, after the HF copy
                engine.update_weights(received, version)
            else:  # the HF engine decodes with the worker's copy
                for _ in received:
                    pass
                engine.update_weights(None, version)
            receive_s += time.perf_counter() - t0
            continue
        if message[0] == "state":
            results.put(("state", {k: v.detach().clone() for k, v in lm.model.state_dict().items()}))
            continue
        if message[0] == "adapter":  # vLLM applies it; the worker's HF copy (a frozen tower: LoRA leaves it) stays
            _, version, config, packed = message
            engine.update_weights(Adapter(config, unpack_weights(*packed)), version)
            continue
        _, key, samples, params, need, features, prompts = message  # key: (training step, sampling round)
        if version < need:  # the trainer sends weights before any request that needs them: a protocol error
            raise RuntimeError(
                f"step {key[0]} (round {key[1]}) needs weights of version >= {need}, the worker holds {version}"
            )
        idle += time.perf_counter() - idle_since - receive_s  # receiving weights is work, not waiting
        adopted = cache.adopt(features)  # a frozen tower's features, as the trainer encoded them: the engine hits
        with torch.no_grad():
            groups = engine.generate(samples, params, prompts)
        stats = {
            **engine.stats(),
            "rollout/worker_threads": float(torch.get_num_threads()),
            "rollout/features_adopted": float(adopted),
        }
        engine.reset_stats()  # the next result's counters start here: the weight syncs before it count with it
        results.put(("groups", key, groups, version, stats, idle, receive_s))
        idle_since, idle, receive_s = time.perf_counter(), 0.0, 0.0


def _received(model, buffers: set[str], version: int, buckets) -> Iterable[tuple[str, Tensor]]:
    """Each received bucket loaded into the worker's HF copy, then its names with the copy's own tensors: vLLM's
    reload may hold a fused layer's first parts until its last arrives, and the copy's tensors stay put until the
    next sync (a receive buffer is reused two buckets later)."""
    state = model.state_dict()
    for tensors in buckets:
        _load_weights(model, buffers, version, tensors)
        yield from ((name, state[name]) for name in tensors)


def _trainer_alive() -> bool:
    return mp.parent_process().is_alive()


def _load_weights(model, buffers: set[str], version: int, weights: dict[str, Tensor]) -> None:
    """Version `version` into the worker's HF copy: the HF engine decodes with it, its vision tower feeds the cache
    (vLLM's image embeddings included). A subset is fine (a frozen part may be left out); a name the model lacks is
    a bug, refused before any engine sees it."""
    unexpected = [
        k for k in model.load_state_dict(weights, strict=False).unexpected_keys if k not in buffers
    ]  # non-persistent buffers (rotary inv_freq): not state, same values
    if unexpected:
        raise RuntimeError(
            f"weights of version {version} hold {len(unexpected)} names the worker's model lacks, "
            f"e.g. {unexpected[:3]}: it would sample with stale weights"
        )


def _next_request(requests) -> tuple:
    """The next message from the trainer; ("stop",) once the trainer process is gone. A rank that torchrun stops
    (SIGTERM) or the OOM killer takes never sends "stop", and a daemon process outlives a parent that is killed."""
    while True:
        try:
            return requests.get(timeout=POLL_S)
        except queue.Empty:
            if not mp.parent_process().is_alive():
                return ("stop",)
