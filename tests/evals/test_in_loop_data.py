"""The in-loop eval's data is checked before step 1: `vlgrpo train` refuses, and `vlgrpo data doctor` reports, an
`eval.suites` entry that the eval data gives nothing to run on (a converted LLaVA / R1-V file: no boxes, no objects),
through the one selection the evaluator itself uses; with suites the data supports, the run trains and evaluates."""

from __future__ import annotations

import json

import pytest

from vlgrpo.cli import main
from vlgrpo.config import ConfigError, load_config, save_config
from vlgrpo.evals.run import in_loop_eval_data, in_loop_eval_problem
from vlgrpo.trainer.metrics import read_metrics

ALL_SUITES = "eval.suites=[vqa, grounding, pope]"


def _val_without_boxes_or_objects(tmp_path, shapes_dir) -> str:
    """Three rows as `vlgrpo data convert --preset llava` writes them: a number or yes/no answer, no boxes, no
    `objects`; the images are the shapes set's own."""
    rows = [
        {
            "id": f"q{i}",
            "image": str(shapes_dir / "images" / f"shapes-train-{i:06d}.png"),
            "question": question,
            "answer": answer,
            "answer_type": kind,
        }
        for i, (question, answer, kind) in enumerate(
            [
                ("How many shapes?", "2", "number"),
                ("Is there a red circle?", "yes", "yesno"),
                ("How many squares?", "1", "number"),
            ]
        )
    ]
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _run_config(tmp_path, model_dir, shapes_dir, *overrides: str):
    """(config path, Config): a one-step tiny run with in-loop eval at every step on the converted val file."""
    cfg = load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.train={shapes_dir / 'train.jsonl'}",
            f"data.val={_val_without_boxes_or_objects(tmp_path, shapes_dir)}",
            "data.answer_format=answer",
            "rollout.completions_per_prompt=2",
            "rollout.max_new_tokens=4",
            "train.prompts_per_step=2",
            "train.micro_batch_completions=4",
            "train.steps=1",
            f"train.output_dir={tmp_path / 'run'}",
            "logging.progress_bar=false",
            "eval.every_steps=1",
            *overrides,
        ],
    )
    path = tmp_path / "my_run.yaml"
    save_config(cfg, path)
    return path, cfg


def test_train_refuses_suites_without_data_before_step_1(tmp_path, tiny_model_dir, shapes_dir, capsys, monkeypatch):
    import vlgrpo.trainer

    path, cfg = _run_config(tmp_path, tiny_model_dir(), shapes_dir, ALL_SUITES)
    started = []
    monkeypatch.setattr(vlgrpo.trainer, "run_training", lambda *a, **k: started.append(a))
    capsys.readouterr()  # the fixtures' progress bars
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "error: eval.suites [vqa, grounding, pope] cannot all run on the in-loop eval data "
            f"(data.val '{cfg.data.val}')"
        )
        and err.count("\n") == 1
    )
    assert "'grounding' has nothing to run on: it needs samples of answer_type box" in err
    assert "'pope' cannot run: POPE: none of the 3 images has >= 3 distinct objects (Sample.objects)" in err
    assert "Drop 'grounding' and 'pope' from eval.suites (eval.suites=[vqa])" in err
    assert started == [] and not (tmp_path / "run").exists()  # no model loaded, no run directory made
    with pytest.raises(ConfigError, match=r"eval.every_steps=0: no in-loop eval"):  # nothing left to keep
        in_loop_eval_data(load_config(path, ["eval.suites=[grounding]"]))


def test_doctor_reports_the_suites_train_would_refuse(tmp_path, tiny_model_dir, shapes_dir, capsys):
    path, cfg = _run_config(tmp_path, tiny_model_dir(), shapes_dir, ALL_SUITES)
    assert main(["data", "doctor", str(path), "--no-progress", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in report["findings"] if f["check"] == "eval_suites"]
    assert (finding["severity"], finding["split"]) == ("error", "val")
    assert finding["message"] == in_loop_eval_problem(cfg)  # the very message `vlgrpo train` stops with
    assert "'grounding' has nothing to run on" in finding["message"] and "'pope' cannot run" in finding["message"]
    assert main(["data", "doctor", str(path), "--no-progress", "--split", "train"]) == 0  # val not checked
    capsys.readouterr()
    assert main(["data", "doctor", str(path), "--no-progress", "--set", "eval.suites=[vqa]"]) == 0
    assert "eval_suites" not in capsys.readouterr().out


def test_suites_the_data_supports_train_and_evaluate(tmp_path, tiny_model_dir, shapes_dir):
    path, _ = _run_config(tmp_path, tiny_model_dir(), shapes_dir, ALL_SUITES)
    assert main(["train", str(path), "eval.suites=[vqa]"]) == 0
    (row,) = read_metrics(tmp_path / "run")
    assert row["eval/failures"] == 0.0 and 0.0 <= row["eval/vqa/accuracy"] <= 1.0
    assert not any(k.startswith(("eval/grounding/", "eval/pope/")) for k in row)
    assert (tmp_path / "run" / "checkpoints" / "step_1").is_dir()
