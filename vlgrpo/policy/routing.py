"""Mixture-of-experts routing: which experts each token went to, recorded at rollout and replayed by the trainer.

A MoE decoder layer's router (`mlp.gate`: Qwen3-VL-MoE's and Qwen3.5-MoE's TopKRouter) turns a token's hidden state
into logits over E experts and keeps the top k, weighted by their softmax probabilities renormalised over the k. The
rollout and the trainer can route the same token differently (a near tie broken by a different batch layout's
rounding, or a policy that moved), and then the importance ratio compares two different networks. Routing replay
(R3, "rollout routing replay"; verl, slime and AReaL ship it) records the experts the rollout chose and forces them in
the trainer's passes: the weights of the k experts are still the current router's probabilities at those experts,
renormalised, so the router keeps its gradient through the chosen experts' weights.

`RoutingControl` is installed once on a MoE model (`control_of`): each router call goes through it. A pass that wants
the choices wraps its model call in `control.call(replay)`, with `replay` the experts [N, L, k] to use for the N tokens
the call routes (in the order the layer flattens them: row-major over [batch, sequence]) or None to let each router
choose; the call's record then holds what each router chose itself and what was used, [N, L, k] each. A dense model
has no control (None), and a call outside `control.call` routes as transformers does, recording nothing.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from vlgrpo.policy.text_decoder import is_moe_block

EXPERT_DTYPE = torch.uint8
"""How recorded expert indices are stored (a rollout's routing: tokens x MoE layers x k bytes); widened for > 256."""


@dataclass
class CallRecord:
    """One model call's routing, filled layer by layer as the call runs."""

    replay: Tensor | None
    """[N, L, k] the experts to use, or None: each router's own choice."""
    chosen: list[Tensor] = field(default_factory=list)
    """Per MoE layer, the router's own top-k [N, k] (what it would choose)."""
    probs: list[Tensor] | None = None
    """Per MoE layer, the router's probabilities [N, E] (with their graph), when the call keeps them (the auxiliary
    load-balancing loss); None: not kept."""

    def own(self) -> Tensor:
        """[N, L, k] the routers' own choices, each token's k experts in descending probability."""
        return torch.stack(self.chosen, dim=1)

    def used(self) -> Tensor:
        """[N, L, k] the experts the call ran: the replayed ones, or the routers' own."""
        return self.replay if self.replay is not None else self.own()


class RoutingControl:
    """The routers of one MoE model, in decoder-layer order, each routed through `_route` (a bound method, so a deep
    copy of the model, such as a reference policy's, routes through its own copy of the control)."""

    def __init__(self, routers: list[torch.nn.Module]) -> None:
        self.routers = routers
        self.top_k = routers[0].top_k
        self.num_experts = routers[0].num_experts
        self._record: CallRecord | None = None
        for layer, router in enumerate(routers):
            router._vlgrpo_routing, router._vlgrpo_layer = self, layer
            router.forward = types.MethodType(_route, router)  # an instance attribute: the class is untouched

    @property
    def layers(self) -> int:
        return len(self.routers)

    @contextmanager
    def call(self, replay: Tensor | None = None, keep_probs: bool = False) -> Iterator[CallRecord]:
        """Around one model call: its routers use `replay` [N, L, k] (None: their own top-k); the record holds the
        routers' own choices once the call has run (and their probabilities with `keep_probs`)."""
        if replay is not None and tuple(replay.shape[1:]) != (self.layers, self.top_k):
            raise ValueError(
                f"routing replay of shape {tuple(replay.shape)}: this model routes through {self.layers} MoE layers "
                f"with top-{self.top_k}, so [tokens, {self.layers}, {self.top_k}] is wanted"
            )
        outer, self._record = self._record, CallRecord(replay, probs=[] if keep_probs else None)
        try:
            yield self._record
        finally:
            self._record = outer


def _route(router, hidden: Tensor):
    """A TopKRouter's forward -> (logits [N, E], weights [N, k], experts [N, k]) as transformers computes them, the
    experts replaced by the call's replay when it has one (weights: the probabilities there, renormalised)."""
    record = router._vlgrpo_routing._record
    if record is None:
        return type(router).forward(router, hidden)
    layer = router._vlgrpo_layer
    h = hidden.reshape(-1, router.hidden_dim)
    logits = F.linear(h, router.weight)  # [N, E]
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    top, experts = torch.topk(probs, router.top_k, dim=-1)
    record.chosen.append(experts)
    if record.probs is not None:
        record.probs.append(probs)
    if record.replay is not None:
        experts = record.replay[:, layer].to(device=h.device, dtype=torch.long)
        if experts.shape[0] != h.shape[0]:
            raise ValueError(f"routing replay for {experts.shape[0]} tokens, but MoE layer {layer} routes {h.shape[0]}")
        top = probs.gather(1, experts)
    top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), experts


