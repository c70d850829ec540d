"""The policy's text decoder layer by layer, outside the transformers forward: which models it runs, the rotary
embedding of text tokens and the attention's projections. Shared by the HF engine's shared-prefix decode step
(`rollout/decode.py`) and the trainer's packed completion pass (`packed.py`).

Text tokens' three M-RoPE position components are equal, which makes M-RoPE the plain rotary embedding at that position
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL's and Qwen3.5's interleaved sections alike). Qwen3's RMSNorm on each head's queries and
keys runs before the rotation, as in its attention. Qwen3.5's full-attention layers rotate the first quarter of each
head only (`partial_rotary_factor`) and gate their output (`q_proj` emits each head's query and gate side by side:
output * sigmoid(gate)); its Gated DeltaNet layers are `linear_attention.py`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vlgrpo.families import is_gated_deltanet


def text_rotary(rot, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and the signed sin (`signed_sin`) [n, 1, r] of text tokens at `positions` [n] (their three M-RoPE
    components equal: plain rotary), what `rotate` takes; r is the rotated part of a head (the whole head, or Qwen3.5's
    first quarter)."""
    freqs = positions[:, None].float() * rot.inv_freq.to(device=positions.device, dtype=torch.float)  # [n, r/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (
        (emb.cos() * rot.attention_scaling).to(dtype)[:, None, :],
        signed_sin((emb.sin() * rot.attention_scaling).to(dtype)[:, None, :]),
    )


def text_rotary_width(rot) -> int:
    """r: the dims of a head that `text_rotary`'s cos and sin turn (the whole head, or Qwen3.5's first quarter)."""
    return 2 * rot.inv_freq.shape[-1]


def signed_sin(sin: Tensor) -> Tensor:
    """transformers' sin [..., r] with its first half negated: rotate_half(x) * sin = cat(-x2, x1) * cat(s1, s2) =
    cat(x2, x1) * cat(-s1, s2) = x.roll(r / 2) * signed_sin(sin), the same products bit for bit, in one op (a roll)
    per tensor rotated instead of three (split, negate, concatenate)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of queries or keys x [..., d] (cos and the signed sin from `text_rotary` / `signed_sin`); with
    cos/sin narrower than d (partial rotary) only the first cos.shape[-1] dims turn, the rest pass unchanged."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + x.roll(r // 2, -1) * sin
    turned, rest = x[..., :r], x[..., r:]
    return torch.cat((turned * cos + turned.roll(r // 2, -1) * sin, rest), dim=-1)


def attention_layers(text) -> list[int]:
    """Indices of the decoder layers with (full) attention; the others are linear attention (Qwen3.5)."""
    return [i for i, layer in enumerate(text.layers) if not is_gated_deltanet(layer)]


def first_attention(text):
    """The first full-attention module: its head size and scaling are every attention layer's."""
    return text.layers[attention_layers(text)[0]].self_attn


def is_hybrid(model) -> bool:
    """A text decoder with linear-attention layers beside attention (Qwen3.5): its per-sequence state lives in the
    cache's conv and recurrent states, which transformers' cache cannot repeat or select per row."""
    try:
        return any(is_gated_deltanet(layer) for layer in model.get_decoder().layers)
    except (AttributeError, TypeError):
        return False


def supports_text_decoder(model) -> bool:
    """A Qwen2-, Qwen3- or Qwen3.5-style text decoder (rotary, grouped-query attention, q/k norms or none, gated or
    not, Gated DeltaNet layers or none, no sliding window) that the shared-prefix decode step and the packed
    completion pass (`packed.py`) can run."""
    try:
        text = model.get_decoder()
        attn = first_attention(text)
        return (
            hasattr(text.rotary_emb, "inv_freq")
            and hasattr(attn, "q_proj")
            and hasattr(attn, "head_dim")
            and hasattr(attn, "q_norm") == hasattr(attn, "k_norm")
            and not getattr(text.config, "use_sliding_window", False)
        )
    except (AttributeError, IndexError, TypeError):
        return False


