"""Training backends behind one small interface: plain (single process, full weights), LoRA, ZeRO-3.

A backend owns the trainable module, the optimiser and the schedule, and answers three questions for the loop:
how to step (a non-finite loss or gradient skips the step on every rank alike), how to get reference log-probs (a
frozen copy, the adapter disabled, or none), and how to save/export.
The freeze switches, the LR schedule, the data-parallel helpers and the modes of the passes (eval for no-grad
log-probs, dropout-free train mode for backward) are shared here. peft and deepspeed live in lora.py / zero3.py only.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from vlgrpo.config import Config, ConfigError
from vlgrpo.models import is_visual
from vlgrpo.registry import BACKEND
from vlgrpo.rollout.weight_stream import Bucket, Spec, with_siblings
from vlgrpo.trainer.ranks import average_gradients, max_over_ranks
from vlgrpo.trainer.safe_state import load_tensors

MERGERS = (".merger.", ".deepstack_merger_list.")
"""Module names of the projections from the tower into the language model: the patch merger, and Qwen3-VL's DeepStack
mergers (one per `deepstack_visual_indexes` entry; ms-swift's `aligner` counts them the same way)."""


def part_of(name: str) -> str:
    """Which part of a Qwen-VL a parameter belongs to: vision (ViT, patch and position embeddings), merger (the
    patch merger and Qwen3-VL's DeepStack mergers), or language."""
    if is_visual(name):
        return "merger" if any(m in name for m in MERGERS) else "vision"
    return "language"


def apply_freeze(model: torch.nn.Module, freeze_vision: bool, freeze_merger: bool, freeze_language: bool) -> dict:
    """Set requires_grad per part; returns trainable parameter counts per part (a ZeRO-3 partitioned parameter
    counts its whole size, `ds_numel`: its local tensor is empty, and counting 0 there had a trainable tower taken
    for a frozen one, its cached features used detached, so it never trained)."""
    frozen = {"vision": freeze_vision, "merger": freeze_merger, "language": freeze_language}
    counts = {"vision": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        part = part_of(name)
        p.requires_grad_(not frozen[part])
        if p.requires_grad:
            counts[part] += getattr(p, "ds_numel", p.numel())
    return counts


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the peak LR at optimiser step `step` (0-based): linear warm-up, then constant or cosine to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@runtime_checkable
class Backend(Protocol):
    """What the loop, the checkpoint code and the rollout engines need of a backend (plain, LoRA, ZeRO-3; chosen by
    `vlgrpo.registry.BACKEND`). A new backend implements these and adds one registry line."""

    name: str
    model: torch.nn.Module
    """The module forward passes run on (ZeRO-3: the engine's module, which gathers inside its forward)."""
    optimizer: torch.optim.Optimizer
    trainable_counts: dict[str, int]
    """Trainable parameters per part (vision, merger, language)."""
    skipped_steps: int
    """Optimiser steps skipped for a non-finite loss or gradient, on every rank alike."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> dict[str, float]:
        """Clip, step the optimiser and the schedule, zero the gradients; `train/grad_norm`, `train/lr`."""

    def rollout_weights(self, full: bool = True) -> AbstractContextManager:
        """A context in which the full weights (or only the vision encoder's) are usable for decoding."""

    def vision_fingerprint(self) -> str: ...

    def reference(self) -> AbstractContextManager:
        """A context yielding the reference-policy module, or None when no reference is kept."""

    def reference_vision(self) -> AbstractContextManager:
        """A context in which the reference's vision tower runs locally (ZeRO-3: gathered), for its own cache; yields
        its fingerprint, or None when the cache can read it from the module itself."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered, LoRA-merged) weights, for export (a rollout engine gets `sync_tensors`)."""

    def sync_specs(self) -> list[Spec]:
        """(name, dtype, full shape) of what a rollout engine holding its own copy is sent after a step, in the
        names of `named_weights`: the weights that change and their siblings (`weight_stream.with_siblings`)."""

    def sync_tensors(self, bucket: Bucket) -> Iterator[torch.Tensor]:
        """The tensors of `bucket` (planned from `sync_specs`), in its order; ZeRO-3 gathers the bucket at once
        (collective: every rank iterates every bucket)."""

    def vision_trainable(self) -> bool: ...

    def save(self, directory: Path) -> None: ...

    def load(self, directory: Path) -> None: ...

    def export(self, out_dir: str | Path, processor) -> Path: ...


class PlainBackend:
    """All weights in one process (CPU tests, a single GPU). Reference policy: a frozen copy, only when beta > 0."""

    name = "plain"

    def __init__(self, model: torch.nn.Module, cfg: Config, need_reference: bool) -> None:
        m = cfg.model
        self.trainable_counts = apply_freeze(model, m.freeze_vision, m.freeze_merger, m.freeze_language)
        self._setup(model, cfg, need_reference)

    def _setup(self, model: torch.nn.Module, cfg: Config, need_reference: bool) -> None:
        """Gradient checkpointing, the optional frozen reference copy, AdamW over trainable params, LR schedule."""
        m, t = cfg.model, cfg.train
        if m.dtype == "float16":
            raise ConfigError(
                f"model.dtype=float16 with train.backend={t.backend}: this backend has no loss scaler, and fp16 "
                "flushes a gradient below ~6e-8 to 0 (a step of small gradients is lost without a sign); use "
                "model.dtype=bfloat16 (the same memory, fp32's range) or train.backend=zero3 (DeepSpeed's dynamic "
                "loss scaler)"
            )
        self.model = model
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if hasattr(model, "enable_input_require_grads"):  # frozen embeddings + adapters need this
                model.enable_input_require_grads()
        self._ref = None
        if need_reference:
            self._ref = copy.deepcopy(model).eval().requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("no trainable parameters: check model.freeze_vision / freeze_merger / freeze_language")
        self._params = params
        self.master = MasterWeights(params)
        """fp32 copies of 16-bit trainable weights, which the optimiser steps (empty when they are fp32)."""
        # PyTorch's fused AdamW: one kernel over all the weights instead of a loop of elementwise ops per weight (a
        # tiny model's step 3-4x cheaper on the CPU), on the devices that have it
        fused = all(p.device.type in ("cpu", "cuda") for p in self.master.stepped)
        self.optimizer = torch.optim.AdamW(self.master.stepped, lr=t.lr, weight_decay=t.weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, t.warmup_steps, t.steps, t.lr_schedule)
        )
        self.max_grad_norm = t.max_grad_norm
        self.skipped_steps = 0
        """Optimiser steps skipped for a non-finite loss or gradient (the loop counts and limits them)."""
        self._nonfinite_loss = False

    # ---- the loop's interface
    def backward(self, loss: torch.Tensor) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            self._nonfinite_loss = True
        loss.backward()
        self.master.accumulate()  # a 16-bit weight's gradient summed in fp32, micro-batch by micro-batch

    def step(self) -> dict[str, float]:
        """(Average grads over data-parallel ranks,) clip, step optimiser and schedule, zero grads. A non-finite loss
        or gradient norm on any rank skips the optimiser and schedule step on every rank alike (`skipped_steps`).
        Returns `train/grad_norm` and `train/lr`."""
        stepped = self.master.stepped  # fp32 gradients: the master copies' and the fp32 weights' own
        average_gradients(stepped)  # reduced in fp32 too
        norm = torch.nn.utils.clip_grad_norm_(stepped, self.max_grad_norm if self.max_grad_norm > 0 else float("inf"))
        lr = self.optimizer.param_groups[0]["lr"]
        # NaN gradients reach every rank through the all-reduce, a non-finite loss does not: the ranks vote
        if max_over_ranks(int(self._nonfinite_loss or not math.isfinite(float(norm)))):
            self.skipped_steps += 1
        else:
            self.optimizer.step()
            self.master.write_back()  # the model's 16-bit weights: the fp32 result rounded once
            self.scheduler.step()
        self._nonfinite_loss = False
        self.optimizer.zero_grad(set_to_none=True)  # the master copies' gradients too
        for p in self._params:
            p.grad = None
        return {"train/grad_norm": float(norm), "train/lr": lr}

    def rollout_weights(self, full: bool = True):
        """Context in which the rollout engine (full) or only the vision encoder runs (ZeRO-3 gathers; here: no-op)."""
        return nullcontext()

    def vision_fingerprint(self) -> str:
        from vlgrpo.vision_cache.key import vision_fingerprint

        return vision_fingerprint(self.model)

    def reference(self):
        """Context yielding the module that computes reference log-probs (None when no reference is kept)."""
        return nullcontext(self._ref)

    def reference_vision(self):
        """The reference's tower is whole in this process: nothing to gather; the cache reads its fingerprint."""
        return nullcontext(None)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered, merged) weights for export."""
        yield from self.model.state_dict().items()

    def sync_specs(self) -> list[Spec]:
        changing = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return with_siblings(((n, t.dtype, tuple(t.shape)) for n, t in self.model.state_dict().items()), changing)

    def sync_tensors(self, bucket: Bucket) -> Iterator[torch.Tensor]:
        """The trainer's own tensors (the optimiser updates them in place): a colocated engine copies them."""
        state = self.model.state_dict()
        for name in bucket.names:
            yield state[name].detach()

    def vision_trainable(self) -> bool:
        return self.trainable_counts["vision"] + self.trainable_counts["merger"] > 0

    # ---- checkpoints
    def save(self, directory: Path) -> None:
        if not dist.is_initialized() or dist.get_rank() == 0:  # replicas are identical: one copy
            torch.save(self.state_dict(), directory / "backend.pt")

    def load(self, directory: Path) -> None:
        self.load_state_dict(load_tensors(directory / "backend.pt"))  # tensors and plain containers only

    def state_dict(self) -> dict:
        return {
            "model": {k: v for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            **self.master.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.master.load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def export(self, out_dir: str | Path, processor) -> Path:
        """A plain HF checkpoint (config, weights, processor) loadable with `from_pretrained`."""
        out = Path(out_dir)
        self.model.save_pretrained(out)
        processor.save_pretrained(out)
        return out


class MasterWeights:
    """fp32 master copies of the 16-bit trainable weights, as DeepSpeed's and apex's mixed-precision optimisers keep.

    AdamW stepping bf16 weights directly loses most updates: a step of lr 1e-6 is below half an ulp of a 0.02 weight
    (bf16 keeps 8 bits of mantissa, an ulp there is ~1.2e-4), so it rounds away. The optimiser steps the fp32 copies;
    each step's result is rounded once into the model. fp32 weights are stepped as they are (no copy).
    """

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.copies = {
            i: torch.nn.Parameter(p.detach().float().clone()) for i, p in enumerate(params) if p.dtype != torch.float32
        }
        self.stepped = [self.copies.get(i, p) for i, p in enumerate(params)]
        """What the optimiser steps: the master copy of a 16-bit weight, an fp32 weight itself."""

    def accumulate(self) -> None:
        """Add each 16-bit weight's gradient (one backward's) to its master copy's fp32 gradient and free it: the
        micro-batches of a step sum in fp32, and the ranks reduce fp32 sums (summed in bf16, each partial sum rounded,
        the error grew with the micro-batches: `test_backends.py` measures it)."""
        for i, copy_ in self.copies.items():
            p = self.params[i]
            if p.grad is None:
                continue
            if copy_.grad is None:
                copy_.grad = p.grad.float()
            else:
                copy_.grad += p.grad
            p.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        for i, copy_ in self.copies.items():
            self.params[i].copy_(copy_)

    def state_dict(self) -> dict:
        """{"master": [fp32 tensors]} in parameter order ({} without copies): a resume continues from the unrounded
        weights, not from the model's rounded ones."""
        return {"master": [self.copies[i].detach() for i in sorted(self.copies)]} if self.copies else {}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """The saved copies; a checkpoint written before master weights existed: the model's weights, widened."""
        saved = state.get("master")
        for k, i in enumerate(sorted(self.copies)):
            self.copies[i].copy_(saved[k] if saved is not None else self.params[i].float())


DROPOUT_ATTRIBUTES = ("attention_dropout", "dropout")
"""Float attributes that attention modules pass to the attention kernel as its dropout probability."""


@contextmanager
def no_dropout(model: torch.nn.Module):
    """Train mode with every dropout probability at 0, for the passes that backpropagate (update, SFT).

    Train mode, because transformers checkpoints a layer only when `self.training` is true: in eval mode gradient
    checkpointing never engages. No dropout, because the update's log-probs must equal the ones the rollout sampled
    from (eval mode): the ratio is exactly 1 on an on-policy pass. Sets p = 0 on every `torch.nn.Dropout*` module
    (peft's LoRA dropout included) and on float `attention_dropout` / `dropout` attributes (the Qwen attention
    modules); restores the mode and every probability afterwards, so the model's config is never changed for good.
    """
    was = model.training
    saved: list[tuple[torch.nn.Module, str, float]] = []
    for module in model.modules():
        names = ("p",) if isinstance(module, torch.nn.modules.dropout._DropoutNd) else DROPOUT_ATTRIBUTES
        for name in names:
            value = getattr(module, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                saved.append((module, name, value))
                setattr(module, name, 0.0)
    model.train()
    try:
        yield model
    finally:
        model.train(was)
        for module, name, value in saved:
            setattr(module, name, value)


def make_backend(model: torch.nn.Module, cfg: Config, need_reference: bool):
    """The backend named by train.backend (vlgrpo.registry.BACKEND: peft and deepspeed are imported only by the
    backend that needs them)."""
    return BACKEND.load(cfg.train.backend)(model, cfg, need_reference)
