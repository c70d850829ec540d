"""A/B of the prompt pass's causal attention in blocks (`policy.causal_blocks`) against transformers' one SDPA call,
on the prefilled prompts of a `benchmarks/bench_vs_trl.py` step (its tiny model, 2 prompts), alternating: seconds of
the prefill forward and of a backward through it (as the kept prefill's), and how far apart the logits are.

  OMP_NUM_THREADS=1 python dev/fast_path/prefill_ab.py --arch qwen2_5_vl [--reps 8]
"""

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_vs_trl as bench  # noqa: E402

import vlgrpo.policy.prefill as prefill_module  # noqa: E402
import vlgrpo.rollout.hf as hf  # noqa: E402
from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.tiny import init_tiny  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen2_5_vl", choices=sorted(bench.SPECS))
    ap.add_argument("--reps", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    args = argparse.Namespace(g=8, prompts=2, new_tokens=32, warmup=1, steps=3, threads=1)
    work = Path(tempfile.mkdtemp())
    model_dir = init_tiny(work / "model", a.arch, spec=bench.SPECS[a.arch])
    train = synth_dataset(work / "data", 20, seed=0, image_size=448)["train"]
    trainer, state = bench.build_vlgrpo(model_dir, train, work / "run", bench.Setting("full", 0.0), args)
    saved, real = {}, hf.prefill

    def keep(*x, **k):
        saved["args"] = x
        return real(*x, **k)

    hf.prefill = keep
    trainer.step_fn()
    hf.prefill = real
    blocks = prefill_module.causal_blocks

    def once(on: bool):
        prefill_module.causal_blocks = blocks if on else contextlib.nullcontext
        try:
            t0 = time.process_time()
            last, cache, _ = prefill_module.prefill(*saved["args"])
            t1 = time.process_time()
            loss = last.square().sum() + sum(layer.keys.square().sum() for layer in cache.layers)
            loss.backward()
            t2 = time.process_time()
        finally:
            prefill_module.causal_blocks = blocks
        state.lm.model.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1, last.detach()

    ref, got = once(False)[2], once(True)[2]
    times = {True: [], False: []}
    for _ in range(a.reps):
        for on in (False, True):
            times[on].append(once(on)[:2])
    for on, name in ((False, "one call"), (True, "blocks")):
        fwd, bwd = statistics.median(t[0] for t in times[on]), statistics.median(t[1] for t in times[on])
        print(f"{name:9s} prefill forward {fwd:.4f} s, backward {bwd:.4f} s (medians of {a.reps})")
    print(f"largest logit difference {float((got - ref).abs().max()):.2e}")


if __name__ == "__main__":
    main()
