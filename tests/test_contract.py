"""The prompt contract (vlgrpo.json): written into run directories and exports, read back as the defaults of
train, eval and reward; the round trip train -> export -> eval equals eval on the run directory."""

from __future__ import annotations

import json

import pytest

from vlgrpo.cli import main
from vlgrpo.config import ConfigError, load_config
from vlgrpo.config.contract import CONTRACT_FILE, PromptContract, read_contract
from vlgrpo.models import load_model


def _contract(**kw) -> PromptContract:
    return PromptContract(
        **{
            "arch": "qwen2_5_vl",
            "answer_format": "answer",
            "box_format": "qwen2_5",
            "system_prompt": "Be brief.",
            "min_pixels": 3136,
            "max_pixels": 12544,
            **kw,
        }
    )


def test_contract_round_trip_and_damaged_files(tmp_path):
    c = _contract()
    path = c.write(tmp_path)
    assert path == tmp_path / CONTRACT_FILE and read_contract(tmp_path) == c == read_contract(path)
    assert json.loads(path.read_text())["format"] == "vlgrpo-prompt-contract"
    assert read_contract(tmp_path / "nowhere") is None and read_contract("Qwen/Qwen2.5-VL-7B-Instruct") is None
    cases = {
        b"\xff{": "not valid UTF-8 JSON",
        b'{"format": "other"}': "is not a vlgrpo prompt contract",
        b'{"format": "vlgrpo-prompt-contract", "version": 9}': "version 9",
        b'{"format": "vlgrpo-prompt-contract", "version": 1, "arch": "qwen2_5_vl", "answer_format": "answer"}': "missing keys \\['box_format'\\]",  # noqa: E501
        b'{"format": "vlgrpo-prompt-contract", "version": 1, "arch": "qwen2_5_vl", "answer_format": "answer", '
        b'"box_format": "qwen2_5", "colour": 1}': "unknown keys \\['colour'\\]",
        b'{"format": "vlgrpo-prompt-contract", "version": 1, "arch": "qwen2_5_vl", "answer_format": "essay", '
        b'"box_format": "qwen2_5"}': "answer_format = 'essay' is not accepted",
        b'{"format": "vlgrpo-prompt-contract", "version": 1, "arch": "qwen2_5_vl", "answer_format": "answer", '
        b'"box_format": "qwen2_5", "max_pixels": -4}': "max_pixels = -4",
    }
    for raw, message in cases.items():
        path.write_bytes(raw)
        with pytest.raises(ConfigError, match=message) as e:
            read_contract(tmp_path)
        assert str(path) in str(e.value)


def test_a_checkpoints_contract_is_the_default_and_an_explicit_key_wins(tiny_model_dir, tmp_path, capsys):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir("qwen2_5_vl"), ckpt)
    _contract().write(ckpt)
    capsys.readouterr()
    cfg = load_config(None, [f"model.name_or_path={ckpt}"])
    assert (cfg.data.answer_format, cfg.data.system_prompt, cfg.reward.box_format) == ("answer", "Be brief.", "qwen2_5")
    assert (cfg.model.min_pixels, cfg.model.max_pixels, cfg.model.arch) == (3136, 12544, "qwen2_5_vl")
    assert "warning" not in capsys.readouterr().err
    cfg = load_config(None, [f"model.name_or_path={ckpt}", "data.answer_format=think_answer", "model.max_pixels=12544"])
    assert (cfg.data.answer_format, cfg.data.system_prompt) == ("think_answer", "Be brief.")
    err = capsys.readouterr().err
    assert "data.answer_format = 'think_answer', but the checkpoint was trained with 'answer'" in err
    assert "max_pixels" not in err  # explicit but equal: nothing to say
    cfg = load_config(None, [f"model.name_or_path={tiny_model_dir('qwen2_5_vl')}"])  # no contract: the defaults
    assert (cfg.data.answer_format, cfg.reward.box_format) == ("think_answer", "auto")


