"""Qwen3.5's Gated DeltaNet outside the transformers forward: rows that continue their own prompt's states equal the
layer's own forward over each whole sequence, and no state crosses from one packed row into the next."""

import torch
from transformers import DynamicCache

from vlgrpo.policy.linear_attention import delta_step, gated_delta, prompt_states, select_cache_rows
from vlgrpo.policy.text_decoder import fuse


def _layer(load):
    model, _ = load("qwen3_5", spread_by=0.1)
    text = model.get_decoder()
    return text.layers[0].linear_attn, text.config


def test_three_packed_rows_each_continue_their_own_prompt_state_and_nothing_leaks(load):
    attn, config = _layer(load)
    gen = torch.Generator().manual_seed(0)
    hidden = config.hidden_size
    prompts = [torch.randn(1, n, hidden, generator=gen) for n in (7, 3, 5)]  # 3 < the conv kernel + 1
    rows = [torch.randn(1, n, hidden, generator=gen) for n in (4, 1, 6)]  # continuations of 4, 1 and 6 tokens
    with torch.no_grad():
        # the reference: the layer's own forward over each whole sequence, one at a time
        ref = [attn(torch.cat((p, r), 1))[0, p.shape[1] :] for p, r in zip(prompts, rows)]
        # ours: each prompt's states from a transformers prefill, then the three rows packed side by side
        convs, states = [], []
        for p in prompts:
            cache = DynamicCache(config=config)
            attn(p, cache_params=cache)
            conv, state = prompt_states(cache, 0)
            convs.append(conv)
            states.append(state)
        length = max(r.shape[1] for r in rows)
        padded = torch.zeros(3, length, hidden)
        valid = torch.zeros(3, length, dtype=torch.bool)
        for i, r in enumerate(rows):
            padded[i, : r.shape[1]], valid[i, : r.shape[1]] = r[0], True
        out, _, _ = gated_delta(attn, padded, valid, torch.cat(convs), torch.cat(states))
        for i, r in enumerate(rows):
            assert (out[i, : r.shape[1]] - ref[i]).abs().max() <= 1e-5
        # the trap it avoids: the three rows packed into one sequence whose state flows from one row into the next
        flat = torch.cat([r[0] for r in rows])[None]
        leaked, _, _ = gated_delta(attn, flat, None, convs[0], states[0])
        starts = [0, 4, 5]
        for i, r in enumerate(rows[1:], start=1):
            got = leaked[0, starts[i] : starts[i] + r.shape[1]]
            assert (got - ref[i]).abs().max() > 1e-2  # a leak is visible at this tolerance


def test_a_decode_step_carries_the_state_as_the_layers_own_cache_does(load):
    """One token at a time through `delta_step` (the HF engine's decode step: the convolution as one weighted sum, the
    recurrent rule's one step, the four input projections fused or not) and through `gated_delta` with L = 1, against
    the layer's own cached decode, over 5 steps; and `select_cache_rows` repeats and selects a hybrid cache's rows."""
    attn, config = _layer(load)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randn(2, 6, config.hidden_size, generator=gen)
    steps = torch.randn(2, 5, config.hidden_size, generator=gen)
    fused = fuse([getattr(attn, f"in_proj_{x}") for x in ("qkv", "z", "b", "a")])
    assert fused is not None
    with torch.no_grad():
        cache = DynamicCache(config=config)
        attn(prompt, cache_params=cache)
        conv, state = (s[[1, 1, 0]] for s in prompt_states(cache, 0))  # copies: the cache updates in place
        select_cache_rows(cache, torch.tensor([1, 1, 0]))
        assert torch.equal(prompt_states(cache, 0)[1], state)
        ways = {"gated_delta": (conv, state), "step": (conv, state), "fused step": (conv, state)}
        for t in range(5):
            x = steps[[1, 1, 0], t : t + 1]
            ref = attn(x, cache_params=cache)
            ref_conv, ref_state = prompt_states(cache, 0)
            for way, (c, s) in ways.items():
                before = c
                if way == "gated_delta":
                    out, c, s = gated_delta(attn, x, None, c, s, final_state=True)
                else:
                    out, c, s = delta_step(attn, x[:, 0], c, s, fused if way == "fused step" else None)
                    out = out[:, None]
                ways[way] = (c, s)
                assert (out - ref).abs().max() <= 1e-6, way
                assert (s - ref_state).abs().max() <= 1e-6, way
                if way != "fused step":
                    assert torch.equal(c, ref_conv), way  # the window: copied, never summed
                    continue
                # the window shifts by copying and takes the fused product's newest input as it is; that product
                # (its own transposed weights) sums each dot product in another order than F.linear, so the input
                # lies within n * eps * sum |x_i w_i| of the layer's own (n = the hidden size: the classic bound)
                assert torch.equal(c[..., :-1], before[..., 1:])
                assert torch.equal(c[..., -1], fused.product(x[:, 0])[:, : c.shape[1]])
                weight = attn.in_proj_qkv.weight
                bound = weight.shape[1] * torch.finfo(torch.float32).eps * (x[:, 0].abs() @ weight.abs().t())
                assert ((c[..., -1] - ref_conv[..., -1]).abs() <= bound).all()


def test_in_bf16_the_decode_step_is_as_close_to_fp32_as_the_recurrent_rule(load):
    """A bf16 model's one-token step (`delta_step`, the decode's) against the fp32 layer's own cached decode: within
    twice what transformers' recurrent rule (`gated_delta` with L = 1) gives in bf16 on the same inputs, over 5 steps
    (the bound is bf16's own rounding, not a constant that holds on one CPU's kernels only)."""
    attn, config = _layer(load)
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randn(2, 6, config.hidden_size, generator=gen)
    steps = torch.randn(2, 5, config.hidden_size, generator=gen)
    with torch.no_grad():
        cache = DynamicCache(config=config)
        attn(prompt, cache_params=cache)
        conv, state = (s.clone() for s in prompt_states(cache, 0))
        refs = [attn(steps[:, t : t + 1], cache_params=cache)[:, 0] for t in range(5)]
        attn.to(torch.bfloat16)
        ways = {"rule": (conv.bfloat16(), state), "step": (conv.bfloat16(), state)}
        errors = {"rule": 0.0, "step": 0.0}
        for t in range(5):
            x = steps[:, t].bfloat16()
            for way, (c, s) in ways.items():
                if way == "rule":
                    out, c, s = gated_delta(attn, x[:, None], None, c, s, final_state=True)
                    out = out[:, 0]
                else:
                    out, c, s = delta_step(attn, x, c, s)
                ways[way] = (c, s)
                errors[way] = max(errors[way], float((out.float() - refs[t]).abs().max()))
        attn.float()
    assert errors["rule"] > 0
    assert errors["step"] <= 2 * errors["rule"] + 1e-3, errors
