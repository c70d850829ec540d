"""One function tells a loaded model's or processor's family (`vlgrpo.families.family_of`); what it says agrees with
the objects themselves: the processor that writes video timestamps, the rope index that takes seconds."""

import inspect

import pytest

from vlgrpo.families import FAMILIES, family, family_of
from vlgrpo.models import load_model
from vlgrpo.policy.forward import core_model


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
    with pytest.raises(ValueError, match="'qwen3_5_moe' \\(a Qwen3.5 mixture-of-experts model"):
        family("qwen3_5_moe")