def test_train_export_eval_equals_eval_on_the_run_directory(tiny_model_dir, shapes_dir, tmp_path, spread, capsys):
    """The issue's case: a checkpoint trained with `answer` must be evaluated with `answer` whichever way it is
    handed over. A spread model answers varied text, so equal predictions are a real check of equal prompts."""
    from vlgrpo.trainer import run_training

    base = tmp_path / "base"
    lm = load_model(tiny_model_dir("qwen2_5_vl"))
    spread(lm.model, 0.3, seed=5)
    lm.model.save_pretrained(base)
    lm.processor.save_pretrained(base)
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.name_or_path={base}",
            f"data.train={shapes_dir / 'train.jsonl'}",
            f"data.test={shapes_dir / 'test.jsonl'}",
            "data.answer_format=answer",
            "data.system_prompt=Answer briefly.",
            "model.max_pixels=12544",
            "data.video.fps=4",
            "rollout.completions_per_prompt=2",
            "rollout.max_new_tokens=4",
            "train.prompts_per_step=2",
            "train.micro_batch_completions=4",
            "train.steps=1",
            f"train.output_dir={run}",
            "logging.progress_bar=false",
        ],
    )
    run_training(cfg, progress=False)
    video = {"fps": 4.0, "max_frames": 32, "min_pixels": None, "max_pixels": None}  # the run's data.video
    expected = PromptContract(
        "qwen2_5_vl", "answer", "qwen2_5", "Answer briefly.", None, 12544, max_new_tokens=4, video=video
    )
    assert read_contract(run) == expected
    assert main(["export", str(run), "--out", str(tmp_path / "export")]) == 0
    assert read_contract(tmp_path / "export") == expected
    common = ["--suite", "vqa,grounding,pope", "--max-new-tokens", "6", "--no-progress"]
    assert main(["eval", "--model", str(run), "--out", str(tmp_path / "e_run"), *common]) == 0
    assert (
        main(
            [
                "eval",
                "--model",
                str(tmp_path / "export"),
                "--data",
                str(shapes_dir / "test.jsonl"),
                "--out",
                str(tmp_path / "e_export"),
                *common,
            ]
        )
        == 0
    )
    on_run, on_export = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("e_run", "e_export"))
    assert on_export["metrics"] == on_run["metrics"] and on_export["counts"] == on_run["counts"]
    assert on_export["info"]["answer_format"] == "answer" and on_export["info"]["prompt_contract"] == CONTRACT_FILE
    assert on_export["info"]["video"] == on_run["info"]["video"] == {**video, "min_pixels": 0, "max_pixels": 0}
    preds = [(tmp_path / d / "predictions.jsonl").read_text() for d in ("e_run", "e_export")]
    assert preds[0] == preds[1]
    texts = {json.loads(line)["completion"] for line in preds[0].splitlines()}
    assert len(texts) > 3  # varied answers: the check above could fail
    # without the contract the export is prompted with the default think_answer: other completions
    (tmp_path / "export" / CONTRACT_FILE).unlink()
    assert (
        main(
            [
                "eval",
                "--model",
                str(tmp_path / "export"),
                "--data",
                str(shapes_dir / "test.jsonl"),
                "--out",
                str(tmp_path / "e_bare"),
                *common,
            ]
        )
        == 0
    )
    bare = json.loads((tmp_path / "e_bare" / "metrics.json").read_text())["info"]
    assert bare["answer_format"] == "think_answer" and bare["prompt_contract"] is None
    assert (tmp_path / "e_bare" / "predictions.jsonl").read_text() != preds[0]


