import json
import math

import pytest
import torch
from PIL import Image

from vlgrpo.cli import main
from vlgrpo.models import ModelLoadError, detect_arch, load_model, placeholder_token_ids


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_init_tiny_loads_back_and_generates_with_an_image(tmp_path, arch, capsys):
    out = tmp_path / arch
    assert main(["model", "init-tiny", "--arch", arch, "--out", str(out)]) == 0
    assert "parameters" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["model_type"] == arch
    lm = load_model(str(out))
    expected = {
        "qwen2_5_vl": "Qwen2_5_VLProcessor",
        "qwen2_vl": "Qwen2VLProcessor",
        "qwen3_vl": "Qwen3VLProcessor",
        "qwen3_5": "Qwen3VLProcessor",  # Qwen3.5's released processor is Qwen3-VL's
    }[arch]
    assert type(lm.processor).__name__ == expected  # not a bare tokenizer
    assert lm.processor.tokenizer.padding_side == "left"
    n_params = sum(p.numel() for p in lm.model.parameters())
    assert 500_000 < n_params < 5_000_000
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red shapes?"}]}]
    text = lm.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    opens = "<think>\n" if arch == "qwen3_5" else ""  # Qwen3.5's template opens the think block (thinking on)
    assert text.endswith("<|im_start|>assistant\n" + opens) and "<|vision_start|><|image_pad|><|vision_end|>" in text
    inputs = lm.processor(text=[text], images=[Image.new("RGB", (112, 112), (200, 0, 0))], return_tensors="pt")
    n_image_tokens = int((inputs["input_ids"] == lm.model.config.image_token_id).sum())
    assert n_image_tokens == 16  # 112 px -> 8x8 patches of 14 px (Qwen3-VL: 128 px, 16 px patches) -> 2x2 merge
    torch.manual_seed(0)
    bad = torch.tensor(placeholder_token_ids(lm.processor.tokenizer))
    out_ids = lm.model.generate(**inputs, max_new_tokens=6, do_sample=False, suppress_tokens=bad)
    assert out_ids.shape == (1, inputs["input_ids"].shape[1] + 6) or out_ids[0, -1] == lm.model.config.eos_token_id
    assert isinstance(lm.processor.decode(out_ids[0, inputs["input_ids"].shape[1] :]), str)


def test_placeholders_and_arch_detection(tiny_model_dir):
    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    ids = placeholder_token_ids(lm.processor.tokenizer)
    assert lm.model.config.image_token_id in ids and lm.model.config.vision_start_token_id in ids
    assert len(ids) == 5
    assert detect_arch("Qwen/Qwen2.5-VL-7B-Instruct") == "qwen2_5_vl"
    assert detect_arch("Qwen/Qwen2-VL-2B-Instruct") == "qwen2_vl"
    assert detect_arch("Qwen/Qwen3-VL-8B-Instruct") == "qwen3_vl"
    assert detect_arch("Qwen/Qwen3.5-9B") == "qwen3_5"
    with pytest.raises(ModelLoadError, match="set model.arch"):
        detect_arch("meta-llama/Llama-3-8B")


