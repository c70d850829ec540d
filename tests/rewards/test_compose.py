"""Registry, recipes and weighted composition: dispatch by answer type, gating, failures, user functions, config."""

import math
import subprocess
import sys
import textwrap

import pytest

from vlgrpo.config import ConfigError, load_config
from vlgrpo.rewards import (
    REWARDS,
    RewardContext,
    RewardError,
    context_from_config,
    default_recipe,
    resolve_reward,
    score,
)
from vlgrpo.rewards.registry import accuracy
from vlgrpo.types import Sample

CTX = RewardContext(box_format="qwen2_5")
COUNT = Sample(id="c1", question="How many red shapes are there?", answer="3", answer_type="number")
COLOUR = Sample(id="t1", question="What colour is the square?", answer="red", answer_type="text")
EXIST = Sample(id="y1", question="Is there a blue circle in the image?", answer="no", answer_type="yesno")
CHOICE = Sample(id="m1", question="Which? (A) red (B) blue", answer="B", answer_type="choice")
MATH = Sample(id="x1", question="1/2 as a decimal?", answer="0.5", answer_type="math")
GROUND = Sample(
    id="b1", question="Locate the red circle.", answer_type="box", boxes=[[10, 10, 50, 50]], image_size=(112, 112)
)


def _ta(answer: str) -> str:
    return f"<think>looking</think><answer>{answer}</answer>"


@pytest.mark.parametrize(
    "sample, right, wrong",
    [
        (COUNT, _ta("3"), _ta("3 or 4")),
        (COUNT, _ta("three"), _ta("4")),
        (COLOUR, _ta("Red."), _ta("red circle")),
        (EXIST, _ta("No, there is none."), _ta("not sure")),
        (CHOICE, _ta("(B)"), _ta("A or B")),
        (MATH, _ta(r"\frac{1}{2}"), _ta("0.6")),
        (GROUND, _ta('[{"bbox_2d": [10, 10, 50, 50]}]'), _ta('[{"bbox_2d": [60, 60, 100, 100]}]')),
    ],
)
def test_accuracy_dispatches_on_answer_type(sample, right, wrong):
    assert accuracy(right, sample, CTX) == 1.0
    assert accuracy(wrong, sample, CTX) == 0.0


def test_weighted_total_components_and_metrics():
    completions = [_ta("3"), "3", _ta("5")]
    batch = score(completions, [COUNT] * 3, {"accuracy": 1.0, "format": 0.5}, CTX)
    assert batch.components == {"accuracy": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0]}
    assert batch.total == [1.5, 1.0, 0.5]
    assert batch.failures == []
    assert batch.metrics() == {
        "reward/accuracy": 2 / 3,
        "reward/format": 2 / 3,
        "reward/total": 1.0,
        "reward/failures": 0.0,
    }


def test_gating_closes_the_format_hack():
    gated = RewardContext(box_format="qwen2_5", gate_accuracy_on_format=True)
    batch = score(["3", _ta("3")], [COUNT, COUNT], {"accuracy": 1.0, "format": 0.5}, gated)
    assert batch.components["accuracy"] == [0.0, 1.0]  # right answer, wrong format: no accuracy
    box = '[{"bbox_2d": [10, 10, 50, 50]}]'
    batch = score([box, _ta(box)], [GROUND, GROUND], {"iou": 1.0, "giou": 1.0, "accuracy": 1.0}, gated)
    assert batch.components == {"iou": [0.0, 1.0], "giou": [0.0, 1.0], "accuracy": [0.0, 1.0]}
    answer_only = RewardContext(box_format="qwen2_5", answer_format="answer", gate_accuracy_on_format=True)
    assert accuracy("<answer>3</answer>", COUNT, answer_only) == 1.0


