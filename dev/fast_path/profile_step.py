"""Where a vlgrpo step's time goes: the `bench_vs_trl.py` setting (tiny model, 448 px, G = 8, 32 tokens), vlgrpo only,
a few untimed steps, then steps timed by phase and one under torch.profiler (top ops by self CPU time).

  OMP_NUM_THREADS=1 python dev/fast_path/profile_step.py --arch qwen2_5_vl --backend full [--steps 4] [--no-profile]
"""

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_vs_trl as bench  # noqa: E402

from vlgrpo.data.synth import synth_dataset  # noqa: E402
from vlgrpo.tiny import init_tiny  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen2_5_vl", choices=sorted(bench.SPECS))
    ap.add_argument("--backend", default="full", choices=bench.BACKENDS)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--shapes", default="", help="comma-separated op names: list their calls by input shape")
    a = ap.parse_args()
    torch.set_num_threads(1)
    args = argparse.Namespace(g=8, prompts=2, new_tokens=32, warmup=a.warmup, steps=a.steps + 1, threads=1)
    import vlgrpo.rollout.hf as hf

    bench.ROLLOUT_PARTS.wrap(hf, "prefill", "prefill")
    bench.ROLLOUT_PARTS.wrap(hf, "decode_loop", "decode")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = init_tiny(work / "model", a.arch, spec=bench.SPECS[a.arch])
        n = math.ceil((args.warmup + args.steps) * args.prompts / 0.8) + 4
        train = synth_dataset(work / "data", n, seed=0, image_size=448)["train"]
        trainer, state = bench.build_vlgrpo(model_dir, train, work / "run", bench.Setting(a.backend, 0.0), args)
        for _ in range(a.warmup):
            trainer.step_fn()
            state.timers.pop()
        bench.ROLLOUT_PARTS.pop()
        times, phases = [], []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            trainer.step_fn()
            times.append(time.perf_counter() - t0)
            ph = {k[len("timing/") :]: v for k, v in state.timers.pop().items() if k.startswith("timing/")}
            ph.update({f"rollout.{k}": v for k, v in bench.ROLLOUT_PARTS.pop().items()})
            phases.append(ph)
        print(f"step s: {' '.join(f'{t:.3f}' for t in times)}  median {statistics.median(times):.3f}")
        for k in phases[0]:
            print(f"  {k:24s} {statistics.median(p[k] for p in phases):.3f}")
        if a.no_profile:
            return
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=bool(a.shapes)) as prof:
            trainer.step_fn()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))
        if a.shapes:
            names = set(a.shapes.split(","))
            rows = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in names]
            rows.sort(key=lambda e: -e.self_cpu_time_total)
            for e in rows[: a.rows]:
                us = e.self_cpu_time_total
                print(f"{e.key:12s} {e.count:6d} calls {us / 1e3:8.2f} ms {us / e.count:8.1f} us  {e.input_shapes}")


if __name__ == "__main__":
    main()
