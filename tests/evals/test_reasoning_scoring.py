"""The reasoning benchmarks' scoring rules against hand-computed results (MathVista's normalisation, MMMU's parsing,
R1-V's counting rule, math_verify for Geometry3K), the suites through `evaluate` with a scripted engine, and
`vlgrpo eval --suite mathvista` end to end on the tiny model."""

from __future__ import annotations

import json

import pytest
from reasoning_files import geometry3k_file, mathvista_file, mmmu_folder, superclevr_file

from vlgrpo.cli import main
from vlgrpo.evals.reasoning.loaders import load_mathvista
from vlgrpo.evals.reasoning.score import (
    edit_distance,
    mathvista_normalize,
    mmmu_choice,
    mmmu_open_correct,
    mmmu_open_predictions,
)
from vlgrpo.evals.reasoning.suite import judge_mathvista, judge_superclevr
from vlgrpo.evals.run import build_eval_data, evaluate, write_outputs
from vlgrpo.rewards import RewardContext
from vlgrpo.types import Completion, RolloutGroup, Sample


class ScriptedEngine:
    """Answers each sample (by id) with a fixed completion."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def generate(self, samples, params):
        assert params.greedy and params.completions_per_prompt == 1
        return [RolloutGroup(s, [], [Completion([], self.answers[s.id], "stop")]) for s in samples]


# ---------------------------------------------------------------- MathVista


def test_edit_distance_and_normalisation_by_hand():
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3
    choices = ["135°", "140°", "145°", "150°"]
    assert mathvista_normalize("146°", choices, "multi_choice", "text", None) == "140°"  # a tie at 1: the first
    assert mathvista_normalize("(d) because", choices, "multi_choice", "text", None) == "150°"  # "(d)" -> D
    assert mathvista_normalize("1.456", None, "free_form", "float", 2) == "1.46"
    assert mathvista_normalize("-2.9", None, "free_form", "integer", None) == "-2"  # int() truncates toward 0
    assert mathvista_normalize("[1,2 , 3]", None, "free_form", "list", None) == "[1, 2, 3]"
    assert mathvista_normalize("", choices, "multi_choice", "text", None) is None


@pytest.mark.parametrize(
    "pid, completion, normalized, correct",
    [
        ("1", "<answer>1.4537</answer>", "1.45", True),  # float, precision 2: str(round(1.4537, 2))
        ("1", "<answer>1.4</answer>", "1.4", False),
        (
            "1",
            "<think>mean of 1.2 and 1.7</think><answer>about 1.45 m</answer>",
            "1.45",
            True,
        ),  # one number in the answer
        ("2", "<answer>[2014,2016]</answer>", "[2014, 2016]", True),  # a list answer, re-printed as Python prints it
        ("2", "<answer>2014 and 2016</answer>", None, False),  # not a list
        ("3", "<answer>145°</answer>", "145°", True),  # a choice answered by its text
        ("3", "<answer>(C) 145°</answer>", "145°", True),  # MathVista's "(C) text" -> C
        ("3", "<answer>C</answer>", "145°", True),
        ("3", "<answer>146°</answer>", "140°", False),  # closest choice by edit distance (a tie: the first)
        ("3", "Let me think.\nAnswer: B", "140°", False),  # no tags: the "Answer:" line
        ("3", "", None, False),  # no answer is wrong (MathVista would give its empty extraction the shortest choice)
        ("4", "<answer>3.7</answer>", "3", True),  # integer: str(int(float(x))) truncates, as MathVista does
        ("4", "<answer>three</answer>", "3", True),
        ("5", "<answer>\\frac{3}{4}</answer>", "0.8", True),  # float, precision 1: round(0.75, 1) = 0.8
        ("5", "\\boxed{0.7}", "0.7", False),
    ],
)
def test_mathvista_rules(tmp_path, pid, completion, normalized, correct):
    sample = next(s for s in load_mathvista(mathvista_file(tmp_path)) if s.meta["pid"] == pid)
    verdict = judge_mathvista(completion, sample, RewardContext())
    assert (verdict.extra["normalized"], verdict.correct) == (normalized, correct)


def test_mathvista_suite_per_task_and_skill(tmp_path):
    path = mathvista_file(tmp_path)
    data = build_eval_data(path, "mathvista,vqa", ctx=RewardContext())
    assert len(data.mathvista) == len(data.vqa) == 5  # vqa scores the same rows by its own rules
    answers = {
        "mathvista-1": "<answer>1.4537</answer>",
        "mathvista-2": "<answer>[2014,2016]</answer>",
        "mathvista-3": "<answer>146°</answer>",
        "mathvista-4": "<answer>3.7</answer>",
        "mathvista-5": "<answer>0.75</answer>",
    }
    result = evaluate(ScriptedEngine(answers), data, RewardContext(), progress=False)
    m = {k[len("eval/mathvista/") :]: v for k, v in result.metrics.items() if k.startswith("eval/mathvista/")}
    assert m == {
        "accuracy": 0.8,
        "accuracy_free_form": 1.0,
        "accuracy_multi_choice": 0.0,
        "accuracy_skill_algebraic_reasoning": 0.5,
        "accuracy_skill_arithmetic_reasoning": 1.0,
        "accuracy_skill_geometry_reasoning": 0.0,
        "accuracy_skill_statistical_reasoning": 1.0,
        "accuracy_task_figure_question_answering": 1.0,
        "accuracy_task_geometry_problem_solving": 0.0,
        "accuracy_task_math_word_problem": 1.0,
        "accuracy_task_visual_question_answering": 1.0,
    }
    assert result.counts["mathvista"] == 5 and result.counts["mathvista/skill_algebraic_reasoning"] == 2
    # vqa's exact number match and option-letter parser accept only the list (its text match drops punctuation)
    assert result.metrics["eval/vqa/accuracy"] == pytest.approx(0.2)
    rows = {r["id"]: r for r in result.predictions if r["suite"] == "mathvista"}
    assert (rows["mathvista-3"]["gold"], rows["mathvista-3"]["normalized"], rows["mathvista-3"]["extracted"]) == (
        "145°",
        "140°",
        "146°",
    )
    report = (write_outputs(result, tmp_path / "out")["report"]).read_text()
    assert "## MathVista accuracy" in report and "| skill algebraic_reasoning | 2 | 0.5000 |" in report


# ---------------------------------------------------------------- Geometry3K, SuperCLEVR


def test_geometry3k_by_math_equivalence(tmp_path):
    geometry3k_file(tmp_path)
    data = build_eval_data(tmp_path / "data", "geometry3k", ctx=RewardContext())  # the downloaded folder
    answers = {
        "geometry3k-1": "<think>x = 2 sqrt 3</think> so x = \\boxed{\\sqrt{12}}",  # the same number
        "geometry3k-2": "<answer>60</answer>",
        "geometry3k-3": "<answer>13.33</answer>",
    }  # 40/3 = 13.333...: not equal
    result = evaluate(ScriptedEngine(answers), data, RewardContext(), progress=False)
    assert result.metrics == {"eval/geometry3k/accuracy": pytest.approx(2 / 3)}
    assert [r["correct"] for r in result.predictions] == [True, True, False]


@pytest.mark.parametrize(
    "completion, gold, ours, r1v",
    [
        ("<think>I count 4</think><answer>4</answer>", 4, True, True),
        ("<answer>There are 9 objects</answer>", 9, True, False),  # R1-V's regex wants digits only between the tags
        ("\\boxed{10}", 10, True, False),
        ("<answer>nine</answer>", 9, True, False),
        ("<answer>3</answer>", 4, False, False),
        ("<answer>4.5</answer>", 4, False, False),
    ],
)
def test_superclevr_rules(completion, gold, ours, r1v):
    sample = Sample("s", "How many?", str(gold), "number", meta={"benchmark": "superclevr"})
    verdict = judge_superclevr(completion, sample, RewardContext())
    assert (verdict.correct, verdict.extra["r1v_rule"]) == (ours, r1v)


def test_superclevr_suite_reports_r1vs_rule_too(tmp_path):
    data = build_eval_data(superclevr_file(tmp_path), "superclevr", ctx=RewardContext())
    answers = {
        "superclevr-1": "<answer>4</answer>",
        "superclevr-2": "<answer>9 objects</answer>",
        "superclevr-3": "<answer>7</answer>",
    }
    result = evaluate(ScriptedEngine(answers), data, RewardContext(), progress=False)
    assert result.metrics == {
        "eval/superclevr/accuracy": pytest.approx(2 / 3),
        "eval/superclevr/accuracy_r1v_rule": pytest.approx(1 / 3),
    }


# ---------------------------------------------------------------- MMMU


@pytest.mark.parametrize(
    "response, letter",
    [
        ("(B)", "B"),
        ("B.", "B"),
        ("Answer: B", "B"),
        ("blue", "B"),  # a letter, or an option's text
        ("(A) is tempting but (B)", "B"),  # several in parentheses: the last
        ("A and C", "C"),
        ("The answer is green, not red", "A"),  # several option texts: the one mentioned last
        ("purple", None),
        (None, None),  # MMMU would pick a random letter; here it is wrong
    ],
)
def test_mmmu_multiple_choice_parsing(response, letter):
    assert mmmu_choice(response, ["red", "blue", "green"]) == letter


@pytest.mark.parametrize(
    "response, gold, correct",
    [
        ("x = 1.50 m", "1.5", True),  # the tail after "=", its number rounded to 2 places
        ("the capital is paris", "Paris", True),  # the gold text inside the tail after "is "
        ("2", "1.5", False),
        ("3.429", "['24/7', '3.429']", True),  # a gold written as a list: any item
        ("", "1.5", False),
    ],
)
def test_mmmu_open_answers(response, gold, correct):
    assert mmmu_open_correct(gold, mmmu_open_predictions(response)) is correct


def test_mmmu_suite_per_subject_with_the_two_image_row_scored(tmp_path):
    data = build_eval_data(mmmu_folder(tmp_path / "mmmu"), "mmmu", ctx=RewardContext())
    answers = {
        "validation_Art_Theory_1": "<think>mostly blue</think><answer>(B) blue</answer>",
        "validation_Math_2": "<answer>(A) same</answer>",
        "validation_Physics_3": "<answer>2 m/s</answer>",
    }
    result = evaluate(ScriptedEngine(answers), data, RewardContext(), progress=False)
    assert {k: v for k, v in result.metrics.items()} == {
        "eval/mmmu/accuracy": 2 / 3,
        "eval/mmmu/accuracy_discipline_art_and_design": 1.0,
        "eval/mmmu/accuracy_discipline_science": 0.5,
        "eval/mmmu/accuracy_subject_Art_Theory": 1.0,
        "eval/mmmu/accuracy_subject_Math": 1.0,
        "eval/mmmu/accuracy_subject_Physics": 0.0,
    }
    assert result.counts["mmmu"] == 3 and "mmmu/several_images_skipped" not in result.counts
    assert "several images" not in write_outputs(result, tmp_path / "out")["report"].read_text()


# ---------------------------------------------------------------- the CLI on the tiny model


def test_cli_eval_suite_mathvista_on_the_tiny_model(tiny_model_dir, tmp_path, capsys):
    path = mathvista_file(tmp_path, "testmini_5.json")
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--model",
        tiny_model_dir("qwen2_5_vl"),
        "--suite",
        "mathvista",
        "--data",
        str(path),
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--no-progress",
    ]
    assert main(argv) == 0
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["counts"]["mathvista"] == 5 and doc["counts"]["mathvista/task_figure_question_answering"] == 2
    assert {"eval/mathvista/accuracy", "eval/mathvista/accuracy_skill_geometry_reasoning"} <= set(doc["metrics"])
    assert all(0 <= v <= 1 for v in doc["metrics"].values())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"mathvista-{p}" for p in "12345"]
    assert all(r["suite"] == "mathvista" for r in rows)
    assert "eval/mathvista/accuracy" in capsys.readouterr().out
    argv[argv.index("mathvista")] = "superclevr"  # a MathVista file holds nothing for another benchmark's suite
    assert main(argv) == 2
    assert "eval suite 'superclevr' has nothing to run on: it needs R1-V's SuperCLEVR test file" in (
        capsys.readouterr().err
    )


def test_mathvista_reads_a_parenthesised_letter_before_a_choice_written_out_as_the_official_code_does():
    """MathVista's normalize_extracted_answer takes a "(x)" letter first: with the choices of testmini pid 168 style,
    ['(c)', '(a)', '(e)', '(d)', '(b)'], the answer "(b)" is letter B, the second choice "(a)"; and "(a)" is the
    first choice "(c)". Before, the verbatim choice won: "(b)" was read as "(b)"."""
    choices = ["(c)", "(a)", "(e)", "(d)", "(b)"]
    assert mathvista_normalize("(b)", choices, "multi_choice", "text", None) == "(a)"
    assert mathvista_normalize("(a)", choices, "multi_choice", "text", None) == "(c)"
    assert mathvista_normalize("B", choices, "multi_choice", "text", None) == "(a)"
    assert mathvista_normalize("(e)", choices, "multi_choice", "text", None) == "(b)"  # letter E, the fifth choice


def test_mmmu_reads_the_whole_response_as_the_official_code_does():
    """MMMU parses the whole response (its answer usually comes last); before, the first 1,000 (multiple choice) or
    4,000 (open) characters were read, and a long response ending in its answer was scored wrong."""
    reasoning = "We compare the options one by one and weigh each. " * 40  # ~2,000 characters, no option named
    assert mmmu_choice(reasoning + "So the answer is (C).", ["red", "green", "blue", "black"]) == "C"
    assert 6.5 in mmmu_open_predictions(reasoning * 3 + "Therefore the length is 6.5")


@pytest.mark.parametrize("name", ["mathvista", "geometry3k", "superclevr", "mmmu"])
def test_a_reasoning_suite_with_no_samples_scores_nothing_instead_of_raising(name):
    """An empty suite (a filter left no rows) gives no metric and a count of 0; it used to raise IndexError."""
    from vlgrpo.registry import EVAL_SUITE

    suite = EVAL_SUITE.load(name)
    assert suite.score([], [], RewardContext(), "pope") == ({}, {"": 0}, [])
