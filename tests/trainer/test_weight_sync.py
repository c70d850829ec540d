"""The weights a rollout engine holds after every sync equal the trainer's, bit for bit: the split worker's copy after
buckets over the pair's process group (full fine-tune, and LoRA's merged weights), and only what changes is sent."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.models import is_visual
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


@pytest.mark.parametrize("backend", ["plain", "lora"])
def test_the_split_workers_weights_equal_the_trainers_after_every_sync(tmp_path, tiny_model_dir, shapes_dir, backend):
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{write_reward_module(tmp_path)}': 1.0}}",
        f"train.backend={backend}",
        "train.lr=1e-2",
        "train.steps=3",
        "rollout.placement=split",
        "rollout.max_staleness=0",
        "rollout.sync_bucket_mb=0.25",  # several buckets on the tiny model
    )
    state = build_state(cfg, progress=False)
    try:
        trainer = Trainer(state)
        base = {n: t.clone() for n, t in state.backend.named_weights()}
        plan = state.sync_plan
        sent = {n for b in plan for n in b.names}
        for _ in range(3):
            metrics = trainer.grpo_step()
            ours, theirs = dict(state.backend.named_weights()), state.engine.worker_weights()
            unequal = [n for n, t in ours.items() if not torch.equal(theirs[n], t)]
            assert unequal == [], f"step {state.step}: {len(unequal)} tensors differ, e.g. {unequal[:3]}"
            assert metrics["sync/buckets"] == len(plan) > 1
            assert metrics["sync/bytes"] == sum(b.payload for b in plan)
            assert metrics["sync/tensors"] == len(sent)
        changed = {n for n, t in ours.items() if not torch.equal(base[n], t)}
        assert state.lm.model.config.tie_word_embeddings  # the tied head moves with the embedding, in both copies
        assert changed and changed - {"lm_head.weight"} <= sent  # every weight that moved was sent
        assert not any(is_visual(n) for n in sent)  # the frozen tower never travels
        if backend == "lora":  # the merged layers and their siblings, not the embeddings, norms or the tower
            assert not any("embed_tokens" in n or n.endswith("norm.weight") for n in sent)
            assert metrics["sync/bytes"] < 0.8 * sum(t.numel() * t.element_size() for t in ours.values())
    finally:
        state.close()
