"""How precise are the Gated DeltaNet decay gradients (A_log, dt_bias, in_proj_a) of a Qwen3.5 pass? One linear
layer of the tiny Qwen3.5 in float64, a 40-token prompt and a 4-token continuation; the gradient of a fixed linear
function of the continuation's outputs, by (a) the layer's own forward over the whole row and (b) vlgrpo's pass
(the prompt's states from a transformers prefill, then `policy.linear_attention.gated_delta`), each with
transformers' float32 rules and with an exact float64 token-by-token rule (tests/policy/exact_delta_rule.py).

    OMP_NUM_THREADS=1 .venv/bin/python dev/qwen3_5_decay_gradients.py [--model DIR]

Prints each path's largest error relative to the exact gradient (log: dev/LOG.md, 2026-12-05)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "policy"))
from exact_delta_rule import exact_gated_delta_rule  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: E402

from vlgrpo.models import load_model  # noqa: E402
from vlgrpo.policy.linear_attention import gated_delta, prompt_states  # noqa: E402
from vlgrpo.tiny import init_tiny  # noqa: E402

DECAY = ("A_log", "dt_bias", "in_proj_a.weight")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a Qwen3.5 checkpoint directory (default: a fresh tiny one)")
    args = ap.parse_args()
    path = args.model or str(init_tiny(Path(tempfile.mkdtemp()) / "tiny", "qwen3_5"))
    text = load_model(path, dtype="float64").model.get_decoder()
    attn, cfg = text.layers[0].linear_attn, text.config
    gen = torch.Generator().manual_seed(0)
    prompt, rest, weight = (torch.randn(1, n, cfg.hidden_size, generator=gen, dtype=torch.float64) for n in (40, 4, 4))

    def grads(run) -> dict[str, torch.Tensor]:
        attn.zero_grad(set_to_none=True)
        (run() * weight).sum().backward()
        return {n: p.grad.clone() for n, p in attn.named_parameters()}

    def whole_row():
        return attn(torch.cat((prompt, rest), 1))[:, prompt.shape[1] :]

    def prefill_then_continue():
        cache = DynamicCache(config=cfg)
        attn(prompt, cache_params=cache)
        return gated_delta(attn, rest, None, *prompt_states(cache, 0))[0]

    float32 = {name: grads(run) for name, run in (("whole row", whole_row), ("vlgrpo", prefill_then_continue))}
    originals = modeling_qwen3_5.torch_chunk_gated_delta_rule, modeling_qwen3_5.torch_recurrent_gated_delta_rule
    modeling_qwen3_5.torch_chunk_gated_delta_rule = modeling_qwen3_5.torch_recurrent_gated_delta_rule = (
        exact_gated_delta_rule
    )
    try:
        exact = {name: grads(run) for name, run in (("whole row", whole_row), ("vlgrpo", prefill_then_continue))}
    finally:
        modeling_qwen3_5.torch_chunk_gated_delta_rule, modeling_qwen3_5.torch_recurrent_gated_delta_rule = originals

    def rel(a: dict, b: dict, names) -> float:
        return max(float((a[n] - b[n]).abs().max() / b[n].abs().max()) for n in names)

    truth = exact["whole row"]
    others = [n for n in truth if n not in DECAY]
    print(f"exact rule: vlgrpo vs whole row, every parameter: {rel(exact['vlgrpo'], truth, truth):.1e}")
    print(f"{'float32 rules':<16}{'decay params vs exact':>24}{'other params vs exact':>24}")
    for name, got in float32.items():
        print(f"{name:<16}{rel(got, truth, DECAY):>24.1e}{rel(got, truth, others):>24.1e}")


if __name__ == "__main__":
    main()