@pytest.mark.parametrize(
    "name, arch", [("Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe"), ("Qwen/Qwen3-VL-30B-A3B", "qwen3_vl_moe")]
)
def test_mixture_of_experts_checkpoints_load_as_their_moe_arch(tmp_path, name, arch):
    assert detect_arch(name) == arch
    (tmp_path / "config.json").write_text(json.dumps({"model_type": arch}))
    assert detect_arch(str(tmp_path)) == arch
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))  # the text-only MoE
    with pytest.raises(ModelLoadError, match=r"model_type 'qwen3_moe' is not supported; accepted: .*qwen3_5_moe"):
        detect_arch(str(tmp_path))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_qwen3_5_is_hybrid_with_16px_patches_and_no_deepstack(tmp_path, tied):
    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.tiny import TinySpec, init_tiny

    out = init_tiny(tmp_path / "m", "qwen3_5", spec=TinySpec(tie_word_embeddings=tied))
    assert detect_arch(str(out)) == "qwen3_5"
    lm = load_model(str(out))
    assert type(lm.model).__name__ == "Qwen3_5ForConditionalGeneration"
    vision, text = lm.model.config.vision_config, lm.model.config.get_text_config()
    assert not hasattr(vision, "deepstack_visual_indexes") and vision.patch_size == 16
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"]  # 3 : 1, as the released models
    layers = lm.model.model.language_model.layers
    assert {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "conv1d"} <= {
        n for n, _ in layers[0].linear_attn.named_children()
    }
    assert layers[0].linear_attn.conv1d.kernel_size == (4,) and layers[0].linear_attn.A_log.shape == (4,)
    # vLLM's CPU kernels: full-attention head 64, Gated DeltaNet key/value heads 64; a quarter of the head rotates
    assert text.head_dim == 64 and (text.linear_key_head_dim, text.linear_value_head_dim) == (64, 64)
    assert text.rope_parameters["partial_rotary_factor"] == 0.25 and text.rope_parameters["mrope_section"] == [3, 3, 2]
    assert layers[3].self_attn.q_proj.out_features == 2 * 4 * 64  # each head's query and its output gate
    assert ProcessorGeometry.from_processor(lm.processor).factor == 32
    head, embed = lm.model.lm_head.weight, lm.model.model.language_model.embed_tokens.weight
    assert (head.data_ptr() == embed.data_ptr()) is tied
    with pytest.raises(ModelLoadError, match="float16 with qwen3_5.*use model.dtype=bfloat16"):
        load_model(str(out), dtype="float16")
    assert load_model(str(out), dtype="bfloat16").model.dtype == torch.bfloat16


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_qwen3_vl_has_deepstack_16px_patches_and_tied_or_untied_embeddings(tmp_path, tied):
    from safetensors.torch import load_file

    from vlgrpo.data.images import ProcessorGeometry
    from vlgrpo.tiny import TinySpec, init_tiny

    out = init_tiny(tmp_path / "m", "qwen3_vl", spec=TinySpec(tie_word_embeddings=tied))
    assert detect_arch(str(out)) == "qwen3_vl"
    lm = load_model(str(out))
    vision, text = lm.model.config.vision_config, lm.model.config.get_text_config()
    assert vision.deepstack_visual_indexes == [0, 1] and vision.depth == 2  # a map after each of the 2 blocks
    assert len(lm.model.model.visual.deepstack_merger_list) == 2 and vision.patch_size == 16
    assert text.head_dim == 32 and text.rope_parameters["mrope_section"] == [6, 5, 5]  # sums to head_dim / 2
    assert lm.model.model.language_model.layers[0].self_attn.q_norm.weight.shape == (32,)  # Qwen3: per-head norms
    geometry = ProcessorGeometry.from_processor(lm.processor)
    assert (geometry.patch_size, geometry.factor) == (16, 32)
    assert geometry.grid_thw(100, 300) == (1, 6, 18)  # smart_resize to multiples of 32 px: 96 x 288
    head, embed = lm.model.lm_head.weight, lm.model.model.language_model.embed_tokens.weight
    assert (head.data_ptr() == embed.data_ptr()) is tied
    saved = load_file(str(out / "model.safetensors"))
    assert ("lm_head.weight" in saved) is not tied
    if not tied:
        assert not torch.equal(head, embed)
    with pytest.raises(ValueError, match=r"deepstack_visual_indexes \[0, 2\]: \[2\] not a vision block"):
        init_tiny(tmp_path / "bad", "qwen3_vl", spec=TinySpec(deepstack_visual_indexes=(0, 2)))


def test_pixel_overrides_reach_the_processor(tiny_model_dir):
    lm = load_model(tiny_model_dir("qwen2_5_vl"), max_pixels=28 * 28 * 4, min_pixels=28 * 28)
    out = lm.processor.image_processor(images=[Image.new("RGB", (112, 112))], return_tensors="pt")
    assert out["image_grid_thw"][0].tolist() == [1, 4, 4]  # capped at 4 merged tokens
    with pytest.raises(ModelLoadError, match="min_pixels"):
        load_model(tiny_model_dir("qwen2_5_vl"), max_pixels=100, min_pixels=1000)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_calibrate_merger_centres_and_scales_image_features(tmp_path, tiny_model_dir, shapes_dir, arch):
    import shutil

    from vlgrpo.models import load_model
    from vlgrpo.tiny import calibrate_merger

    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir(arch), model_dir)
    images = sorted(str(p) for p in (shapes_dir / "images").glob("*.png"))[:12]
    before = load_model(str(model_dir)).model.state_dict()
    stats = calibrate_merger(model_dir, images, target_std=0.2)
    lm = load_model(str(model_dir))
    after = lm.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    last = {"qwen3_vl": "linear_fc2"}.get(arch, "mlp.2")  # only its last Linear (not a DeepStack merger's)
    assert sorted(k.split("visual.")[-1] for k in changed) == [f"merger.{last}.bias", f"merger.{last}.weight"]
    assert len(changed) == 2 and stats["std_before"] < 0.1
    from vlgrpo.data.images import load_image

    inputs = lm.processor.image_processor(images=[load_image(p) for p in images], return_tensors="pt")
    with torch.no_grad():
        out = lm.model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
    feats = getattr(out, "pooler_output", None)
    feats = (feats if feats is not None else out[0] if isinstance(out, tuple) else out).float()
    assert feats.mean(0).abs().max() < 1e-4  # centred over the calibration images
    assert feats.std(0).mean() == pytest.approx(0.2, rel=1e-3)


