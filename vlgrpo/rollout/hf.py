"""Transformers rollout backend that runs anywhere: each prompt (image features from the vision cache, Qwen3-VL's
DeepStack maps with them) is prefilled once, then its G rows are sampled with a short decode loop of our own that
reads the prompt's KV once per step (`decode.py`).

Vision placeholder ids are never sampled (logits at -inf), exactly as the trainer's log-prob pass masks them.
Shares the trainer's model object; knows nothing of rewards or losses.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

import torch
from torch import Tensor

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.data.video import VideoSampling
from vlgrpo.models import eval_mode
from vlgrpo.policy.decode_weights import decode_weights
from vlgrpo.policy.kept_prefill import KeptPrefill
from vlgrpo.policy.linear_attention import select_cache_rows
from vlgrpo.policy.prefill import extend, prefill
from vlgrpo.policy.prompt import PromptInputs, PromptSettings, build_prompt, forbidden_mask, left_pad, vocab_size
from vlgrpo.policy.routing import compact, control_of
from vlgrpo.rollout.base import EngineCounters, SamplingParams
from vlgrpo.rollout.decode import SharedPrefixDecoder, cache_rows, turn_cache
from vlgrpo.rollout.sampling import DecodeRun, Row, StopCheck
from vlgrpo.types import Completion, RolloutGroup, Sample


def decode_loop(model, last: Tensor, cache, next_pos: Tensor, prompt_mask: Tensor | None, run: DecodeRun) -> list:
    """Sample G = params.completions_per_prompt completions per prefilled prompt: last [B, V] logits of the last prompt
    position, cache: the prompts' KV cache, next_pos [B] next M-RoPE position, prompt_mask [B, T] (None when unpadded)
    -> B*G rows (prompt-major). Finished rows stop being sampled at once. The strategy is `decode_shared` for the models
    `SharedPrefixDecoder` runs, else `decode_copied`; the rows still sampling get the same logits up to the matrix
    kernels' rounding of a smaller batch (bit for bit on some CPUs, within 3e-6 in a log-prob on others;
    `tests/rollout/test_hf.py`)."""
    strategy = decode_shared if SharedPrefixDecoder.supports(model) else decode_copied
    return strategy(model, last, cache, next_pos, prompt_mask, run)


def decode_shared(
    model, last: Tensor, cache, next_pos: Tensor, prompt_mask: Tensor | None, run: DecodeRun, drop_finished: bool = True
) -> list:
    """Each prompt's KV read once per step for its G rows (`SharedPrefixDecoder`); a prompt is dropped once all its
    G rows have finished, so a short answer's group stops costing compute while a long one's continues.
    `drop_finished=False` keeps every row stepping to the end instead: the same tokens and log-probs at more cost
    (what the engine did before; benchmarks/bench_decode.py and tests/rollout/test_hf.py compare the two)."""
    g = run.params.completions_per_prompt
    decoder = SharedPrefixDecoder(model, cache, prompt_mask, g, run.params.max_new_tokens)
    control = control_of(model) if run.record_routing else None  # each fed token's experts (`policy.routing`)
    logits, pos = last.repeat_interleave(g, dim=0), next_pos.repeat_interleave(g)
    rows = [Row() for _ in range(logits.shape[0])]
    active = list(range(len(rows)))
    held = list(range(len(rows) // g))  # the prompts the decoder holds, until all their rows have finished
    tokens = torch.zeros(len(rows), dtype=torch.long, device=logits.device)  # a held prompt's finished rows step too
    active_idx = torch.arange(len(rows), device=logits.device)  # the decoder rows of `active`
    slot = {p: i for i, p in enumerate(held)}
    frozen: dict[int, list] = {}  # row -> its Gated DeltaNet states once its last token was fed (kept KV, hybrids)
    for _ in range(run.params.max_new_tokens):
        tok, keep = run.sample(rows, active, logits)
        if not keep:
            break
        tokens[active_idx] = tok
        finished = [active[j] for j in sorted(set(range(len(active))) - set(keep))]
        active = [active[j] for j in keep]
        live = sorted({r // g for r in active})
        if drop_finished and len(live) < len(held):  # a prompt's rows have all finished: drop it
            _keep_kv(run, decoder, rows, [p for p in held if p not in live], slot, g, frozen)
            idx = torch.tensor([held.index(p) for p in live], device=tok.device)
            kept = decoder.keep(idx)
            tokens, pos, held = tokens[kept], pos[kept], live
        slot = {p: i for i, p in enumerate(held)}
        active_idx = torch.tensor([slot[r // g] * g + r % g for r in active], device=tok.device)
        with control.call() if control is not None else nullcontext() as record:
            logits, pos = decoder.step(tokens, pos)[active_idx], pos + 1
        if control is not None:  # the experts of each active row's token just fed
            for r, experts in zip(active, compact(record.own()[active_idx], control.num_experts)):
                rows[r].routing.append(experts)
        run.counts["decode_tokens"] += len(active)
        if run.kv_out is not None:  # this step fed the last token of the rows that just finished
            for r in finished:
                if r // g in slot:
                    frozen[r] = decoder.row_states(slot[r // g] * g + r % g)
    _keep_kv(run, decoder, rows, held, slot, g, frozen)
    return rows


def _keep_kv(
    run: DecodeRun, decoder: SharedPrefixDecoder, rows: list, prompts: list[int], slot: dict, g: int, frozen: dict
) -> None:
    """Into `run.kv_out`: the state of the rows of `prompts` (still held by the decoder, at `slot`), each over the
    tokens it fed: a row's token t is fed at step t while its prompt is held, so min(its length, the steps taken).
    A Gated DeltaNet's states are `frozen`'s where the row finished before the last step (taken as its last token was
    fed; they went on stepping after), else the decoder's current ones (its last token not yet fed)."""
    if run.kv_out is None:
        return
    for p in prompts:
        for r in range(p * g, (p + 1) * g):
            fed = min(len(rows[r].token_ids), decoder.length)
            run.kv_out[r] = decoder.row_kv(slot[p] * g + r % g, fed, run.prompt_tokens[p], frozen.get(r))


