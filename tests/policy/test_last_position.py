"""A prefill's last decoder layer at the last position only (`policy.last_position`): the same last logits, cache and
gradients as the whole layer, with one position per prompt through its MLP."""

import pytest
import torch
from exact_delta_rule import use_exact_rule

from vlgrpo.policy import last_position
from vlgrpo.policy.prefill import prefill
from vlgrpo.policy.prompt import build_prompt, left_pad
from vlgrpo.vision_cache import VisionCache


def _prompts(model, processor, samples):
    """Two prompts of different lengths (one left-padded) with their injected features."""
    batch = [samples[0], samples[5]]
    prompts = [build_prompt(s, processor) for s in batch]
    ids, mask = left_pad([p.input_ids for p in prompts], processor.tokenizer.pad_token_id, "cpu")
    mm, _ = left_pad([p.mm_token_type_ids for p in prompts], 0, "cpu")
    assert (mask == 0).any()
    return ids, mask, mm, VisionCache(model, processor).get([s.image for s in batch])


def _run(model, inputs):
    """last logits, every layer's cache tensors and the language model's gradients of a loss reading both."""
    model.zero_grad(set_to_none=True)
    last, cache, _ = prefill(model, *inputs)
    states = [t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    g = torch.Generator().manual_seed(0)
    loss = (last * torch.randn(last.shape, generator=g)).sum()
    loss = loss + sum((s * torch.randn(s.shape, generator=g)).sum() for s in states if s.is_floating_point())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return last.detach(), [s.detach() for s in states], grads


@pytest.mark.parametrize(
    "arch,attention",
    [("qwen2_5_vl", "sdpa"), ("qwen2_5_vl", "eager"), ("qwen2_vl", "sdpa"), ("qwen3_vl", "sdpa"), ("qwen3_5", "sdpa")],
)
def test_the_last_layer_at_the_last_position_gives_the_whole_layers_logits_cache_and_gradients(
    load, samples, arch, attention, monkeypatch
):
    """SDPA's boolean mask and eager attention's additive one alike: the last query's row of it."""
    model, processor = load(arch, spread_by=0.05, attn_implementation=attention)
    if arch == "qwen3_5":  # the float32 chunked rule's own backward error exceeds the tolerance (test_forward.py)
        use_exact_rule(monkeypatch)
    model.train()  # the kept prefill's mode: gradients through it
    inputs = _prompts(model, processor, samples)
    layer = last_position.trimmable_layer(model)
    assert layer is model.get_decoder().layers[-1]
    positions = []
    hook = layer.mlp.register_forward_hook(lambda m, a, out: positions.append(a[0].shape[:-1].numel()))
    try:
        got = _run(model, inputs)
        assert positions == [2]  # one position per prompt through the last MLP, not 2 x the padded length
        monkeypatch.setattr(last_position, "trimmable_layer", lambda m: None)
        ref = _run(model, inputs)
        assert positions[1] == inputs[0].numel()
    finally:
        hook.remove()
    assert "forward" not in layer.__dict__  # restored
    assert (got[0] - ref[0]).abs().max() <= 1e-5
    assert len(got[1]) == len(ref[1]) and all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))  # keys, values
    assert got[2].keys() == ref[2].keys()
    for name, g in got[2].items():
        scale = float(ref[2][name].abs().max())
        assert (g - ref[2][name]).abs().max() <= 1e-6 + 1e-5 * scale, name


@pytest.mark.parametrize("arch", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_a_mixture_of_experts_last_layer_runs_whole(load, arch):
    """A MoE rollout records every prompt token's experts at every layer: its last layer is not trimmed."""
    model, _ = load(arch)
    assert last_position.trimmable_layer(model) is None


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_5"])
def test_in_bf16_the_last_position_is_as_close_to_fp32_as_the_whole_layer(load, samples, arch, monkeypatch):
    """bf16 rounds the trimmed layer's products differently from the whole layer's (its last query runs alone), so the
    bound is the bf16 model's own: against the fp32 whole layer, the trimmed bf16 logits are within twice the whole
    bf16 layer's distance (a wrong key, mask or position would be off by far more); the cache's keys and values are
    the whole bf16 layer's bit for bit (the same products on the same inputs)."""
    model, processor = load(arch, spread_by=0.05)
    inputs = _prompts(model, processor, samples)
    with torch.no_grad():
        whole = last_position.trimmable_layer
        monkeypatch.setattr(last_position, "trimmable_layer", lambda m: None)
        ref = prefill(model, *inputs)[0]
        model.to(torch.bfloat16)
        bf16_whole, whole_cache, _ = prefill(model, *inputs)
        monkeypatch.setattr(last_position, "trimmable_layer", whole)
        bf16_trim, trim_cache, _ = prefill(model, *inputs)
    layer = trim_cache.layers[-1]
    assert torch.equal(layer.keys, whole_cache.layers[-1].keys) and torch.equal(
        layer.values, whole_cache.layers[-1].values
    )
    own_error = (bf16_whole.float() - ref).abs().max()
    assert own_error > 0  # bf16 really rounds
    assert (bf16_trim.float() - ref).abs().max() <= 2 * own_error + 1e-3
