"""Chunked log-probs/entropy: equal to the naive log_softmax-gather (values and gradients), temperature,
forbidden-token mask, and no fp32 [N, T, V] tensor ever allocated."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vlgrpo.grpo import token_logprobs

N, T, V = 3, 5, 50


def _naive(logits, ids, temperature=1.0, forbidden=None):
    x = logits.float() / temperature
    if forbidden is not None:
        x = x.masked_fill(forbidden, -torch.inf)
    logp_all = torch.log_softmax(x, dim=-1)
    finite = logp_all if forbidden is None else logp_all.masked_fill(forbidden, 0.0)  # p log p -> 0 where p = 0
    entropy = -(logp_all.exp() * finite).sum(-1)
    return logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1), entropy


def _data(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(N, T, V, generator=g) * 3).to(dtype)
    ids = torch.randint(0, V, (N, T), generator=g)
    return logits, ids, torch.randn(N, T, generator=g), torch.randn(N, T, generator=g)


def _grads(fn, logits, ids, g_lp, g_ent, **kw):
    x = logits.clone().requires_grad_(True)
    logp, ent = fn(x, ids, **kw)
    (logp * g_lp + ent * g_ent).sum().backward()
    return logp.detach(), ent.detach(), x.grad


@pytest.mark.parametrize("chunk_tokens", [1, 3, 5, 7, 11, 4096])  # splits inside rows, whole rows, all at once
def test_values_and_gradients_equal_naive(chunk_tokens):
    logits, ids, g_lp, g_ent = _data()
    lp, ent, grad = _grads(lambda x, i: token_logprobs(x, i, chunk_tokens=chunk_tokens), logits, ids, g_lp, g_ent)
    lp0, ent0, grad0 = _grads(_naive, logits, ids, g_lp, g_ent)
    torch.testing.assert_close(lp, lp0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, grad0, atol=1e-6, rtol=1e-6)


def test_temperature_and_forbidden_tokens_match_naive():
    logits, ids, g_lp, g_ent = _data(1)
    forbidden = torch.zeros(V, dtype=torch.bool)
    forbidden[[3, 17, 41]] = True
    ids = ids.masked_fill(forbidden[ids], 0)  # sampled ids never hit a forbidden token
    kw = dict(temperature=0.7, forbidden=forbidden)
    lp, ent, grad = _grads(lambda x, i, **k: token_logprobs(x, i, chunk_tokens=4, **k), logits, ids, g_lp, g_ent, **kw)
    lp0, ent0, grad0 = _grads(_naive, logits, ids, g_lp, g_ent, **kw)
    torch.testing.assert_close(lp, lp0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, grad0, atol=1e-6, rtol=1e-6)
    assert grad[..., forbidden].abs().max() == 0  # a -inf logit gets no gradient
    # temperature really changes the numbers (not silently ignored)
    assert (token_logprobs(logits, ids)[0] - lp).abs().max() > 1e-2


def test_hand_computed_two_token_vocabulary():
    # logits [0, ln 3] -> p = [1/4, 3/4]; at T = 2: [0, ln 3 / 2] -> p = [1/(1+sqrt3), sqrt3/(1+sqrt3)]
    logits = torch.tensor([[[0.0, 3.0]]]).log().nan_to_num(neginf=0.0)  # [[[0, ln 3]]]
    logp, ent = token_logprobs(logits, torch.tensor([[1]]))
    assert logp.item() == pytest.approx(torch.tensor(0.75).log().item(), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * torch.tensor(0.25).log() + 0.75 * torch.tensor(0.75).log()).item())
    logp_t, _ = token_logprobs(logits, torch.tensor([[1]]), temperature=2.0)
    s3 = 3**0.5
    assert logp_t.item() == pytest.approx(torch.tensor(s3 / (1 + s3)).log().item(), abs=1e-6)
    # forbidding token 1 leaves all mass on token 0: logp(0) = 0, entropy 0, logp(1) = -inf
    forbidden = torch.tensor([False, True])
    assert token_logprobs(logits, torch.tensor([[0]]), forbidden=forbidden)[0].item() == 0.0
    lp1, ent1 = token_logprobs(logits, torch.tensor([[1]]), forbidden=forbidden)
    assert lp1.item() == float("-inf") and ent1.item() == 0.0


def test_bf16_logits_and_non_contiguous_slice():
    logits, ids, g_lp, g_ent = _data(2, torch.bfloat16)
    full = torch.cat([logits, logits[:, :1]], dim=1)[:, :-1]  # like model_logits[:, :-1]: a strided view
    assert not full.is_contiguous()
    lp, ent, grad = _grads(lambda x, i: token_logprobs(x[:, :], i, chunk_tokens=4), full, ids, g_lp, g_ent)
    lp0, ent0, grad0 = _grads(_naive, logits, ids, g_lp, g_ent)
    assert lp.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp, lp0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad.float(), grad0.float(), atol=1e-2, rtol=1e-2)  # bf16 rounding of the grad


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 3), generator=g)
    forbidden = torch.zeros(7, dtype=torch.bool)
    forbidden[5] = True
    ids = ids.masked_fill(ids == 5, 0)
    assert torch.autograd.gradcheck(
        lambda x: token_logprobs(x, ids, temperature=1.3, forbidden=forbidden, chunk_tokens=2), (logits,)
    )


def test_no_grad_path_equals_grad_path():
    logits, ids, _, _ = _data(5)
    with torch.no_grad():
        a = token_logprobs(logits.requires_grad_(True), ids, chunk_tokens=4)
    b = token_logprobs(logits, ids, chunk_tokens=4)
    assert a[0].grad_fn is None and b[0].grad_fn is not None
    torch.testing.assert_close(a[0], b[0].detach(), atol=0, rtol=0)


def test_empty_completions():
    logits = torch.randn(2, 0, V, requires_grad=True)
    logp, ent = token_logprobs(logits, torch.zeros(2, 0, dtype=torch.long))
    assert logp.shape == ent.shape == (2, 0)
    (logp.sum() + ent.sum()).backward()
    assert logits.grad.shape == (2, 0, V)


class _LargestFp32(TorchDispatchMode):
    """Records the largest float32 tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_never_allocates_fp32_full_vocab_tensor():
    n, t, v, chunk = 4, 16, 1000, 8
    logits = torch.randn(n, t, v).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, v, (n, t))
    with _LargestFp32() as mode:
        logp, ent = token_logprobs(logits, ids, chunk_tokens=chunk)
        (logp.sum() + ent.sum()).backward()
    assert mode.largest == chunk * v  # one chunk, never n * t * v = 64k
    with _LargestFp32() as naive_mode:
        _naive(logits, ids)[0].sum().backward()
    assert naive_mode.largest == n * t * v  # the check itself can see a full-size tensor


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(chunk_tokens=0), "chunk_tokens must be >= 1"),
        (dict(forbidden=torch.zeros(V - 1, dtype=torch.bool)), r"bool mask over the vocabulary \[50\]"),
        (dict(forbidden=torch.zeros(V)), "bool mask"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    logits, ids, _, _ = _data()
    with pytest.raises(ValueError, match=match):
        token_logprobs(logits, ids, **kwargs)
    with pytest.raises(ValueError, match=r"logits \[N, T, V\] and ids \[N, T\]"):
        token_logprobs(logits[0], ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_qwen_vocab_memory_and_values():
    """On the GPU at Qwen's vocabulary: same numbers as the naive path, and the extra memory of forward + backward
    is the bf16 gradient plus a few fp32 chunks, far below one fp32 [N, T, V] tensor."""
    n, t, v, chunk = 4, 512, 151936, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(n, t, v, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    ids = torch.randint(0, v, (n, t), device="cuda", generator=g)
    forbidden = torch.zeros(v, dtype=torch.bool, device="cuda")
    forbidden[151652:151656] = True  # Qwen2.5-VL vision start/end/pad-style ids
    ids = ids.masked_fill(forbidden[ids], 0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logp, ent = token_logprobs(logits, ids, temperature=0.9, forbidden=forbidden, chunk_tokens=chunk)
    (logp.sum() + ent.sum()).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    full_fp32 = n * t * v * 4
    assert extra < logits.numel() * 2 + 6 * chunk * v * 4 < full_fp32
    lp0, ent0 = _naive(logits.detach()[:1], ids[:1], 0.9, forbidden)
    torch.testing.assert_close(logp[:1].detach(), lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[:1].detach(), ent0, atol=1e-4, rtol=1e-5)