def decode_copied(model, last: Tensor, cache, next_pos: Tensor, prompt_mask: Tensor | None, run: DecodeRun) -> list:
    """The transformers forward over a cache copied G ways (any model), from which finished rows are dropped."""
    g = run.params.completions_per_prompt
    rows_of = torch.arange(last.shape[0], device=last.device).repeat_interleave(g)
    select_cache_rows(cache, rows_of)  # one prefill, G continuations: [B*G, heads, T, d] or a Gated DeltaNet's states
    logits, pos = last.repeat_interleave(g, dim=0), next_pos.repeat_interleave(g)
    mask = prompt_mask.repeat_interleave(g, dim=0) if prompt_mask is not None else None
    rows = [Row() for _ in range(logits.shape[0])]
    active = list(range(len(rows)))
    for _ in range(run.params.max_new_tokens):
        tok, keep = run.sample(rows, active, logits)
        if not keep:
            break
        if len(keep) < len(active):  # drop finished rows from the batch and the cache
            idx = torch.tensor(keep, device=tok.device)
            select_cache_rows(cache, idx)
            tok, pos = tok[idx], pos[idx]
            mask = mask[idx] if mask is not None else None
            active = [active[j] for j in keep]
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
        out = model(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=pos.view(1, -1, 1).expand(3, -1, 1),
            past_key_values=cache,
            use_cache=True,
        )
        logits, pos = out.logits[:, -1], pos + 1
        run.counts["decode_tokens"] += len(active)
    return rows


