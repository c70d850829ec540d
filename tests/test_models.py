import json

import pytest
import torch
from PIL import Image

from vlgrpo.cli import main
from vlgrpo.models import ModelLoadError, detect_arch, load_model, placeholder_token_ids


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl"])
def test_init_tiny_loads_back_and_generates_with_an_image(tmp_path, arch, capsys):
    out = tmp_path / arch
    assert main(["model", "init-tiny", "--arch", arch, "--out", str(out)]) == 0
    assert "parameters" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["model_type"] == arch
    lm = load_model(str(out))
    expected = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen2_vl": "Qwen2VLProcessor"}[arch]
    assert type(lm.processor).__name__ == expected  # not a bare tokenizer
    assert lm.processor.tokenizer.padding_side == "left"
    n_params = sum(p.numel() for p in lm.model.parameters())
    assert 500_000 < n_params < 5_000_000
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red shapes?"}]}]
    text = lm.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and "<|vision_start|><|image_pad|><|vision_end|>" in text
    inputs = lm.processor(text=[text], images=[Image.new("RGB", (112, 112), (200, 0, 0))], return_tensors="pt")
    n_image_tokens = int((inputs["input_ids"] == lm.model.config.image_token_id).sum())
    assert n_image_tokens == 16  # 112 px -> 8x8 patches -> 2x2 merge -> 16 tokens
    torch.manual_seed(0)
    bad = torch.tensor(placeholder_token_ids(lm.processor.tokenizer))
    out_ids = lm.model.generate(**inputs, max_new_tokens=6, do_sample=False, suppress_tokens=bad)
    assert out_ids.shape == (1, inputs["input_ids"].shape[1] + 6) or out_ids[0, -1] == lm.model.config.eos_token_id
    assert isinstance(lm.processor.decode(out_ids[0, inputs["input_ids"].shape[1]:]), str)


def test_placeholders_and_arch_detection(tiny_model_dir):
    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    ids = placeholder_token_ids(lm.processor.tokenizer)
    assert lm.model.config.image_token_id in ids and lm.model.config.vision_start_token_id in ids
    assert len(ids) == 5
    assert detect_arch("Qwen/Qwen2.5-VL-7B-Instruct") == "qwen2_5_vl"
    assert detect_arch("Qwen/Qwen2-VL-2B-Instruct") == "qwen2_vl"
    with pytest.raises(ModelLoadError, match="set model.arch"):
        detect_arch("meta-llama/Llama-3-8B")


def test_pixel_overrides_reach_the_processor(tiny_model_dir):
    lm = load_model(tiny_model_dir("qwen2_5_vl"), max_pixels=28 * 28 * 4, min_pixels=28 * 28)
    out = lm.processor.image_processor(images=[Image.new("RGB", (112, 112))], return_tensors="pt")
    assert out["image_grid_thw"][0].tolist() == [1, 4, 4]  # capped at 4 merged tokens
    with pytest.raises(ModelLoadError, match="min_pixels"):
        load_model(tiny_model_dir("qwen2_5_vl"), max_pixels=100, min_pixels=1000)
