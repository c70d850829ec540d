"""Every change `vlgrpo plan` can suggest is one the trainer runs.

The suggestions are enumerated over a grid of run configs (backend x engine x GPUs x beta x checkpointing x
micro-batch x ZeRO-3 offload): each suggested override must pass config validation, name a backend the trainer
builds, and give back exactly the input the planner priced when mapped through the same config path.
"""

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from vlgrpo.cli import main
from vlgrpo.config import ConfigError, load_config
from vlgrpo.config.schema import CHOICES
from vlgrpo.memory import GPU_TYPES, PlanInput, plan, suggestions
from vlgrpo.memory.fit import peak_on
from vlgrpo.memory.from_config import plan_input_from_config
from vlgrpo.memory.suggest import DEEPSPEED_JSON, candidates, merge_overrides, not_run_by_trainer

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
BIG = "Qwen/Qwen2.5-VL-72B-Instruct"


def _grid():
    axes = itertools.product(
        ["plain", "lora", "zero3"], ["hf", "vllm"], [1, 8], [0.0, 0.04], [False, True], [6, 3], [False, True]
    )
    for backend, engine, gpus, beta, checkpointing, micro, offload in axes:
        if offload and backend != "zero3":
            continue
        yield [
            f"model.name_or_path={MODEL}",
            "model.dtype=bfloat16",
            f"train.backend={backend}",
            f"rollout.engine={engine}",
            f"train.num_gpus={gpus}",
            f"grpo.beta={beta}",
            f"model.gradient_checkpointing={checkpointing}",
            f"train.micro_batch_completions={micro}",
            "rollout.completions_per_prompt=6",
            f"train.zero3.offload_optimizer={offload}",
        ]


def _check_runs(base: list[str], overrides: tuple[str, ...] | list[str], priced: PlanInput) -> None:
    """The override passes validation, names a built backend, and the config maps back onto the priced input."""
    try:
        cfg = load_config(None, base + list(overrides))
    except ConfigError as e:
        pytest.fail(f"suggested {overrides} on {base} is rejected by the config: {e}")
    assert cfg.train.backend in CHOICES["train.backend"]
    assert plan_input_from_config(cfg) == priced, f"{overrides} on {base} is not what the planner priced"
    assert not_run_by_trainer(priced) == []


def _peak_on_a100(cfg) -> int:
    inp = plan_input_from_config(cfg)
    return peak_on(inp, plan(inp)["per_gpu"], GPU_TYPES["A100-80GB"])[0]


def test_every_single_change_runs():
    seen = set()
    for base in _grid():
        inp = plan_input_from_config(load_config(None, base))
        assert not_run_by_trainer(inp) == []  # a run config is something the trainer runs
        for overrides, alt in candidates(inp):
            seen.add(tuple(o.split("=")[0] for o in overrides))
            _check_runs(base, overrides, alt)
    # the grid reached every kind of suggestion the planner has
    assert seen == {
        ("model.gradient_checkpointing",),
        ("train.micro_batch_completions",),
        ("train.backend",),
        ("train.backend", "train.zero3.offload_optimizer"),
        ("train.backend", "train.lora.rank"),
        ("train.zero3.offload_optimizer",),
        ("train.zero3.offload_param",),
        ("rollout.placement", "rollout.vllm.rollout_gpus"),
    }


@pytest.mark.parametrize("backend", ["plain", "zero3"])
def test_printed_suggestions_and_the_greedy_combination_run(backend):
    base = [
        f"model.name_or_path={BIG}",
        "model.dtype=bfloat16",
        f"train.backend={backend}",
        "train.num_gpus=8",
        "rollout.engine=vllm",
        "rollout.vllm.tensor_parallel_size=8",
        "rollout.max_new_tokens=512",
    ]
    inp = plan_input_from_config(load_config(None, base))
    out = suggestions(inp, "A100-80GB")
    assert not any(s["fits"] for s in out[:-1]) and out[-1]["fits"]  # the last entry: a combination that fits
    for s in out:  # the priced input of a suggestion: apply its overrides and plan again
        cfg = load_config(None, base + s["overrides"])
        assert s["peak_bytes"] == _peak_on_a100(cfg)
    # vLLM over 8 GPUs: a split would need tensor parallelism in each rank's worker, which the trainer does not run
    assert not any("rollout.placement=split" in s["overrides"] for s in out)


def test_split_placement_is_suggested_as_the_trainer_runs_it(capsys):
    """One vLLM GPU per training rank (4 + 4 on 8 GPUs), the layout the split rollout runs, without a note."""
    assert main(["plan", "--model", BIG, "--gpus", "8", "--set", "rollout.engine=vllm"]) == 0
    table = capsys.readouterr().out
    split = [line for line in table.splitlines() if "rollout.placement=split" in line]
    assert split[0].endswith("  rollout.placement=split rollout.vllm.rollout_gpus=4")  # alone, then in the combination
    assert split[-1].endswith(" rollout.placement=split rollout.vllm.rollout_gpus=4")
    assert "note:" not in table and "planned" not in table


