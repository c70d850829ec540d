"""N data-parallel ranks compute the update of one process on the union of their batches (docs/scaling-out.md):
every aggregation's normaliser and the batch-scaled advantages' std are the union batch's, reduced over the ranks,
and so are the logged metrics of the update (entropy, clip fractions, ratio, loss: weighted by tokens or sequences).
The ranks' completion lengths differ (rank 1's are 3x rank 0's) and so do their sequence counts, so a per-rank
normaliser (the mean of per-rank token means, of per-rank sequence means) or a rank's own reward std moves the
weights differently, by far more than the tolerance."""

from pathlib import Path

import pytest
import torch
from trainer_helpers import run_ranks, tiny_config, write_reward_module
from union_worker import CASES, GROUPS

from vlgrpo.config import save_config

WORKER = Path(__file__).with_name("union_worker.py")


def _update(tmp_path, name: str, nproc: int, ranks: int, port: int, *overrides: str) -> dict:
    """Run union_worker.py on `nproc` ranks for the groups of `ranks` ranks; its result.pt."""
    out = tmp_path / name
    out.mkdir()
    cfg = tiny_config(
        str(tmp_path / "model"),
        tmp_path / "data",
        out / "run",
        f"reward.recipe={{'{write_reward_module(tmp_path)}': 1.0}}",
        "rollout.max_new_tokens=16",
        # ZeRO-3's accumulation count, prompts x 4 / micro-batch: 1 on every rank (as many rows as rank 0 holds: 8
        # rows), or every group in one process, in micro-batches of 4 (the update sums micro-batches as ranks)
        *(["train.prompts_per_step=2", "train.micro_batch_completions=8"] if nproc > 1 else []),
        *([f"train.prompts_per_step={sum(GROUPS[r] for r in range(ranks))}"] if nproc == 1 else []),
        "train.max_grad_norm=0",
        "train.lr=1.0",
        "train.save_every=0",
        *overrides,
    )
    save_config(cfg, out / "cfg.yaml")
    status, stderr = run_ranks(WORKER, str(out / "cfg.yaml"), str(out), str(ranks), port=port, timeout=600, nproc=nproc)
    assert status == 0, stderr[-3000:]
    return torch.load(out / "result.pt")


def _assert_union_equal(split: dict, union: dict) -> dict:
    """Every variant's advantages and gradient equal to 1e-6; returns the largest gradient difference per variant."""
    worst = {}
    for key in (f"{a}/{r}/{adv}" for a, r, adv in CASES):
        s, u = split[key], union[key]
        assert torch.allclose(s["advantages"], u["advantages"], atol=1e-6, rtol=0), key
        assert set(s["gradient"]) == set(u["gradient"]) and u["gradient"], key
        worst[key] = max(float((s["gradient"][n] - u["gradient"][n]).abs().max()) for n in u["gradient"])
        largest = max(float(g.abs().max()) for g in u["gradient"].values())
        assert worst[key] <= 1e-6 and largest > 1e-3, (key, worst[key], largest)
        # the logged values (#60 item 4): token-weighted over micro-batches and ranks, as the one process logs them
        # (before: rank 0's mean of its micro-batch means; rank 1's completions are 3x longer, so its entropy and
        # loss weigh 3x more in the union)
        sm, um = s["metrics"], u["metrics"]
        assert sm.keys() == um.keys() and {"grpo/entropy", "train/loss"} <= um.keys(), key
        assert all(abs(sm[k] - um[k]) <= 1e-6 * max(1.0, abs(um[k])) for k in um), (key, sm, um)
    return worst


@pytest.mark.parametrize(
    "backend, ranks, port, arch",
    [
        ("plain", 3, 29613, "qwen2_5_vl"),  # 3 ranks: uneven shards of the union batch (2 ranks: the zero3 cases)
        ("zero3", 2, 29619, "qwen2_5_vl"),  # (zero3 on 3 ranks: the plain case's shards with zero3's all-reduce)
        ("lora", 2, 29623, "qwen3_5"),  # Gated DeltaNet layers: each row's states from its own prompt, on any rank
        ("zero3", 2, 29625, "qwen3_5"),  # + A_log / dt_bias gathered by vlgrpo's hook, conv1d as an external param
    ],
)
def test_n_ranks_update_as_one_process_on_the_union_batch(
    tmp_path, tiny_model_dir, shapes_dir, backend, ranks, port, arch
):
    if backend == "zero3":
        pytest.importorskip("deepspeed")
    (tmp_path / "model").symlink_to(tiny_model_dir(arch))
    (tmp_path / "data").symlink_to(shapes_dir)
    extra = [f"train.backend={backend}"] + (["train.lora.rank=4"] if backend == "lora" else [])
    split = _update(tmp_path, "split", ranks, ranks, port, *extra)
    union = _update(tmp_path, "union", 1, ranks, port + 1, *extra)
    print(backend, ranks, _assert_union_equal(split, union))
