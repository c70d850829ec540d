"""The hand-scored corpus (corpus.yaml): numbers, choices, yes/no hedges, math, boxes per model convention and the
format reward, each completion scored through `score()` as the trainer calls it."""

from pathlib import Path

import pytest
import yaml

from vlgrpo.rewards import RewardContext, score
from vlgrpo.types import Sample

CASES = yaml.safe_load((Path(__file__).parent / "corpus.yaml").read_text())


def test_corpus_covers_every_answer_type_and_box_convention():
    assert {c["answer_type"] for c in CASES} == {"number", "choice", "yesno", "text", "math", "box"}
    assert {c.get("box_format", "plain") for c in CASES if c["answer_type"] == "box"} == {
        "plain",
        "qwen2",
        "qwen2_5",
        "qwen3",
    }
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_case(case):
    sample = Sample(
        case["id"],
        "q",
        case.get("answer"),
        case["answer_type"],
        boxes=case.get("boxes"),
        image_size=tuple(case["image_size"]) if "image_size" in case else None,
    )
    ctx = RewardContext(
        box_format=case.get("box_format", "plain"), answer_format=case.get("answer_format", "think_answer")
    )
    reward = case.get("reward", "accuracy")
    batch = score([case["completion"]], [sample], {reward: 1.0}, ctx)
    assert batch.failures == []
    assert batch.components[reward][0] == pytest.approx(case["expected"], abs=1e-6), case.get("note", "")
