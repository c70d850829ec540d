"""The freeze switches on Qwen3-VL's module names: the DeepStack mergers are mergers (`model.freeze_merger`), the ViT
blocks and the patch and position embeddings are the tower (`model.freeze_vision`)."""

import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.models import load_model
from vlgrpo.trainer.backends import apply_freeze, part_of
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


def test_qwen3_vl_parameters_are_sorted_into_tower_mergers_and_language_model(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen3_vl")).model
    parts = {n: part_of(n) for n, _ in model.named_parameters()}
    assert {n for n, p in parts.items() if p == "merger"} == {
        n for n in parts if n.startswith(("model.visual.merger.", "model.visual.deepstack_merger_list."))
    }
    tower = ("model.visual.blocks.", "model.visual.patch_embed.", "model.visual.pos_embed.")
    assert {n for n, p in parts.items() if p == "vision"} == {n for n in parts if n.startswith(tower)}
    counts = apply_freeze(model, True, True, False)  # the defaults: the whole `visual` frozen, DeepStack included
    assert counts["vision"] == counts["merger"] == 0
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".visual." in f".{n}")


def test_a_qwen3_vl_step_with_trainable_mergers_moves_them_and_leaves_the_tower(tmp_path, tiny_model_dir, shapes_dir):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir("qwen3_vl"),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "model.freeze_merger=false",
        "model.freeze_language=true",
        "train.steps=1",
    )
    state = build_state(cfg, progress=False)
    model = state.backend.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    mergers = sum(p.numel() for n, p in model.named_parameters() if part_of(n) == "merger")
    assert state.backend.trainable_counts == {"vision": 0, "merger": mergers, "language": 0}
    Trainer(state).train()
    moved = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    state.close()
    assert all(part_of(n) == "merger" for n in moved)  # the tower and the language model stayed
    for prefix in (
        "model.visual.merger.",
        "model.visual.deepstack_merger_list.0.",
        "model.visual.deepstack_merger_list.1.",
    ):
        assert any(n.startswith(prefix) for n in moved), prefix
