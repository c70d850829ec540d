"""The packed pass's grouped attention (`policy.prefix_attention`) against PyTorch's SDPA over each row's [prompt | own]
keys: the same output and gradients for the queries, the prompts' keys and values and the rows' own ones."""

import pytest
import torch
import torch.nn.functional as F

from vlgrpo.policy.prefix_attention import HELD_BYTES, fits, shared_prefix_attention


def _reference(q, prompt_k, prompt_v, k, v, prompt_mask, scale):
    """SDPA per row: its prompt's keys and values, then its own (causal), the prompt's padding masked."""
    b, r, length = prompt_k.shape[0], q.shape[0], q.shape[1]
    row_prompt = torch.arange(b).repeat_interleave(r // b)
    keys = torch.cat((prompt_k[row_prompt], k.transpose(1, 2)), dim=2)
    values = torch.cat((prompt_v[row_prompt], v.transpose(1, 2)), dim=2)
    reps = q.shape[2] // k.shape[2]
    keys, values = keys.repeat_interleave(reps, dim=1), values.repeat_interleave(reps, dim=1)
    own = torch.ones(length, length, dtype=torch.bool).tril().expand(r, 1, length, length)
    allowed = torch.cat((prompt_mask[row_prompt][:, None, None, :].expand(r, 1, length, -1), own), dim=-1)
    return F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=allowed, scale=scale).transpose(
        1, 2
    )


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2), (4, 1)])
def test_grouped_attention_equals_sdpa_forward_and_back(heads, kv_heads):
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    b, rows, length, t, d = 3, 6, 5, 9, 8
    prompt_mask = torch.ones(b, t, dtype=torch.bool)
    prompt_mask[1, :3] = False  # a left-padded prompt
    bias = torch.zeros(b, t).masked_fill(~prompt_mask, float("-inf"))
    tensors = [
        torch.randn(rows, length, heads, d, generator=g),
        torch.randn(b, kv_heads, t, d, generator=g),
        torch.randn(b, kv_heads, t, d, generator=g),
        torch.randn(rows, length, kv_heads, d, generator=g),
        torch.randn(rows, length, kv_heads, d, generator=g),
    ]
    weight = torch.randn(rows, length, heads, d, generator=g)
    results = []
    for way in ("grouped", "sdpa"):
        xs = [x.clone().requires_grad_() for x in tensors]
        if way == "grouped":
            out = shared_prefix_attention(xs[0], xs[1], xs[2], xs[3], xs[4], bias, 0.3)
        else:
            out = _reference(*xs, prompt_mask, 0.3)
        (out * weight).sum().backward()
        results.append((out.detach(), [x.grad for x in xs]))
    (out, grads), (ref, ref_grads) = results
    assert out.shape == ref.shape and (out - ref).abs().max() <= 1e-5
    for name, a, e in zip(("q", "prompt k", "prompt v", "k", "v"), grads, ref_grads):
        assert (a - e).abs().max() <= 1e-5 * max(1.0, float(e.abs().max())), name
    assert grads[1][1, :, :3].abs().max() == 0  # no gradient reaches the padding


def test_fits_takes_fp32_cpu_groups_within_the_held_bound():
    q, keys = torch.zeros(16, 31, 4, 48), torch.zeros(2, 2, 355, 48)
    assert fits(q, keys, 8)
    assert not fits(q, keys, 0)  # rows not in equal groups
    assert not fits(q.bfloat16(), keys, 8)
    long = torch.zeros(16, 1024, 28, 1)  # a long CPU pass: its softmax would hold GBs
    assert 16 * 1024 * 28 * (2048 + 1024) * 4 > HELD_BYTES and not fits(long, torch.zeros(2, 4, 2048, 1), 8)
