"""One decode's sampling: the next token of each row from its logits (temperature, top-k, top-p, the placeholder ids
never drawn), each row's record of what it sampled, and when a row stops (EOS, a stop string, the length cap).
Shared by every decode strategy of the HF engine (`rollout/hf.py`) and by a custom `decode`, whose rows are `Row`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from vlgrpo.rollout.base import SamplingParams, cut_at_stop


def sample_next(
    logits: Tensor, params: SamplingParams, forbidden: Tensor | None, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Next token of each row -> (ids [R] long, log-probs [R] fp32).

    The reported log-prob is log softmax(logits / T) of the chosen id with the forbidden ids at -inf (T = 1 when
    greedy), before top-k / top-p truncation: the value `vlgrpo.grpo.logprobs.token_logprobs` recomputes.
    """
    x = logits.float()  # [R, V]
    if forbidden is not None:
        x = x.masked_fill(forbidden, -torch.inf)
    if params.greedy:
        ids = x.argmax(dim=-1)
        return ids, torch.log_softmax(x, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
    if params.temperature != 1.0:  # x / 1 is x: one op a step saved
        x = x / params.temperature
    logp = torch.log_softmax(x, dim=-1)
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, -torch.inf)
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p = torch.softmax(sorted_x, dim=-1)
        drop = (p.cumsum(-1) - p) >= params.top_p  # mass before this token already reaches top_p
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -torch.inf)
    ids = torch.multinomial(torch.softmax(x, dim=-1), 1, generator=generator).squeeze(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)


@dataclass
class Row:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    routing: list[Tensor] = field(default_factory=list)
    """A MoE model's: the experts [L, k] of each token fed back (every sampled token but the last)."""


class StopCheck:
    """Stop strings, checked on the decoded tail of a row (enough tokens to hold the longest stop string)."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.tail = max((len(s.encode()) for s in stop), default=0) + 2  # every token decodes to >= 1 byte

    def hit(self, ids: list[int]) -> bool:
        if not self.stop:
            return False
        text = self.tokenizer.decode(ids[-self.tail :], skip_special_tokens=True)
        return any(s in text for s in self.stop)

    def cut(self, text: str) -> str:
        return cut_at_stop(text, self.stop)


@dataclass
class DecodeRun:
    """What one decode needs besides the model and its prefilled prompts."""

    params: SamplingParams
    forbidden: Tensor | None
    """[V] bool: the placeholder ids, never sampled."""
    eos_ids: set[int]
    stop: StopCheck
    generator: torch.Generator | None
    counts: dict[str, int]
    """The engine's counters (`decode_tokens` grows here)."""
    kv_out: list | None = None
    """When a list of one None per row: `decode_shared` puts each row's `TurnKV` there (its next turn continues it;
    multi-turn rollouts). Other decodes leave it as it is."""
    prompt_tokens: list[int] | None = None
    """Each prompt's unpadded length (with `kv_out`)."""
    record_routing: bool = False
    """A MoE model's decode records each fed token's experts in its row (`Row.routing`)."""

    def sample(self, rows: list[Row], active: list[int], logits: Tensor) -> tuple[Tensor, list[int]]:
        """Sample the next token of each active row and record it -> (tokens [A], indices into `active` of the rows
        that go on); a row finishes on EOS or a stop string ("stop") or at max_new_tokens ("length")."""
        tok, logp = sample_next(logits, self.params, self.forbidden, self.generator)  # the active rows: same draws
        keep = []
        for j, (t, lp) in enumerate(zip(tok.tolist(), logp.tolist())):
            row = rows[active[j]]
            row.token_ids.append(t)
            row.logprobs.append(lp)
            if t in self.eos_ids or self.stop.hit(row.token_ids):
                row.finish_reason = "stop"
            elif len(row.token_ids) >= self.params.max_new_tokens:
                row.finish_reason = "length"
            else:
                keep.append(j)
        return tok, keep
