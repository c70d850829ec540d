"""The prompt builder: the processor's own ids from the image sizes alone."""

import pytest
from PIL import Image

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import render_messages
from vlgrpo.policy.prompt import build_prompt
from vlgrpo.types import InputError, Sample

ARCHS = ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"]


@pytest.mark.parametrize("arch", ARCHS)
def test_build_prompt_gives_the_processors_ids_without_pixels(load, samples, arch, tmp_path):
    model, processor = load(arch, max_pixels=28 * 28 * 40)
    wide = tmp_path / "wide.png"
    Image.new("RGB", (300, 130), (10, 200, 30)).save(wide)
    cases = [samples[0], Sample(id="w", question="Is there a green square?", answer_type="yesno", image=str(wide))]
    for s in cases:
        p = build_prompt(s, processor, None, "answer", "qwen2_5", "Be brief.")
        msgs = render_messages(s, "answer", "qwen2_5", "Be brief.")
        text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ref = processor(text=[text], images=[load_image(s.image)], return_tensors="pt")
        assert p.input_ids == ref["input_ids"][0].tolist()
        assert p.mm_token_type_ids == ref["mm_token_type_ids"][0].tolist()
        assert p.image_grid_thw.tolist() == ref["image_grid_thw"].tolist()
        assert p.image == s.image and p.sources == [s.image] and p.video_grid_thw is None
    # 300x130 under 28*28*40 px: resized to 252x112 px in 14 px patches (Qwen3-VL: 256x96 px in 16 px patches)
    assert p.image_grid_thw.tolist() == ([[1, 6, 16]] if arch == "qwen3_vl" else [[1, 8, 18]])
    with pytest.raises(InputError, match="'nope' has no image or video"):
        build_prompt(Sample(id="nope", question="q"), processor)
