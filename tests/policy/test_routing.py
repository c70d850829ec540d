"""Mixture-of-experts routing: recorded at rollout, replayed (R3) or compared by the trainer's passes."""

import pytest
import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.config.schema import ConfigError
from vlgrpo.data.adapters import load_samples
from vlgrpo.policy.routing import BatchRouting, control_of, load_balance, mismatch
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

MOE = ["qwen3_vl_moe", "qwen3_5_moe"]


def spread_experts(model, scale: float, seed: int = 3) -> None:
    """Seeded noise on every language weight, the experts' 3-D ones too, so each expert computes something else."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".visual." not in f".{name}" and p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def near_ties(model, gap: float = 1e-6) -> None:
    """Routers whose second choice is a near tie for every token: expert 0 first by far, experts 1 and 2 apart by
    `gap` (relative) of their logit, expert 3 last; and expert 2 the negative of expert 1, scaled up 8 times (expert 0
    takes most of the weight), so a token routed to the other one comes out far apart. The rollout's decode step and
    the trainer's packed pass round a token's hidden state differently (different attention kernels), which breaks
    such a tie one way or the other."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            router, experts = layer.mlp.gate, layer.mlp.experts
            u = torch.randn(router.weight.shape[1], generator=gen)
            v = torch.randn(router.weight.shape[1], generator=gen)
            router.weight[0] = 4 * u
            router.weight[1] = v
            router.weight[2] = v * (1 + gap)
            router.weight[3] = -4 * u
            experts.down_proj[1] *= 8
            experts.gate_up_proj[2] = experts.gate_up_proj[1]
            experts.down_proj[2] = -experts.down_proj[1]


def _state(tmp_path, model_dir, shapes_dir, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        model_dir,
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        "rollout.max_new_tokens=12",
        "rollout.completions_per_prompt=4",
        "train.micro_batch_completions=8",
        *extra,
    )
    return build_state(cfg, progress=False)


def test_mismatch_and_load_balance_on_known_routings():
    a = torch.tensor([[[0, 1], [2, 3]], [[1, 0], [0, 2]]])  # 2 tokens x 2 layers x top-2
    b = torch.tensor([[[1, 0], [2, 1]], [[1, 0], [0, 3]]])  # same set, differs, same set, differs
    assert mismatch(a, b) == (2.0, 4.0)
    assert mismatch(a, b, torch.tensor([True, False])) == (1.0, 2.0)
    # layer 0 routes experts 0, 1, 1, 0 (4 experts: counts 2, 2, 0, 0 -> max / mean 2 / 1); layer 1 2, 3, 0, 2 (1, 0,
    # 2, 1 -> 2 / 1)
    assert load_balance(a, 4) == (2.0, 2.0)
    c = torch.tensor([[[0, 1]], [[2, 3]]])  # one layer, every expert once: 1.0
    assert load_balance(c, 4) == (1.0, 1.0)


def test_the_aux_loss_is_transformers_load_balancing_loss_per_layer():
    """One layer: equal to transformers' own `load_balancing_loss_func` on the router logits (its top-k chosen
    there); several: the mean of each layer's; a perfect balance gives k."""
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 4, generator=gen)  # 2 layers x 6 tokens x 4 experts
    probs = logits.softmax(-1)
    top = probs.topk(2, dim=-1).indices
    for layer in (0, 1):
        r = BatchRouting(None, None, False, 1.0)
        r.aux_terms.append((probs[layer][:, None], top[layer][:, None]))
        want = load_balancing_loss_func((logits[layer],), num_experts=4, top_k=2)
        assert torch.allclose(r.aux_loss(), want, atol=1e-6) and r.aux_terms == []
    both = BatchRouting(None, None, False, 1.0)
    both.aux_terms += [(probs[:, :3].transpose(0, 1), top[:, :3].transpose(0, 1))]  # two calls, 3 tokens each
    both.aux_terms += [(probs[:, 3:].transpose(0, 1), top[:, 3:].transpose(0, 1))]
    per_layer = [load_balancing_loss_func((logits[i],), num_experts=4, top_k=2) for i in (0, 1)]
    assert torch.allclose(both.aux_loss(), torch.stack(per_layer).mean(), atol=1e-6)
    even = BatchRouting(None, None, False, 1.0)
    even.aux_terms.append((torch.full((2, 1, 4), 0.25), torch.tensor([[[0, 1]], [[2, 3]]])))
    assert float(even.aux_loss()) == pytest.approx(2.0)  # k


