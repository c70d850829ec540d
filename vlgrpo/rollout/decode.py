"""The decode step of the HF engine: G completions per prompt read their prompt's KV cache once per step.

After one prefill per prompt (`policy.prefill.prefill`), the transformers forward would copy each prompt's KV cache G
times (`batch_repeat_interleave`), grow every row's cache by concatenation at every step and, with grouped-query
attention and a padding mask, copy the keys and values once more per step to repeat them over the query heads. Here
the prompt's keys and values stay as the prefill left them, once per prompt: the G rows' queries (and the query heads
that share a KV head) are stacked into one matrix product against them, as cascade / shared-prefix attention kernels
do; each row's own tokens go to a preallocated cache written in place. One softmax spans both parts, so the result is
the attention of the whole sequence.

It calls the model's own modules (embedding, norms, projections, MLP, LM head), so LoRA wrappers and gathered ZeRO-3
weights work as in the transformers forward. Decode tokens are text: their three M-RoPE position components are equal,
which makes M-RoPE the plain rotary embedding at that position (Qwen2-VL, Qwen2.5-VL and Qwen3-VL's interleaved
sections alike), and DeepStack, which touches image tokens only, has nothing to add. Qwen3's RMSNorm on each head's
queries and keys runs before the rotation, as in its attention (these pieces: `policy.text_decoder`).
Qwen3.5's Gated DeltaNet layers have no keys to share: each row carries its own conv and recurrent state, the
prompt's repeated G ways after the one prefill, and steps it by the recurrent rule (`policy.linear_attention`).
`SharedPrefixDecoder.supports` names the models it applies to; the engine falls back to the transformers forward for
any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from vlgrpo.families import is_gated_deltanet
from vlgrpo.policy.linear_attention import delta_step, prompt_states, set_states
from vlgrpo.policy.text_decoder import (
    fast_norm,
    feed_forward,
    first_attention,
    fuse,
    fuse_attention,
    fuse_mlp,
    gated,
    project_qkv,
    rotate,
    supports_text_decoder,
    text_rotary,
    text_rotary_width,
)


@dataclass
class TurnKV:
    """One decoded row's state, kept for its next turn (a multi-turn rollout), per decoder layer: an attention layer's
    keys and values [kv heads, L, d] over its prompt's real tokens and the first `length` - prompt tokens it sampled
    (the ones fed back); a Gated DeltaNet layer's (Qwen3.5) conv state [conv dim, K] and recurrent state
    [v heads, k dim, v dim] after those same tokens."""

    layers: list[tuple[Tensor, Tensor]]
    length: int
    """Tokens of the row's sequence (prompt ids + sampled ids) the state covers."""


def turn_cache(model, kvs: list[TurnKV]) -> tuple[DynamicCache, Tensor | None]:
    """Rows' TurnKVs as one transformers cache of the model's layer types, which the transformers forward continues
    and `SharedPrefixDecoder` reads: an attention layer's keys and values left-padded to [B, kv heads, T, d], a
    Gated DeltaNet layer's states stacked [B, ...] (a state has no length to pad) -> (cache, mask [B, T]; None: no
    padding)."""
    width = max(kv.length for kv in kvs)
    first = next(pair[0] for lin, pair in zip(linear_layers(model), kvs[0].layers) if not lin)
    mask = torch.zeros(len(kvs), width, dtype=torch.long, device=first.device)
    for b, kv in enumerate(kvs):
        mask[b, width - kv.length :] = 1
    cache = DynamicCache(config=model.config)
    for li, lin in enumerate(linear_layers(model)):
        if lin:
            conv, state = (torch.stack([kv.layers[li][i] for kv in kvs]) for i in (0, 1))
            set_states(cache.layers[li], conv, state)
            continue
        k0 = kvs[0].layers[li][0]
        keys = k0.new_zeros(len(kvs), k0.shape[0], width, k0.shape[2])
        values = torch.zeros_like(keys)
        for b, kv in enumerate(kvs):
            keys[b, :, width - kv.length :], values[b, :, width - kv.length :] = kv.layers[li]
        cache.layers[li].update(keys, values)
    return cache, (mask if not bool(mask.all()) else None)