def test_box_rewards_and_iou_at_tau():
    half = _ta('[{"bbox_2d": [10, 30, 50, 70]}]')  # inter 40x20 = 800, union 2400 -> IoU 1/3
    recipe = {"iou": 1.0, "iou@0.3": 1.0, "iou@0.5": 1.0, "iou_threshold": 1.0, "giou": 1.0, "accuracy": 2.0}
    batch = score([half], [GROUND], recipe, CTX)
    got = {k: v[0] for k, v in batch.components.items()}
    # enclosing box 40x60 = 2400 = union, so GIoU = IoU
    assert got == pytest.approx(
        {"iou": 1 / 3, "iou@0.3": 1.0, "iou@0.5": 0.0, "iou_threshold": 0.0, "giou": 1 / 3, "accuracy": 0.0}
    )
    assert batch.total[0] == pytest.approx(1 / 3 + 1 + 1 / 3)
    # box rewards score 0 on non-box samples, so a mixed dataset shares one recipe without failures
    batch = score([_ta("3")], [COUNT], {"iou": 1.0, "giou": 1.0}, CTX)
    assert batch.components == {"iou": [0.0], "giou": [0.0]} and batch.failures == []


def test_exceptions_nan_and_inf_become_counted_zeros(tmp_path):
    path = tmp_path / "bad_rewards.py"
    path.write_text(
        textwrap.dedent("""
        def boom(completion, **fields):
            raise RuntimeError("broken reward on " + fields["id"])
        def nan(completion, **fields):
            return float("nan")
        def inf(completion, **fields):
            return float("inf")
    """)
    )
    recipe = {"accuracy": 1.0, f"{path}:boom": 1.0, f"{path}:nan": 1.0, f"{path}:inf": 1.0}
    no_size = Sample(id="b2", question="q", answer_type="box", boxes=[[0, 0, 5, 5]])  # qwen2_5 needs the size
    batch = score([_ta("3"), _ta("[0, 0, 5, 5]")], [COUNT, no_size], recipe, CTX)
    assert batch.total == [1.0, 0.0]
    assert all(v == 0.0 for name, values in batch.components.items() if name != "accuracy" for v in values)
    failed = [(sid, name.rsplit(":", 1)[-1] if ":" in name else name) for sid, name, _ in batch.failures]
    assert failed == [
        ("c1", "boom"),
        ("c1", "nan"),
        ("c1", "inf"),
        ("b2", "accuracy"),
        ("b2", "boom"),
        ("b2", "nan"),
        ("b2", "inf"),
    ]
    assert "broken reward on c1" in batch.failures[0][2] and "non-finite value nan" in batch.failures[1][2]
    assert "sample 'b2' has no image_size" in batch.failures[3][2]
    assert batch.metrics()["reward/failures"] == 7.0
    bad_gold = Sample(id="c9", question="q", answer="many", answer_type="number")
    batch = score([_ta("3")], [bad_gold], {"accuracy": 1.0}, CTX)
    assert batch.failures[0][:2] == ("c9", "accuracy") and "'many' is not a valid number" in batch.failures[0][2]