def moe_routers(model) -> list[torch.nn.Module]:
    """The routers of a model's MoE decoder layers, in layer order (empty for a dense model)."""
    try:
        layers = model.get_decoder().layers
    except (AttributeError, TypeError):
        return []
    return [layer.mlp.gate for layer in layers if is_moe_block(layer.mlp)]


def control_of(model) -> RoutingControl | None:
    """The model's routing control, installed on first use; None for a dense model."""
    routers = moe_routers(model)
    if not routers:
        return None
    control = getattr(routers[0], "_vlgrpo_routing", None)
    return control if control is not None else RoutingControl(routers)


def compact(experts: Tensor, num_experts: int) -> Tensor:
    """Expert indices as stored with a rollout: one byte each (two past 256 experts), on the CPU."""
    return experts.to(device="cpu", dtype=EXPERT_DTYPE if num_experts <= 256 else torch.int16)


def mismatch(a: Tensor, b: Tensor, valid: Tensor | None = None) -> tuple[float, float]:
    """(decisions whose expert SET differs, decisions compared) between two routings [..., L, k]: a decision is one
    token at one MoE layer; `valid` [...] marks the tokens compared (None: all)."""
    differ = (a.sort(dim=-1).values.long() != b.sort(dim=-1).values.long()).any(dim=-1)  # [..., L]
    if valid is not None:
        differ = differ[valid.bool()]
    return float(differ.sum()), float(differ.numel())


def load_balance(experts: Tensor, num_experts: int) -> tuple[float, float]:
    """Expert load of the routed tokens [N, L, k]: per MoE layer, the busiest expert's tokens over the mean per
    expert -> (mean over layers, worst layer). 1.0 is a perfect balance, num_experts / k the worst possible."""
    if experts.shape[0] == 0:
        return 1.0, 1.0
    flat = experts.long().transpose(0, 1).reshape(experts.shape[1], -1).cpu()  # [L, N * k]
    counts = torch.zeros(experts.shape[1], num_experts).scatter_add_(1, flat, torch.ones(flat.shape))
    ratio = counts.max(dim=1).values / counts.mean(dim=1)
    return float(ratio.mean()), float(ratio.max())


@dataclass
class BatchRouting:
    """A training batch's rollout routing, aligned with its `CompletionBatch` tensors, and what its passes saw."""

    prompt: Tensor | None
    """[B, Tp, L, k] the experts each prompt token went to in the rollout's prefill (left padding: experts 0..k-1);
    None when the engine recorded none (vLLM): the passes then keep only what the auxiliary loss needs."""
    completion: Tensor | None
    """[R, C, L, k] each completion token's, as the decode step fed it (right padding, and a row's last token, which
    is never fed: experts 0..k-1)."""
    replay: bool
    """Force these experts in the trainer's passes (`train.routing_replay=rollout`); False: only compare."""
    aux_coef: float = 0.0
    """The weight of the routers' load-balancing loss in the update (`train.router_aux_loss_coef`); 0: off."""
    observed: list = field(default_factory=list)
    """(own [n, L, k], recorded [n, L, k], used [n, L, k]) of the real tokens of each pass over this batch."""
    aux_terms: list = field(default_factory=list)
    """(probs [n, L, E] with their graph, used [n, L, k]) of the real tokens of each call since the last
    `aux_loss`, when aux_coef > 0."""

    def select(self, used: Tensor, rows: Tensor) -> BatchRouting:
        """The routing of `CompletionBatch.select`'s micro-batch (its prompts `used`, its `rows`); what its passes
        observe goes to the whole batch's lists."""
        pick = lambda t, i: None if t is None else t[i]  # noqa: E731
        return BatchRouting(
            pick(self.prompt, used),
            pick(self.completion, rows),
            self.replay,
            self.aux_coef,
            self.observed,
            self.aux_terms,
        )

    def aux_loss(self) -> Tensor | None:
        """The routers' load-balancing loss over the calls since the last one (then forgotten), as transformers'
        `load_balancing_loss_func` (Switch Transformer) per MoE layer: E x sum_e (tokens routed to e / tokens) x
        (mean router probability of e), k at a perfect balance; averaged over layers. None when no call kept any."""
        if not self.aux_terms:
            return None
        probs = torch.cat([t[0] for t in self.aux_terms])  # [N, L, E]
        used = torch.cat([t[1] for t in self.aux_terms]).long()  # [N, L, k]
        self.aux_terms.clear()
        n, layers, e = probs.shape
        flat = used.transpose(0, 1).reshape(layers, -1)  # [L, N * k]
        routed = torch.zeros(layers, e, device=probs.device).scatter_add_(
            1, flat, torch.ones(flat.shape, device=flat.device)
        )
        return (e * (routed / n * probs.mean(0)).sum(-1)).mean()