def test_reward_cli_reads_the_checkpoints_box_convention_and_geometry(tiny_model_dir, tmp_path, capsys):
    """A 1120x840 image under max_pixels 12544 is resized to 112x84 (Qwen2.5-VL smart_resize: factor 28,
    sqrt(940800 / 12544) = 8.66, floor(96.99 / 28) * 28 = 84, floor(129.3 / 28) * 28 = 112), so the gold box
    [280, 210, 840, 630] is [28, 21, 84, 63] in the model's pixels: IoU 1 with --model. Without it the released
    processors' bounds keep 1120x840, and the same box reads as [28, 21, 84, 63] in original pixels, wholly outside
    the gold: IoU 0."""
    import shutil

    ckpt = tmp_path / "export"
    shutil.copytree(tiny_model_dir("qwen2_5_vl"), ckpt)
    _contract(min_pixels=None, max_pixels=12544).write(ckpt)
    from PIL import Image

    Image.new("RGB", (1120, 840)).save(tmp_path / "cat.png")
    sample = json.dumps(
        {
            "id": "b",
            "image": str(tmp_path / "cat.png"),
            "question": "Locate the cat.",
            "answer_type": "box",
            "boxes": [[280, 210, 840, 630]],
            "image_size": [1120, 840],
        }
    )
    argv = [
        "reward",
        "--sample",
        sample,
        "--completion",
        '<answer>[{"bbox_2d": [28, 21, 84, 63]}]</answer>',
        "--recipe",
        "iou",
        "--json",
    ]

    def iou() -> float:
        out = capsys.readouterr().out
        return json.loads(out[out.index("{\n") :])["components"]["iou"]  # after any library log line

    assert main([*argv, "--model", str(ckpt)]) == 0
    assert iou() == pytest.approx(1.0)
    assert main(argv) == 0
    assert iou() == 0.0
    assert main([*argv, "--model", tiny_model_dir("qwen2_5_vl")]) == 2
    assert "holds no vlgrpo.json" in capsys.readouterr().err


def test_a_qwen3_vl_run_writes_reads_and_scores_boxes_on_the_0_1000_grid(tiny_model_dir, shapes_dir, tmp_path, capsys):
    """Qwen3-VL through its arch alone (reward.box_format auto): the run's contract says qwen3, its SFT target writes
    the gold box on the 0-1000 grid, and `vlgrpo reward --model` scores a 0-1000 box 1 and the same box written in
    pixels 0 (the coordinate-frame bug peers shipped)."""
    import shutil

    from PIL import Image

    from vlgrpo.rewards import context_from_config
    from vlgrpo.trainer.sft import render_target
    from vlgrpo.types import Sample

    ckpt = tiny_model_dir("qwen3_vl")
    cfg = load_config(None, [f"model.name_or_path={ckpt}", "data.train=x.jsonl", "data.answer_format=answer"])
    ctx = context_from_config(cfg, "qwen3_vl")
    contract = PromptContract.from_config(cfg, "qwen3_vl", ctx.box_format)
    assert (ctx.box_format, contract.box_format) == ("qwen3", "qwen3")
    Image.new("RGB", (3000, 2000)).save(tmp_path / "cat.png")
    row = {
        "id": "b",
        "image": str(tmp_path / "cat.png"),
        "question": "Locate the cat.",
        "answer_type": "box",
        "boxes": [[300, 200, 900, 600]],
        "image_size": [3000, 2000],
    }
    target = render_target(Sample(**{**row, "image_size": (3000, 2000)}), "answer", ctx.box_format, ctx.geometry)
    assert '"bbox_2d": [100, 100, 300, 300]' in target  # 300/3000, 200/2000, 900/3000, 600/2000 of 1000
    export = tmp_path / "export"
    shutil.copytree(ckpt, export)
    contract.write(export)
    argv = ["reward", "--sample", json.dumps(row), "--recipe", "iou", "--json", "--model", str(export)]

    def iou(box) -> float:
        assert main([*argv, "--completion", f'<answer>[{{"bbox_2d": {box}}}]</answer>']) == 0
        out = capsys.readouterr().out
        return json.loads(out[out.index("{\n") :])["components"]["iou"]

    assert iou([100, 100, 300, 300]) == pytest.approx(1.0)
    assert iou([300, 200, 900, 600]) == 0.0  # pixels read on the 0-1000 grid: [900, 400, 2700, 1200] px
    # the grounding eval of a Qwen3-VL checkpoint without a contract: the arch alone picks the grid
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                ckpt,
                "--suite",
                "grounding",
                "--data",
                str(shapes_dir / "test.jsonl"),
                "--max-new-tokens",
                "2",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads((out / "metrics.json").read_text())["info"]["box_format"] == "qwen3"