def test_user_function_gets_completion_and_named_fields(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        def length_bonus(completion, answer, image_size, task="none"):
            return len(completion) / 100 + image_size[0] / 1000 + (answer == "3")
        def everything(completion, **fields):
            return float(sorted(fields) == ["answer", "answer_type", "boxes", "id", "image", "image_size", "meta",
                                            "objects", "question", "task"])
        def with_ctx(completion, sample, ctx):
            return float(sample.id == "c1" and ctx.box_format == "qwen2_5")
        def needs_unknown(completion, colour):
            return 1.0
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sample = Sample(id="c1", question="q", answer="3", answer_type="number", image_size=(200, 100))
    recipe = {"my_rewards:length_bonus": 2.0, "my_rewards:everything": 1.0, "my_rewards:with_ctx": 1.0}
    batch = score(["x" * 50], [sample], recipe, CTX)
    assert batch.components == {
        "my_rewards:length_bonus": [pytest.approx(1.7)],
        "my_rewards:everything": [1.0],
        "my_rewards:with_ctx": [1.0],
    }
    assert batch.total == [pytest.approx(2 * 1.7 + 2)] and batch.failures == []
    with pytest.raises(RewardError, match=r"parameter\(s\) \['colour'\] are not sample fields"):
        resolve_reward("my_rewards:needs_unknown")
    with pytest.raises(RewardError, match="'my_rewards' has no function 'nope'"):
        resolve_reward("my_rewards:nope")
    with pytest.raises(RewardError, match="cannot load 'no_such_module_xyz'"):
        resolve_reward("no_such_module_xyz:fn")
    sys.modules.pop("my_rewards", None)


def test_recipe_errors_name_the_entry():
    with pytest.raises(RewardError, match="reward.recipe.acuracy: unknown reward 'acuracy'; accepted: accuracy"):
        score(["x"], [COUNT], {"acuracy": 1.0}, CTX)
    with pytest.raises(RewardError, match="reward.recipe.format: the weight must be a finite number"):
        score(["x"], [COUNT], {"format": math.nan}, CTX)
    with pytest.raises(RewardError, match=r"iou@1.5.*number in \[0, 1\]"):
        score(["x"], [GROUND], {"iou@1.5": 1.0}, CTX)
    with pytest.raises(RewardError, match="reward.recipe is empty"):
        score(["x"], [COUNT], {}, CTX)
    with pytest.raises(ValueError, match="2 completions but 1 samples"):
        score(["x", "y"], [COUNT], {"format": 1.0}, CTX)


def test_default_recipes_and_registry_names():
    assert default_recipe("number") == {"accuracy": 1.0, "format": 0.5}
    assert default_recipe("box") == {"iou": 1.0, "format": 0.5}
    with pytest.raises(RewardError, match="answer_type 'video' has no default recipe"):
        default_recipe("video")
    assert set(REWARDS) == {"accuracy", "format", "iou", "iou_threshold", "giou", "judge", "tool"}
    assert "overlong" not in REWARDS  # the GRPO module shapes overlong completions


def test_importing_rewards_needs_no_torch():
    code = "import sys, vlgrpo.rewards; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_context_from_config_resolves_auto_box_format():
    cfg = load_config(
        overrides=[
            "reward.number_atol=0.5",
            "reward.iou_threshold=0.7",
            "data.answer_format=answer",
            "reward.gate_accuracy_on_format=true",
        ]
    )
    ctx = context_from_config(cfg, arch="qwen2_vl")
    assert (ctx.box_format, ctx.answer_format, ctx.number_atol, ctx.iou_threshold, ctx.gate_accuracy_on_format) == (
        "qwen2",
        "answer",
        0.5,
        0.7,
        True,
    )
    ctx = context_from_config(load_config(overrides=["model.arch=qwen2_5_vl", "model.max_pixels=200000"]))
    assert ctx.box_format == "qwen2_5" and ctx.geometry.max_pixels == 200_000
    assert context_from_config(load_config(overrides=["reward.box_format=qwen3"])).box_format == "qwen3"
    with pytest.raises(ConfigError, match="reward.box_format is 'auto' but the model arch is unknown"):
        context_from_config(load_config())
    with pytest.raises(ValueError, match="RewardContext.box_format = 'auto' is not accepted"):
        RewardContext(box_format="auto")


CALL = (
    '<think>zoom</think><tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 10, 50, 50]}}'
    "</tool_call>"
)


@pytest.mark.parametrize(
    "trajectory, correct",
    [
        (CALL, 0.0),  # cut at max_turns after the call: no answer, whatever the zoom box
        (CALL + '{"bbox_2d": [60, 60, 100, 100]}', 0.0),  # answered elsewhere, without tags
        (CALL + _ta('[{"bbox_2d": [10, 10, 50, 50]}]'), 1.0),  # the last turn's answer is read
        (CALL + "3", 0.0),
        ('<think>z</think><tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 10, 50, 50]', 0.0),
    ],
)
def test_a_tool_trajectorys_answer_is_read_from_its_last_turn_never_from_a_call(trajectory, correct):
    """A zoom call's bbox_2d equal to the gold box used to score as the answer (accuracy 1, IoU 1) when the
    trajectory had no answer tags (#59)."""
    batch = score([trajectory], [GROUND], {"accuracy": 1.0, "iou": 1.0}, CTX)
    assert batch.components == {"accuracy": [correct], "iou": [correct]}
    assert accuracy(CALL + _ta("3"), COUNT, CTX) == 1.0 and accuracy(CALL, COUNT, CTX) == 0.0
