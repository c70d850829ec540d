"""Training batches: rollout groups -> one shared-prefix `CompletionBatch`, its micro-batches, and their log-probs.

Each prompt is forwarded once per pass and its KV cache shared by its G completions (policy/forward.py does the
model side). Completions in which the model sampled a vision placeholder token are masked out of the loss and
counted; the tokens of a multi-turn rollout's tool-response turns (their crops' placeholders too) are out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlgrpo.policy.forward import CompletionBatch, collate_groups
from vlgrpo.policy.routing import collate_routing
from vlgrpo.types import RolloutGroup


@dataclass
class TrainBatch:
    """R = sum of G over B prompts. `loss_mask` [R, C] float: 1 on scored tokens (padding and masked rows are 0)."""

    batch: CompletionBatch
    features: list
    """B entries: each prompt's visual features, a list of ImageFeatures in `visual_sources` order (cached, no
    pixels; embeds [N, H], with Qwen3-VL's DeepStack maps)."""
    sources: list
    """B lists: each prompt's visual sources (image refs, a VideoClip), re-encoded with grad when the tower trains."""
    loss_mask: torch.Tensor
    masked_rows: int = 0
    """Completions dropped from the loss because they contain a vision placeholder token."""
    engine_logp: torch.Tensor | None = None
    """[R, C] the engine's sampling log-prob of each completion token (NaN where it reported none); None when no
    completion carries engine log-probs."""

    @property
    def rows(self) -> int:
        return self.batch.completion_ids.shape[0]

    def micro_batches(self, size: int):
        """(row slice, CompletionBatch of those rows, indices of the prompts it keeps) in order."""
        for start in range(0, self.rows, size):
            rows = torch.arange(start, min(start + size, self.rows))
            yield slice(start, start + len(rows)), self.batch.select(rows), self.batch.used_prompts(rows)


def make_batch(
    groups: list[RolloutGroup],
    features: list,
    pad_id: int,
    image_token_id: int,
    forbidden_ids: list[int],
    device: torch.device | str | None = None,
    video_token_id: int | None = None,
    sources: list | None = None,
    routing_replay: bool = False,
    router_aux_loss_coef: float = 0.0,
) -> TrainBatch:
    """features: one entry per group, its ImageFeatures or the list of its parts' (embeds [N, H], grid_thw [3],
    DeepStack maps or None), kept whole: the log-prob passes inject all of them. `sources`: each group's visual
    sources (default: its images). Tensors go to `device` (the model's). A MoE rollout's recorded experts ride along
    (`CompletionBatch.routing`), forced in every pass with `routing_replay`; with `router_aux_loss_coef` the update's
    passes keep the routers' probabilities for their load-balancing loss."""
    batch = collate_groups(groups, pad_id, image_token_id, video_token_id, device)
    widths = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    batch.routing = collate_routing(groups, *widths, routing_replay, router_aux_loss_coef)
    sampled = batch.completion_mask if batch.tool_mask is None else batch.completion_mask * (1 - batch.tool_mask)
    loss_mask = sampled.float()  # a tool-response turn's tokens: no loss, no ratio, not in the normalisers
    forbidden = torch.tensor(list(forbidden_ids), dtype=torch.long, device=batch.completion_ids.device)
    bad = (torch.isin(batch.completion_ids, forbidden) & sampled.bool()).any(1)  # [R]: the model sampled one
    if bad.any():  # a placeholder would desync image tokens and has logp = -inf: drop the row, keep the shapes
        batch.completion_ids[bad] = pad_id
        batch.completion_mask[bad] = 0
        loss_mask[bad] = 0.0
        if batch.tool_mask is not None:
            batch.tool_mask[bad] = 0
    sources = sources if sources is not None else [list(g.sample.images) for g in groups]
    return TrainBatch(batch, list(features), sources, loss_mask, int(bad.sum()), _engine_logps(groups, batch))


def _engine_logps(groups: list[RolloutGroup], batch) -> torch.Tensor | None:
    """The engine's per-token log-probs as [R, C] (NaN padding), in row order; None when the engine gave none."""
    rows = [c.logprobs for g in groups for c in g.completions]
    if not any(rows):
        return None
    out = torch.full(batch.completion_ids.shape, float("nan"), device=batch.completion_ids.device)
    for r, lps in enumerate(rows):
        if lps:
            n = min(len(lps), out.shape[1])
            out[r, :n] = torch.tensor(lps[:n], dtype=torch.float32)
    return out


def attach_crops(batch: TrainBatch, groups: list[RolloutGroup], cache) -> None:
    """Multi-turn rollouts: each row's crops (the images its tools returned) as features from the vision cache (a
    crop encoded during the rollout is a hit), on `batch.batch.row_images`; a row dropped from the loss keeps none.
    Nothing when no completion holds one."""
    crops = [c.images for g in groups for c in g.completions]
    if not any(crops):
        return
    kept = batch.batch.completion_mask.any(1).tolist()
    crops = [c if keep else [] for c, keep in zip(crops, kept)]
    feats = iter(cache.get_rows([c for c in crops if c]))
    batch.batch.row_images = [next(feats) if c else [] for c in crops]


def over_turn_mask(groups: list[RolloutGroup]) -> torch.Tensor:
    """[B*G] bool: the trajectories still calling a tool when `rollout.max_turns` or `rollout.max_total_length`
    ended them."""
    cut = ("max_turns", "max_total_length")
    return torch.tensor([c.finish_reason in cut for g in groups for c in g.completions])
