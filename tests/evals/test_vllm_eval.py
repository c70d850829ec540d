"""`vlgrpo eval --engine vllm` (vLLM's CPU build, `make test-vllm`): exactly the predictions and metrics of the HF
engine on the tiny Qwen2.5-VL and Qwen3-VL (greedy, fp32; Qwen3-VL's DeepStack maps sent from our vision cache), so
large checkpoints can be evaluated fast on a GPU."""

import json

import pytest

from vlgrpo.cli import main
from vlgrpo.models import load_model

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_vllm_eval_writes_the_hf_engines_predictions_and_metrics(
    arch, tiny_model_dir, shapes_dir, tmp_path, monkeypatch, spread, spread_deepstack
):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    lm = load_model(tiny_model_dir(arch))
    spread(lm.model, 0.5, seed=3)  # varied answers make "the same predictions" a real check
    spread_deepstack(lm.model, 1.0)  # Qwen3-VL: answers that depend on the DeepStack maps (a no-op otherwise)
    model = tmp_path / "model"
    lm.model.save_pretrained(model)
    lm.processor.save_pretrained(model)
    common = [
        "eval",
        "--model",
        str(model),
        "--suite",
        "pope,grounding,vqa",
        "--data",
        str(shapes_dir / "train.jsonl"),
        "--max-samples",
        "12",
        "--max-new-tokens",
        "12",
        "--no-progress",
    ]
    assert main([*common, "--out", str(tmp_path / "hf")]) == 0
    assert (
        main(
            [
                *common,
                "--out",
                str(tmp_path / "vllm"),
                "--engine",
                "vllm",
                "--engine-kwargs",
                '{"enforce_eager": true, "block_size": 32}',
            ]
        )
        == 0
    )
    hf, vl = (
        [json.loads(x) for x in (tmp_path / d / "predictions.jsonl").read_text().splitlines()] for d in ("hf", "vllm")
    )
    assert len(hf) >= 20 and [p["completion"] for p in vl] == [p["completion"] for p in hf]
    assert len({p["completion"] for p in hf}) > 5
    m_hf, m_vl = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("hf", "vllm"))
    assert m_vl["metrics"] == m_hf["metrics"] and m_vl["info"]["engine"] == "vllm"


def test_vllm_eval_with_the_zoom_tool_writes_the_hf_engines_trajectories(tool_caller_dir, shapes_dir, tmp_path):
    """`vlgrpo eval --engine vllm --tools zoom_in` runs (it was refused at the command line): the tiny model taught
    to call the tool gives, through vLLM's multi-turn rollouts, the HF engine's conversations, crops and metrics."""
    common = [
        "eval",
        "--model",
        tool_caller_dir,
        "--suite",
        "vqa",
        "--data",
        str(shapes_dir / "train.jsonl"),
        "--max-samples",
        "3",
        "--max-new-tokens",
        "100",
        "--box-format",
        "plain",
        "--tools",
        "zoom_in",
        "--max-turns",
        "3",
        "--no-progress",
    ]
    assert main([*common, "--out", str(tmp_path / "hf")]) == 0
    kwargs = '{"enforce_eager": true, "block_size": 32}'
    assert main([*common, "--out", str(tmp_path / "vllm"), "--engine", "vllm", "--engine-kwargs", kwargs]) == 0
    hf, vl = (
        [json.loads(x) for x in (tmp_path / d / "predictions.jsonl").read_text().splitlines()] for d in ("hf", "vllm")
    )
    assert [p["completion"] for p in vl] == [p["completion"] for p in hf]
    assert [p.get("messages") for p in vl] == [p.get("messages") for p in hf]
    m_hf, m_vl = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("hf", "vllm"))
    assert m_vl["metrics"] == m_hf["metrics"] and m_vl["info"]["tools"]["tools"] == ["zoom_in"]
    assert m_hf["info"]["tools"]["tools/calls_per_sample"] > 0  # the tool was called and its crop came back
