"""The gated delta rule token by token in float64: a reference against which a Gated DeltaNet pass's gradients can be
compared exactly. transformers' chunked rule runs in float32 and takes exp of differences of cumulative decays: on a
whole row (prompt + completion in one chunk) its gradients of A_log and dt_bias land ~0.4 % from the exact ones on
the tiny Qwen3.5 (decays up to -20 per token), vlgrpo's prefill-then-continuation pass ~0.02 %
(dev/qwen3_5_decay_gradients.py, dev/LOG.md); with this rule both agree to 3e-8."""

import torch


def exact_gated_delta_rule(
    query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, **_
):
    """transformers' `torch_recurrent_gated_delta_rule` contract ([B, T, H, d] in and out), computed in float64."""
    q, k, v, b, d = (x.transpose(1, 2).double() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q / q.shape[-1] ** 0.5
    batch, heads, length, dk = k.shape
    state = (
        torch.zeros(batch, heads, dk, v.shape[-1], dtype=torch.float64)
        if initial_state is None
        else initial_state.double()
    )
    out = []
    for t in range(length):
        state = state * d[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - (state * k[:, :, t, :, None]).sum(-2)) * b[:, :, t, None]
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out.append((state * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, 2).transpose(1, 2).to(query.dtype), (state if output_final_state else None)


def use_exact_rule(monkeypatch) -> None:
    """Both of transformers' rules (the whole-row forward's and vlgrpo's passes', looked up at each call) -> exact."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    monkeypatch.setattr(modeling_qwen3_5, "torch_chunk_gated_delta_rule", exact_gated_delta_rule)
    monkeypatch.setattr(modeling_qwen3_5, "torch_recurrent_gated_delta_rule", exact_gated_delta_rule)
