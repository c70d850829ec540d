"""DeepSpeed ZeRO-3 backend: parameters, gradients and optimiser states partitioned over the data-parallel ranks.

The only module that imports deepspeed. Runs on GPUs (NCCL) and on the CPU (gloo, for tests). Weights are gathered
one parameter at a time when the rollout engine or an export needs them; checkpoints are DeepSpeed's own, read
with every `torch.load` forced to weights_only=True (PICKLED_CLASSES are the only classes allowed besides tensors).

Mixture-of-experts models (transformers 5's fused experts: one module holds every expert's weights as one tensor per
projection) need no ZeRO-3 leaf modules: every rank calls the same modules in the same order whichever experts its
tokens hit, and one fetch gathers a layer's experts. Marking the MoE block a leaf, as peers do for per-expert
modules, breaks DeepSpeed's gradient bucketing here (the block runs twice per pass, the prompts' prefill and the
packed completions: a parameter reaches one bucket twice). A MoE model loads whole (`loads_whole`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from vlgrpo.config import Config
from vlgrpo.families import is_gated_deltanet
from vlgrpo.trainer.backends import apply_freeze, lr_factor
from vlgrpo.trainer.group import bound_every_group
from vlgrpo.trainer.ranks import max_over_ranks
from vlgrpo.trainer.safe_state import weights_only_loads

PICKLED_CLASSES = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
)
"""Classes DeepSpeed pickles into its ZeRO-3 optimiser files (plain records: a loss scale, an int enum): the only
ones allowed, besides tensors and plain containers, when a checkpoint is loaded or scanned."""


def _pickled_classes() -> list[type]:
    import importlib

    return [getattr(importlib.import_module(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]) for n in PICKLED_CLASSES]


def init_distributed(cfg: Config) -> None:
    """DeepSpeed's communication layer over the process group the trainer joined (`trainer.state`, on its restart
    attempt's own keys); it joins the group itself when none is, with train.dist_timeout_s (idempotent: a second
    call does nothing)."""
    from datetime import timedelta

    import deepspeed

    deepspeed.init_distributed(
        dist_backend="nccl" if torch.cuda.is_available() else "gloo",
        timeout=timedelta(seconds=cfg.train.dist_timeout_s),
    )


def micro_batches_per_step(cfg: Config) -> int:
    """Backward passes the loop runs per `backend.step()`: one pass over the step's rows in micro-batches. Rows are
    B x G completions in GRPO (each of the grpo.num_iterations passes ends in its own step) and B gold answers in
    SFT (one per prompt)."""
    t = cfg.train
    rows = t.prompts_per_step * (cfg.rollout.completions_per_prompt if t.stage == "grpo" else 1)
    return math.ceil(rows / t.micro_batch_completions)


def ds_config(cfg: Config, world_size: int) -> dict:
    """The DeepSpeed JSON: train.zero3.deepspeed_config when given (batch keys filled in), else built here.
    gradient_accumulation_steps is exactly the micro-batch count of one update pass, so DeepSpeed's accumulation
    boundary (its optimiser step) falls on the last backward before each `backend.step()`."""
    t = cfg.train
    micro = t.micro_batch_completions
    accumulation = micro_batches_per_step(cfg)
    if t.zero3.deepspeed_config:
        path = Path(t.zero3.deepspeed_config)
        if not path.is_file():
            raise FileNotFoundError(f"train.zero3.deepspeed_config: '{path}' does not exist")
        config = json.loads(path.read_text())
    else:
        config = {
            "zero_optimization": {
                "stage": 3,
                "overlap_comm": torch.cuda.is_available(),
                "contiguous_gradients": True,
                "stage3_gather_16bit_weights_on_model_save": True,
            },
            "gradient_clipping": t.max_grad_norm if t.max_grad_norm > 0 else 0.0,
            "zero_allow_untested_optimizer": True,
        }
        zero = config["zero_optimization"]
        if t.zero3.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
        if t.zero3.offload_param:
            zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
        if cfg.model.dtype == "bfloat16":
            config["bf16"] = {"enabled": True}
        elif cfg.model.dtype == "float16":
            config["fp16"] = {"enabled": True}
    # Batch keys always follow the vlgrpo config so the two can never disagree.
    config["train_micro_batch_size_per_gpu"] = micro
    config["gradient_accumulation_steps"] = accumulation
    config["train_batch_size"] = micro * accumulation * world_size
    config.setdefault("steps_per_print", 10**9)
    return config


_HF_DS_CONFIG = None  # transformers keeps a weak reference: the object must outlive the model load


def prepare_partitioned_load(cfg: Config) -> None:
    """Call before `from_pretrained`: with ZeRO-3 each rank then materialises only its shard of the weights; a
    mixture-of-experts model loads whole (`loads_whole`) and is partitioned by `deepspeed.initialize`."""
    init_distributed(cfg)
    if not loads_whole(cfg):
        _announce_zero3(cfg)


def loads_whole(cfg: Config) -> bool:
    """A mixture-of-experts model loads whole on each rank, not partitioned at load: transformers 5.20 skips its
    checkpoint conversion of the fused expert weights (Qwen3-VL-MoE's are stored transposed) under DeepSpeed's
    ZeRO-3 init and fails on their shapes (huggingface/transformers#43257). Each rank holds the whole model in host
    memory while it loads (a 30B-A3B: ~61 GB in bf16); `deepspeed.initialize` then keeps only its shard."""
    from vlgrpo.families import family
    from vlgrpo.models import detect_arch

    arch = cfg.model.arch if cfg.model.arch != "auto" else detect_arch(cfg.model.name_or_path)
    return family(arch).dense is not None


def _announce_zero3(cfg: Config) -> None:
    """Tell transformers ZeRO-3 is on (its from_pretrained then loads partitioned)."""
    global _HF_DS_CONFIG
    from transformers.integrations import HfDeepSpeedConfig

    if _HF_DS_CONFIG is None:
        _HF_DS_CONFIG = HfDeepSpeedConfig(ds_config(cfg, torch.distributed.get_world_size()))


def register_linear_attention_parameters(model: torch.nn.Module, config: dict) -> int:
    """Make ZeRO-3 gather what a Gated DeltaNet layer (Qwen3.5) reads outside its own modules' forwards -> how many
    layers. transformers' forward reads `conv1d.weight` in the layer's forward: registered to the layer as an
    external parameter. vlgrpo's passes (`policy.linear_attention.gated_delta`) call the layer's submodules one by
    one, never the layer, and read its `A_log` and `dt_bias` right after `in_proj_a`: a pre-forward hook on
    `in_proj_a` gathers the two vectors (one entry per value head) whenever they are partitioned (at the start, and
    after every re-partition: a checkpoint, the rollout's gathered weights). ZeRO-3 keeps parameters under
    stage3_param_persistence_threshold elements whole once gathered; a config whose threshold is smaller would
    partition them again mid-pass and is refused."""
    import deepspeed

    layers = [layer.linear_attn for layer in model.modules() if is_gated_deltanet(layer)]
    if not layers:
        return 0
    threshold = config.get("zero_optimization", {}).get("stage3_param_persistence_threshold", 100_000)
    largest = max(getattr(m.A_log, "ds_numel", m.A_log.numel()) for m in layers)
    if threshold < largest:
        raise ValueError(
            f"zero_optimization.stage3_param_persistence_threshold={threshold} partitions the Gated DeltaNet's A_log "
            f"and dt_bias ({largest} elements each): vlgrpo's passes need them whole; set it to at least {largest} "
            "(DeepSpeed's default is 100000)"
        )

    def gather_vectors(module, _inputs):
        vectors = [p for p in module.ds_gated_delta_vectors if p.ds_status.name == "NOT_AVAILABLE"]
        if vectors:
            vectors[0].all_gather(param_list=vectors)

    for m in layers:
        deepspeed.zero.register_external_parameter(m, m.conv1d.weight)
        m.in_proj_a.ds_gated_delta_vectors = (m.A_log, m.dt_bias)
        m.in_proj_a.register_forward_pre_hook(gather_vectors)
    return len(layers)


class Zero3Backend:
    name = "zero3"

    def __init__(self, model: torch.nn.Module, cfg: Config, need_reference: bool) -> None:
        import deepspeed

        init_distributed(cfg)
        m, t = cfg.model, cfg.train
        self.trainable_counts = apply_freeze(model, m.freeze_vision, m.freeze_merger, m.freeze_language)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        config = ds_config(cfg, torch.distributed.get_world_size())
        register_linear_attention_parameters(model, config)
        self._ref = None
        if need_reference:  # a second load (partitioned the same way: no deepcopy of shards), frozen, no optimiser
            from vlgrpo.models import load_model

            ref = load_model(m.name_or_path, m.arch, m.dtype, m.attn_implementation).model.requires_grad_(False)
            register_linear_attention_parameters(ref, config)
            ref_config = {k: v for k, v in config.items() if k not in ("optimizer", "scheduler")}
            self._ref, *_ = deepspeed.initialize(model=ref.eval(), config=ref_config)
        _announce_zero3(cfg)  # a MoE model (and its reference) loaded whole: ZeRO-3 is on from here
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s, t.warmup_steps, t.steps, t.lr_schedule)
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
        )
        bound_every_group(t.dist_timeout_s)  # DeepSpeed's own groups included (their default is torch's)
        self.model = self.engine.module  # ZeRO-3 hooks gather parameters inside its forward
        self._pass_start: int | None = None  # DeepSpeed's step count at the first backward of this update pass
        self._backwards, self._lr = 0, t.lr
        self.skipped_steps = 0
        """Optimiser steps DeepSpeed skipped for a non-finite loss or gradient (its grad-norm check, agreed over the
        ranks). With fp16, an overflow of the loss-scaled gradients is DeepSpeed's loss scaler at work: counted in
        `loss_scale_skips` instead."""
        self.loss_scale_skips = 0
        """fp16: optimiser steps skipped because the loss-scaled gradients overflowed (the scale is then lowered)."""
        self._nonfinite_loss = False

    # ---- the loop's interface
    def backward(self, loss: torch.Tensor) -> None:
        if self._pass_start is None:
            self._pass_start, self._lr = self.engine.global_steps, self.scheduler.get_last_lr()[0]
        self._backwards += 1
        if not bool(torch.isfinite(loss.detach()).all()):
            # make every gradient NaN: DeepSpeed's grad-norm check (all-reduced) then skips the step on every rank
            loss, self._nonfinite_loss = loss * float("nan"), True
        # DeepSpeed counts micro-batches in `engine.forward` (ZeRO-3's micro_step_id, moved on by
        # clear_backward_seen_flag): at 0 a backward COPIES its gradients into the partitions instead of adding them.
        # Our passes call the module's layers, not engine.forward, so without this every micro-batch overwrote the
        # one before and the step used the last micro-batch's gradient alone (test_union_batch.py caught it).
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:  # DeepSpeed >= 0.18; older versions count in the backward epilogue themselves
            clear()
        # Our loss is already normalised over the whole batch: no extra 1/accumulation scaling.
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()  # a no-op except at the accumulation boundary: the last micro-batch of the pass

    def step(self) -> dict[str, float]:
        """DeepSpeed stepped at the accumulation boundary inside the last backward(): check that it did, exactly
        once in this pass (as the plain and LoRA backends step once per call), and report it."""
        start = self.engine.global_steps if self._pass_start is None else self._pass_start
        taken = self.engine.global_steps - start
        if taken != 1:
            raise RuntimeError(
                f"ZeRO-3 took {taken} optimiser steps over the {self._backwards} micro-batches of this update pass, "
                f"expected 1: DeepSpeed's gradient_accumulation_steps is {self.engine.gradient_accumulation_steps()} "
                "but the loop ran a different number of backward passes (vlgrpo.trainer.zero3.micro_batches_per_step "
                "must count what Trainer runs between two backend.step() calls)"
            )
        self._pass_start, self._backwards = None, 0
        if not self.engine.was_step_applied():  # a non-finite grad norm: DeepSpeed skipped the optimiser and LR step
            # fp16: DeepSpeed's dynamic loss scale overflows now and then by design; count only non-finite losses
            if not self.engine.fp16_enabled() or max_over_ranks(int(self._nonfinite_loss)):
                self.skipped_steps += 1
            else:
                self.loss_scale_skips += 1
        self._nonfinite_loss = False
        norm = self.engine.get_global_grad_norm()
        return {"train/grad_norm": float(norm) if norm is not None else 0.0, "train/lr": self._lr}

    def rollout_weights(self, full: bool = True):
        """Gathered weights with the ZeRO hooks removed, so the vision encoder and decoding run locally (ranks hit
        the cache and decode lengths differently; per-module gathers, one collective per forward, would deadlock).
        full=True: the whole policy (the HF engine decodes with it); False: only `visual` (vLLM decodes with its own
        copy of the weights, only the encoder runs here)."""
        from vlgrpo.vision_cache.key import find_visual

        module = self.engine.module if full else find_visual(self.engine.module)
        return _gathered_without_hooks(self.engine, list(module.parameters()))

    @contextmanager
    def reference_vision(self):
        """A context in which the reference's vision tower runs locally, gathered without its ZeRO hooks (each rank
        encodes the images its cache misses, a different number per rank: per-module gathers would deadlock); yields
        the tower's fingerprint, read from the gathered weights. Only needed when the tower trains (frozen: the
        policy's features serve)."""
        if self._ref is None:
            yield None
            return
        from vlgrpo.vision_cache.key import find_visual, vision_fingerprint

        with _gathered_without_hooks(self._ref, list(find_visual(self._ref.module).parameters())):
            yield vision_fingerprint(self._ref.module, gather=lambda _: nullcontext())  # whole already

    def vision_fingerprint(self) -> str:
        import deepspeed

        from vlgrpo.vision_cache.key import vision_fingerprint

        return vision_fingerprint(
            self.model, gather=lambda ps: deepspeed.zero.GatheredParameters(ps, modifier_rank=None)
        )

    def reference(self):
        return nullcontext(None if self._ref is None else self._ref.module)

    def vision_trainable(self) -> bool:
        return self.trainable_counts["vision"] + self.trainable_counts["merger"] > 0

    @contextmanager
    def gathered(self, module: torch.nn.Module):
        """Full parameters of `module` on every rank for the duration (read-only)."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            yield module

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream full weights one parameter at a time (every rank must iterate: the gather is collective)."""
        import deepspeed

        for name, p in self.model.named_parameters():
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                yield name, p.data.detach().clone()
        for name, b in self.model.named_buffers():
            yield name, b.detach().clone()

    def sync_specs(self):
        """Full shapes (ds_shape) of the trainable parameters and their siblings; buffers never change."""
        from vlgrpo.rollout.weight_stream import with_siblings

        changing = {n for n, p in self.model.named_parameters() if p.requires_grad}
        specs = ((n, p.dtype, tuple(getattr(p, "ds_shape", p.shape))) for n, p in self.model.named_parameters())
        return with_siblings(specs, changing)

    def sync_tensors(self, bucket):
        """One gather for the whole bucket (collective), copies of the full tensors (the partitions are freed when
        the gather ends, and a colocated engine may still hold the tensors it was given)."""
        import deepspeed

        params = dict(self.model.named_parameters())
        chosen = [params[n] for n in bucket.names]
        with deepspeed.zero.GatheredParameters(chosen, modifier_rank=None):
            copies = [p.data.detach().clone() for p in chosen]
        yield from copies

    # ---- checkpoints
    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag="zero3")

    def load(self, directory: Path) -> None:
        with weights_only_loads(_pickled_classes()):  # DeepSpeed turns weights_only off: forced on here
            path, _ = self.engine.load_checkpoint(str(directory), tag="zero3")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")

    def export(self, out_dir: str | Path, processor) -> Path:
        """Gather every parameter and write a plain HF checkpoint from rank 0."""
        out = Path(out_dir)
        state = dict(self.named_weights())
        if int(os.environ.get("RANK", "0")) == 0:
            self.model.save_pretrained(out, state_dict=state)
            processor.save_pretrained(out)
        torch.distributed.barrier()
        return out


@contextmanager
def _gathered_without_hooks(engine, params: list[torch.nn.Parameter]):
    """`params` of a DeepSpeed engine gathered on every rank, with the engine's ZeRO-3 forward and backward hooks
    removed for the duration, so a module runs locally whatever the other ranks do (the trained engine's hooks live
    in its optimiser's parameter offload; an engine without optimiser, the reference, holds the offload itself)."""
    import deepspeed

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        # The top module's start-of-forward hook resets the fetch trace, which is collective until a trace is
        # recorded: ranks that decode a different number of tokens (or, under dynamic sampling, none) would
        # deadlock on it. The next update forward resets the trace anyway.
        start_of_forward = offload.module._forward_pre_hooks[offload.fwd_pre_hook.id]
        offload.fwd_pre_hook.remove()
        try:
            yield
        finally:
            offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start_of_forward)
            offload._register_deepspeed_module(offload.module)


def export_checkpoint(checkpoint_dir: Path, cfg: Config, out_dir: str | Path) -> Path:
    """A plain HF checkpoint from a ZeRO-3 checkpoint in one process, whatever the training world size: the shards
    are consolidated offline (DeepSpeed's zero_to_fp32) and loaded into the base architecture."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from vlgrpo.models import load_model

    with weights_only_loads(_pickled_classes()):  # zero_to_fp32 turns weights_only off: forced on
        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag="zero3")
    m = cfg.model
    lm = load_model(m.name_or_path, m.arch, m.dtype, m.attn_implementation, m.min_pixels, m.max_pixels)
    missing, unexpected = lm.model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(lm.model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"ZeRO-3 checkpoint {checkpoint_dir} does not match {m.name_or_path}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    out = Path(out_dir)
    lm.model.to(getattr(torch, m.dtype)).save_pretrained(out)
    lm.processor.save_pretrained(out)
    return out
