"""The rollout's prompt prefill, kept with its autograd graph, as the update's prompt pass of the same step.

On-policy, the HF engine samples with the trainer's own module (num_iterations = 1): the update's prompt forward would
recompute the rollout's, the same weights on the same prompts. When the engine keeps its prefill (`HFEngine.
keep_prefill`), it runs it with autograd on and hands over its outputs: the last position's logits, each decoder
layer's keys and values (a Gated DeltaNet layer's conv and recurrent states), the next positions. The update turns
them into leaves (`Leaves`): every micro-batch's completion pass reads its prompts' rows of them and its backward
stops there, their gradients summing over the micro-batches; then one backward (`Leaves.carry`) takes the sums
through the rollout's prefill graph into the weights. The gradient is the same sum as with a prompt forward per
micro-batch; the prompt forward runs once per step instead of twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from vlgrpo.families import is_gated_deltanet
from vlgrpo.policy.linear_attention import prompt_states, set_states


@dataclass
class KeptPrefill:
    """One prefill's outputs, with their graph: `prompt_ids`/`prompt_mask` [B, T] the left-padded prompts it ran,
    `last` [B, V], `next_pos` [B], `layers` per decoder layer (keys, values) [B, kv heads, T, d] or a Gated DeltaNet
    layer's (conv [B, C, K], recurrent [B, hv, dk, dv])."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    last: Tensor
    next_pos: Tensor
    layers: list[tuple[Tensor, Tensor]]
    linear: list[bool]
    """Per decoder layer: a Gated DeltaNet layer (its pair is the conv and recurrent states)."""

    @classmethod
    def of(cls, model, prompt_ids: Tensor, prompt_mask: Tensor, last: Tensor, cache, next_pos: Tensor) -> KeptPrefill:
        """From `prefill.prefill`'s (last, cache, next_pos) over `prompt_ids` / `prompt_mask`."""
        linear = [is_gated_deltanet(layer) for layer in model.get_decoder().layers]
        layers = [
            prompt_states(cache, i) if lin else (cache.layers[i].keys, cache.layers[i].values)
            for i, lin in enumerate(linear)
        ]
        return cls(prompt_ids, prompt_mask, last, next_pos, layers, linear)

    def serves(self, prompt_ids: Tensor) -> bool:
        """Whether these are the prompts `prompt_ids` (a batch's, left-padded the same way) in the same order."""
        return self.prompt_ids.shape == prompt_ids.shape and torch.equal(
            self.prompt_ids, prompt_ids.to(self.prompt_ids)
        )

    def leaves(self, model) -> Leaves:
        return Leaves(self, model)


class Leaves:
    """The kept prefill's outputs detached into leaves that gather the update's gradients, micro-batch by
    micro-batch, until `carry` takes them through the prefill's graph."""

    def __init__(self, kept: KeptPrefill, model) -> None:
        self.kept, self.config, self.linear = kept, model.config, kept.linear
        leaf = lambda t: t.detach().requires_grad_(t.requires_grad)  # noqa: E731
        self.last = leaf(kept.last)
        self.layers = [(leaf(a), leaf(b)) for a, b in kept.layers]

    def part(self, used: list[int]) -> tuple[Tensor, DynamicCache, Tensor, Tensor]:
        """`prefill.prefill_batch`'s outputs for prompts `used` (a micro-batch's, in its order): (last-position logits
        [b, V], a cache over them, next positions [b], the key mask [b, T])."""
        if list(used) == list(range(self.last.shape[0])):  # every prompt in order (one micro-batch): no gather
            pick = lambda t: t  # noqa: E731
        else:
            idx = torch.as_tensor(used, dtype=torch.long, device=self.last.device)
            pick = lambda t: t[idx]  # noqa: E731
        cache = DynamicCache(config=self.config)
        for i, (a, b) in enumerate(self.layers):
            if self.linear[i]:
                set_states(cache.layers[i], pick(a), pick(b))
            else:
                cache.layers[i].update(pick(a), pick(b))
        return pick(self.last), cache, pick(self.kept.next_pos), pick(self.kept.prompt_mask)

    def carry(self) -> Tensor | None:
        """A scalar whose backward takes the gradients the leaves gathered through the rollout's prefill graph: the
        sum of each output times its leaf's gradient (d/dw of sum(out * g) = J^T g, g constant), so the backend's
        own `backward` runs it. None when no leaf got a gradient."""
        outs = [self.kept.last, *(t for pair in self.kept.layers for t in pair)]
        leaves = [self.last, *(t for pair in self.layers for t in pair)]
        terms = [(out * leaf.grad).sum() for out, leaf in zip(outs, leaves) if leaf.grad is not None and out.grad_fn]
        self.kept = None  # the graph goes with the backward
        return torch.stack(terms).sum() if terms else None