class HFEngine(EngineCounters):
    """RolloutEngine on a transformers model shared with the trainer (so `update_weights` is a version bump)."""

    holds_own_weights = False
    max_model_len: int | None = None
    """No context bound of the engine's own: a trajectory is bounded by max_total_length and max_turns."""
    max_images: int | None = None
    """A prompt may hold any number of images."""
    COUNTERS = (*EngineCounters.COUNTERS, "decode_tokens", "finish_stop", "finish_length")

    @classmethod
    def from_config(cls, cfg, lm, vision_cache, prompt: PromptSettings) -> HFEngine:
        """The engine of a run (`rollout.build.build_engine`): the trainer's own module and processor. A step's
        prompts are prefilled and decoded as one batch, the KV cache the memory planner counts
        (`memory.terms.rollout_terms`)."""
        return cls(lm.model, lm.processor, vision_cache, **prompt.prompt_kw(), batch_prompts=cfg.train.prompts_per_step)

    @classmethod
    def for_eval(cls, lm, vision_cache, prompt: PromptSettings, *, model=None, batch_prompts: int = 8, **launch):
        """A greedy decoder (`rollout.build.build_engine`): `model` (the in-loop eval's training module), else the
        loaded model itself; `launch` (dtype, engine_kwargs, gpu_memory_utilization) concerns engines that load their
        own copy."""
        model = lm.model.eval() if model is None else model
        return cls(model, lm.processor, vision_cache, **prompt.prompt_kw(), batch_prompts=batch_prompts)

    def __init__(
        self,
        model,
        processor,
        vision_cache,
        answer_format: str = "think_answer",
        box_format: str = "qwen2_5",
        system_prompt: str = "",
        batch_prompts: int = 8,
        video_sampling: VideoSampling | None = None,
        decode: Callable[..., list] | None = None,
        thinking: str = "auto",
    ):
        """`decode`: the decode of a prefilled chunk, with `decode_loop`'s signature; None: `decode_loop` (the
        shared-prefix step where the model supports it, else the transformers forward). Benchmarks and tests pass
        `decode_copied` or `functools.partial(decode_shared, drop_finished=False)` to compare the strategies."""
        if batch_prompts < 1:
            raise ValueError(f"batch_prompts must be >= 1, got {batch_prompts}")
        self.model, self.processor, self.cache = model, processor, vision_cache
        self.prompt_kw = dict(
            answer_format=answer_format,
            box_format=box_format,
            system_prompt=system_prompt,
            video_sampling=video_sampling or VideoSampling(),
            thinking=thinking,
        )
        self.batch_prompts = batch_prompts
        self.decode = decode
        self.geometry = ProcessorGeometry.from_processor(processor)
        tok = processor.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.device = next(model.parameters()).device
        self.forbidden = forbidden_mask(tok, vocab_size(model), self.device)
        eos = model.generation_config.eos_token_id
        self.eos_ids = {tok.eos_token_id, *(eos if isinstance(eos, (list, tuple)) else [eos])} - {None}
        self.policy_version = 0
        self.last_kv: list = []
        """Each completion's TurnKV from the last `generate_prompts(keep_kv=True)` or `continue_prompts`."""
        self.keep_prefill = False
        """Run the prompt prefill with autograd and keep it (`kept`) for the update of the same step: set by a run
        whose update can use it (`trainer.prefill_once`)."""
        self.kept: KeptPrefill | None = None
        """The last `generate`'s prefill with its graph (with `keep_prefill`, one chunk of prompts), until taken."""
        self.reset_stats()

    def build_prompts(self, samples: list[Sample]) -> list[PromptInputs]:
        return [build_prompt(s, self.processor, self.geometry, **self.prompt_kw) for s in samples]

    def generate(
        self, samples: list[Sample], params: SamplingParams, prompts: list[PromptInputs] | None = None
    ) -> list[RolloutGroup]:
        """1. prompts (the caller's, else built here), 2. features of every unique image and video (one encoder call
        each), 3. per chunk: prefill once + decode."""
        return self.generate_prompts(samples, prompts if prompts is not None else self.build_prompts(samples), params)

    @property
    def keeps_turns(self) -> bool:
        """Whether a multi-turn rollout's next turn can continue each row's state (`continue_prompts`): the
        shared-prefix decode keeps an attention layer's keys and values and a Gated DeltaNet layer's conv and
        recurrent states (Qwen3.5); a custom `decode` keeps nothing."""
        return self.decode is None and SharedPrefixDecoder.supports(self.model)

    def generate_prompts(
        self, samples: list[Sample], prompts: list[PromptInputs], params: SamplingParams, keep_kv: bool = False
    ) -> list[RolloutGroup]:
        """`generate` from prompts built already: a multi-turn rollout's next turn continues a trajectory's ids.
        `keep_kv` (with `keeps_turns`): `last_kv` gets each completion's TurnKV, in the groups' order."""
        feats = self.features(self.cache, prompts)
        gen = torch.Generator(device=self.device).manual_seed(params.seed) if params.seed is not None else None
        stop = StopCheck(self.processor.tokenizer, params.stop)
        run = replace(params, completions_per_prompt=1) if params.greedy else params  # greedy: decode once, copy G
        rows: list[Row] = []
        kv: list = []
        # a MoE model's experts per token, recorded by the shared-prefix decode (one-turn rollouts: a multi-turn one's
        # later turns keep no record; a custom `decode` records none)
        routing = [] if control_of(self.model) is not None and self.keeps_turns and not keep_kv else None
        # the update's prompt pass, when asked and the step's prompts are one chunk the shared-prefix decode runs
        keep = (
            self.keep_prefill
            and not keep_kv
            and self.keeps_turns
            and routing is None
            and len(prompts) <= self.batch_prompts
        )
        self.kept = None
        with eval_mode(self.model), torch.no_grad():  # train mode + gradient checkpointing would drop the KV cache
            for i in range(0, len(prompts), self.batch_prompts):
                chunk = slice(i, i + self.batch_prompts)
                chunk_kv = [None] * (len(prompts[chunk]) * run.completions_per_prompt) if keep_kv else None
                rows += self._generate_chunk(prompts[chunk], feats[chunk], run, stop, gen, chunk_kv, routing, keep)
                kv += chunk_kv or []
        run_g, g = run.completions_per_prompt, params.completions_per_prompt
        self.last_kv = [kv[b * run_g + j % run_g] for b in range(len(prompts)) for j in range(g)] if keep_kv else []
        return self._groups(samples, prompts, rows, run_g, g, stop, routing)

    def continue_prompts(
        self, samples: list[Sample], prompts: list[PromptInputs], kvs: list, params: SamplingParams
    ) -> list[RolloutGroup]:
        """One completion per prompt, each prompt the continuation of a row whose KV is `kvs[i]` (a TurnKV from the
        turn before): only the tokens after it are prefilled (the tool response, its crop's features from the vision
        cache, the next turn's opening), positions those of the whole sequence; `last_kv` then holds the new KVs."""
        feats = self.features(self.cache, prompts)
        gen = torch.Generator(device=self.device).manual_seed(params.seed) if params.seed is not None else None
        stop = StopCheck(self.processor.tokenizer, params.stop)
        run = replace(params, completions_per_prompt=1)
        rows: list[Row] = []
        self.last_kv = []
        with eval_mode(self.model), torch.no_grad():
            for i in range(0, len(prompts), self.batch_prompts):
                chunk = slice(i, i + self.batch_prompts)
                lasts, extended, positions = [], [], []
                for p, f, kv in zip(prompts[chunk], feats[chunk], kvs[chunk]):
                    ids = torch.tensor([p.input_ids], device=self.device)
                    cache, _ = turn_cache(self.model, [kv])
                    last, cache, next_pos = extend(self.model, cache, ids, kv.length, f)
                    self._counts["prefill_tokens"] += len(p.input_ids) - kv.length
                    lasts.append(last)
                    positions.append(next_pos)
                    extended += cache_rows(self.model, cache, len(p.input_ids))
                stacked, mask = turn_cache(self.model, extended)
                chunk_kv = [None] * len(extended)
                lengths = [kv.length for kv in extended]
                with decode_weights(self.model), torch.inference_mode():
                    rows += decode_shared(
                        self.model,
                        torch.cat(lasts),
                        stacked,
                        torch.cat(positions),
                        mask,
                        DecodeRun(run, self.forbidden, self.eos_ids, stop, gen, self._counts, chunk_kv, lengths),
                    )
                self.last_kv += chunk_kv
        return self._groups(samples, prompts, rows, 1, 1, stop)

    def _generate_chunk(
        self,
        prompts,
        feats,
        params,
        stop,
        gen,
        kv_out: list | None = None,
        prompt_routing: list | None = None,
        keep: bool = False,
    ) -> list[Row]:
        """Prefill a chunk of prompts once, then decode their rows; a MoE model's prompt routing (each prompt's real
        tokens' experts) goes to `prompt_routing`, its rows' to each row. `keep`: the prefill runs with autograd and
        is kept for the update (`kept`)."""
        ids, mask = left_pad([p.input_ids for p in prompts], self.pad_id, self.device)
        mm, _ = left_pad([p.mm_token_type_ids for p in prompts], 0, self.device)
        control = control_of(self.model) if prompt_routing is not None else None
        with control.call() if control is not None else nullcontext() as record, torch.set_grad_enabled(keep):
            last, cache, next_pos = prefill(self.model, ids, mask, mm, feats)
        if control is not None:  # each prompt's real tokens' experts, kept with its group
            experts = compact(record.own(), control.num_experts).view(*ids.shape, control.layers, control.top_k)
            prompt_routing += [e[m.bool().cpu()] for e, m in zip(experts, mask)]
        self._counts["prefill_tokens"] += int(mask.sum())
        if keep:  # the update's prompt pass (`policy.kept_prefill`); the decode below reads it without a graph
            self.kept = KeptPrefill.of(self.model, ids, mask, last, cache, next_pos)
        padded = mask if not bool(mask.all()) else None
        decode = self.decode or decode_loop  # the module global, looked up per call (bench_vs_trl.py times it)
        lengths = [len(p.input_ids) for p in prompts]
        # inference mode: no version counters or view records on the decode's ~2,000 ops a step (its tensors never
        # reach a graph; the kept prefill's are read, not recorded), 0.261 -> 0.248 s a decode (dev/fast_path)
        with decode_weights(self.model), torch.inference_mode():
            return decode(
                self.model,
                last,
                cache,
                next_pos,
                padded,
                DecodeRun(
                    params, self.forbidden, self.eos_ids, stop, gen, self._counts, kv_out, lengths, control is not None
                ),
            )

    def _groups(self, samples, prompts, rows, run_g: int, g: int, stop, routing=None) -> list[RolloutGroup]:
        tok = self.processor.tokenizer
        forbidden = set(torch.nonzero(self.forbidden).flatten().tolist())
        groups = []
        for b, (s, p) in enumerate(zip(samples, prompts)):
            completions = []
            for row in rows[b * run_g : (b + 1) * run_g] * (g // run_g):
                text = p.opened + stop.cut(tok.decode(row.token_ids, skip_special_tokens=True))
                c = Completion(list(row.token_ids), text, row.finish_reason, list(row.logprobs))
                if routing is not None:  # [fed tokens, L, k]; a one-token row fed none
                    c.routing = torch.stack(row.routing) if row.routing else routing[b][:0]
                completions.append(c)
                self._counts[f"finish_{row.finish_reason}"] += 1
                self._counts["generated_tokens"] += len(row.token_ids)
                self._counts["placeholder_sampled"] += sum(t in forbidden for t in row.token_ids)
            group = RolloutGroup(s, list(p.input_ids), completions, self.policy_version)
            group.prompt_routing = None if routing is None else routing[b]
            groups.append(group)
        self._counts["prompts"] += len(samples)
        self._counts["completions"] += len(samples) * g
        return groups

    def take_prefill(self) -> KeptPrefill | None:
        """The kept prefill, handed over once (the engine holds no graph after)."""
        kept, self.kept = self.kept, None
        return kept

    def update_weights(self, named_params=None, version: int = 0) -> None:
        """The model is the trainer's own object: only the version moves (and a trainable tower's cache version)."""
        self.policy_version = int(version)
        self.cache.set_step(int(version))