@dataclass
class Fused:
    """Sibling projections of one input (q/k/v, or an MLP's gate/up), or one projection alone, as one matrix product:
    their weights stacked and stored transposed, [in, sum of `sizes`] contiguous (on this CPU a product of a decode
    step's few rows against weights read cold from memory runs ~10 % faster in that layout than F.linear's:
    dev/fast_path/README.md), `sizes` the outputs of each in order."""

    weight_t: Tensor
    bias: Tensor | None
    sizes: list[int]

    def product(self, h: Tensor) -> Tensor:
        """h [..., in] -> [..., sum of sizes]: every projection's output side by side."""
        if self.bias is None:
            return h @ self.weight_t
        if h.dim() == 2:
            return torch.addmm(self.bias, h, self.weight_t)
        return (h @ self.weight_t).add_(self.bias)

    def __call__(self, h: Tensor) -> tuple[Tensor, ...]:
        return self.product(h).split(self.sizes, dim=-1)

    def add_to(self, x: Tensor, h: Tensor) -> Tensor:
        """x + the projection of h [n, in] (one projection alone): the sum inside the product, one op for two."""
        out = torch.addmm(x, h, self.weight_t)
        return out if self.bias is None else out.add_(self.bias)


@dataclass
class FusedMLP:
    """A dense gated MLP as the decode runs it: gate and up as one product, down as another (`fuse`)."""

    gate_up: Fused
    down: Fused
    act: Callable[[Tensor], Tensor]

    def hidden(self, h: Tensor) -> Tensor:
        gate, up = self.gate_up(h)
        return self.act(gate) * up

    def __call__(self, h: Tensor) -> Tensor:
        return self.down.product(self.hidden(h))

    def add_to(self, x: Tensor, h: Tensor) -> Tensor:
        """x + the MLP of h: the residual summed inside the down projection's product."""
        return self.down.add_to(x, self.hidden(h))


def linear_weights(module) -> tuple[Tensor, Tensor | None] | None:
    """(weight, bias) when `module` computes F.linear(x, weight, bias): a torch Linear, or a layer whose forward is
    `functools.partial(F.linear, weight=..., bias=...)` (the LoRA backend's merged decode); None for any other (peft's
    adapter path, a quantized layer), which must be called."""
    forward = module.__dict__.get("forward")
    if forward is None and type(module) is torch.nn.Linear:
        return module.weight, module.bias
    if isinstance(forward, functools.partial) and forward.func is F.linear and not forward.args:
        return forward.keywords["weight"], forward.keywords.get("bias")
    return None


def fuse(modules: list) -> Fused | None:
    """The modules as one `Fused` product, or None where one of them is not a plain linear map or the weights are not
    on the CPU. Stacking copies the weights (once per decode): on the CPU, where a decode step's [rows x width]
    products are bound by their dispatch and by reading each weight, one product instead of three (q/k/v) or two
    (gate/up) pays that many times over, and the transposed layout pays for a single projection too (`Fused`); on a
    GPU the copy would be memory the planner does not count."""
    parts = [linear_weights(m) for m in modules]
    if any(p is None for p in parts) or any(p[0].device.type != "cpu" for p in parts):
        return None
    with torch.no_grad():
        weight_t = torch.cat([w.t() for w, _ in parts], dim=1)  # one copy, [in, out] contiguous
        bias = None
        if any(b is not None for _, b in parts):
            bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in parts])
    return Fused(weight_t, bias, [w.shape[0] for w, _ in parts])


def fuse_attention(attn) -> Fused | None:
    """An attention's q, k and v projections as one product (`fuse`)."""
    return fuse([attn.q_proj, attn.k_proj, attn.v_proj])


def fuse_mlp(mlp) -> FusedMLP | None:
    """A dense gated MLP's gate and up projections as one product and its down projection as another (`fuse`); None
    for a mixture-of-experts block, an MLP of another form or one whose projections must be called."""
    if is_moe_block(mlp) or not all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return None
    gate_up, down = fuse([mlp.gate_proj, mlp.up_proj]), fuse([mlp.down_proj])
    return None if gate_up is None or down is None else FusedMLP(gate_up, down, mlp.act_fn)


