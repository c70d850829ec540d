"""The eval runner: suite selection, scoring through a scripted engine (exact values), the tiny model end to end,
the `vlgrpo eval --model` command (checkpoint and run directory) and the trainer's in-loop hook."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from vlgrpo.cli import main
from vlgrpo.config import Config, load_config
from vlgrpo.data.adapters import load_samples
from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.evals.pope.build import build_pope, objects_from_samples, write_pope
from vlgrpo.evals.run import EvalData, build_eval_data, evaluate, make_evaluator, write_outputs
from vlgrpo.evals.suite import PopeOptions
from vlgrpo.rewards import RewardContext
from vlgrpo.types import Completion, InputError, RolloutGroup, Sample

OUTPUTS = ("metrics.json", "predictions.jsonl", "report.md")


class ScriptedEngine:
    """A RolloutEngine answering each question with a fixed text; records the size of every call."""

    def __init__(self, answers: dict[str, str]):
        self.answers, self.calls = answers, []

    def generate(self, samples, params):
        assert params.greedy and params.completions_per_prompt == 1
        self.calls.append(len(samples))
        return [RolloutGroup(s, [], [Completion([], self.answers[s.question], "stop")]) for s in samples]


def _pope(split: str, qid: int, label: str, question: str) -> Sample:
    return Sample(
        f"pope-{split}-{qid}", question, label, "yesno", task=f"pope/{split}", meta={"split": split, "question_id": qid}
    )


def _scripted_set():
    data = EvalData(
        vqa=[Sample("n", "How many?", "3", "number", task="count"), Sample("t", "Colour?", "red", "text")],
        grounding=[Sample("g", "Where?", answer_type="box", boxes=[[0, 0, 100, 100]], image_size=(200, 100))],
        pope=[
            _pope("random", 1, "yes", "R1"),
            _pope("random", 2, "no", "R2"),
            _pope("popular", 1, "yes", "P1"),
            _pope("popular", 2, "no", "P2"),
        ],
    )
    answers = {
        "How many?": "<answer>3</answer>",
        "Colour?": "<answer>blue</answer>",
        "Where?": "<answer>(0,0),(500,500)</answer>",  # qwen2 0-1000 -> (0,0,100,50): IoU 0.5
        "R1": "Yes",
        "R2": "Yes, there is",
        "P1": "No",
        "P2": "No, there is not.",
    }
    return data, ScriptedEngine(answers)


def test_scripted_answers_give_hand_computed_metrics(tmp_path):
    data, engine = _scripted_set()
    result = evaluate(engine, data, RewardContext(box_format="qwen2"), batch_prompts=3, progress=False)
    assert engine.calls == [3, 3, 1]  # 7 samples in batches of 3
    m = result.metrics
    # random: yes/yes vs yes/no -> TP 1 FP 1; popular: no/no vs yes/no -> TN 1 FN 1; headline = mean of splits
    assert {k: m[f"eval/pope/random/{k}"] for k in ("accuracy", "precision", "recall", "f1", "yes_ratio")} == {
        "accuracy": 0.5,
        "precision": 0.5,
        "recall": 1.0,
        "f1": pytest.approx(2 / 3),
        "yes_ratio": 1.0,
    }
    assert (m["eval/pope/popular/precision"], m["eval/pope/popular/recall"], m["eval/pope/popular/f1"]) == (0, 0, 0)
    assert (m["eval/pope/accuracy"], m["eval/pope/precision"], m["eval/pope/recall"]) == (0.5, 0.25, 0.5)
    assert (m["eval/pope/f1"], m["eval/pope/yes_ratio"], m["eval/pope/unknown"]) == (pytest.approx(1 / 3), 0.5, 0)
    assert {k: m[f"eval/grounding/{k}"] for k in ("acc50", "acc75", "miou", "parse_fail")} == {
        "acc50": 1.0,
        "acc75": 0.0,
        "miou": 0.5,
        "parse_fail": 0.0,
    }
    assert (m["eval/vqa/accuracy"], m["eval/vqa/accuracy_number"], m["eval/vqa/accuracy_text"]) == (0.5, 1.0, 0.0)
    assert m["eval/vqa/accuracy_task_count"] == 1.0 and "eval/vqa/accuracy_task_" not in m
    assert result.counts == {
        "pope": 4,
        "pope/random": 2,
        "pope/popular": 2,
        "grounding": 1,
        "vqa": 2,
        "vqa/number": 1,
        "vqa/text": 1,
        "vqa/task_count": 1,
    }
    rows = {p["id"]: p for p in result.predictions}
    assert len(result.predictions) == 7 and rows["g"]["pred_box"] == [0.0, 0.0, 100.0, 50.0]
    assert (rows["pope-random-2"]["parsed"], rows["pope-random-2"]["correct"], rows["t"]["extracted"]) == (
        "yes",
        False,
        "blue",
    )
    strict = evaluate(
        _scripted_set()[1], data, RewardContext(box_format="qwen2"), pope_parser="strict", progress=False
    ).metrics
    assert strict["eval/pope/unknown"] == 0.5 and strict["eval/pope/random/accuracy"] == 0.5

    paths = write_outputs(result, tmp_path / "out")
    assert json.loads(paths["metrics"].read_text())["metrics"] == m
    assert len(paths["predictions"].read_text().splitlines()) == 7
    report = paths["report"].read_text()
    assert "| mean | 4 | 0.5000 | 0.2500 | 0.5000 | 0.3333 | 0.5000 | 0.0000 |" in report
    assert "| all | 1 | 1.0000 | 0.0000 | 0.5000 | 0.0000 |" in report and "| task count | 1 | 1.0000 |" in report


def test_eval_data_from_one_dataset(shapes_dir):
    test = shapes_dir / "test.jsonl"
    samples = load_samples(test).samples
    data = build_eval_data(test, "pope,grounding,vqa", ctx=RewardContext())
    assert [s.id for s in data.vqa] == [s.id for s in samples if s.answer_type in ("number", "text", "yesno")]
    assert [s.id for s in data.grounding] == [s.id for s in samples if s.answer_type == "box"]
    eligible = sum(len(set(s.objects)) >= 3 for s in samples)
    assert len(data.pope) == 6 * eligible and {s.task for s in data.pope} == {"pope/random"}
    assert sum(s.answer == "yes" for s in data.pope) == 3 * eligible
    capped = build_eval_data(test, ["pope", "vqa"], max_samples=2, pope=PopeOptions(splits=("random", "adversarial")))
    assert len(capped.vqa) == 2 and not capped.grounding
    assert [s.task for s in capped.pope] == ["pope/random"] * 6 + ["pope/adversarial"] * 6  # whole images


def test_eval_data_from_a_pope_file_and_errors(tmp_path, shapes_dir):
    samples = load_samples(shapes_dir / "train.jsonl").samples
    paths = write_pope(build_pope(objects_from_samples(samples), 4), tmp_path / "pope", "shapes")
    data = build_eval_data(paths["popular"], "pope", max_samples=4)
    assert [s.id for s in data.pope] == [f"pope-popular-{i}" for i in (1, 2, 3, 4)]
    mixed = build_eval_data(
        shapes_dir / "test.jsonl", "pope,vqa", pope=PopeOptions(data=paths["random"], splits=("random",))
    )
    assert len(mixed.pope) == 24 and mixed.vqa
    with pytest.raises(InputError, match="suite 'grounding' has nothing to run on"):
        build_eval_data(paths["random"], "grounding")
    with pytest.raises(InputError, match="accepted; use a comma list of pope, grounding, vqa"):
        build_eval_data(shapes_dir / "test.jsonl", "pope,chat")
    with pytest.raises(InputError, match="none of the .* images has >= 9 distinct objects"):
        build_eval_data(shapes_dir / "test.jsonl", "pope", pope=PopeOptions(min_objects=9))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, spread):
    """The tiny Qwen2.5-VL with its LM weights spread out (seeded), so greedy answers vary between prompts."""
    from vlgrpo.models import load_model

    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    spread(lm.model, 0.1)
    return lm


def _run_tiny(lm, data, batch_prompts):
    from vlgrpo.rollout.hf import HFEngine
    from vlgrpo.vision_cache import VisionCache

    cache = VisionCache(lm.model, lm.processor)
    ctx = RewardContext(box_format="qwen2_5", geometry=ProcessorGeometry.from_processor(lm.processor))
    engine = HFEngine(lm.model.eval(), lm.processor, cache, "answer", "qwen2_5", batch_prompts=batch_prompts)
    result = evaluate(engine, data, ctx, batch_prompts=batch_prompts, max_new_tokens=6, progress=False)
    return result, cache.stats()


def test_evaluate_tiny_model_end_to_end(tiny, shapes_dir):
    data = build_eval_data(shapes_dir / "test.jsonl", "pope,grounding,vqa")
    samples = data.vqa + data.grounding + data.pope
    result, stats = _run_tiny(tiny, data, batch_prompts=8)
    assert len(result.predictions) == len(samples) == result.info["samples"]
    for key in (
        "pope/accuracy",
        "pope/f1",
        "pope/yes_ratio",
        "pope/unknown",
        "grounding/acc50",
        "grounding/miou",
        "grounding/parse_fail",
        "vqa/accuracy",
        "vqa/accuracy_number",
        "vqa/accuracy_task_shapes/count",
    ):
        assert f"eval/{key}" in result.metrics
    assert all(0.0 <= v <= 1.0 for v in result.metrics.values())
    unique = len({s.image for s in samples})
    assert stats["images_encoded"] == stats["misses"] == unique  # each image encoded once, POPE's six share it
    assert len({p["completion"] for p in result.predictions}) > 3  # varied answers make the next check meaningful
    again, _ = _run_tiny(tiny, data, batch_prompts=3)  # fresh cache, other batching: greedy gives the same text
    assert [p["completion"] for p in again.predictions] == [p["completion"] for p in result.predictions]
    assert again.metrics == result.metrics


def test_cli_eval_on_a_checkpoint_directory(tiny_model_dir, shapes_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--model",
        tiny_model_dir("qwen2_5_vl"),
        "--suite",
        "pope,grounding,vqa",
        "--data",
        str(shapes_dir / "test.jsonl"),
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, "pope_vlmevalkit.tsv"])
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["info"]["answer_format"] == "think_answer" and doc["info"]["box_format"] == "qwen2_5"
    assert doc["counts"]["vqa"] + doc["counts"]["grounding"] + doc["counts"]["pope"] == len(
        (out / "predictions.jsonl").read_text().splitlines()
    )
    assert "eval/pope/accuracy" in capsys.readouterr().out
    assert main(["eval"]) == 2 and "pass --model" in capsys.readouterr().err
    assert main(["eval", "--model", tiny_model_dir("qwen2_5_vl")]) == 2  # no data
    assert "no eval data" in capsys.readouterr().err


def test_cli_eval_on_a_run_directory(tiny_model_dir, shapes_dir, tmp_path):
    """The run's settings, its completion budget included (the CLI's own default, 128, cut a 512-token run's
    reasoning off); an export carries that budget in its vlgrpo.json; --max-new-tokens still wins."""
    from vlgrpo.config.contract import read_contract
    from vlgrpo.trainer import run_training

    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_dir('qwen2_5_vl')}",
            f"data.train={shapes_dir / 'train.jsonl'}",
            f"data.test={shapes_dir / 'test.jsonl'}",
            "data.answer_format=answer",
            "rollout.completions_per_prompt=2",
            "rollout.max_new_tokens=3",
            "train.prompts_per_step=2",
            "train.micro_batch_completions=4",
            "train.steps=1",
            f"train.output_dir={run}",
            "logging.progress_bar=false",
        ],
    )
    run_training(cfg, progress=False)
    out = tmp_path / "eval"
    assert (
        main(["eval", "--model", str(run), "--suite", "vqa", "--out", str(out), "--max-samples", "4", "--no-progress"])
        == 0
    )
    info = json.loads((out / "metrics.json").read_text())["info"]
    assert (info["answer_format"], info["data"]) == ("answer", str(shapes_dir / "test.jsonl"))  # the run's settings
    assert info["max_new_tokens"] == 3
    export = tmp_path / "export"
    assert main(["export", str(run), "--out", str(export)]) == 0
    assert read_contract(export).max_new_tokens == 3
    for extra, budget in (([], 3), (["--max-new-tokens", "5"], 5)):
        assert (
            main(
                [
                    "eval",
                    "--model",
                    str(export),
                    "--suite",
                    "vqa",
                    "--data",
                    str(shapes_dir / "test.jsonl"),
                    "--out",
                    str(out),
                    "--max-samples",
                    "4",
                    "--no-progress",
                    *extra,
                ]
            )
            == 0
        )
        assert json.loads((out / "metrics.json").read_text())["info"]["max_new_tokens"] == budget


def test_in_loop_evaluator_leaves_training_undisturbed(tiny, shapes_dir, tmp_path, monkeypatch):
    from vlgrpo.rollout.hf import HFEngine
    from vlgrpo.vision_cache import VisionCache

    val = tmp_path / "val.jsonl"
    val.write_text((shapes_dir / "test.jsonl").read_text().replace('"images/', f'"{shapes_dir}/images/'))
    cfg = Config()
    cfg.eval.data, cfg.eval.suites, cfg.eval.max_samples, cfg.eval.batch_prompts = str(val), ["pope", "vqa"], 6, 4
    cfg.rollout.max_new_tokens, cfg.data.answer_format = 4, "answer"
    ctx = RewardContext(box_format="qwen2_5", geometry=ProcessorGeometry.from_processor(tiny.processor))
    state = SimpleNamespace(
        backend=SimpleNamespace(model=tiny.model),
        lm=tiny,
        cache=VisionCache(tiny.model, tiny.processor),
        reward_ctx=ctx,
    )
    evaluator = make_evaluator(cfg)
    val.unlink()  # the samples were selected when the evaluator was made (before step 1): no call reads the file
    for training in (True, False):
        tiny.model.train(training)
        torch.manual_seed(123)
        before = torch.get_rng_state()
        metrics = evaluator(state)
        assert torch.equal(torch.get_rng_state(), before) and tiny.model.training is training
        assert {"eval/pope/accuracy", "eval/vqa/accuracy"} <= set(metrics)
        assert not any("grounding" in k for k in metrics)
    # Greedy decoding itself draws no random numbers ...
    engine = HFEngine(tiny.model, tiny.processor, state.cache, "answer", "qwen2_5")
    before = torch.get_rng_state()
    evaluate(engine, build_eval_data(shapes_dir / "test.jsonl", "vqa"), ctx, max_new_tokens=4, progress=False)
    assert torch.equal(torch.get_rng_state(), before)
    # ... and an engine that did would still leave the trainer's stream where it was.
    greedy = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, *a: (torch.rand(1), greedy(self, *a))[1])
    tiny.model.train()
    assert evaluator(state) == metrics and torch.equal(torch.get_rng_state(), before) and tiny.model.training
    tiny.model.eval()
    with pytest.raises(InputError, match="eval.data or data.val"):
        make_evaluator(Config())


def test_more_than_half_without_an_answer_is_a_loud_warning(tmp_path):
    """The issue's case: an `answer`-trained model prompted with think_answer wrote "<answer>" and nothing else; VQA
    accuracy read 0.000 with no word of why. Now the result, report.md and the CLI say so."""
    data, engine = _scripted_set()
    half_empty = {
        **engine.answers,
        "How many?": "<answer>",
        "Colour?": "<answer></answer>",
        "Where?": "<answer>",
        "R1": "<answer>",
    }  # 4 of 7 without an answer
    result = evaluate(ScriptedEngine(half_empty), data, RewardContext(box_format="qwen2"), progress=False)
    assert result.info["no_answer"] == 4
    assert "4 of 7 completions (57%) hold no answer" in result.info["warning"]
    assert {p["id"]: p["answered"] for p in result.predictions} == {
        "n": False,
        "t": False,
        "g": False,
        "pope-random-1": False,
        "pope-random-2": True,
        "pope-popular-1": True,
        "pope-popular-2": True,
    }
    write_outputs(result, tmp_path)
    assert "4 of 7 completions" in (tmp_path / "report.md").read_text()
    three = {**engine.answers, "How many?": "<answer>", "Colour?": "", "Where?": "nothing"}  # 3 of 7: no warning
    result = evaluate(ScriptedEngine(three), data, RewardContext(box_format="qwen2"), progress=False)
    assert result.info["no_answer"] == 3 and "warning" not in result.info


def test_eval_data_from_a_saved_datasetdict_picks_a_test_split_or_the_one_asked(tmp_path, shapes_dir):
    """`vlgrpo eval --data DIR` on a DatasetDict saved with save_to_disk: its test split unless `--split` names
    another (it used to read `train`, and fail on a dict without one); an unknown split names the ones there."""
    import datasets

    from vlgrpo.evals.source import resolve_source, rows_split

    def rows(split):
        out = [json.loads(line) for line in (shapes_dir / f"{split}.jsonl").read_text().splitlines()]
        for r in out:  # absolute paths: a saved dataset's images resolve against its parent directory
            r["image"] = str(shapes_dir / r["image"]) if not r["image"].startswith("/") else r["image"]
        return [{k: v for k, v in r.items() if k != "meta"} for r in out]  # meta's scene lists: not for Arrow

    saved = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows("train")), "test": datasets.Dataset.from_list(rows("test"))}
    ).save_to_disk(str(saved))
    test_ids = {json.loads(line)["id"] for line in (shapes_dir / "test.jsonl").read_text().splitlines()}
    assert rows_split(saved) == "test" and rows_split(saved, "train") == "train" and rows_split(shapes_dir) is None
    picked = build_eval_data(saved, "vqa")
    assert {s.id for s in picked.by_suite["vqa"]} <= test_ids and picked.by_suite["vqa"]
    train = build_eval_data(resolve_source(saved, split="train"), "vqa")
    assert not {s.id for s in train.by_suite["vqa"]} & test_ids
    with pytest.raises(Exception, match="has no split 'val'; splits: train, test"):
        build_eval_data(resolve_source(saved, split="val"), "vqa")
