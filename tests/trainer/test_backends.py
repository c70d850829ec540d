"""The freeze switches on Qwen3-VL's module names: the DeepStack mergers are mergers (`model.freeze_merger`), the ViT
blocks and the patch and position embeddings are the tower (`model.freeze_vision`)."""

import pytest
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


def test_a_bf16_step_at_lr_1e_6_moves_the_weights_as_the_fp32_step_does(tmp_path, tiny_model_dir, shapes_dir):
    """The plain backend steps fp32 master copies of bf16 weights: one AdamW step at lr 1e-6 (below half an ulp of
    most bf16 weights) moves the masters as the fp32 run moves its weights, and the model holds the result rounded
    once. Stepping the bf16 weights themselves rounded nearly every update away."""
    from vlgrpo.data.adapters import load_samples

    start = load_model(tiny_model_dir()).model  # weights bf16 can hold exactly: both runs start from the same values
    with torch.no_grad():
        for p in start.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    start.save_pretrained(tmp_path / "start")
    load_model(tiny_model_dir()).processor.save_pretrained(tmp_path / "start")
    spec = write_reward_module(tmp_path)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = tiny_config(
            str(tmp_path / "start"),
            shapes_dir,
            tmp_path / dtype,
            f"reward.recipe={{'{spec}': 1.0}}",
            f"model.dtype={dtype}",
            "train.lr=1e-6",
            "train.weight_decay=0",
        )
        runs[dtype] = build_state(cfg, progress=False)
    samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
    groups = runs["float32"].engine.generate(samples, runs["float32"].sampling_for(0))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    moved = {}
    for dtype, state in runs.items():
        trainer = Trainer(state)
        batch = trainer._collate(groups, state.cache.get([s.image for s in samples]))
        trainable = [(n, p) for n, p in state.backend.model.named_parameters() if p.requires_grad]
        before = {n: p.detach().double().clone() for n, p in trainable}
        trainer._update(batch, advantages, None, None)
        weights = dict(zip([n for n, _ in trainable], state.backend.master.stepped))  # fp32: the weights themselves
        for n, p in trainable:  # the model holds the master's value rounded once
            assert p.dtype == getattr(torch, dtype) and torch.equal(p.detach(), weights[n].detach().to(p.dtype)), n
        moved[dtype] = {n: weights[n].detach().double() - before[n] for n in before}
        model_moved = sum(int((p.detach().double() != before[n]).sum()) for n, p in trainable)
        moved[f"{dtype} model"] = model_moved / sum(p.numel() for _, p in trainable)
        state.close()
    a = torch.cat([d.flatten() for d in moved["float32"].values()])
    b = torch.cat([d.flatten() for d in moved["bfloat16"].values()])
    assert a.abs().mean() > 5e-7  # AdamW's first step: ~lr per weight
    assert float(b.abs().mean() / a.abs().mean()) == pytest.approx(1.0, abs=0.05)  # as far as the fp32 step
    assert float((torch.sign(a) == torch.sign(b)).double().mean()) > 0.9  # and the same way
    assert moved["float32 model"] > 0.9 and moved["bfloat16 model"] < 0.2  # bf16 itself keeps few of them


def test_16_bit_gradients_are_summed_in_fp32_over_the_micro_batches():
    """#60 item 8: each backward's bf16 gradient goes onto the fp32 master copy's gradient at once, so a step's 16
    micro-batches sum in fp32 (and the ranks all-reduce fp32 sums): equal to the exact sum of the 16 backwards' own
    gradients up to fp32 rounding. Left to accumulate in the bf16 `.grad`, as before, each partial sum was rounded to
    bf16's 8-bit mantissa (up to 2^-9 relative per add)."""
    from vlgrpo.trainer.backends import MasterWeights

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 64).to(torch.bfloat16))
    xs = [torch.randn(8, 64).to(torch.bfloat16) for _ in range(16)]
    master, exact = MasterWeights([w]), torch.zeros(64, 64, dtype=torch.float64)
    for x in xs:
        (x @ w).float().pow(2).mean().backward()
        exact += w.grad.double()  # this backward's own gradient
        master.accumulate()
        assert w.grad is None  # freed: the next backward starts a new one
    rel = lambda g: float((g.double() - exact).norm() / exact.norm())  # noqa: E731
    summed_fp32 = rel(master.copies[0].grad)
    for x in xs:  # the old way: the bf16 .grad accumulates over the backwards
        (x @ w).float().pow(2).mean().backward()
    summed_bf16 = rel(w.grad)
    print(f"relative error of the summed gradient: fp32 {summed_fp32:.1e}, bf16 {summed_bf16:.1e}")
    assert summed_fp32 < 1e-6 and summed_bf16 > 3e-4


def test_fp16_is_refused_where_no_loss_scaler_runs(tiny_model_dir, shapes_dir, tmp_path):
    """#60 item 8: the plain and LoRA backends have no loss scaler; fp16 would flush small gradients to 0 silently."""
    from vlgrpo.config import ConfigError
    from vlgrpo.trainer.state import build_state

    for backend in ("plain", "lora"):
        cfg = tiny_config(
            tiny_model_dir(), shapes_dir, tmp_path / backend, "model.dtype=float16", f"train.backend={backend}"
        )
        with pytest.raises(
            ConfigError, match=f"model.dtype=float16 with train.backend={backend}: this backend has no loss"
        ):
            build_state(cfg, progress=False)
