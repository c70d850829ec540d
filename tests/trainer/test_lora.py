import pytest
import torch
from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.data.adapters import load_samples
from vlgrpo.families import family
from vlgrpo.models import load_model
from vlgrpo.policy.decode_weights import decode_weights
from vlgrpo.policy.text_decoder import fuse_attention
from vlgrpo.tiny import TinySpec, init_tiny
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.lora import target_regex
from vlgrpo.trainer.state import build_state


def _lora_state(tmp_path, tiny_model_dir, shapes_dir, *extra):
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        "train.backend=lora",
        "train.lora.rank=4",
        f"reward.recipe={{'{spec}': 1.0}}",
        *extra,
    )
    return build_state(cfg, progress=False)


def test_adapters_only_on_language_linears():
    pattern = target_regex(["q_proj", "gate_proj"])
    import re

    assert re.fullmatch(pattern, "model.language_model.layers.0.self_attn.q_proj")
    assert re.fullmatch(pattern, "model.language_model.layers.3.mlp.gate_proj")
    assert not re.fullmatch(pattern, "model.visual.blocks.0.mlp.gate_proj")  # Qwen2.5-VL's ViT has gate_proj too
    assert re.fullmatch(target_regex(["visual.merger.mlp.0"]), "model.visual.merger.mlp.0")


def test_reference_logprobs_equal_the_base_model(tmp_path, tiny_model_dir, shapes_dir):
    state = _lora_state(tmp_path, tiny_model_dir, shapes_dir, "grpo.beta=0.04")
    names = [n for n, p in state.backend.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n and ".visual." not in n for n in names)
    torch.manual_seed(1)
    for n, p in state.backend.model.named_parameters():
        if "lora_B" in n:  # peft starts B at zero; move it so the adapter changes the policy
            p.data.normal_(0, 0.3)
    trainer = Trainer(state)
    samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
    feats = state.cache.get([s.image for s in samples])
    batch = trainer._collate(state.engine.generate(samples, state.sampling_for(0)), feats)
    with state.backend.reference() as ref:
        ref_logp = trainer._logprobs(ref, batch)
    policy_logp = trainer._logprobs(state.backend.model, batch)
    base_logp = trainer._logprobs(load_model(tiny_model_dir()).model, batch)
    mask = batch.loss_mask.bool()
    assert torch.allclose(ref_logp[mask], base_logp[mask], atol=1e-5)
    assert (policy_logp[mask] - base_logp[mask]).abs().max() > 1e-2
    state.close()


def test_lora_training_and_merged_export(tmp_path, tiny_model_dir, shapes_dir):
    state = _lora_state(tmp_path, tiny_model_dir, shapes_dir, "train.lr=1e-2")
    base = {n: p.detach().clone() for n, p in load_model(tiny_model_dir()).model.named_parameters()}
    Trainer(state).train()
    out = state.backend.export(tmp_path / "export", state.lm.processor)
    merged = dict(state.backend.named_weights())
    state.close()
    exported = load_model(str(out)).model
    changed = 0
    for n, p in exported.named_parameters():
        assert torch.allclose(p, merged[n], atol=1e-6), n
        changed += not torch.equal(p, base[n])
        if ".visual." in f".{n}":
            assert torch.equal(p, base[n]), n
    assert changed > 0 and (out / "adapter" / "adapter_config.json").is_file()


# Qwen3-VL: 7 linears in each of 4 layers. Qwen3.5: 3 Gated DeltaNet layers with 5 projections + 3 MLP linears, and
# a full-attention layer with 7
ADAPTED = {"qwen3_vl": 7 * 4, "qwen3_5": 3 * 8 + 7}
MODEL_CLASS = {"qwen3_vl": "Qwen3VLForConditionalGeneration", "qwen3_5": "Qwen3_5ForConditionalGeneration"}


