"""The docs say what a user types: every `vlgrpo …` command in README.md and docs/*.md parses with the CLI's own
parser, every repository path that the docs, the recipes and the scripts' usage lines name exists, and every
config key the docs name is one.

Code-block lines are parsed whole (`parse_args`, as the shell would pass them); an inline `vlgrpo …` span in prose
is often a synopsis (`[--json]`, `CONFIG`, `…`), so only its subcommands and flag names are checked.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from vlgrpo.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
INLINE = re.compile(r"`((?:vlgrpo|python -m vlgrpo\.cli|torchrun [^`]*-m vlgrpo\.cli) [^`]*)`")
OPERATORS = {"|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "&"}
COMMAND_START = re.compile(r"^([A-Z_]+=\S*\s+)*(vlgrpo|python|torchrun|scripts/)")
SINGLE_PROCESS = ("export", "eval", "plan", "data", "reward", "model", "cache")
"""Commands that run in one process: under torchrun every rank would write the same files."""
REPO_DIRS = ("vlgrpo", "configs", "scripts", "benchmarks", "dev", "docs", "tests", "evals", "data/models", ".ci")
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(d) for d in REPO_DIRS) + r")/[\w.@/-]*\w)")


def _blocks(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each shell code-block line, continuation lines joined."""
    out, lang, pending, start = [], None, "", 0
    for no, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.strip())
        if m:
            lang = None if lang is not None else m.group(1)
            continue
        if lang is None or lang not in SHELL_LANGS:
            continue
        if not pending:
            start = no
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, (pending + line).strip()))
        pending = ""
    return out


def _cli_args(tokens: list[str]) -> list[str] | None:
    """The arguments `vlgrpo` receives from one shell command, or None if the command is not vlgrpo's.
    `scripts/eval.sh TARGET FLAGS` hands FLAGS to `vlgrpo eval --model TARGET`."""
    cut = next((i for i, t in enumerate(tokens) if t in OPERATORS), len(tokens))
    tokens = [t for t in tokens[:cut] if not re.fullmatch(r"[A-Z_]+=\S*", t)] or [""]  # env prefixes: VAR=1 cmd
    if tokens[0] == "vlgrpo":
        return tokens[1:]
    if "vlgrpo.cli" in tokens and tokens[tokens.index("vlgrpo.cli") - 1] == "-m":
        return tokens[tokens.index("vlgrpo.cli") + 1 :]
    if tokens[0].endswith("scripts/eval.sh") and len(tokens) > 1:
        return ["eval", "--model", *tokens[1:]]
    return None


def doc_commands() -> list[tuple[str, list[str], str]]:
    """(file:line, vlgrpo arguments, the line) of every command in a shell code block of the docs."""
    found = []
    for doc in DOCS:
        for no, line in _blocks(doc.read_text()):
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:  # a tree or a table in a plain block is not shell; a command must parse
                if COMMAND_START.match(line):
                    found.append((f"{doc.name}:{no}", ["<unparseable shell>", str(e)], line))
                continue
            args = _cli_args(tokens)
            if args is not None:
                found.append((f"{doc.name}:{no}", args, line))
    return found


def inline_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in INLINE.finditer(text):
            out.append((f"{doc.name}:{text.count(chr(10), 0, m.start()) + 1}", " ".join(m.group(1).split())))
    return out


def launcher_problem(text: str) -> str | None:
    """A one-process command shown under a multi-process launcher (`torchrun … -m vlgrpo.cli export`)."""
    words = text.split()
    if words[0] != "torchrun" or "vlgrpo.cli" not in words:
        return None
    rest = words[words.index("vlgrpo.cli") + 1 :]
    if rest and rest[0] in SINGLE_PROCESS:
        return f"`{rest[0]}` runs in one process: run it as `vlgrpo {rest[0]} …`, not under torchrun"
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def synopsis_problems(text: str) -> list[str]:
    """Unknown subcommands or flags in a synopsis `vlgrpo eval --model PATH [--json]`: walk the subcommands, then
    check each `--flag` against the options of the (sub)parser it reached."""
    words = text.replace("\\|", "|").split()
    words = words[words.index("vlgrpo.cli") + 1 :] if "vlgrpo.cli" in words else words[1:]
    parser, problems = build_parser(), [p for p in [launcher_problem(text)] if p]
    for word in words:
        subs = _subparsers(parser)
        if word in subs:
            parser = subs[word]
            continue
        for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", word):
            if flag not in parser._option_string_actions:
                problems.append(f"{flag} is not an option of `{parser.prog}`")
    return problems


def test_every_command_in_a_code_block_parses():
    commands = doc_commands()
    assert len(commands) >= 25  # the docs hold that many: a broken collector must not pass silently
    parser, bad = build_parser(), []
    for where, args, line in commands:
        try:
            parser.parse_args(args)
        except SystemExit:
            bad.append(f"{where}: vlgrpo {' '.join(args)}")
        if launcher_problem(line):
            bad.append(f"{where}: {launcher_problem(line)}")
    assert not bad, "commands in the docs that the CLI refuses:\n" + "\n".join(bad)