def test_calibrate_merger_needs_images(tiny_model_dir):
    from vlgrpo.tiny import calibrate_merger
    from vlgrpo.types import InputError

    with pytest.raises(InputError, match="no images"):
        calibrate_merger(tiny_model_dir(), [])


def test_init_tiny_cli_calibrates_on_an_image_folder(tmp_path, shapes_dir, capsys):
    out = tmp_path / "tiny"
    assert main(["model", "init-tiny", "--out", str(out), "--calibrate-images", str(shapes_dir / "images")]) == 0
    assert "merger calibrated on 40 images" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    empty = ["model", "init-tiny", "--out", str(tmp_path / "t2"), "--calibrate-images", str(tmp_path / "empty")]
    assert main(empty) == 2
    assert "no image files" in capsys.readouterr().err


def test_mrope_section_reaches_the_config_and_the_rotary_frequencies(tmp_path):
    from vlgrpo.tiny import TinySpec, init_tiny

    init_tiny(tmp_path / "m", spec=TinySpec(rope_theta=1000.0))
    model = load_model(str(tmp_path / "m")).model
    assert model.config.get_text_config().rope_parameters["mrope_section"] == [4, 6, 6]  # Qwen2.5-VL's 1/4, 3/8, 3/8
    # a text token at position p and an image token at (s, s + row, s + col): with sections (4, 6, 6) the width
    # axis owns frequency pairs 10..15, at 1000 ** (-i / 16) rad per position (0.013 down to 0.0015)
    rotary = model.model.language_model.rotary_emb
    pos = torch.tensor([[[0]], [[0]], [[1]]])  # (3 axes, batch 1, 1 token): one step along the width only
    cos, _ = rotary(torch.zeros(1, 1, 32), pos)
    moved = [i for i in range(16) if abs(float(cos[0, 0, i]) - 1.0) > 1e-9]
    assert moved == list(range(10, 16))
    assert float(cos[0, 0, 10]) == pytest.approx(math.cos(1000.0 ** (-10 / 16)), abs=1e-6)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_the_patch_embedding_runs_as_a_product_with_the_convolutions_output_and_gradients(tiny_model_dir, arch):
    """`patches_as_products`: a loaded model's patch-embedding Conv3d (stride = kernel, one patch per input) runs as
    [patches, 3 x 2 x p x p] @ its flattened weight: the convolution's output and weight gradient within fp32
    rounding, its state dict unchanged, and an input of another shape still convolved."""
    import copy

    lm = load_model(tiny_model_dir(arch))
    conv = lm.model.model.visual.patch_embed.proj
    assert "forward" in conv.__dict__  # replaced at load
    twin = copy.deepcopy(conv)
    assert twin.forward.args[0] is twin  # a copy runs its own weights
    plain = torch.nn.Conv3d(
        conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, bias=conv.bias is not None
    )
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(37, conv.in_channels, *conv.kernel_size, generator=torch.Generator().manual_seed(0))
    w = torch.randn(37, conv.out_channels, 1, 1, 1, generator=torch.Generator().manual_seed(1))
    got, ref = conv(x), plain(x)
    assert got.shape == ref.shape and (got - ref).abs().max() <= 1e-5
    (got * w).sum().backward()
    (ref * w).sum().backward()
    assert (conv.weight.grad - plain.weight.grad).abs().max() <= 1e-4 * float(plain.weight.grad.abs().max())
    wide = torch.randn(2, conv.in_channels, conv.kernel_size[0], 2 * conv.kernel_size[1], 2 * conv.kernel_size[2])
    assert torch.equal(conv(wide), plain(wide))  # not one patch: the convolution itself
    assert conv.state_dict().keys() == plain.state_dict().keys()
