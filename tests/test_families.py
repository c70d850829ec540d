"""One table of family facts (`vlgrpo.families`) and one function that tells a loaded model's or processor's family
(`family_of`); what the table says agrees with the objects themselves (classes, patch size, layers, the rope index that
takes seconds), and the modules that need a family fact read it there."""

import inspect

import pytest

from vlgrpo.families import FAMILIES, arch_by_name, family, family_of, is_gated_deltanet
from vlgrpo.models import load_model
from vlgrpo.policy.prefill import core_model


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_the_family_of_a_model_and_of_its_processor_is_its_arch(tiny_model_dir, arch):
    lm = load_model(tiny_model_dir(arch))
    assert family_of(lm.model) == family_of(lm.model.config) == family(arch)
    by_processor = family_of(lm.processor)  # Qwen3.5 ships Qwen3-VL's processor: the same video conventions
    assert (by_processor.video_timestamps, by_processor.patch_size) == (
        family(arch).video_timestamps,
        family(arch).patch_size,
    )
    # the objects' own behaviour: only Qwen2.5-VL's rope index takes seconds per temporal patch
    takes_seconds = "second_per_grid_ts" in inspect.signature(core_model(lm.model).get_rope_index).parameters
    assert family_of(core_model(lm.model).config).video_seconds == takes_seconds


def test_anything_else_is_refused_by_name():
    with pytest.raises(ValueError, match="cannot tell the model family of a dict.*accepted: models and configs of"):
        family_of({})
    with pytest.raises(ValueError, match="model arch 'llama' is not supported; accepted: qwen2_vl, .*qwen3_5_moe"):
        family("llama")


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_each_row_is_what_the_tiny_model_of_its_family_is(tiny_model_dir, arch):
    fam = family(arch)
    lm = load_model(tiny_model_dir(arch))
    model, processor = lm.model, lm.processor
    assert (type(model).__name__, type(processor).__name__, type(model.config).__name__) == (
        fam.model_class,
        fam.processor_class,
        fam.config_class,
    )
    assert processor.image_processor.patch_size == model.config.vision_config.patch_size == fam.patch_size
    assert hasattr(model.config.vision_config, "deepstack_visual_indexes") == fam.deepstack
    block = core_model(model).visual.blocks[0]
    assert hasattr(block.mlp, "gate_proj") == fam.vision_swiglu  # SwiGLU (Qwen2.5-VL) or fc1/fc2
    layers = model.get_decoder().layers
    attn = next(layer.self_attn for layer in layers if not is_gated_deltanet(layer))
    assert hasattr(attn, "q_norm") == fam.qwen3
    heads = model.config.get_text_config().num_attention_heads
    assert (attn.q_proj.out_features == 2 * heads * attn.head_dim) == fam.gated_attention
    # one test of a Gated DeltaNet layer, over the layer modules and over the config's layer_types alike
    linear = [is_gated_deltanet(layer) for layer in layers]
    assert any(linear) == fam.hybrid_attention
    if fam.hybrid_attention:
        assert (
            linear
            == [is_gated_deltanet(t) for t in model.config.get_text_config().layer_types]
            == [True, True, True, False]
        )


def test_the_modules_read_the_table():
    from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry, checkpoint_geometry, released_geometry
    from vlgrpo.memory.models import MODEL_TABLE
    from vlgrpo.policy import packed, text_decoder
    from vlgrpo.registry import MODEL_ARCH
    from vlgrpo.rewards.boxes import box_format_for_arch
    from vlgrpo.rollout import decode
    from vlgrpo.trainer import zero3

    for arch, fam in FAMILIES.items():
        assert MODEL_ARCH.load(arch) is fam  # the classes vlgrpo.models loads
        assert box_format_for_arch(arch) == fam.box_format
        released = ProcessorGeometry(patch_size=fam.patch_size, min_pixels=fam.min_pixels, max_pixels=fam.max_pixels)
        assert released_geometry(arch) == released == checkpoint_geometry("Qwen/not-local", arch=arch)[0]
    assert DEFAULT_GEOMETRY == released_geometry("qwen2_5_vl") == released_geometry("qwen2_vl")
    assert (released_geometry("qwen3_5").factor, released_geometry("qwen3_5").max_pixels) == (32, 16384 * 32 * 32)
    for spec in MODEL_TABLE.values():  # the planner's formulas branch on the same traits
        assert spec.traits is FAMILIES[spec.family] and spec.patch == FAMILIES[spec.family].patch_size
        assert (spec.linear_layers > 0) == spec.traits.hybrid_attention == spec.gated_attention
    # ZeRO-3, the packed pass, the decode step and the planner share one Gated DeltaNet test
    assert packed.is_gated_deltanet is decode.is_gated_deltanet is text_decoder.is_gated_deltanet is is_gated_deltanet
    assert zero3.is_gated_deltanet is is_gated_deltanet


@pytest.mark.parametrize(
    "name, arch",
    [
        ("Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe"),
        ("qwen3-vl-30b-a3b", "qwen3_vl_moe"),
        ("Qwen/Qwen3-VL-235B-A22B-Thinking", "qwen3_vl_moe"),
        ("Qwen/Qwen3-VL-8B-Instruct", "qwen3_vl"),
        ("Qwen/Qwen2.5-VL-72B-Instruct-AWQ", "qwen2_5_vl"),
        ("meta-llama/Llama-3-8B", None),
    ],
)
def test_a_hub_name_names_its_arch_mixture_of_experts_by_one_rule(name, arch):
    from vlgrpo.models import detect_arch

    assert arch_by_name(name) == arch
    if arch is not None:
        assert detect_arch(name) == arch