def fast_norm(module) -> Callable[[Tensor], Tensor]:
    """`module` (an RMSNorm) as PyTorch's own `rms_norm` over its weight and epsilon where that computes the same
    numbers bit for bit, checked once on a probe in the weight's dtype (transformers' Qwen2/Qwen3 norms in fp32: one
    call where the module's forward runs eight ops, the most frequent call of a decode step); else the module itself
    (Qwen3.5's norms scale by 1 + weight)."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return module
    probe = torch.randn(4, weight.shape[0], generator=torch.Generator().manual_seed(0)).to(weight)
    norm = functools.partial(F.rms_norm, normalized_shape=tuple(weight.shape), weight=weight, eps=eps)
    with torch.no_grad():
        return norm if torch.equal(module(probe), norm(probe)) else module


def project_qkv(
    attn,
    h: Tensor,
    heads: int,
    kv_heads: int,
    d: int,
    fused: Fused | None = None,
    qk_norms: tuple[Callable, Callable] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Queries [n, heads, d], keys and values [n, kv heads, d] of hidden states h [n, H], before the rotation, and
    the output gate [n, heads * d] of a gated attention (Qwen3.5), else None; a Qwen3 attention normalises each query
    and key head (`q_norm`, `k_norm`: RMSNorm over d; `qk_norms`: those two as `fast_norm` gives them). `fused`: the
    three projections as one product (`fuse_attention`)."""
    if fused is not None:
        q, k, v = fused(h)
    else:
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    q_norm, k_norm = qk_norms or (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))
    q, gate = _queries(q, heads, d, q_norm)
    k, v = _keys_values(k, v, kv_heads, d, k_norm)
    return q, k, v, gate


def project_q(attn, h: Tensor, heads: int, d: int) -> tuple[Tensor, Tensor | None]:
    """`project_qkv`'s queries and gate alone."""
    return _queries(attn.q_proj(h), heads, d, getattr(attn, "q_norm", None))


def project_kv(attn, h: Tensor, kv_heads: int, d: int) -> tuple[Tensor, Tensor]:
    """`project_qkv`'s keys and values alone."""
    return _keys_values(attn.k_proj(h), attn.v_proj(h), kv_heads, d, getattr(attn, "k_norm", None))


def _queries(q: Tensor, heads: int, d: int, q_norm: Callable | None) -> tuple[Tensor, Tensor | None]:
    gate = None
    if q.shape[-1] == 2 * heads * d:  # Qwen3.5: each head's query, then its gate
        q, gate = q.view(-1, heads, 2 * d).chunk(2, dim=-1)
        gate = gate.reshape(-1, heads * d)
    q = q.reshape(-1, heads, d)
    return (q_norm(q) if q_norm is not None else q), gate


def _keys_values(k: Tensor, v: Tensor, kv_heads: int, d: int, k_norm: Callable | None) -> tuple[Tensor, Tensor]:
    k = k.view(-1, kv_heads, d)
    return (k_norm(k) if k_norm is not None else k), v.view(-1, kv_heads, d)


def feed_forward(layer, h: Tensor, fused: FusedMLP | None = None) -> Tensor:
    """A decoder layer's MLP on hidden states h [n, H] -> [n, H]: a dense MLP, or a mixture-of-experts block (its
    router's top-k experts per token; Qwen3.5-MoE adds a gated shared expert), which takes [batch, seq, H]. `fused`:
    the dense MLP as the decode's products (`fuse_mlp`)."""
    if is_moe_block(layer.mlp):
        return layer.mlp(h[None])[0]
    if fused is not None:
        return fused(h)
    return layer.mlp(h)


def is_moe_block(mlp) -> bool:
    """A mixture-of-experts feed-forward block (a router `gate` choosing among `experts`), not a dense MLP."""
    return hasattr(mlp, "experts") and hasattr(mlp, "gate")


def gated(out: Tensor, gate: Tensor | None) -> Tensor:
    """A gated attention's output (Qwen3.5: out * sigmoid(gate)), or the output unchanged."""
    return out if gate is None else out * torch.sigmoid(gate)
