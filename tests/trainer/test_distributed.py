import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import run_ranks, tiny_config, write_reward_module

from vlgrpo.config import save_config
from vlgrpo.models import load_model
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.metrics import read_metrics
from vlgrpo.trainer.state import build_state

WORKER = Path(__file__).with_name("dist_worker.py")
MODEL_CLASS = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
}


def _torchrun(tmp_path, port: int, *overrides: str, timeout: int = 600) -> list[dict]:
    """Train on 2 ranks; returns each rank's {"history", "progress"} (see dist_worker.py). A run that outlives
    `timeout` (a deadlock) fails the test and is stopped, torchrun and both ranks."""
    status, stderr = run_ranks(
        WORKER, str(tmp_path / "cfg.yaml"), str(tmp_path), *overrides, port=port, timeout=timeout
    )
    assert status == 0, stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _config(tmp_path, tiny_model_dir, shapes_dir, *extra, arch: str = "qwen2_5_vl"):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(arch),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.save_every=1",
        *extra,
    )
    save_config(cfg, tmp_path / "cfg.yaml")


# Qwen3-VL: the DeepStack maps are encoded under the gathered tower and injected in every pass over the shards
# (untied: the head is a tensor of its own, gathered and exported as itself)
@pytest.mark.parametrize(
    "arch, port, tied",
    # tied embeddings: qwen2_5_vl; qwen3_vl's DeepStack and untied head together (CI time: its tied case adds nothing)
    [
        ("qwen2_5_vl", 29517, True),
        ("qwen3_vl", 29523, False),
        ("qwen3_5", 29525, False),
        ("qwen3_vl_moe", 29531, False),
    ],
    ids=["qwen2_5_vl", "qwen3_vl-untied", "qwen3_5-untied", "qwen3_vl_moe-untied"],
)
def test_zero3_two_ranks_on_cpu_trains_and_exports_the_gathered_weights(
    tmp_path, tiny_model_dir, shapes_dir, arch, port, tied
):
    pytest.importorskip("deepspeed")
    if not tied:
        from vlgrpo.tiny import TinySpec, init_tiny

        untied = str(init_tiny(tmp_path / "untied", arch, spec=TinySpec(tie_word_embeddings=False)))
        tiny_model_dir = lambda _arch=None: untied  # noqa: E731
    _config(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "train.backend=zero3",
        "grpo.beta=0.04",
        "train.dist_timeout_s=3000",
        arch=arch,
    )
    _torchrun(tmp_path, port)
    # train.dist_timeout_s reaches DeepSpeed's own data-parallel group too (it took gloo's 30-minute default: #60)
    timeouts = json.loads((tmp_path / "rank1.json").read_text())["timeouts"]
    assert timeouts == {"world": 3000.0, "deepspeed_data_parallel": 3000.0}, timeouts
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and "grpo/kl" in rows[-1]
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "zero3").is_dir()  # DeepSpeed's own sharded checkpoint
    gathered = torch.load(tmp_path / "weights_rank0.pt")
    exported_model = load_model(str(tmp_path / "export")).model
    assert exported_model.config.architectures == [MODEL_CLASS[arch]] == [type(exported_model).__name__]
    exported = exported_model.state_dict()
    base = load_model(tiny_model_dir(arch)).model.state_dict()
    missing = set(exported) - set(gathered)
    assert missing == ({"lm_head.weight"} if tied else set())  # tied: one gathered tensor serves both
    for name, tensor in exported.items():
        expected = gathered.get(name, gathered["model.language_model.embed_tokens.weight"])
        assert torch.equal(tensor, expected), name  # the export is exactly the gathered weights
    moved = [n for n in exported if not torch.equal(exported[n], base[n])]
    assert moved and all(".visual." not in f".{n}" for n in moved)  # trained, vision tower frozen
    if arch.endswith("_moe"):  # every router and expert weight trains (all experts of a layer: one module, one gather)
        blocks = [n for n in exported if ".language_model." in n and ".mlp." in n]
        assert len(blocks) == 3 * 4 and set(blocks) <= set(moved), sorted(set(blocks) - set(moved))
    if not tied:  # the head trained on its own, apart from the embeddings
        assert "lm_head.weight" in moved and not torch.equal(
            exported["lm_head.weight"], exported["model.language_model.embed_tokens.weight"]
        )
    # `vlgrpo export` in ONE process consolidates the 2-rank ZeRO-3 checkpoint to the same weights
    from vlgrpo.cli import main

    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "offline")]) == 0
    offline = load_model(str(tmp_path / "offline")).model.state_dict()
    assert all(torch.equal(offline[n], exported[n]) for n in exported)


