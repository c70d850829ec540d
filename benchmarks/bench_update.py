"""The trainer's completion pass, measured: the packed pass (`vlgrpo/policy/packed.py`: no layer runs on padding)
against the transformers forward over the prompts' KV cache gathered to every row (the fallback), side by side in
one run, on GRPO batches the demo's model samples.

A batch is what one demo GRPO step trains on: --prompts prompts x --completions completions sampled by the HF engine,
right-padded to the longest. Each round times both ways on the same batches in mirrored order (packed, transformers,
transformers, packed), since this machine's speed drifts over minutes: the forward alone (the old / reference
log-prob passes) and forward + backward of the summed log-probs (the update). Medians per batch. Both ways must give
the same log-probs (checked to 1e-5).

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_update.py [--model DIR] [--prompts 16] [--completions 8] [--rounds 2]
The model defaults to the SFT cold start of `make demo` (runs/demo/sft_model) when there is one, else the shipped
base (whose completions run to --max-new-tokens, so rows are nearly all the same length: little padding to skip).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from bench_decode import setup  # benchmarks/ is on sys.path when this script runs

from vlgrpo.models import placeholder_token_ids
from vlgrpo.policy import forward, prompt
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.trainer.batch import make_batch


def main() -> None:
    args, samples, lm, cache = setup(
        __doc__, Path("runs/demo/sft_model"), "runs/bench_update/data", prompts=16, batches=4, rounds=2
    )
    model, tok = lm.model, lm.processor.tokenizer
    engine = HFEngine(model.eval(), lm.processor, cache, answer_format="think_answer", batch_prompts=args.prompts)
    image_id = tok.convert_tokens_to_ids(prompt.IMAGE_PAD)
    forbidden = prompt.forbidden_mask(tok, prompt.vocab_size(model))
    batches = []
    for k in range(args.batches):
        chunk = samples[k * args.prompts : (k + 1) * args.prompts]
        with torch.no_grad():
            params = SamplingParams(completions_per_prompt=args.completions, max_new_tokens=args.max_new_tokens, seed=k)
            groups = engine.generate(chunk, params)
        batches.append(
            make_batch(
                groups, cache.get([s.image for s in chunk]), tok.pad_token_id, image_id, placeholder_token_ids(tok)
            )
        )
    real = sum(float(b.batch.completion_mask.sum()) for b in batches)
    slots = sum(b.batch.completion_mask.numel() for b in batches)
    supports = forward.supports_text_decoder
    times: dict[tuple[str, str], list[float]] = {}
    logps: dict[str, list] = {}
    model.train()  # as the update runs (dropout is 0 in these models)
    for r in range(args.rounds):
        for way in ("packed", "transformers", "transformers", "packed"):
            forward.supports_text_decoder = supports if way == "packed" else (lambda m: False)
            got = []
            for b in batches:
                t = time.perf_counter()
                with torch.no_grad():
                    lp = forward.completion_logprobs(model, b.batch, b.features, forbidden)
                times.setdefault((way, "forward"), []).append(time.perf_counter() - t)
                t = time.perf_counter()
                (forward.completion_logprobs(model, b.batch, b.features, forbidden) * b.loss_mask).sum().backward()
                times.setdefault((way, "forward+backward"), []).append(time.perf_counter() - t)
                model.zero_grad(set_to_none=True)
                got.append(lp * b.loss_mask)
            logps.setdefault(way, got)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"round {r + 1}: forward packed {med['packed', 'forward']:.3f} s, transformers "
            f"{med['transformers', 'forward']:.3f} s; forward+backward packed {med['packed', 'forward+backward']:.3f}"
            f" s, transformers {med['transformers', 'forward+backward']:.3f} s (medians so far)",
            flush=True,
        )
    forward.supports_text_decoder = supports
    diff = max(float((a - b).abs().max()) for a, b in zip(logps["packed"], logps["transformers"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{args.prompts} prompts x {args.completions} completions, {real / slots:.0%} of the padded slots are real "
        f"tokens; per batch:"
    )
    for part in ("forward", "forward+backward"):
        p, t = med["packed", part], med["transformers", part]
        print(f"  {part:>16}: packed {p:.3f} s, transformers {t:.3f} s: {t / p:.2f}x")
    print(f"  largest log-prob difference: {diff:.1e}")
    print(
        json.dumps(
            {
                "forward_packed_s": med["packed", "forward"],
                "forward_transformers_s": med["transformers", "forward"],
                "update_packed_s": med["packed", "forward+backward"],
                "update_transformers_s": med["transformers", "forward+backward"],
                "real_fraction": real / slots,
                "max_logp_diff": diff,
                "model": args.model,
            }
        )
    )
    if diff > 1e-5:
        raise SystemExit(f"the two passes disagree: largest log-prob difference {diff:.1e} > 1e-5")


if __name__ == "__main__":
    main()