@pytest.mark.parametrize("arch, tied", [("qwen3_vl", True), ("qwen3_vl", False), ("qwen3_5", True), ("qwen3_5", False)])
def test_qwen3_lora_trains_the_language_model_and_vlgrpo_export_merges_it(tmp_path, shapes_dir, arch, tied):
    """LoRA on a Qwen3-VL or Qwen3.5: adapters on the language model's linears only (the tower and Qwen3-VL's
    DeepStack mergers frozen; Qwen3.5's Gated DeltaNet projections adapted, its conv1d, A_log and dt_bias frozen);
    `vlgrpo export` writes the merged weights, which transformers loads as the model class equal to what trained,
    with the LM head tied to the embedding or not as built."""
    from transformers import AutoModelForImageTextToText

    from vlgrpo.cli import main

    model_dir = init_tiny(tmp_path / "m", arch, spec=TinySpec(tie_word_embeddings=tied))
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        str(model_dir),
        shapes_dir,
        tmp_path / "run",
        "train.backend=lora",
        "train.lora.rank=4",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.lr=1e-2",
        "grpo.beta=0.04",
    )
    state = build_state(cfg, progress=False)
    adapted = {
        n.split(".lora_A.")[0].removeprefix("base_model.model.")
        for n, p in state.backend.model.named_parameters()
        if ".lora_A." in n
    }
    assert all(p.requires_grad == ("lora_" in n) for n, p in state.backend.model.named_parameters())
    assert len(adapted) == ADAPTED[arch] and all(".language_model.layers." in n for n in adapted)
    if arch == "qwen3_5":
        assert {n.rsplit(".", 1)[1] for n in adapted if ".linear_attn." in n} == {
            "in_proj_qkv",
            "in_proj_z",
            "in_proj_b",
            "in_proj_a",
            "out_proj",
        }
    Trainer(state).train()
    trained = dict(state.backend.named_weights())
    state.close()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")]) == 0
    exported = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "export"))
    assert type(exported).__name__ == MODEL_CLASS[arch]
    assert exported.config.architectures == [MODEL_CLASS[arch]]
    base = load_model(str(model_dir)).model.state_dict()
    weights = exported.state_dict()
    assert set(weights) == set(trained)
    for n, w in weights.items():
        assert torch.equal(w, trained[n]), n  # the merged weights, exactly
        if ".visual." in f".{n}" or "norm" in n or any(k in n for k in ("conv1d", "A_log", "dt_bias")):
            assert torch.equal(w, base[n]), n  # no adapter: the tower, DeepStack mergers, norms, conv1d unchanged
    assert all(not torch.equal(weights[f"{n}.weight"], base[f"{n}.weight"]) for n in adapted)  # trained
    embed, head = exported.model.language_model.embed_tokens.weight, exported.lm_head.weight
    assert (head.data_ptr() == embed.data_ptr()) == tied
    assert torch.equal(head, base["lm_head.weight"])  # untied: the base's own head, not the embedding
    assert torch.equal(embed, base["model.language_model.embed_tokens.weight"])


def test_bf16_split_lora_never_writes_the_base_weights(tmp_path, tiny_model_dir, shapes_dir):
    """50 bf16 LoRA steps with the engine in a split worker (a weight sync after every step): the trainer's base
    weights, which are also the reference policy and half of the export, are bit for bit those it loaded. peft's
    merge/unmerge round trip at each sync moved them (in bf16, W + dW - dW != W)."""
    state = _lora_state(
        tmp_path,
        tiny_model_dir,
        shapes_dir,
        "model.dtype=bfloat16",
        "rollout.placement=split",
        "rollout.max_staleness=0",
        "train.lr=5e-2",
        "train.steps=50",
        "train.save_every=0",
    )
    base = load_model(tiny_model_dir(), dtype="bfloat16").model.state_dict()
    history = Trainer(state).train()
    trained = {n.replace(".base_layer.", "."): p for n, p in state.backend._peft.get_base_model().state_dict().items()}
    synced = dict(state.backend.named_weights())
    state.close()
    assert len(history) == 50
    lora_bases = [n for n in trained if "lora_" not in n and n in base]
    assert all(torch.equal(trained[n], base[n]) for n in lora_bases), [
        n for n in lora_bases if not torch.equal(trained[n], base[n])
    ][:5]
    # and the adapter trained: the synced (merged) weights left the base
    assert sum(not torch.equal(synced[n], base[n]) for n in base) >= 10