@pytest.mark.parametrize("arch", MOE)
def test_recording_or_replaying_the_routers_own_choice_changes_no_logit(tiny_model_dir, arch, load):
    model, _ = load(arch)
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        control = control_of(model)
        with control.call() as record:
            recorded = model(input_ids=ids).logits
        own = record.own()
        assert own.shape == (18, control.layers, control.top_k)
        with control.call(own) as again:
            replayed = model(input_ids=ids).logits
        other = own.flip(-1).roll(1, dims=0)  # other experts for most tokens
        with control.call(other):
            forced = model(input_ids=ids).logits
    assert torch.equal(plain, recorded) and torch.equal(plain, replayed)
    assert torch.equal(again.own(), own)
    assert (forced - plain).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"routes through \d+ MoE layers with top-2"):
        with control.call(own[:, :1]):
            pass


@pytest.mark.parametrize("arch", MOE)
def test_replay_gives_the_update_the_rollouts_log_probs_where_near_ties_flip(
    tmp_path, tiny_model_dir, shapes_dir, arch
):
    """A policy whose routers are near ties: the rollout (shared-prefix decode, one token per row) and the update's
    packed pass route some tokens to different experts. Replaying the rollout's experts gives the update the
    rollout's log-probs to the layout's rounding; routing afresh, the flipped tokens' log-probs move 100 times more."""
    gaps = {}
    for replay in ("rollout", "off"):
        state = _state(tmp_path / replay, tiny_model_dir(arch), shapes_dir, f"train.routing_replay={replay}")
        model = state.backend.model
        spread_experts(model, 0.05)
        near_ties(model)
        trainer = Trainer(state)
        samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
        feats = state.cache.get([s.image for s in samples])
        groups = state.engine.generate(samples, state.sampling_for(0))
        batch = trainer._collate(groups, feats)
        assert batch.batch.routing is not None and batch.batch.routing.replay == (replay == "rollout")
        trainer_logp = trainer._logprobs(model, batch)
        engine_logp = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(c.logprobs) for g in groups for c in g.completions], batch_first=True
        )
        mask = batch.loss_mask.bool()
        own, recorded, _ = (torch.cat([o[i] for o in batch.batch.routing.observed]) for i in range(3))
        differ, decisions = mismatch(own, recorded)
        gaps[replay] = (float((trainer_logp[mask] - engine_logp[mask]).abs().max()), differ, decisions)
        state.close()
    replayed, fresh = gaps["rollout"], gaps["off"]
    assert replayed[1] > 0 and fresh[1] > 0, gaps  # the ties did flip, in both runs (the same rollout)
    # the bound: the decode step and the packed pass round these models' log-probs apart by up to ~4e-5 with no
    # routing difference at all (routers far from ties: 3.6e-5 Qwen3-VL-MoE, 2.0e-5 Qwen3.5-MoE, AVX2); replayed,
    # 6e-6 / 1.7e-5 (AVX2) and 1.2e-5 / 1.9e-5 (SSE4.1 kernels); routed afresh, 0.038 / 0.25 and 0.0033 / 0.12
    assert replayed[0] <= 5e-5, gaps
    assert fresh[0] > 1e-3 and fresh[0] > 100 * replayed[0], gaps


