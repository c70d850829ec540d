"""Everything a run holds, built once from the config: model, backend, vision cache, rollout engine, rewards,
data stream and its row checks (`rows.CheckedRows`), logger — and checkpoint save/resume of all of it.

`build_state` is the only place that turns config strings into objects; the loop then only calls methods. While a run
trains, rank 0 holds the run directory's lock (`close()` releases it; so does the process's death).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vlgrpo.config import Config, ConfigError, save_config, to_dict
from vlgrpo.config.contract import CONTRACT_FILE, PromptContract
from vlgrpo.data.adapters import load_samples, no_usable_row, skip_reason
from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.data.prompts import check_system_prompt
from vlgrpo.data.stream import SampleStream
from vlgrpo.models import LoadedModel, load_model, placeholder_token_ids
from vlgrpo.policy.prompt import PromptSettings, forbidden_mask
from vlgrpo.registry import ENGINE
from vlgrpo.rewards import check_recipe, context_from_config
from vlgrpo.rewards.context import RewardContext
from vlgrpo.rewards.judge import Judge
from vlgrpo.rollout.adapters import adapter_sync, sync_mode
from vlgrpo.rollout.base import RolloutEngine, SamplingParams, staleness
from vlgrpo.rollout.build import build_engine
from vlgrpo.rollout.split import SplitRollout, worker_gpu
from vlgrpo.rollout.weight_stream import Bucket, SyncStats, WeightBuckets, plan_buckets
from vlgrpo.trainer import checkpoint, prefill_once
from vlgrpo.trainer.backends import Backend, make_backend
from vlgrpo.trainer.group import join_group
from vlgrpo.trainer.metrics import MetricsLogger, Timers
from vlgrpo.trainer.ranks import max_over_ranks, rank_world
from vlgrpo.trainer.rows import CheckedRows
from vlgrpo.trainer.rundir import RunDirError, RunLock, describe
from vlgrpo.types import InputError
from vlgrpo.vision_cache import VisionCache


@dataclass
class RunState:
    """Everything one run holds between steps: built once by `build_state`, advanced by the loop, saved by
    `checkpoint`."""

    cfg: Config
    run_dir: Path
    lm: LoadedModel
    backend: Backend
    cache: VisionCache
    engine: RolloutEngine | SplitRollout | None
    """None in the SFT stage (nothing is sampled); a SplitRollout with rollout.placement=split."""
    data: SampleStream
    rows: CheckedRows
    """The rows drawn from `data`: checked when first drawn, their prompts, the rows skipped (`rows.py`)."""
    logger: MetricsLogger
    reward_ctx: RewardContext
    recipe: dict[str, float]
    geometry: ProcessorGeometry
    sampling: SamplingParams
    engine_needs_weights: bool = False
    """True when the engine holds its own copy of the weights (vLLM, or any engine in a split worker); the colocated
    HF engine shares the trainer's model."""
    engine_logprobs_differ: bool = False
    """True when another implementation than the trainer's forward samples (vLLM, colocated or in a split worker):
    its log-probs differ from the trainer's by numerics, which the rollout IS weights measure and correct."""
    evaluator: Callable[[RunState], dict[str, float]] | None = None
    ref_cache: VisionCache | None = None
    """Features of the reference policy's own vision tower (only when the policy's tower trains)."""
    step: int = 0
    nonfinite_steps: int = 0
    """Steps whose optimiser step was skipped for a non-finite loss or gradient (`train/nonfinite_steps`)."""
    nonfinite_streak: int = 0
    """Such steps in a row, up to now; the run stops at train.max_nonfinite_steps."""
    eval_failures: int = 0
    """In-loop evals that raised in this process (`eval/failures`): logged as warnings, never fatal."""
    lock: RunLock | None = None
    """The run directory's lock (rank 0 while training; None on other ranks and for exports)."""
    timers: Timers = field(default_factory=Timers)

    @property
    def tokenizer(self):
        return self.lm.processor.tokenizer

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    @property
    def image_token_id(self) -> int:
        return self.lm.model.config.image_token_id

    @property
    def video_token_id(self) -> int | None:
        return getattr(self.lm.model.config, "video_token_id", None)

    @property
    def forbidden_ids(self) -> list[int]:
        return placeholder_token_ids(self.tokenizer)

    @functools.cached_property
    def forbidden(self) -> torch.Tensor:
        """[V] bool mask of the vision placeholder ids: never sampled, -inf in every log-prob pass."""
        vocab = self.lm.model.config.get_text_config().vocab_size  # not the weight: ZeRO-3 partitions it
        return forbidden_mask(self.tokenizer, vocab)

    @property
    def temperature(self) -> float:
        return self.cfg.rollout.temperature

    @property
    def device(self) -> torch.device:
        return next(self.backend.model.parameters()).device

    def sampling_for(self, step: int, round_no: int = 0) -> SamplingParams:
        """Sampling params with a seed of their own per step and top-up round: reproducible across resumes."""
        seed = self.sampling.seed * 1_000_003 + step * 7919 + round_no
        return dataclasses.replace(self.sampling, seed=seed)

    def log_warning(self, message: str) -> None:
        print(f"[vlgrpo] warning: {message}", file=sys.stderr)

    def save_checkpoint(self) -> Path:
        return checkpoint.save(self)

    def sync_engine(self) -> SyncStats:
        """The engine gets this step's policy (phase 8, and after a resume); returns what moved. Nothing for an
        engine that shares the trainer's model (a version bump); the LoRA adapter alone for one that applies it
        (vLLM, rollout.vllm.adapter_sync); else the weights that change, in buckets (`weight_stream`; ZeRO-3 gathers
        a bucket at once, LoRA merges into new tensors)."""
        if not self.engine_needs_weights:
            self.engine.update_weights(None, self.step)
            return SyncStats()
        if adapter_sync(self.cfg):
            adapter = self.backend.adapter()
            self.engine.update_weights(adapter, self.step)
            return SyncStats(adapter.bytes, len(adapter.tensors), 1)
        weights = WeightBuckets(self.sync_plan, self.backend.sync_tensors)
        self.engine.update_weights(weights, self.step)
        return SyncStats.of(weights)

    @functools.cached_property
    def sync_plan(self) -> list[Bucket]:
        """The buckets every sync moves (the names, dtypes and shapes do not change during a run)."""
        return plan_buckets(self.backend.sync_specs(), int(self.cfg.rollout.sync_bucket_mb * 2**20))

    @property
    def split(self) -> bool:
        """The rollout runs in a worker process of its own (rollout.placement=split)."""
        return self.cfg.rollout.placement == "split" and self.engine is not None

    def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        self.logger.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _engine(cfg: Config, lm: LoadedModel, cache: VisionCache, prompt: PromptSettings):
    if cfg.train.stage == "sft":
        return None, False
    if cfg.rollout.placement == "split":  # the engine in a worker process of its own (rollout/split.py)
        return _split_rollout(cfg, prompt.box_format), True
    engine = build_engine(cfg.rollout.engine, lm, cache, prompt, run=cfg)
    return engine, engine.holds_own_weights