def test_lora_data_parallel_keeps_the_ranks_identical(tmp_path, tiny_model_dir, shapes_dir):
    _config(tmp_path, tiny_model_dir, shapes_dir, "train.backend=lora", "train.lora.rank=4", "train.lr=1e-2")
    _torchrun(tmp_path, 29518)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]  # rank 0 logs, once per step
    w0, w1 = (torch.load(tmp_path / f"weights_rank{r}.pt") for r in (0, 1))
    base = load_model(tiny_model_dir()).model.state_dict()
    # each rank saw different prompts; averaged gradients keep the replicas equal, and training moved them
    assert all(torch.equal(w0[n], w1[n]) for n in w0)
    assert any(not torch.equal(w0[n], base[n]) for n in base if n in w0)


def test_zero3_sft_steps_the_optimiser_every_step_and_learns_a_fixed_batch(tmp_path, tiny_model_dir, shapes_dir):
    pytest.importorskip("deepspeed")
    # 4 samples over 2 ranks and 2 prompts per step: each rank trains on the same 2 gold answers every step
    _config(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "train.backend=zero3",
        "train.stage=sft",
        "train.steps=5",
        "data.max_samples=4",
        "train.save_every=0",
    )
    ranks = _torchrun(tmp_path, 29519)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[0]["vision/images_encoded"] >= 1
    for rank in ranks:
        assert [p["optimizer_steps"] for p in rank["progress"]] == [1, 2, 3, 4, 5]  # one per SFT step
        prints = [p["fingerprint"] for p in rank["progress"]]
        assert all(a != b for a, b in zip(prints, prints[1:]))  # the weights move every step
        losses = [h["train/loss"] for h in rank["history"]]
        assert all(b < a for a, b in zip(losses, losses[1:])), losses  # the same gold answers get likelier


def test_zero3_steps_once_per_pass_over_the_batch_like_the_plain_backend(tmp_path, tiny_model_dir, shapes_dir):
    pytest.importorskip("deepspeed")
    # grpo.num_iterations=2: two passes per GRPO step, each ending in backend.step(); a 4-step warm-up makes the
    # logged LR follow the optimiser step count
    extra = ("grpo.num_iterations=2", "train.warmup_steps=4", "train.save_every=0")
    _config(tmp_path, tiny_model_dir, shapes_dir, "train.backend=zero3", *extra)
    ranks = _torchrun(tmp_path, 29520)
    spec = write_reward_module(tmp_path)
    plain = build_state(
        tiny_config(tiny_model_dir(), shapes_dir, tmp_path / "plain", *extra, f"reward.recipe={{'{spec}': 1.0}}"),
        progress=False,
    )
    plain_history = Trainer(plain).train()
    plain.close()
    assert plain.backend.scheduler.last_epoch == 4  # 2 steps x 2 passes
    for rank in ranks:
        assert [p["optimizer_steps"] for p in rank["progress"]] == [2, 4]
        lrs = [h["train/lr"] for h in rank["history"]]
        assert lrs == pytest.approx([h["train/lr"] for h in plain_history])  # [2/4, 4/4] x lr


RANK_REWARD = '''
import os


def rank_one_constant(completion):
    """Every group on rank 1 has zero variance (dynamic sampling wants top-ups there); rank 0's groups vary."""
    return 0.5 if os.environ["RANK"] == "1" else len(completion) / 10.0
'''


