"""A/B of the HF engine's decode step: the working tree's `SharedPrefixDecoder` against the one at a git revision, on
the same prefilled prompts of a `benchmarks/bench_vs_trl.py` step (its tiny model, G = 8, 32 new tokens), in
alternating order: CPU seconds per decode and op counts under the profiler, and whether both sampled the same tokens.

  OMP_NUM_THREADS=1 python dev/fast_path/decode_ab.py --arch qwen3_vl --backend full --rev 66015f8
"""

import argparse
import copy
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_vs_trl as bench  # noqa: E402

import vlgrpo.rollout.hf as hf  # noqa: E402
from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.tiny import init_tiny  # noqa: E402


def decoder_at(rev: str):
    """`SharedPrefixDecoder` as `vlgrpo/rollout/decode.py` was at `rev` (imported beside today's package)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:vlgrpo/rollout/decode.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "decode_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("decode_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up while it is being built
    spec.loader.exec_module(module)
    return module.SharedPrefixDecoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen2_5_vl", choices=sorted(bench.SPECS))
    ap.add_argument("--backend", default="full", choices=bench.BACKENDS)
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--table", type=int, default=0, help="print the working tree's top N ops of one decode")
    a = ap.parse_args()
    torch.set_num_threads(1)
    args = argparse.Namespace(g=8, prompts=2, new_tokens=32, warmup=1, steps=3, threads=1, arch=a.arch)
    work = Path(tempfile.mkdtemp())
    model_dir = init_tiny(work / "model", a.arch, spec=bench.SPECS[a.arch])
    train = synth_dataset(work / "data", 20, seed=0, image_size=448)["train"]
    trainer, state = bench.build_vlgrpo(model_dir, train, work / "run", bench.Setting(a.backend, 0.0), args)
    saved, loop = {}, hf.decode_loop

    def keep(*x, **k):  # the arguments of the step's decode: its prefilled prompts
        saved["args"] = x
        return loop(*x, **k)

    hf.decode_loop = keep
    trainer.step_fn()
    hf.decode_loop = loop
    model, last, cache, pos, mask, run = saved["args"]
    ways = {"rev": decoder_at(a.rev), "tree": hf.SharedPrefixDecoder}

    def once(cls):
        hf.SharedPrefixDecoder = cls
        r = copy.copy(run)
        r.generator, r.counts = torch.Generator().manual_seed(0), {"decode_tokens": 0}
        with torch.no_grad(), state.backend.rollout_weights():
            t = time.process_time()
            rows = loop(model, last, cache, pos, mask, r)
            return time.process_time() - t, rows

    rows = {k: once(cls)[1] for k, cls in ways.items()}
    seconds = {k: [] for k in ways}
    for _ in range(a.reps):
        for k, cls in ways.items():
            seconds[k].append(once(cls)[0])
    from torch.profiler import ProfilerActivity, profile

    for k, cls in ways.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            once(cls)
        ops = prof.key_averages()
        s = sorted(seconds[k])
        print(f"{k:5s} CPU s per decode: median {s[len(s) // 2]:.3f}, min {s[0]:.3f}; ops {sum(e.count for e in ops)}")
        if a.table and k == "tree":
            print(ops.table(sort_by="self_cpu_time_total", row_limit=a.table))
    same = all(x.token_ids == y.token_ids for x, y in zip(rows["rev"], rows["tree"]))
    gap = max(abs(p - q) for x, y in zip(rows["rev"], rows["tree"]) for p, q in zip(x.logprobs, y.logprobs))
    print(f"same tokens: {same}; largest log-prob difference {gap:.2e}")
    hf.SharedPrefixDecoder = ways["tree"]


if __name__ == "__main__":
    main()
