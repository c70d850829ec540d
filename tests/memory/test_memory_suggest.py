"""Every change `vlgrpo plan` can suggest is one the trainer runs.

The suggestions are enumerated over a grid of run configs (backend x engine x GPUs x beta x checkpointing x
micro-batch x ZeRO-3 offload): each suggested override must pass config validation, name a backend the trainer
builds, and give back exactly the input the planner priced when mapped through the same config path.
"""

import itertools

import pytest

from vlgrpo.cli import main
from vlgrpo.config import ConfigError, load_config
from vlgrpo.config.schema import CHOICES
from vlgrpo.memory import GPU_TYPES, PlanInput, plan, suggestions
from vlgrpo.memory.planner import peak_on
from vlgrpo.memory.report import plan_input_from_config
from vlgrpo.memory.suggest import candidates, merge_overrides, not_run_by_trainer

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
BIG = "Qwen/Qwen2.5-VL-72B-Instruct"


def _grid():
    axes = itertools.product(["plain", "lora", "zero3"], ["hf", "vllm"], [1, 8], [0.0, 0.04], [False, True], [6, 3],
                             [False, True])
    for backend, engine, gpus, beta, checkpointing, micro, offload in axes:
        if offload and backend != "zero3":
            continue
        yield [f"model.name_or_path={MODEL}", "model.dtype=bfloat16", f"train.backend={backend}",
               f"rollout.engine={engine}", f"train.num_gpus={gpus}", f"grpo.beta={beta}",
               f"model.gradient_checkpointing={checkpointing}", f"train.micro_batch_completions={micro}",
               "rollout.completions_per_prompt=6", f"train.zero3.offload_optimizer={offload}"]


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
    assert seen == {("model.gradient_checkpointing",), ("train.micro_batch_completions",), ("train.backend",),
                    ("train.backend", "train.zero3.offload_optimizer"), ("train.backend", "train.lora.rank"),
                    ("train.zero3.offload_optimizer",), ("train.zero3.offload_param",),
                    ("rollout.placement", "rollout.vllm.rollout_gpus")}


@pytest.mark.parametrize("backend", ["plain", "zero3"])
def test_printed_suggestions_and_the_greedy_combination_run(backend):
    base = [f"model.name_or_path={BIG}", "model.dtype=bfloat16", f"train.backend={backend}", "train.num_gpus=8",
            "rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=8", "rollout.max_new_tokens=512"]
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
    argv = ["plan", "--model", MODEL, "--gpus", "8", "--set", "rollout.engine=vllm", "--set",
            "rollout.placement=split", "--set", "rollout.vllm.rollout_gpus=2"]
    assert main(argv) == 0
    assert ("note: rollout.placement=split with 2 vLLM GPU(s) for 6 training GPU(s) is planned for comparison"
            in capsys.readouterr().out)
    runs = load_config(None, [f"model.name_or_path={MODEL}", "train.num_gpus=8", "rollout.engine=vllm",
                              "rollout.placement=split", "rollout.vllm.rollout_gpus=4"])
    assert not_run_by_trainer(plan_input_from_config(runs)) == []


def test_comparison_only_inputs_are_labelled(capsys):
    assert main(["plan", "--params", "7e9", "--gpus", "8", "--zero", "2", "--offload", "optimizer,reference"]) == 0
    table = capsys.readouterr().out
    assert "note: ZeRO-2 is planned for comparison" in table
    assert "note: --offload optimizer,reference is planned for comparison" in table


def test_merging_overrides_keeps_the_last_backend_and_its_section():
    steps = [("train.backend=zero3", "train.zero3.offload_optimizer=true"), ("model.gradient_checkpointing=true",),
             ("train.backend=lora", "train.lora.rank=16")]
    assert merge_overrides(steps) == ("model.gradient_checkpointing=true", "train.backend=lora", "train.lora.rank=16")
    assert merge_overrides([("train.micro_batch_completions=4",), ("train.micro_batch_completions=2",)]) == (
        "train.micro_batch_completions=2",)