def test_the_hf_engine_decodes_fp32_lora_merged_with_peft_s_log_probs(tmp_path, tiny_model_dir, shapes_dir):
    """In the HF engine's decode loop (`policy.decode_weights`) every language LoRA layer runs one product with its
    merged weight (no adapter product, the base untouched), the prefill before it peft's path; the rollout's log-probs
    equal the trainer's (peft's path) to fp32 rounding; after, peft's path is back."""
    state = _lora_state(tmp_path, tiny_model_dir, shapes_dir, "train.lora.target_modules=[q_proj,v_proj,down_proj]")
    torch.manual_seed(1)
    for n, p in state.backend.model.named_parameters():
        if "lora_B" in n:  # an adapter that moves the policy
            p.data.normal_(0, 0.3)
    model = state.backend.model
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer" in n}
    calls = []
    for n, m in model.named_modules():
        if "lora_A" in n:
            m.register_forward_hook(lambda *_: calls.append(1))
    samples = load_samples(shapes_dir / "train.jsonl").samples[:2]
    feats = state.cache.get([s.image for s in samples])
    attn = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn") and "visual" not in n)
    with decode_weights(state.engine.model):  # what the engine's decode loop runs in
        assert fuse_attention(attn) is not None  # merged, the layers are plain linear maps: the decode fuses q/k/v
    assert fuse_attention(attn) is None  # peft's path: its layers must be called
    adapters = sum(n.endswith("lora_A.default") for n, _ in model.named_modules())
    with state.backend.rollout_weights():
        groups = state.engine.generate(samples, state.sampling_for(0))
    assert len(calls) == adapters  # the prefill's, once per adapter (peft's path: the update can take its graph);
    # the decode's steps ran none, the merged weights did
    for n, p in model.named_parameters():
        if "base_layer" in n:
            assert torch.equal(p, base[n]), n
    trainer = Trainer(state)
    batch = trainer._collate(groups, feats)
    trainer_logp = trainer._logprobs(model, batch)
    assert len(calls) > adapters  # the trainer's pass: peft's path
    engine_logp = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(c.logprobs) for g in groups for c in g.completions], batch_first=True
    )
    mask = batch.loss_mask.bool()
    gap = (trainer_logp[mask] - engine_logp[mask]).abs().max()
    assert 0 < gap < 1e-4, gap  # merged differs from peft's three products by fp32 rounding only
    state.close()


@pytest.mark.parametrize("arch", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_moe_lora_on_the_experts_exports_a_model_that_computes_what_trained(tmp_path, shapes_dir, arch):
    """train.lora.experts: adapters on every expert's fused weights (rank r per expert) beside the attention's; the
    export loads as the released MoE class, its weights the merged ones, and its logits are the peft model's."""
    from vlgrpo.cli import main

    model_dir = init_tiny(tmp_path / "m", arch)
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        str(model_dir),
        shapes_dir,
        tmp_path / "run",
        "train.backend=lora",
        "train.lora.rank=4",
        "train.lora.experts=true",
        f"reward.recipe={{'{spec}': 1.0}}",
        "train.lr=1e-2",
    )
    state = build_state(cfg, progress=False)
    trainable = [n for n, p in state.backend.model.named_parameters() if p.requires_grad]
    experts = [n for n in trainable if ".mlp.experts." in n]
    assert len(experts) == 4 * 2 * 2  # 4 layers x (gate_up_proj, down_proj) x (A, B)
    Trainer(state).train()
    ids = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        peft_logits = state.backend.model.eval()(input_ids=ids).logits
    state.close()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")]) == 0
    exported = load_model(str(tmp_path / "export")).model
    assert type(exported).__name__ == exported.config.architectures[0] == family(arch).model_class
    base = load_model(str(model_dir)).model.state_dict()
    moved = {n for n, w in exported.state_dict().items() if not torch.equal(w, base[n])}
    assert {n for n in moved if ".mlp.experts." in n} == {
        f"model.language_model.layers.{i}.mlp.experts.{w}" for i in range(4) for w in ("gate_up_proj", "down_proj")
    }
    with torch.no_grad():
        assert (exported(input_ids=ids).logits - peft_logits).abs().max() < 1e-4  # W + BA merged: fp32 rounding
