"""The prompt pass's causal attention in blocks of queries (`policy.causal_blocks`) against transformers' own sdpa
attention function: the same outputs and gradients to fp32 rounding, and everything it must not take handed over."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from vlgrpo.policy import causal_blocks as cb


class _Attn(torch.nn.Module):
    def __init__(self, heads: int, kv_heads: int, causal: bool = True):
        super().__init__()
        self.num_key_value_groups, self.is_causal = heads // kv_heads, causal


def _inputs(b, heads, kv_heads, q_len, k_len, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, q_len, d, generator=g).requires_grad_()
    k = torch.randn(b, kv_heads, k_len, d, generator=g).requires_grad_()
    v = torch.randn(b, kv_heads, k_len, d, generator=g).requires_grad_()
    return q, k, v


def _causal_padded(b: int, q_len: int, k_len: int, pads: list[int]) -> torch.Tensor:
    """[b, 1, q, k] bool: query i at position k - q + i sees the real keys up to it (row r's first pads[r] keys are
    left padding; a padding query sees itself, as transformers keeps such rows finite)."""
    pos = torch.arange(k_len - q_len, k_len)[:, None]
    keys = torch.arange(k_len)[None, :]
    mask = (keys <= pos)[None, None].repeat(b, 1, 1, 1)
    for r, p in enumerate(pads):
        mask[r, :, :, :p] = False
        mask[r, :, (pos[:, 0] < p), :] = (keys == pos)[(pos[:, 0] < p)]
    return mask


def _both(attn, q, k, v, mask, **kw):
    """(blocked output, reference output, their gradients) on the same inputs and the same output gradient."""
    outs = []
    for fn in (cb.blocked_sdpa, sdpa_attention_forward):
        for t in (q, k, v):
            t.grad = None
        with cb.causal_blocks():
            out, _ = fn(attn, q, k, v, mask, scaling=0.25, **kw)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        outs.append((out.detach(), [t.grad.clone() for t in (q, k, v)]))
    return outs


@pytest.mark.parametrize(
    "case",
    ["padded, grouped heads", "no mask", "continuing a cache", "float mask"],
)
def test_blocks_give_transformers_attention_and_gradients(case):
    heads, kv_heads, q_len, k_len = 4, 2, 355, 355
    if case == "continuing a cache":
        q_len, k_len = 250, 400
    q, k, v = _inputs(2, heads, kv_heads, q_len, k_len)
    mask = None if case == "no mask" else _causal_padded(2, q_len, k_len, [0, 7])
    if case == "float mask":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert q_len >= cb.MIN_ROWS  # the blocks run: ceil(q / BLOCK) of them
    (out, grads), (ref, ref_grads) = _both(_Attn(heads, kv_heads), q, k, v, mask)
    assert out.shape == ref.shape == (2, q_len, heads, 16)
    assert (out - ref).abs().max() <= 1e-6
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() <= 1e-5 * float(want.abs().max())


def test_what_the_blocks_must_not_take_goes_to_transformers_unchanged(monkeypatch):
    """A mask letting a query see a later key (blocks would drop it), a non-causal module (the vision tower), too few
    queries (a decode step) run transformers' own function, bit for bit."""
    calls = []
    real = sdpa_attention_forward
    q, k, v = _inputs(1, 2, 2, 300, 300)
    later = _causal_padded(1, 300, 300, [0])
    later[0, 0, 10, 200] = True  # query 10 sees key 200
    short = _inputs(1, 2, 2, cb.MIN_ROWS - 1, cb.MIN_ROWS - 1)
    cases = [(_Attn(2, 2), q, k, v, later), (_Attn(2, 2, causal=False), q, k, v, None), (_Attn(2, 2), *short, None)]
    with cb.causal_blocks():
        monkeypatch.setattr(cb, "_original", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        for attn, qq, kk, vv, mask in cases:
            with torch.no_grad():
                out, _ = cb.blocked_sdpa(attn, qq, kk, vv, mask, scaling=0.5)
                ref, _ = real(attn, qq, kk, vv, mask, scaling=0.5)
            assert torch.equal(out, ref)
    assert len(calls) == len(cases)


def test_the_context_swaps_transformers_sdpa_and_puts_it_back():
    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert before is not cb.blocked_sdpa
    with cb.causal_blocks():
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is cb.blocked_sdpa
        with cb.causal_blocks():  # nested (a prefill inside a pass that entered it)
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is cb.blocked_sdpa
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is cb.blocked_sdpa
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    with pytest.raises(RuntimeError), cb.causal_blocks():
        raise RuntimeError("a failed pass")
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