def test_a_split_the_trainer_does_not_run_is_labelled(capsys):
    argv = [
        "plan",
        "--model",
        MODEL,
        "--gpus",
        "8",
        "--set",
        "rollout.engine=vllm",
        "--set",
        "rollout.placement=split",
        "--set",
        "rollout.vllm.rollout_gpus=2",
    ]
    assert main(argv) == 0
    assert (
        "note: rollout.placement=split with 2 vLLM GPU(s) for 6 training GPU(s) is planned for comparison"
        in capsys.readouterr().out
    )
    runs = load_config(
        None,
        [
            f"model.name_or_path={MODEL}",
            "train.num_gpus=8",
            "rollout.engine=vllm",
            "rollout.placement=split",
            "rollout.vllm.rollout_gpus=4",
        ],
    )
    assert not_run_by_trainer(plan_input_from_config(runs)) == []


def test_comparison_only_inputs_are_labelled(capsys):
    assert main(["plan", "--params", "7e9", "--gpus", "8", "--zero", "2", "--offload", "optimizer,reference"]) == 0
    table = capsys.readouterr().out
    assert "note: ZeRO-2 is planned for comparison" in table
    assert "note: --offload optimizer,reference is planned for comparison" in table


def test_merging_overrides_keeps_the_last_backend_and_its_section():
    steps = [
        ("train.backend=zero3", "train.zero3.offload_optimizer=true"),
        ("model.gradient_checkpointing=true",),
        ("train.backend=lora", "train.lora.rank=16"),
    ]
    assert merge_overrides(steps) == ("model.gradient_checkpointing=true", "train.backend=lora", "train.lora.rank=16")
    assert merge_overrides([("train.micro_batch_completions=4",), ("train.micro_batch_completions=2",)]) == (
        "train.micro_batch_completions=2",
    )
    # an edit of the DeepSpeed JSON goes with the zero3 backend: a later switch to LoRA drops it
    offload = f"{DEEPSPEED_JSON}zero_optimization.offload_optimizer.device=cpu"
    assert merge_overrides([(offload,), ("train.backend=lora", "train.lora.rank=16")]) == (
        "train.backend=lora",
        "train.lora.rank=16",
    )
    assert merge_overrides([(offload,), ("model.gradient_checkpointing=true",)]) == (
        offload,
        "model.gradient_checkpointing=true",
    )


ROOT = Path(__file__).resolve().parents[2]
ZERO3_RECIPE = ROOT / "configs" / "qwen2_5_vl_7b_zero3_8xa100.yaml"


