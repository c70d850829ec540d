"""Peak extra memory and time of per-token log-probs + entropy (forward and backward): naive vs chunked.

Each method runs in a fresh subprocess on the CPU with one thread; the peak is the process's high-water RSS
above the RSS right after the logits exist. Usage: python benchmarks/bench_logprobs.py [--n 4 --t 128 --chunk 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _worker(method: str, n: int, t: int, vocab: int, chunk: int, dtype: str) -> dict:
    import torch

    from vlgrpo.grpo import token_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    logits = torch.randn(n, t, vocab, dtype=getattr(torch, dtype)).requires_grad_(True)  # no fp32 temporary
    ids = torch.randint(0, vocab, (n, t))
    base = _rss_kib("VmRSS")
    try:  # reset the high-water mark to the current RSS (Linux >= 4.0); else the setup peak stays in VmHWM
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    start = time.perf_counter()
    if method == "naive":
        logp_all = torch.log_softmax(logits.float(), dim=-1)  # [N, T, V] fp32
        logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    else:
        logp, entropy = token_logprobs(logits, ids, chunk_tokens=chunk)
    (logp.sum() + entropy.sum()).backward()
    seconds = time.perf_counter() - start
    return {"method": method, "peak_extra_mib": (_rss_kib("VmHWM") - base) / 1024, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4, help="completions N")
    ap.add_argument("--t", type=int, default=128, help="completion tokens T")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary V (Qwen2.5-VL: 151936)")
    ap.add_argument("--chunk", type=int, default=64, help="chunk_tokens of the chunked version")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="logits dtype")
    ap.add_argument("--worker", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(_worker(a.worker, a.n, a.t, a.vocab, a.chunk, a.dtype)))
        return
    logits_mib = a.n * a.t * a.vocab * (2 if a.dtype == "bfloat16" else 4) / 2**20
    print(f"N={a.n} T={a.t} V={a.vocab} {a.dtype} logits = {logits_mib:.0f} MiB, chunk_tokens={a.chunk}, 1 thread")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for method in ("naive", "chunked"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                method,
                "--n",
                str(a.n),
                "--t",
                str(a.t),
                "--vocab",
                str(a.vocab),
                "--chunk",
                str(a.chunk),
                "--dtype",
                a.dtype,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['method']:>8}: peak extra {r['peak_extra_mib']:8.0f} MiB   fwd+bwd {r['seconds']:6.2f} s")


if __name__ == "__main__":
    main()