def cache_rows(model, cache, length: int) -> list[TurnKV]:
    """The rows of an unpadded transformers cache of `length` tokens (what `turn_cache` and a forward over it left),
    one TurnKV each."""
    lin = linear_layers(model)
    pairs = [prompt_states(cache, i) if lin[i] else (layer.keys, layer.values) for i, layer in enumerate(cache.layers)]
    return [TurnKV([(a[b], c[b]) for a, c in pairs], length) for b in range(pairs[0][0].shape[0])]


def linear_layers(model) -> list[bool]:
    """Per decoder layer: a Gated DeltaNet layer (True) or attention."""
    return [is_gated_deltanet(layer) for layer in model.get_decoder().layers]


class SharedPrefixDecoder:
    """KV state and one decode step for R = B*G rows, row r continuing prompt r // G."""

    @staticmethod
    def supports(model) -> bool:
        return supports_text_decoder(model)

    def __init__(self, model, cache, prompt_mask: Tensor | None, g: int, max_new: int) -> None:
        """cache: the prefill's cache of B prompts ([B, kv heads, T, d] per attention layer; conv and recurrent
        states per Gated DeltaNet layer), prompt_mask [B, T] (None when unpadded), g: rows per prompt, max_new: decode
        steps at most."""
        self.text, self.head = model.get_decoder(), model.get_output_embeddings()
        attn = first_attention(self.text)
        cfg = self.text.config
        self.heads, self.kv_heads, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
        self.rep, self.scale, self.g = self.heads // self.kv_heads, attn.scaling, g
        self.linear = [is_gated_deltanet(layer) for layer in self.text.layers]
        # attention layers: the prompt's keys and values, never copied; linear ones: each row's own conv and recurrent
        # state, the prompt's repeated G ways (a state is per sequence: the rows diverge from their first token)
        self.prompt_k = [None if lin else layer.keys for lin, layer in zip(self.linear, cache.layers)]
        self.prompt_v = [None if lin else layer.values for lin, layer in zip(self.linear, cache.layers)]
        self.states = [
            [s.repeat_interleave(g, dim=0) for s in prompt_states(cache, li)] if lin else None
            for li, lin in enumerate(self.linear)
        ]
        k0 = next(k for k in self.prompt_k if k is not None)
        b, _, t, _ = k0.shape
        self.b, self.rows = b, b * g
        self.bias = None  # [B, 1, 1, T] additive: -inf on left padding
        if prompt_mask is not None:
            self.bias = torch.zeros(b, 1, 1, t, dtype=k0.dtype, device=k0.device)
            self.bias.masked_fill_(prompt_mask[:, None, None, :] == 0, torch.finfo(k0.dtype).min)
        # the rows' own tokens, written in place, a prompt's G rows side by side per KV head: [B, kvh, G, max_new, d]
        shape = (b, self.kv_heads, g, max_new, self.d)
        self.own_k = [None if k is None else k0.new_empty(shape) for k in self.prompt_k]
        self.own_v = [None if k is None else k0.new_empty(shape) for k in self.prompt_k]
        self.length = 0
        # q/k/v, o, gate/up and down as products of the decode's own transposed copies where the layers are plain
        # linear maps on the CPU (`text_decoder.fuse`)
        layers = self.text.layers
        self.qkv = [None if lin else fuse_attention(layer.self_attn) for lin, layer in zip(self.linear, layers)]
        self.o = [None if lin else fuse([layer.self_attn.o_proj]) for lin, layer in zip(self.linear, layers)]
        self.mlp = [fuse_mlp(layer.mlp) for layer in layers]
        self.delta_in = [  # a Gated DeltaNet layer's four input projections as one product
            fuse([getattr(layer.linear_attn, f"in_proj_{x}") for x in ("qkv", "z", "b", "a")]) if lin else None
            for lin, layer in zip(self.linear, layers)
        ]
        # the norms as one call each where PyTorch's rms_norm is bit for bit theirs (`text_decoder.fast_norm`)
        self.norms = [(fast_norm(layer.input_layernorm), fast_norm(layer.post_attention_layernorm)) for layer in layers]
        self.qk_norms = [
            (fast_norm(layer.self_attn.q_norm), fast_norm(layer.self_attn.k_norm))
            if not lin and hasattr(layer.self_attn, "q_norm")
            else None
            for lin, layer in zip(self.linear, layers)
        ]
        self.final_norm = fast_norm(self.text.norm)
        # queries, keys and values rotated as one tensor where nothing stands between the product and the rotation (no
        # q/k norms, no output gate, whole heads turned): per head, cos and sin times the query scaling (queries), 1
        # (keys), or cos 1 and sin 0 (values: unchanged bit for bit); fp32, as the scaling's product with a scalar
        self.joint = text_rotary_width(self.text.rotary_emb) == self.d and all(
            lin or (qkv is not None and norms is None and qkv.sizes[0] == self.heads * self.d)
            for lin, qkv, norms in zip(self.linear, self.qkv, self.qk_norms)
        )
        turn = [self.scale] * self.heads + [1.0] * self.kv_heads + [0.0] * self.kv_heads
        self.turn = torch.tensor(turn, device=k0.device)[:, None]
        self.keep_v = (self.turn == 0).float()
        self._prompt_views()

    def _prompt_views(self) -> None:
        """The prompts' keys transposed once, [B * kvh, d, T] (the step's products read them in place), their values
        [B * kvh, T, d], and the padding bias per KV head [B * kvh, 1, T] (summed inside the scores' product)."""
        b, kvh, d = self.b, self.kv_heads, self.d
        self.prompt_kt = [None if k is None else k.transpose(-1, -2).reshape(b * kvh, d, -1) for k in self.prompt_k]
        self.prompt_v3 = [None if v is None else v.reshape(b * kvh, -1, d) for v in self.prompt_v]
        self.bias3 = None if self.bias is None else self.bias.expand(b, kvh, 1, -1).reshape(b * kvh, 1, -1)

    def row_kv(self, row: int, fed: int, prompt_tokens: int, states: list | None = None) -> TurnKV:
        """Row `row`'s (a current index) state: its prompt's real positions and its first `fed` tokens
        (`prompt_tokens`: the prompt's unpadded length). A Gated DeltaNet layer's states are the row's current ones,
        or `states` (from `row_states`, taken when the row had fed exactly `fed` tokens: a finished row's states go
        on stepping while its prompt's other rows sample)."""
        b = row // self.g
        real = None if self.bias is None else self.bias[b, 0, 0] == 0
        layers = []
        for li, (pk, pv, ok, ov) in enumerate(zip(self.prompt_k, self.prompt_v, self.own_k, self.own_v)):
            if self.linear[li]:
                layers.append(states[li] if states is not None else (self.states[li][0][row], self.states[li][1][row]))
                continue
            k, v = (pk[b], pv[b]) if real is None else (pk[b][:, real], pv[b][:, real])
            j = row % self.g
            layers.append((torch.cat([k, ok[b, :, j, :fed]], 1), torch.cat([v, ov[b, :, j, :fed]], 1)))
        return TurnKV(layers, prompt_tokens + fed)

    def row_states(self, row: int) -> list | None:
        """Row `row`'s Gated DeltaNet states now (copies; None per attention layer), or None for an attention-only
        model."""
        if not any(self.linear):
            return None
        return [(s[0][row].clone(), s[1][row].clone()) if s is not None else None for s in self.states]

    def keep(self, prompts: Tensor) -> Tensor:
        """Keep only the prompts `prompts` [b'] (ascending indices into the current ones) and their G rows each: the
        loop drops a prompt once all its rows have finished, so later steps compute only rows that can still sample.
        -> the kept rows' indices [b' * G] into the current rows."""
        rows = (prompts[:, None] * self.g + torch.arange(self.g, device=prompts.device)).flatten()
        pick = lambda xs, idx: [None if x is None else x[idx] for x in xs]  # noqa: E731
        self.prompt_k, self.prompt_v = pick(self.prompt_k, prompts), pick(self.prompt_v, prompts)
        self.own_k, self.own_v = pick(self.own_k, prompts), pick(self.own_v, prompts)
        self.states = [None if s is None else pick(s, rows) for s in self.states]
        self.bias = self.bias[prompts] if self.bias is not None else None
        self.b, self.rows = len(prompts), len(rows)
        self._prompt_views()
        return rows

    def step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens [R] long, positions [R] (their M-RoPE position) -> next-token logits [R, V]."""
        x = self.text.embed_tokens(tokens)  # [R, H]
        cos, sin = text_rotary(self.text.rotary_emb, positions, x.dtype)  # [R, 1, r]
        if self.joint:  # [R, heads + 2 kvh, d]: queries scaled, keys plain, values unchanged
            rotation = ((cos.float() * self.turn + self.keep_v).to(x.dtype), (sin.float() * self.turn).to(x.dtype))
        elif cos.shape[-1] == self.d:  # the queries' scaling folded into their rotation (8 products a step, not 16)
            rotation = (cos * self.scale, sin * self.scale)
        else:
            rotation = None
        for li, layer in enumerate(self.text.layers):
            before_attention, before_mlp = self.norms[li]
            h = before_attention(x)
            if self.linear[li]:  # Gated DeltaNet: one recurrent step of each row's own state
                o, conv, state = delta_step(layer.linear_attn, h, *self.states[li], self.delta_in[li])
                self.states[li] = [conv, state]
                x = x + o
            else:
                out = self._attention(li, layer.self_attn, h, cos, sin, rotation)
                x = self.o[li].add_to(x, out) if self.o[li] is not None else x + layer.self_attn.o_proj(out)
            mlp = self.mlp[li]
            x = mlp.add_to(x, before_mlp(x)) if mlp is not None else x + feed_forward(layer, before_mlp(x))
        self.length += 1
        return self.head(self.final_norm(x))

    def _attention(self, li: int, attn, h: Tensor, cos: Tensor, sin: Tensor, rotation) -> Tensor:
        """Attention layer `li` for the current token of every row, before its output projection: the prompt's keys
        read once for its G rows.

        Scores [B, kvh, G*rep, T + i + 1] in grouped layout (a prompt's G rows' queries, and the query heads that share
        a KV head, stacked): the prompt part is one product per prompt and KV head (its padding bias summed inside),
        the rows' own part one per row (its own keys sit at the same place in `own_k`'s layout), one softmax over both,
        and the output turns to rows once. `rotation`: the joint rotation of queries, keys and values (`joint`), or
        cos and sin with the queries' scaling folded in, or None (a partial rotation)."""
        i, b, g, kvh, rep, d, heads = self.length, self.b, self.g, self.kv_heads, self.rep, self.d, self.heads
        gate = None
        if self.joint:
            qkv = self.qkv[li].product(h).view(self.rows, heads + 2 * kvh, d)
            qkv = rotate(qkv, *rotation)
            q, k, v = qkv[:, :heads], qkv[:, heads : heads + kvh], qkv[:, heads + kvh :]
        else:
            q, k, v, gate = project_qkv(attn, h, heads, kvh, d, self.qkv[li], self.qk_norms[li])
            k = rotate(k, cos, sin)
            q = rotate(q, *rotation) if rotation is not None else rotate(q, cos, sin) * self.scale
        own_k, own_v = self.own_k[li], self.own_v[li]
        own_k[:, :, :, i] = k.view(b, g, kvh, d).transpose(1, 2)
        own_v[:, :, :, i] = v.view(b, g, kvh, d).transpose(1, 2)
        q = q.view(b, g, kvh, rep, d).transpose(1, 2).contiguous()  # [B, kvh, G, rep, d]: head j reads KV head j // rep
        q3, kt = q.view(b * kvh, g * rep, d), self.prompt_kt[li]
        prompt_s = torch.bmm(q3, kt) if self.bias3 is None else torch.baddbmm(self.bias3, q3, kt)  # [B*kvh, G*rep, T]
        own_s = q @ own_k[:, :, :, : i + 1].transpose(-1, -2)  # [B, kvh, G, rep, i+1]
        s = torch.cat((prompt_s.view(b, kvh, g * rep, -1), own_s.view(b, kvh, g * rep, i + 1)), dim=-1)
        p = torch.softmax(s, dim=-1) if s.dtype == torch.float32 else torch.softmax(s.float(), dim=-1).to(q.dtype)
        t = kt.shape[-1]
        out = (p[..., t:].view(b, kvh, g, rep, i + 1) @ own_v[:, :, :, : i + 1]).view(b * kvh, g * rep, d)
        out = out.baddbmm_(p[..., :t].reshape(b * kvh, g * rep, t), self.prompt_v3[li])
        out = out.view(b, kvh, g, rep, d).permute(0, 2, 1, 3, 4).reshape(self.rows, heads * d)
        return gated(out, gate)