def _set(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def _get(tree: dict, dotted: str):
    for key in dotted.split("."):
        tree = tree.get(key, {})
    return tree


def _apply(suggestion: dict, base: list[str], tmp_path: Path) -> list[str]:
    """The overrides that apply a printed suggestion: its config overrides, and its DeepSpeed JSON edits made in a copy
    of the file that the run then names."""
    extra = list(suggestion["overrides"])
    if suggestion.get("deepspeed_json"):
        ds = json.loads(Path(suggestion["deepspeed_json"]["file"]).read_text())
        for key, value in suggestion["deepspeed_json"]["set"].items():
            _set(ds, key, value)
        copy = tmp_path / f"ds_{len(list(tmp_path.iterdir()))}.json"
        copy.write_text(json.dumps(ds))
        extra.append(f"train.zero3.deepspeed_config={copy}")
    return base + extra


@pytest.mark.parametrize("gpus", [1, 2])
def test_printed_suggestions_change_what_the_trainer_runs(gpus, tmp_path, monkeypatch, capsys):
    """The ZeRO-3 recipe names configs/ds_zero3_bf16.json, which wins over train.zero3.offload_*: offload must be
    suggested in that file's terms, and every suggestion, applied as printed, must change the DeepSpeed config the
    trainer builds (`trainer.zero3.ds_config`) and give the peak that was printed."""
    from vlgrpo.trainer.zero3 import ds_config

    monkeypatch.chdir(ROOT)  # the recipe names its JSON relative to the repository root, as the launch scripts run
    assert main(["plan", str(ZERO3_RECIPE), "--gpus", str(gpus)]) == 0
    table = capsys.readouterr().out
    assert main(["plan", str(ZERO3_RECIPE), "--gpus", str(gpus), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["suggestions"]
    base = [f"train.num_gpus={gpus}"]
    before = ds_config(load_config(ZERO3_RECIPE, base), world_size=gpus)
    assert "offload_optimizer" not in before["zero_optimization"]
    for s in out:
        assert s["change"] in table
        cfg = load_config(ZERO3_RECIPE, _apply(s, base, tmp_path))
        inp = plan_input_from_config(cfg)
        assert peak_on(inp, plan(inp)["per_gpu"], GPU_TYPES["A100-80GB"])[0] == s["peak_bytes"], s["change"]
        if cfg.train.backend != "zero3":
            continue  # LoRA: no DeepSpeed at all
        after = ds_config(cfg, world_size=gpus)  # what DeepSpeed is handed; rollout changes do not reach it
        assert after["train_micro_batch_size_per_gpu"] == cfg.train.micro_batch_completions
        for target in ("optimizer", "param"):
            device = f"zero_optimization.offload_{target}.device"
            if target in inp.offload:  # planned as offloaded: DeepSpeed must be told so
                assert _get(before, device) != "cpu" and _get(after, device) == "cpu", (
                    f"{s['change']} does not change what DeepSpeed runs"
                )
    # in the JSON's terms, never as train.zero3.offload_* keys the trainer would ignore
    assert not any(o.startswith("train.zero3.") for s in out for o in s["overrides"])
    assert [s["deepspeed_json"]["set"] for s in out if s["deepspeed_json"]] == [
        {"zero_optimization.offload_optimizer.device": "cpu"},
        {"zero_optimization.offload_param.device": "cpu"},
    ]
    assert 'fits   in configs/ds_zero3_bf16.json set zero_optimization.offload_optimizer.device to "cpu"' in table


def test_the_plan_takes_offload_from_the_deepspeed_json(tmp_path, capsys):
    """With train.zero3.deepspeed_config set, the trainer reads offload from the file: so does the plan, and a
    train.zero3.offload_* key beside the file is refused (it would do nothing)."""
    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps(
            {
                "bf16": {"enabled": True},
                "zero_optimization": {
                    "stage": 3,
                    "offload_optimizer": {"device": "cpu"},
                    "offload_param": {"device": "none"},
                },
            }
        )
    )
    base = [
        f"model.name_or_path={MODEL}",
        "model.dtype=bfloat16",
        "train.backend=zero3",
        "train.num_gpus=8",
        f"train.zero3.deepspeed_config={ds}",
    ]
    inp = plan_input_from_config(load_config(None, base))
    assert inp.offload == frozenset({"optimizer"}) and inp.deepspeed_config == str(ds)
    assert main(["plan", "--set", base[0], "--set", base[2], "--set", base[3], "--set", base[4]]) == 0
    assert f"offload: optimizer (from {ds})" in capsys.readouterr().out
    assert (
        main(
            [
                "plan",
                "--set",
                base[0],
                "--set",
                base[2],
                "--set",
                base[3],
                "--set",
                base[4],
                "--set",
                "train.zero3.offload_param=true",
            ]
        )
        == 2
    )
    assert "zero_optimization.offload_param.device: cpu" in capsys.readouterr().err
    # each offload change, applied to a copy of the JSON, gives back exactly the input that was priced
    for changes, alt in candidates(inp):
        edits = {c.removeprefix(DEEPSPEED_JSON).split("=")[0]: "cpu" for c in changes if c.startswith(DEEPSPEED_JSON)}
        if not edits:
            continue
        assert not any(c.startswith("train.zero3.offload") for c in changes)
        edited = json.loads(ds.read_text())
        for key, value in edits.items():
            _set(edited, key, value)
        copy = tmp_path / "edited.json"
        copy.write_text(json.dumps(edited))
        cfg = load_config(None, base + [f"train.zero3.deepspeed_config={copy}"])
        assert plan_input_from_config(cfg) == dataclasses.replace(alt, deepspeed_config=str(copy))


def test_deepspeed_json_settings_the_plan_does_not_follow_are_named(tmp_path, capsys):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    assert (
        main(["plan", "--model", MODEL, "--set", "train.backend=zero3", "--set", f"train.zero3.deepspeed_config={ds}"])
        == 0
    )
    table = capsys.readouterr().out
    assert f"note: {ds} sets zero_optimization.stage=2: the zero3 backend is built for stage 3" in table
    assert f"note: {ds} enables float16 but model.dtype=bfloat16" in table
    assert (
        main(
            [
                "plan",
                "--model",
                MODEL,
                "--set",
                "train.backend=zero3",
                "--set",
                f"train.zero3.deepspeed_config={tmp_path / 'missing.json'}",
            ]
        )
        == 2
    )
    assert "train.zero3.deepspeed_config: cannot read" in capsys.readouterr().err