def collate_routing(
    groups, prompt_width: int, completion_width: int, replay: bool, aux_coef: float = 0.0
) -> BatchRouting | None:
    """The rollout routing of B groups, left-padded prompts of `prompt_width` and right-padded completions of
    `completion_width` as `collate_groups` lays them out. Without a record (a dense model, vLLM): None, or with the
    auxiliary loss on, a routing without recorded experts (its passes keep what the loss needs)."""
    prompts = [g.prompt_routing for g in groups]
    rows = [c.routing for g in groups for c in g.completions]
    if any(x is None for x in prompts) or any(x is None for x in rows):
        return BatchRouting(None, None, False, aux_coef) if aux_coef > 0 else None
    layers, k = prompts[0].shape[1:]
    fill = torch.arange(k, dtype=torch.long)  # a valid, distinct choice where no token routes
    prompt = fill.expand(len(prompts), prompt_width, layers, k).clone()
    for b, x in enumerate(prompts):
        prompt[b, prompt_width - x.shape[0] :] = x.long()
    completion = fill.expand(len(rows), completion_width, layers, k).clone()
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    for r, (x, n) in enumerate(zip(rows, lengths)):
        if x.shape[0] != max(n - 1, 0):  # every sampled token but the last was fed back, and routed
            raise ValueError(f"completion {r} has {n} tokens but a routing record of {x.shape[0]} (want {n - 1})")
        completion[r, : x.shape[0]] = x.long()
    return BatchRouting(prompt, completion, replay, aux_coef)


@contextmanager
def routed(model, routing: BatchRouting | None, recorded: Tensor | None, valid: Tensor | None = None):
    """Around one model call of a trainer pass over N tokens whose rollout routing is `recorded` [N, L, k] (the
    call's token order; None: not recorded): the experts are replayed when `routing.replay`; for the real tokens
    (`valid` [N] bool, None: all) the routers' own choices and what was used are observed, and with the auxiliary
    loss on their probabilities kept. Nothing for a dense model or no routing."""
    control = control_of(model) if routing is not None else None
    if control is None:
        yield
        return
    replay = recorded if routing.replay and recorded is not None else None
    with control.call(replay, keep_probs=routing.aux_coef > 0) as record:
        yield
    if not record.chosen:  # the call routed no token (a micro-batch of one-token completions)
        return
    used = record.used().to(record.chosen[0].device)
    keep = torch.ones(used.shape[0], dtype=torch.bool) if valid is None else valid.reshape(-1).bool().cpu()
    if recorded is not None:
        routing.observed.append((record.own().cpu()[keep], recorded.cpu()[keep], used.cpu()[keep]))
    if record.probs is not None:
        device_keep = keep.to(used.device)
        routing.aux_terms.append((torch.stack(record.probs, dim=1)[device_keep], used[device_keep]))


def routing_metrics(routing: BatchRouting | None, num_experts: int) -> tuple[dict, dict]:
    """`moe/*` metrics of a batch's passes -> (means: name -> (value, items), maxima: name -> value):
    `moe/routing_mismatch`, the share of routing decisions (a token at a MoE layer) whose experts the trainer's
    routers chose differently from the rollout's (with replay: would have chosen); the expert load of the tokens the
    passes ran, busiest expert over the mean per expert: `moe/load_max_over_mean` (mean over layers) and
    `moe/load_max_over_mean_worst` (the worst layer's)."""
    if routing is None or not routing.observed:
        return {}, {}
    own, recorded, used = (torch.cat([o[i] for o in routing.observed]) for i in range(3))
    differ, decisions = mismatch(own, recorded)
    mean, worst = load_balance(used, num_experts)
    means = {"moe/routing_mismatch": (differ / max(decisions, 1.0), decisions), "moe/load_max_over_mean": (mean, 1.0)}
    return means, {"moe/load_max_over_mean_worst": worst}
