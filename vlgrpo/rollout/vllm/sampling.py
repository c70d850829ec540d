"""What a vLLM request asks of its sampler and what its output becomes (pure helpers of `engine.py`, tested
on the CPU; vllm itself is not imported): the sampling keyword arguments (the placeholders biased out of reach, the
sampled tokens' processed log-probs), a seed per request, and a RequestOutput turned into Completions.
"""

from __future__ import annotations

import math

from vlgrpo.rollout.base import SamplingParams, cut_at_stop
from vlgrpo.types import Completion

PLACEHOLDER_BIAS = -1.0e4  # exp(-1e4) == 0 in fp32: the same distribution as a -inf mask


def sampling_kwargs(params: SamplingParams, forbidden_ids: list[int], seed: int | None = None) -> dict:
    """Keyword arguments of one request's `vllm.SamplingParams` (greedy runs n=1; the engine copies the result)."""
    return {
        "n": 1 if params.greedy else params.completions_per_prompt,  # vLLM's name for G
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "seed": seed,
        "logprobs": 0,  # the sampled token's log-prob (logprobs_mode=processed_logprobs: after temperature, top-k/p)
        "logit_bias": {int(i): PLACEHOLDER_BIAS for i in forbidden_ids},
        "skip_special_tokens": True,
    }


def request_seeds(seed: int | None, count: int) -> list[int | None]:
    """One seed per request of a batch (the same seed on every prompt would correlate their samples)."""
    return [None] * count if seed is None else [(seed * 1_000_003 + i) % 2**63 for i in range(count)]


def to_completions(
    output, params: SamplingParams, forbidden_ids: set[int], decode, opened: str = ""
) -> tuple[list[Completion], int]:
    """A vLLM RequestOutput -> G Completions, and how many sampled a vision placeholder.

    A completion that sampled a placeholder is cut just before it and marked finish_reason "placeholder" (the trainer
    masks it); its id must never reach a forward pass ("Image features and image tokens do not match"). The text is
    decoded from the ids with our tokenizer, as the HF engine does (vLLM's incremental detokenizer holds back a
    trailing partial UTF-8 character), so rewards and evals see the same text from either engine; `opened` (what the
    prompt opened of the turn, `PromptInputs.opened`) leads it, as in the HF engine.
    """
    outs = list(output.outputs)
    if params.greedy and params.completions_per_prompt > 1:
        outs = outs[:1] * params.completions_per_prompt
    completions, bad = [], 0
    for o in outs:
        ids = list(o.token_ids)
        logps = [lp[t].logprob for lp, t in zip(o.logprobs, ids)] if o.logprobs else None
        if logps and not all(math.isfinite(lp) or lp == -math.inf for lp in logps):
            raise RuntimeError(
                "vLLM returned NaN log-probs for a completion: its kernels computed non-finite logits, so neither "
                "the tokens nor the log-probs can be trained on. vLLM 0.32's CPU build does this for Qwen3.5 (its "
                "CPU Gated DeltaNet kernel, seen with and without AVX-512 and AMX); use rollout.engine=hf (or a GPU)"
            )
        reason = "stop" if o.finish_reason == "stop" else "length"
        hit = next((i for i, t in enumerate(ids) if t in forbidden_ids), None)
        if hit is not None:
            bad += 1
            ids, logps, reason = ids[:hit], (logps[:hit] if logps else logps), "placeholder"
        completions.append(Completion(ids, opened + cut_at_stop(decode(ids), params.stop), reason, logps))
    return completions, bad