@pytest.mark.parametrize("arch", MOE)
def test_a_lora_grpo_run_with_routing_replay_reports_the_routing_metrics(tmp_path, tiny_model_dir, shapes_dir, arch):
    state = _state(
        tmp_path,
        tiny_model_dir(arch),
        shapes_dir,
        "train.backend=lora",
        "train.routing_replay=rollout",
        "train.steps=3",
    )
    trainer = Trainer(state)
    for _ in range(3):
        metrics = trainer.step_fn()
        assert 0.0 <= metrics["moe/routing_mismatch"] <= 1.0
        assert 1.0 <= metrics["moe/load_max_over_mean"] <= metrics["moe/load_max_over_mean_worst"] <= 2.0  # E/k = 2
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    state.close()


def test_the_aux_loss_enters_the_update_and_moves_the_routers(tmp_path, tiny_model_dir, shapes_dir):
    """train.router_aux_loss_coef > 0: `moe/aux_loss` logged, and the routers' weights after one step differ from a
    run without it (same seed, same rollout)."""
    routers = {}
    for coef in (0.0, 5.0):
        state = _state(
            tmp_path / str(coef), tiny_model_dir("qwen3_vl_moe"), shapes_dir, f"train.router_aux_loss_coef={coef}"
        )
        metrics = Trainer(state).step_fn()
        assert ("moe/aux_loss" in metrics) == (coef > 0)
        if coef:
            assert 1.0 < metrics["moe/aux_loss"] < 4.0  # k = 2 at a perfect balance, E = 4 at the worst
        routers[coef] = torch.cat([r.weight.detach().flatten() for r in control_of(state.backend.model).routers])
        state.close()
    assert not torch.equal(routers[0.0], routers[5.0])


@pytest.mark.parametrize(
    "extra, why",
    [
        (["rollout.engine=vllm"], "rollout.engine=vllm"),
        (["rollout.tools=[zoom_in]", "rollout.max_turns=2"], "rollout.tools"),
        (["rollout.placement=split"], "rollout.placement=split"),
    ],
)
def test_routing_replay_is_refused_where_no_rollout_routing_comes_back(tmp_path, shapes_dir, extra, why):
    with pytest.raises(ConfigError, match=f"train.routing_replay=rollout does not run with {why}"):
        tiny_config("m", shapes_dir, tmp_path, "train.routing_replay=rollout", *extra)


def test_yaml_off_is_the_off_setting(tmp_path, shapes_dir):
    assert tiny_config("m", shapes_dir, tmp_path, "train.routing_replay=off").train.routing_replay == "off"


def test_a_negative_aux_loss_weight_is_refused(tmp_path, shapes_dir):
    with pytest.raises(ConfigError, match=r"train.router_aux_loss_coef' must be >= 0 \(0: off\)"):
        tiny_config("m", shapes_dir, tmp_path, "train.router_aux_loss_coef=-0.01")


def test_only_the_shared_prefix_decode_records_routing(tiny_model_dir, load, samples):
    """A custom decode (the transformers forward) routes without recording: its groups carry no routing, so a batch
    of them is never replayed with padding for experts."""
    from vlgrpo.rollout.base import SamplingParams
    from vlgrpo.rollout.hf import HFEngine, decode_copied
    from vlgrpo.vision_cache import VisionCache

    model, processor = load("qwen3_vl_moe", spread_by=0.3)
    cache = VisionCache(model, processor)
    params = SamplingParams(completions_per_prompt=2, temperature=1.0, max_new_tokens=5, seed=0)
    shared = HFEngine(model, processor, cache).generate(samples[:2], params)
    copied = HFEngine(model, processor, cache, decode=decode_copied).generate(samples[:2], params)
    assert all(g.prompt_routing is not None and g.prompt_routing.shape[0] == len(g.prompt_ids) for g in shared)
    assert all(c.routing.shape[0] == len(c.token_ids) - 1 for g in shared for c in g.completions)
    assert all(g.prompt_routing is None and all(c.routing is None for c in g.completions) for g in copied)