def test_zero3_dynamic_sampling_ranks_agree_on_the_top_up_rounds(tmp_path, tiny_model_dir, shapes_dir):
    pytest.importorskip("deepspeed")
    (tmp_path / "rank_reward.py").write_text(RANK_REWARD)
    # the ZeRO-3 7B recipe: dynamic sampling and gradient checkpointing on
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        "train.backend=zero3",
        f"reward.recipe={{'{tmp_path}/rank_reward.py:rank_one_constant': 1.0}}",
        "grpo.dynamic_sampling=true",
        "grpo.max_topup_rounds=2",
        "model.gradient_checkpointing=true",
    )
    save_config(cfg, tmp_path / "cfg.yaml")
    rank0, rank1 = _torchrun(tmp_path, 29521, timeout=300)
    assert [h["step"] for h in rank0["history"]] == [h["step"] for h in rank1["history"]] == [1, 2]
    for h0, h1 in zip(rank0["history"], rank1["history"]):
        # rank 1 never fills its batch: 1 + 2 top-up rounds; rank 0 joins each round (the gather is collective)
        assert h0["grpo/sampling_rounds"] == h1["grpo/sampling_rounds"] == 3
        # rank 1 filled its batch with constant groups (its own count); the zero-advantage share is the union's:
        # all of rank 1's completions (1.0), none of rank 0's, logged alike on both ranks
        assert h1["grpo/dropped_groups"] == 6 and h0["grpo/zero_adv_frac"] == h1["grpo/zero_adv_frac"] == 0.5


def test_zero3_with_a_trainable_tower_and_a_kl_term_trains_on_two_ranks(tmp_path, tiny_model_dir):
    """beta > 0 with the tower trained: the reference keeps a vision cache of its own, built and encoded under its
    gathered tower (its fingerprint read partitioned weights and raised before). Its KL is 0 at the first step (the
    reference is the initial policy) and the tower moves. Rank 1's micro-batch holds a video beside an image, rank
    0's images only (#60 item 5): the update encodes images and videos in one tower call, so both ranks gather the
    tower's shards alike (two calls on rank 1 against one on rank 0 left the ranks' collectives unpaired)."""
    import json

    from vlgrpo.data.synth import synth_dataset

    pytest.importorskip("deepspeed")
    data = tmp_path / "data"
    synth_dataset(data, 30, seed=3, image_size=64, kinds=("count", "motion"))
    rows = [json.loads(x) for x in (data / "train.jsonl").read_text().splitlines()]
    images, videos = [r for r in rows if "video" not in r], [r for r in rows if "video" in r]
    # unshuffled, rank r draws rows r, r + 2, ...: rank 0 rows 0 and 2 (images), rank 1 rows 1 and 3 (image, video)
    order = [images[0], images[1], images[2], videos[0], *images[3:], *videos[1:]]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in order))
    _config(
        tmp_path,
        tiny_model_dir,
        data,
        "train.backend=zero3",
        "grpo.beta=0.04",
        "model.freeze_vision=false",
        "model.freeze_merger=false",
        "train.lr=1e-2",
        "train.save_every=0",
        "data.shuffle=false",
        "data.video.max_pixels=50176",
        "data.video.fps=4.0",
        "train.micro_batch_completions=8",  # one micro-batch of both prompts on each rank
        "train.fault_timeout_s=30",
        "train.dist_timeout_s=60",
    )
    ranks = _torchrun(tmp_path, 29524)
    for rank in ranks:
        kls = [h["grpo/kl"] for h in rank["history"]]
        assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 0, kls
    exported = load_model(str(tmp_path / "export")).model.state_dict()
    base = load_model(tiny_model_dir()).model.state_dict()
    assert any(not torch.equal(exported[n], base[n]) for n in base if ".visual.blocks." in f".{n}")


def test_zero3_refuses_a_persistence_threshold_that_would_partition_qwen3_5s_gated_delta_vectors(tiny_model_dir):
    pytest.importorskip("deepspeed")
    from vlgrpo.trainer.zero3 import register_linear_attention_parameters

    model = load_model(tiny_model_dir("qwen3_5")).model  # A_log and dt_bias: 4 entries each (one per value head)
    with pytest.raises(ValueError, match="stage3_param_persistence_threshold=3 partitions.*at least 4"):
        register_linear_attention_parameters(model, {"zero_optimization": {"stage3_param_persistence_threshold": 3}})
    assert register_linear_attention_parameters(load_model(tiny_model_dir("qwen2_5_vl")).model, {}) == 0
