"""One registry per choice (vlgrpo/registry.py): every option's implementation imports, and the config, the CLI and
the configuration reference offer exactly the registries' names."""

from __future__ import annotations

import argparse

import pytest

from vlgrpo.cli.main import build_parser
from vlgrpo.config import CHOICES, EVAL_SUITES, load_config
from vlgrpo.registry import (
    BACKEND,
    BOX_FORMAT,
    BY_KEY,
    DATA_FORMAT,
    DATA_PRESET,
    ENGINE,
    EVAL_SUITE,
    MODEL_ARCH,
    POPE_PARSER,
    REGISTRIES,
    TOOL,
    Option,
    Registry,
)


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.key)
def test_every_option_imports_and_is_what_it_names(registry):
    for option in registry.options.values():
        if option.target is None:
            with pytest.raises(ValueError, match=f"{registry.key}="):
                registry.load(option.name)
            continue
        obj = registry.load(option.name)
        if registry is EVAL_SUITE:
            assert obj.name == option.name
        if registry is BOX_FORMAT:
            assert obj.name == option.name
        if registry in (BACKEND,):
            assert obj.name == option.name
        if registry is TOOL:  # a Tool, which the model may call by another name
            assert option.name in (obj.name, *obj.aliases)


def test_config_choices_are_the_registries_names():
    for key, registry in BY_KEY.items():
        if key == EVAL_SUITE.key:
            assert EVAL_SUITES == registry.names
        elif key == TOOL.key:  # a list of names, each one of these or a user function: validate checks each
            assert key not in CHOICES
        else:
            assert CHOICES[key] == registry.names


def _choices(parser: argparse.ArgumentParser, *path: str) -> dict[str, tuple]:
    for name in path:  # walk the sub-commands
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return {a.option_strings[0]: tuple(a.choices) for a in parser._actions if a.choices and a.option_strings}


def test_cli_choices_are_the_registries_names():
    parser = build_parser()
    without_auto = lambda r: tuple(n for n in r.names if n not in ("auto", "none"))  # noqa: E731
    assert _choices(parser, "eval")["--pope-parser"] == POPE_PARSER.names
    assert _choices(parser, "eval")["--engine"] == ENGINE.names
    assert _choices(parser, "eval")["--box-format"] == without_auto(BOX_FORMAT)
    assert _choices(parser, "eval", "score")["--parser"] == POPE_PARSER.names
    assert _choices(parser, "reward")["--box-format"] == without_auto(BOX_FORMAT)
    assert _choices(parser, "model", "init-tiny")["--arch"] == without_auto(MODEL_ARCH)
    assert _choices(parser, "data", "convert")["--preset"] == without_auto(DATA_PRESET)
    assert _choices(parser, "data", "doctor")["--preset"] == without_auto(DATA_PRESET)


def test_a_former_name_is_accepted_with_a_deprecation_message(capsys):
    cfg = load_config(None, ["grpo.loss=gspo"])
    assert cfg.grpo.ratio == "sequence"
    err = capsys.readouterr().err
    assert "config key 'grpo.loss' is now 'grpo.ratio'" in err and "grpo.ratio='gspo' is deprecated" in err
    assert load_config(None, ["grpo.ratio=sequence_token"]).grpo.ratio == "sequence_token"
    assert capsys.readouterr().err == ""
    with pytest.raises(Exception, match="sets both 'grpo.loss'.*and 'grpo.ratio'"):
        load_config(None, ["grpo.loss=gspo", "grpo.ratio=token"])


def test_a_new_option_is_one_line():
    """What adding an engine or a suite takes: a Registry line naming the implementation; loading it imports it."""
    reg = Registry(
        "rollout.engine",
        *ENGINE.options.values(),
        Option("sglang", "vlgrpo.rollout.hf:HFEngine", "stands in for a new engine module"),
    )
    assert reg.names == ("hf", "vllm", "sglang") and reg.load("sglang").from_config
    assert DATA_FORMAT.load("jsonl").__module__ == "vlgrpo.data.adapters"
