"""The text decoder's pieces outside the transformers forward: the rotation and the fused projections."""

import functools

import torch
import torch.nn.functional as F
from transformers.models.qwen2.modeling_qwen2 import rotate_half

from vlgrpo.policy.text_decoder import Fused, fuse, linear_weights, rotate, signed_sin


def test_rotate_is_transformers_rotation_bit_for_bit():
    """x * cos + x.roll(d/2) * signed sin against transformers' x * cos + rotate_half(x) * sin: the same products, so
    equal bit for bit (whole heads and a partial rotation of the first quarter, as Qwen3.5's)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 48, generator=g)
    angles = torch.randn(5, 1, 24, generator=g)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    assert torch.equal(rotate(x, cos, signed_sin(sin)), x * cos + rotate_half(x) * sin)
    cos, sin = cos[..., :6].repeat(1, 1, 2), sin[..., :6].repeat(1, 1, 2)  # a quarter of the head, its 6 angles
    out = rotate(x, cos, signed_sin(sin))
    assert torch.equal(out[..., :12], x[..., :12] * cos + rotate_half(x[..., :12]) * sin)
    assert torch.equal(out[..., 12:], x[..., 12:])


def test_only_plain_linear_maps_are_fused_and_the_product_equals_the_three():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.nn.Linear(8, 6), torch.nn.Linear(8, 4, bias=False), torch.nn.Linear(8, 4)
    assert linear_weights(k) == (k.weight, None)
    merged = torch.randn(4, 8, generator=g)
    k.forward = functools.partial(F.linear, weight=merged, bias=None)  # the LoRA backend's merged decode
    assert linear_weights(k)[0] is merged
    h = torch.randn(3, 8, generator=g)
    fused = fuse([q, k, v])
    assert isinstance(fused, Fused) and fused.sizes == [6, 4, 4]
    for part, module in zip(fused(h), (q, k, v)):  # k's missing bias is a zero bias
        assert (part - module(h)).abs().max() <= 1e-6
    wrapped = torch.nn.Sequential(torch.nn.Linear(8, 4))  # any other module must be called, never read
    assert linear_weights(wrapped) is None and fuse([q, wrapped]) is None

    class Adapter(torch.nn.Linear):  # a subclass may compute more than its weight (peft's layers, quantized ones)
        pass

    assert linear_weights(Adapter(8, 4)) is None


def test_fused_products_add_the_residual_and_run_the_mlp_as_the_modules_do():
    """`Fused` keeps its weights transposed ([in, out], contiguous: a copy, never the module's); `add_to` is x + the
    projection, `FusedMLP` the dense MLP: within n * eps * sum |terms| of the modules (another summation order only)."""
    from transformers.activations import ACT2FN

    from vlgrpo.policy.text_decoder import FusedMLP, fuse_mlp

    g = torch.Generator().manual_seed(2)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(8, 12, bias=False), torch.nn.Linear(8, 12, bias=False)
            self.down_proj, self.act_fn = torch.nn.Linear(12, 8, bias=False), ACT2FN["silu"]

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    mlp, h, x = MLP(), torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    o = torch.nn.Linear(8, 8)
    one = fuse([o])
    assert one.weight_t.shape == (8, 8) and one.weight_t.is_contiguous()
    assert one.weight_t.data_ptr() != o.weight.data_ptr() and torch.equal(one.weight_t, o.weight.t())
    bound = 8 * torch.finfo(torch.float32).eps * (h.abs() @ o.weight.abs().t() + o.bias.abs() + x.abs())
    assert ((one.add_to(x, h) - (x + o(h))).abs() <= bound).all()
    fused = fuse_mlp(mlp)
    assert isinstance(fused, FusedMLP) and fused.gate_up.sizes == [12, 12]
    with torch.no_grad():
        hidden = mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h)
        assert (fused.hidden(h) - hidden).abs().max() <= 1e-6
        assert (fused(h) - mlp(h)).abs().max() <= 1e-6
        assert (fused.add_to(x, h) - (x + mlp(h))).abs().max() <= 1e-6
    mlp.down_proj = torch.nn.Sequential(torch.nn.Linear(12, 8))  # a projection that must be called: no fused MLP
    assert fuse_mlp(mlp) is None
