"""Seconds per weight sync to a split rollout worker against model size, before and after buckets, in one run.

Before (the split placement until buckets): every tensor of the model packed into one CPU buffer per dtype
(`split.pack_weights`), put on the worker's queue (shared memory), the worker unpacking it and loading it into its copy.
After (`rollout.weight_stream`): only the weights that change (a full fine-tune of the language model with the tower
frozen, the demo's setting: the trainable tensors and their siblings) in buckets of `--bucket-mb`, sent over the pair's
gloo group while the next bucket is packed, the worker loading each bucket as it arrives. The time is the trainer's,
from the start of the sync until the worker has loaded the last tensor (it acknowledges through its queue).

Models: tiny Qwen2.5-VL configs of growing width (`vlgrpo.tiny.TinySpec`), built in memory with random weights.
Ends with the planner's projection for the 7B recipes (`vlgrpo plan`'s sync line). One torch thread per side.

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_sync.py [--sizes 128x4,512x8,1024x8,1536x12] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from vlgrpo.rollout.split import pack_weights, unpack_weights
from vlgrpo.rollout.weight_stream import (
    PairGroup,
    WeightBuckets,
    host_store,
    plan_buckets,
    receive_buckets,
    send_buckets,
    with_siblings,
)


def build(hidden: int, layers: int):
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlgrpo.tiny import TinySpec, build_tiny_tokenizer, tiny_config

    spec = TinySpec(hidden_size=hidden, num_layers=layers, intermediate_size=3 * hidden, num_heads=max(4, hidden // 64))
    with tempfile.TemporaryDirectory() as d:
        tokenizer = build_tiny_tokenizer(Path(d))
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(tiny_config("qwen2_5_vl", spec, tokenizer)).eval()
    for name, p in model.named_parameters():
        p.requires_grad_("visual" not in name)  # the demo's full fine-tune: the tower frozen
    return model


def worker(hidden: int, layers: int, port: int, requests, acks) -> None:
    torch.set_num_threads(1)
    model = build(hidden, layers)
    pair = PairGroup.join("127.0.0.1", port)
    while True:
        message = requests.get()
        if message[0] == "stop":
            return
        if message[0] == "packed":
            model.load_state_dict(unpack_weights(*message[1]), strict=False)
        else:
            for tensors in receive_buckets(pair, message[1], lambda: True):
                model.load_state_dict(tensors, strict=False)
        acks.put("loaded")


def measure(hidden: int, layers: int, repeats: int, bucket_mb: float) -> dict:
    model = build(hidden, layers)
    state = model.state_dict()
    changing = {n for n, p in model.named_parameters() if p.requires_grad}
    specs = with_siblings(((n, t.dtype, tuple(t.shape)) for n, t in state.items()), changing)
    buckets = plan_buckets(specs, int(bucket_mb * 2**20))
    weights = WeightBuckets(buckets, lambda b: [state[n] for n in b.names])
    ctx = mp.get_context("spawn")
    requests, acks = ctx.Queue(), ctx.Queue()
    store = host_store()
    process = ctx.Process(target=worker, args=(hidden, layers, store.port, requests, acks), daemon=True)
    process.start()
    pair = PairGroup(store, 0)
    before, after = [], []
    try:
        for _ in range(repeats + 1):  # the first of each is a warm-up
            t0 = time.perf_counter()
            requests.put(("packed", pack_weights(state.items())))
            acks.get()
            before.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            requests.put(("buckets", buckets))
            send_buckets(pair, weights, process.is_alive)
            acks.get()
            after.append(time.perf_counter() - t0)
        requests.put(("stop",))
    finally:
        process.join(timeout=60)
    whole = sum(t.numel() * t.element_size() for t in state.values())
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "before_mb": whole / 1e6,
        "after_mb": weights.nbytes / 1e6,
        "buckets": len(buckets),
        "before_s": statistics.median(before[1:]),
        "after_s": statistics.median(after[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="128x4,512x8,1024x8,1536x12", help="hidden x layers, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=16.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{'params':>8} {'before MB':>10} {'before s':>9} {'after MB':>9} {'buckets':>8} {'after s':>8} {'ratio':>6}")
    for size in args.sizes.split(","):
        hidden, layers = (int(x) for x in size.split("x"))
        r = measure(hidden, layers, args.repeats, args.bucket_mb)
        rows.append({"size": size, **r})
        print(
            f"{r['params_m']:7.1f}M {r['before_mb']:10.1f} {r['before_s']:9.4f} {r['after_mb']:9.1f} "
            f"{r['buckets']:8d} {r['after_s']:8.4f} {r['after_s'] / r['before_s']:6.2f}"
        )
    from vlgrpo.config import load_config
    from vlgrpo.memory.from_config import plan_input_from_config
    from vlgrpo.memory.report import build_report, format_report

    for recipe in ("configs/qwen2_5_vl_7b_zero3_8xa100.yaml", "configs/qwen3_5_9b_lora_8xa100.yaml"):
        report = build_report(plan_input_from_config(load_config(recipe)))
        line = next(x for x in format_report(report).splitlines() if x.startswith("weight sync"))
        print(f"{recipe}: {line}")
    print(json.dumps({"rows": rows, "bucket_mb": args.bucket_mb, "repeats": args.repeats}))


if __name__ == "__main__":
    main()