def test_every_inline_command_names_real_subcommands_and_flags():
    spans = inline_commands()
    assert len(spans) > 30
    bad = [f"{where}: `{text}`: {'; '.join(p)}" for where, text in spans if (p := synopsis_problems(text))]
    assert not bad, "inline commands with unknown subcommands or flags:\n" + "\n".join(bad)


def test_the_checker_refuses_a_wrong_flag():
    """The cases the checks exist for: `--suites` for `--suite` (argparse blames ACTION), a missing value."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--suites", "pope", "--model", "M"])
    assert synopsis_problems("vlgrpo eval --suites pope --pope-data data/pope_hf --model …") == [
        "--suites is not an option of `vlgrpo eval`"
    ]
    assert synopsis_problems("vlgrpo eval score --suite pope --pred FILE [--parser pope|vlmevalkit] [--json]") == []
    assert launcher_problem("torchrun --nproc_per_node 8 -m vlgrpo.cli export RUN --out DIR")
    assert launcher_problem("torchrun --nproc_per_node 8 -m vlgrpo.cli train CONFIG") is None
    assert _cli_args(shlex.split("DRY_RUN=1 scripts/eval.sh runs/x --suite pope | tee log", comments=True)) == [
        "eval",
        "--model",
        "runs/x",
        "--suite",
        "pope",
    ]


def _named_paths(text: str) -> set[str]:
    paths = set()
    for m in REPO_PATH.finditer(text):
        path = m.group(1).rstrip(".")
        name = path.rsplit("/", 1)[-1]
        if "my_" in path or "*" in path or "{" in path or re.fullmatch(r"[A-Z_]+(\.\w+)?", name):
            continue  # a user's own file (configs/my_run.yaml), a pattern, or a placeholder (configs/NAME.yaml)
        paths.add(path)
    return paths


def test_every_repository_path_named_exists():
    """Paths under vlgrpo/, configs/, scripts/, docs/, tests/, evals/ and data/models/ named in the docs, the recipes'
    comments and the scripts' usage lines; and every relative Markdown link of the docs."""
    sources = DOCS + sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "scripts").glob("*.sh"))
    missing = []
    for src in sources:
        text = src.read_text()
        for path in sorted(_named_paths(text)):
            if not (ROOT / path).exists():
                missing.append(f"{src.relative_to(ROOT)}: {path}")
        if src.suffix == ".md":
            for link in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", text):
                if not (src.parent / link).exists():
                    missing.append(f"{src.relative_to(ROOT)}: link {link}")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def test_readme_is_an_entry_point():
    """Two commands first (the demo, the tests: both Makefile targets), at most 1,000 words, and the demo table's
    figures are the five-seed table's mean row (docs/demo-seeds.md, written by dev/demo_seeds.sh)."""
    text = (ROOT / "README.md").read_text()
    first = _blocks(text)
    assert [cmd.split("#")[0].strip() for _, cmd in first[:2]] == ["make demo", "make test"]
    assert text.index("make test") < text.index("\n## ")
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"demo", "test"} <= set(targets)
    assert len(text.split()) <= 1000
    mean = next(
        line for line in (ROOT / "docs" / "demo-seeds.md").read_text().splitlines() if line.startswith("| mean")
    )
    cells = [re.findall(r"(\d\.\d{3}) → (\d\.\d{3})", c) for c in mean.split("|")[2:]]
    vqa, count, colour, exist, ground, pope = (c[0] for c in cells[:6])
    rows = {
        r.split("|")[1].strip(): [x.strip() for x in r.split("|")[2:4]]
        for r in text.splitlines()
        if r.startswith("| ") and "→" not in r
    }
    assert rows["VQA accuracy"] == list(vqa)
    assert rows["count / colour / existence"] == [" / ".join(x[i] for x in (count, colour, exist)) for i in (0, 1)]
    assert rows["POPE F1"] == list(pope) and rows["grounding Acc@0.5"] == list(ground)


CONFIG_KEY = re.compile(r"`((?:model|data|rollout|train|grpo|reward|eval|logging)\.[A-Za-z_][\w.]*?)(?=[`=:\s\[])")
CODE_SPANS = {"model.generate", "model.load_weights", "model.model.rope_deltas"}
"""Spans that read like config keys but are attributes of a transformers or vLLM model object."""


def test_every_config_key_the_docs_name_exists():
    """A backticked `section.key` in README.md or docs/*.md is a key of the config (a section, a field, or a former
    name the loader still accepts), so the docs never send a user to a key that is gone."""
    from vlgrpo.config import Config, get_key
    from vlgrpo.config.schema import RENAMED_KEYS

    cfg, missing = Config(), []
    for doc in DOCS:
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            for key in (m.group(1).rstrip(".") for m in CONFIG_KEY.finditer(line)):
                if key in CODE_SPANS or key in RENAMED_KEYS:
                    continue
                try:
                    get_key(cfg, key)
                except (AttributeError, KeyError, ValueError):
                    missing.append(f"{doc.name}:{no}: {key}")
    assert not missing, "config keys the docs name that do not exist:\n" + "\n".join(missing)
