"""Weights in buckets (vlgrpo/rollout/weight_stream.py): the plan, the sibling rule vLLM's in-place reload needs, and
buckets sent over a real process group of two (gloo) arriving bit for bit."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from vlgrpo.rollout.weight_stream import (
    ALIGN,
    PairGroup,
    WeightBuckets,
    host_store,
    pack,
    plan_buckets,
    receive_buckets,
    send_buckets,
    unpack,
    with_siblings,
)

F32, BF16 = torch.float32, torch.bfloat16
SPECS = [
    ("m.layers.0.attn.q_proj.weight", F32, (4, 4)),  # 64 bytes each
    ("m.layers.0.attn.q_proj.bias", F32, (4,)),
    ("m.layers.0.attn.k_proj.weight", F32, (4, 4)),
    ("m.layers.0.attn.v_proj.weight", F32, (4, 4)),
    ("m.layers.0.mlp.up_proj.weight", BF16, (8, 4)),
    ("m.layers.0.mlp.down_proj.weight", BF16, (4, 8)),
    ("m.layers.0.linear_attn.A_log", F32, (2,)),
    ("m.layers.0.linear_attn.in_proj_a.weight", F32, (2, 4)),
    ("m.embed.weight", BF16, (10, 4)),
    ("m.norm.weight", F32, (3,)),
]


def test_what_a_sync_moves_is_whole_sibling_groups():
    names = lambda specs: [s[0] for s in specs]  # noqa: E731
    # LoRA on q and v: vLLM fuses q, k and v into one layer, so k (and q's bias) go too; the MLP stays
    assert names(with_siblings(SPECS, {"m.layers.0.attn.q_proj.weight", "m.layers.0.attn.v_proj.weight"})) == [
        "m.layers.0.attn.q_proj.weight",
        "m.layers.0.attn.q_proj.bias",
        "m.layers.0.attn.k_proj.weight",
        "m.layers.0.attn.v_proj.weight",
    ]
    # a parameter directly on a module (a Gated DeltaNet's A_log) goes with that module's own tensors only
    assert names(with_siblings(SPECS, {"m.layers.0.linear_attn.A_log"})) == ["m.layers.0.linear_attn.A_log"]
    assert names(with_siblings(SPECS, {"m.layers.0.linear_attn.in_proj_a.weight"})) == [
        "m.layers.0.linear_attn.in_proj_a.weight"
    ]
    assert names(with_siblings(SPECS, {"m.embed.weight"})) == ["m.embed.weight", "m.norm.weight"]
    assert with_siblings(SPECS, set()) == []


def test_buckets_keep_the_order_the_size_and_sibling_groups_together():
    buckets = plan_buckets(SPECS, 256)
    assert [n for b in buckets for n in b.names] == [s[0] for s in SPECS]  # every tensor once, in order
    assert [b.names for b in buckets] == [
        # q, q bias, k, v: 64 + 16 (-> 64) + 64 + 64 = 256 bytes, exactly one bucket
        [
            "m.layers.0.attn.q_proj.weight",
            "m.layers.0.attn.q_proj.bias",
            "m.layers.0.attn.k_proj.weight",
            "m.layers.0.attn.v_proj.weight",
        ],
        # up and down (64 + 64) fit after nothing else; the linear_attn group (8 -> 64, + 32) does not straddle
        [
            "m.layers.0.mlp.up_proj.weight",
            "m.layers.0.mlp.down_proj.weight",
            "m.layers.0.linear_attn.A_log",
            "m.layers.0.linear_attn.in_proj_a.weight",
        ],
        ["m.embed.weight", "m.norm.weight"],
    ]
    for b in buckets:
        assert b.nbytes <= 256 and all(e.offset % ALIGN == 0 for e in b.entries)
        ends = [e.offset + e.nbytes for e in b.entries]
        assert all(e.offset >= end for e, end in zip(b.entries[1:], ends))  # no overlap
    # a group larger than a bucket straddles two; one that fits a bucket of its own starts one rather than straddle
    assert [b.names for b in plan_buckets(SPECS[:6], 192)] == [
        ["m.layers.0.attn.q_proj.weight", "m.layers.0.attn.q_proj.bias", "m.layers.0.attn.k_proj.weight"],
        ["m.layers.0.attn.v_proj.weight", "m.layers.0.mlp.up_proj.weight", "m.layers.0.mlp.down_proj.weight"],
    ]
    assert [b.names for b in plan_buckets([("a.x.w", F32, (16,)), *SPECS[4:6]], 128)] == [
        ["a.x.w"],
        ["m.layers.0.mlp.up_proj.weight", "m.layers.0.mlp.down_proj.weight"],
    ]
    # a tensor larger than a bucket travels alone
    big = plan_buckets([("a.w", F32, (100,)), ("b.w", F32, (2,))], 64)
    assert [b.names for b in big] == [["a.w"], ["b.w"]] and big[0].nbytes == 400


def test_a_bucket_packs_and_unpacks_bit_for_bit():
    torch.manual_seed(0)
    tensors = {n: torch.randn(shape).to(dtype) for n, dtype, shape in SPECS}
    (bucket,) = plan_buckets(SPECS, 4096)
    buffer = torch.zeros(bucket.nbytes, dtype=torch.uint8)
    pack(bucket, [tensors[n] for n in bucket.names], buffer)
    out = unpack(bucket, buffer)
    assert list(out) == bucket.names
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t)


def _receiver(port: int, buckets, results, done) -> None:
    pair = PairGroup.join("127.0.0.1", port)
    got = {}
    for tensors in receive_buckets(pair, buckets, lambda: True):
        got.update({name: t.clone() for name, t in tensors.items()})  # views of a buffer reused two buckets on
    results.put(got)
    done.wait(60)  # the tensors travel as this process's shared memory: it stays until they are read


def test_buckets_sent_over_a_process_group_of_two_arrive_bit_for_bit():
    torch.manual_seed(1)
    tensors = {
        f"m.layers.{i}.mlp.{p}.weight": torch.randn(16, 8).to(dt)
        for i in range(5)
        for p, dt in (("up_proj", BF16), ("down_proj", F32))
    }
    weights = WeightBuckets.from_named(tensors.items(), 700)  # 256 + 512 bytes a layer: two buckets per layer
    assert len(weights.buckets) == 10 and weights.nbytes == 5 * (256 + 512) and weights.tensors == 10
    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    store = host_store()
    process = ctx.Process(target=_receiver, args=(store.port, weights.buckets, results, done))
    process.start()
    try:
        send_buckets(PairGroup(store, 0), weights, process.is_alive)
        got = {name: t.clone() for name, t in results.get(timeout=60).items()}
    finally:
        done.set()
        process.join(timeout=30)
    assert list(got) == list(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


def _dies(port: int) -> None:
    PairGroup.join("127.0.0.1", port)
    raise SystemExit(3)


def test_a_sender_whose_receiver_died_stops_with_an_error():
    ctx = mp.get_context("spawn")
    store = host_store()
    process = ctx.Process(target=_dies, args=(store.port,))
    process.start()
    pair = PairGroup(store, 0)
    weights = WeightBuckets.from_named([("a.w", torch.zeros(4))], 64)
    try:
        send_buckets(pair, weights, process.is_alive)
    except RuntimeError as e:
        assert "weight sync to the rollout worker" in str(e)
    else:
        raise AssertionError("the send to a dead receiver returned")
    finally:
        process.join(timeout=30)
