"""The HF engine's decode, measured: the shared-prefix step (`vlgrpo/rollout/decode.py`: each prompt's KV read once
per step for its G rows, a prompt dropped once all its rows have finished) against the same step keeping every row to
the end (`decode_shared(..., drop_finished=False)`, the step before it dropped prompts) and against the transformers
forward over a KV cache copied G ways (`decode_copied`, the engine's fallback), and the first way in chunks of 8
prompts (what a run's engine did before it decoded a step's prompts as one batch), side by side in one run, on the
demo's model and prompts; each way is an `HFEngine` given its decode explicitly.

Each round samples the same batches every way, in mirrored order (shared, kept, transformers, chunked, chunked,
transformers, kept, shared), since this machine's speed drifts over minutes; the figures are medians of the per-batch
`generate` times (prompt building, prefill and decode; the image features are cached beforehand). The first three
ways sample the same tokens (checked); chunked prefills round differently, so its tokens differ slightly (its mean
length is printed). The default batch is a demo GRPO step: 16 prompts x 8 completions.

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_decode.py [--model DIR] [--prompts 16] [--completions 8] [--rounds 2]
The model defaults to the demo's SFT cold start when `benchmarks/bench_async.py` left one in runs/bench_async/seed0,
else the shipped base (whose completions run to --max-new-tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from vlgrpo.data.adapters import load_samples
from vlgrpo.data.synth import synth_dataset
from vlgrpo.models import load_model
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.hf import HFEngine, decode_copied, decode_shared
from vlgrpo.vision_cache import VisionCache

BASE = Path(__file__).resolve().parent.parent / "data" / "models" / "shapes-tiny-qwen2_5_vl"


def setup(doc: str, model: Path, data: str, prompts: int, batches: int, rounds: int):
    """The command line and the inputs both decode and update benchmarks share: (args, train samples, loaded model,
    vision cache with every sample's features). One thread; the data is synthesised once (a seed the demo never
    uses)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--model", default=str(model if model.is_dir() else BASE))
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--completions", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=56)
    ap.add_argument("--batches", type=int, default=batches, help="batches per round")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--data", default=data)
    args = ap.parse_args()
    torch.set_num_threads(1)
    folder = Path(args.data)
    if not (folder / "train.jsonl").is_file():
        synth_dataset(folder, n=2 * args.prompts * args.batches, seed=12345, image_size=112, max_shapes=3)  # 80 % train
    samples = load_samples(folder / "train.jsonl").samples
    lm = load_model(args.model)
    cache = VisionCache(lm.model, lm.processor)
    cache.get([s.image for s in samples])
    return args, samples, lm, cache


WAYS = ("shared", "kept", "transformers", "chunked")
CHUNK = 8


def main() -> None:
    args, samples, lm, cache = setup(
        __doc__, Path("runs/bench_async/seed0/sft_model"), "runs/bench_decode/data", prompts=16, batches=4, rounds=2
    )
    model = lm.model.eval()
    decodes = {
        "shared": None,
        "kept": partial(decode_shared, drop_finished=False),
        "transformers": decode_copied,
        "chunked": None,
    }
    engines = {
        way: HFEngine(
            model,
            lm.processor,
            cache,
            answer_format="think_answer",
            decode=decodes[way],
            batch_prompts=CHUNK if way == "chunked" else args.prompts,
        )
        for way in WAYS
    }
    batches = [samples[i * args.prompts : (i + 1) * args.prompts] for i in range(args.batches)]
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    tokens: dict[str, list] = {}
    for r in range(args.rounds):
        for way in WAYS + WAYS[::-1]:
            got = []
            for k, batch in enumerate(batches):
                params = SamplingParams(
                    completions_per_prompt=args.completions, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=k
                )
                t = time.perf_counter()
                with torch.no_grad():
                    groups = engines[way].generate(batch, params)
                times[way].append(time.perf_counter() - t)
                got.append([c.token_ids for g in groups for c in g.completions])
            tokens.setdefault(way, got)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{w} {statistics.median(times[w]):.3f} s" for w in WAYS)
            + " per batch (medians so far)",
            flush=True,
        )
    same = tokens["shared"] == tokens["kept"] == tokens["transformers"]
    n_tokens, n_chunked = (
        statistics.fmean(len(t) for batch in tokens[w] for t in batch) for w in ("shared", "chunked")
    )
    med = {w: statistics.median(times[w]) for w in WAYS}
    print(
        f"{args.prompts} prompts x {args.completions} completions, {n_tokens:.1f} tokens each; per batch: "
        "shared-prefix "
        f"{med['shared']:.3f} s, every row kept to the end {med['kept']:.3f} s ({med['kept'] / med['shared']:.2f}x), "
        f"transformers forward {med['transformers']:.3f} s ({med['transformers'] / med['shared']:.2f}x), "
        f"in chunks of {CHUNK} {med['chunked']:.3f} s ({med['chunked'] / med['shared']:.2f}x, {n_chunked:.1f} tokens "
        f"each); same tokens (first three): {same}"
    )
    print(
        json.dumps(
            {
                **{f"{w}_s": med[w] for w in WAYS},
                "same_tokens": same,
                "mean_tokens": n_tokens,
                "chunked_mean_tokens": n_chunked,
                "model": args.model,
            }
        )
    )


if __name__ == "__main__":
    main()