def _split_rollout(cfg: Config, box_format: str) -> SplitRollout:
    # One worker per rank: it samples this rank's prompts (its data shard, its seeds) and gets this rank's full weights
    # (ZeRO-3 gathers them, every rank alike). Version 0 is the checkpoint both sides load; a resumed run sends its
    # weights right after (checkpoint.resume)
    return SplitRollout(cfg, box_format, {}, staleness(cfg), _rollout_gpu(cfg))


def _rollout_gpu(cfg: Config) -> str | None:
    """The GPU on which this rank's worker runs vLLM (`rollout.split.worker_gpu`); None keeps the worker on the CPU:
    the hf engine (its worker decodes on the CPU), or a machine without CUDA."""
    if cfg.rollout.engine != "vllm" or not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g.strip() for g in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    local, ranks = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return worker_gpu(local, ranks, cfg.rollout.vllm.rollout_gpus, gpus)


def _lock_run_dir(cfg: Config, run: Path) -> RunLock | None:
    """Rank 0, the only process that writes the run directory, locks it and writes the resolved config.yaml; every
    rank learns whether it could (a second run on the directory, or one that cannot write it, stops every rank)."""
    lock, error = None, None
    if rank_world()[0] == 0:
        try:
            lock = RunLock(run)
            try:
                save_config(cfg, run / "config.yaml")
            except OSError as e:
                lock.release()
                raise RunDirError(
                    f"could not write '{run / 'config.yaml'}': {describe(e)}; nothing else was "
                    "written: free space or choose a writable train.output_dir"
                ) from e
        except RunDirError as e:
            error = e
    if max_over_ranks(int(error is not None)):
        raise error or RunDirError(f"rank 0 could not lock or write train.output_dir '{run}' (see its error)")
    return lock


def build_state(
    cfg: Config, run_dir: str | Path | None = None, progress: bool | None = None, for_export: bool = False
) -> RunState:
    """Join the ranks, lock the run directory and save the resolved config (training, rank 0), build everything,
    resume if asked. An export only reads the run directory: no lock, nothing written."""
    torch.manual_seed(cfg.train.seed)
    run = Path(run_dir or cfg.train.output_dir)
    device = join_group(
        cfg.train.dist_timeout_s
    )  # join the group (DeepSpeed then finds it joined) and pick the rank's GPU
    if cfg.train.backend == "zero3":
        from vlgrpo.trainer.zero3 import prepare_partitioned_load

        prepare_partitioned_load(cfg)  # before from_pretrained: each rank loads only its shard
    if cfg.train.backend == "zero3":
        device = "cpu"  # DeepSpeed places the partitions itself
    lock = None if for_export else _lock_run_dir(cfg, run)
    try:
        state = _build(cfg, run, device, progress, for_export)
        state.lock = lock
        if lock is not None:  # rank 0 of a training run: how this run prompts, for eval / export / a later train
            _write_contract(state, run)
        if cfg.train.resume or for_export:
            checkpoint.resume(state, for_export)
        elif checkpoint.checkpoint_dirs(run) or _has_rows(run / "metrics.jsonl"):
            raise ConfigError(
                f"train.output_dir '{run}' holds checkpoints or metrics of an earlier run and train.resume is false: "
                "set train.resume=true to continue it, or choose a new train.output_dir (nothing was overwritten)"
            )
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return state


