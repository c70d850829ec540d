"""scripts/gpu_check.sh: the dry run takes the GPU check's code path on the CPU and writes its table elsewhere; the
comparison flags a planner miss; a missing package or a dry run aimed at docs/gpu-validation.md stops it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gpu-validation.md"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {label}"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_dry_run_takes_the_whole_path_and_leaves_the_docs_file_alone(tmp_path, arch):
    records = lambda: {p.name: p.read_text() for p in DOC.parent.glob("gpu-validation*.md")}  # noqa: E731
    before = records()
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--arch", arch, "--work", str(tmp_path / "w")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "w" / "gpu-validation-dry-run.md").read_text()
    assert records() == before and DOC.name in before  # no docs record written or changed
    assert "--dry-run (CPU, tiny sizes: not a GPU record)" in text
    assert ("--arch qwen3_vl" in text and "tiny Qwen3-VL (DeepStack on)" in text) == (arch == "qwen3_vl")
    for model in ("demo_model", "memory_model"):  # both parts ran on the arch asked for
        assert json.loads((tmp_path / "w" / model / "config.json").read_text())["model_type"] == arch
    assert _row(text, "steps run") == ["2", "2"]  # LoRA, full fine-tune
    for phase in ("vision", "rollout", "ref_logprob", "update"):
        assert all(float(v) > 0 for v in _row(text, f"`timing/{phase}`")), phase
    # 2 prompts per step, unseen images: one batched encoder call per step encoding exactly those 2 images
    assert _row(text, "`vision/encoder_calls` per step") == ["1.00", "1.00"]
    assert _row(text, "`vision/images_encoded` per step") == ["2.00", "2.00"]
    for run in ("LoRA r=16, no checkpointing", "full fine-tune, gradient checkpointing"):
        _, tokens, planned, measured, ratio, within = _row(text, run)
        assert float(planned.split()[0]) > 0 and (measured, ratio, within) == ("—", "—", "n/a (no CUDA)")
        # 112 px image under max_pixels 112²: 16 image tokens of 28 px; Qwen3-VL's 32 px tokens fit 96 px: 3 x 3
        assert tokens.startswith(
            {"qwen2_5_vl": "16 + ", "qwen3_vl": "9 + ", "qwen3_5": "9 + "}[arch]
        )  # as the planner counts them
    assert "| `rollout/logprob_abs_diff` |" in text and ("not checkable there" in text or "not measured" in text)


def test_a_miss_is_reported_not_hidden():
    gc = _module()
    assert gc.compare(105, 100) == (1.05, True)
    assert gc.compare(89, 100) == (0.89, False) and gc.compare(111, 100)[1] is False
    assert gc.compare(0, 100) == (None, None)  # nothing measured (no CUDA)
    row = {
        "mode": "full",
        "params": 2e9,
        "trainable": 1.3e9,
        "image_tokens": 256,
        "text_tokens": 70,
        "response_length": 128.0,
        "planned_gb": 20.0,
        "train_phase_gb": 20.0,
        "rollout_phase_gb": 9.0,
        "measured_gb": 24.0,
        "ratio": 1.2,
        "within": False,
    }
    (line,) = [x for x in gc._memory_table([row]) if x.startswith("| full")]
    assert line.endswith("| 24.00 | 1.200 | **NO — planner miss** |")


def test_missing_packages_and_a_dry_run_onto_the_docs_file_stop_it(tmp_path, capsys, monkeypatch):
    gc = _module()
    assert gc.main(["--dry-run", "--out", str(DOC), "--work", str(tmp_path)]) == 2
    assert "does not overwrite docs/gpu-validation.md" in capsys.readouterr().err
    monkeypatch.setitem(gc.REQUIRED, "no_such_package_xyz", "the test")
    assert gc.main(["--dry-run", "--work", str(tmp_path)]) == 2
    assert "missing no_such_package_xyz (needed for the test)" in capsys.readouterr().err