def _write_contract(state: RunState, run: Path) -> None:
    try:
        PromptContract.from_config(state.cfg, state.lm.arch, state.reward_ctx.box_format).write(run)
    except OSError as e:
        raise RunDirError(
            f"could not write '{run / CONTRACT_FILE}': {describe(e)}: free space or choose a writable train.output_dir"
        ) from e


def _has_rows(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _build(cfg: Config, run: Path, device: str, progress: bool | None, for_export: bool) -> RunState:
    """Load model and data, build backend/cache/engine/rewards/logger into a RunState at step 0."""
    check_system_prompt(cfg.data.system_prompt)  # every prompt holds it: a config error, not a row's
    if "judge" in cfg.reward.recipe and not for_export:
        Judge(cfg.reward.judge).headers()  # a missing API key fails now, not after the model loaded
    m = cfg.model
    rank, world = rank_world()
    lm = load_model(m.name_or_path, m.arch, m.dtype, m.attn_implementation, m.min_pixels, m.max_pixels, device)
    geometry = ProcessorGeometry.from_processor(lm.processor)
    reward_ctx = context_from_config(cfg, lm.arch, geometry)
    check_recipe(cfg.reward.recipe)  # unknown reward names fail here, before any compute
    loaded = load_samples(
        cfg.data.train,
        cfg.data.format,
        errors="skip",
        max_samples=cfg.data.max_samples,
        preset=cfg.data.preset,
        columns=dict(cfg.data.columns),
    )
    for err in loaded.errors if rank == 0 else []:
        print(f"[vlgrpo] skipped bad sample: {err}", file=sys.stderr)
    if not loaded.samples:  # the rows' problems, not `SampleStream`'s "empty" ValueError
        raise no_usable_row(loaded.source, [(skip_reason(e), e.row) for e in loaded.errors])
    if len(loaded.samples) < world:
        raise InputError(
            f"{loaded.source}: {len(loaded.samples)} usable rows for {world} data-parallel ranks; every "
            "rank needs at least one"
        )
    need_ref = cfg.train.stage == "grpo" and cfg.grpo.beta > 0
    backend = make_backend(lm.model, cfg, need_ref)
    cache = VisionCache(
        lm.model,
        lm.processor,
        cfg.rollout.vision_cache_bytes,
        cfg.rollout.vision_cache_dir,
        trainable=backend.vision_trainable(),
        fingerprint=backend.vision_fingerprint(),
    )
    # the run's prompt settings: the rows count and train on the prompts the engine samples from, both written from
    # this one value (a split worker builds the same from the same config)
    prompt = PromptSettings.from_config(cfg, reward_ctx.box_format, lm.processor)
    engine, needs_weights = (None, False) if for_export else _engine(cfg, lm, cache, prompt)
    adapter_alone, why = sync_mode(cfg)
    if needs_weights and cfg.train.backend == "lora" and not adapter_alone and rank == 0:
        print(
            f"[vlgrpo] the rollout engine gets the merged weights after each step ({why}): merged into new tensors, "
            "the trainer's base is never written"
        )
    r = cfg.rollout
    sampling = SamplingParams(
        completions_per_prompt=r.completions_per_prompt,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=r.max_new_tokens,
        stop=list(r.stop),
        seed=cfg.train.seed + 7919 * rank,
    )
    show = (cfg.logging.progress_bar if progress is None else progress) and rank == 0
    logger = MetricsLogger(
        run,
        cfg.logging.tensorboard and rank == 0,
        cfg.logging.wandb_project if rank == 0 else None,
        to_dict(cfg),
        cfg.train.steps,
        show,
        enabled=rank == 0 and not for_export,
    )
    data = SampleStream(loaded.samples[rank::world], cfg.train.seed, cfg.data.shuffle)
    rows = CheckedRows(data, lm.processor, geometry, cfg.data, prompt, loaded.errors, loaded.source)
    state = RunState(
        cfg=cfg,
        run_dir=run,
        lm=lm,
        backend=backend,
        cache=cache,
        engine=engine,
        data=data,
        rows=rows,
        logger=logger,
        reward_ctx=reward_ctx,
        recipe=dict(cfg.reward.recipe),
        geometry=geometry,
        sampling=sampling,
        engine_needs_weights=needs_weights,
        engine_logprobs_differ=engine is not None and ENGINE.load(cfg.rollout.engine).holds_own_weights,
    )
    prefill_once.enable(state)  # the rollout's prompt prefill is the update's, where it can be
    return state
