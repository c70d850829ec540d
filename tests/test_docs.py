"""The docs say what a user types: every `vlgrpo …` command in README.md and docs/*.md parses with the CLI's own
parser, every repository path that the docs, the recipes and the scripts' usage lines name exists, every config key,
vlgrpo module, function, class or attribute the docs name is one, and every metric they name is one the code writes.

Code-block lines are parsed whole (`parse_args`, as the shell would pass them); an inline `vlgrpo …` span in prose
is often a synopsis (`[--json]`, `CONFIG`, `…`), so only its subcommands and flag names are checked.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import shlex
from pathlib import Path

import pytest

from vlgrpo.cli.main import build_parser

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


# ---------------------------------------------------------------- Python names

CONFIG_SECTIONS = {"model", "data", "rollout", "train", "grpo", "reward", "eval", "logging"}
"""`data.…`, `rollout.…`, `grpo.…` read as config keys (checked above); the package's other top-level modules are
names when the docs write them without `vlgrpo.` (`trainer.ranks.average_gradients`)."""
MODULES = sorted({p.stem for p in (ROOT / "vlgrpo").iterdir() if p.suffix == ".py" or p.is_dir()} - CONFIG_SECTIONS)
PY_NAME = re.compile(r"`((?:vlgrpo|" + "|".join(MODULES) + r")\.[\w.]*\w(?::\w+)?)[`(]")
FILE_SUFFIXES = {"json", "yaml", "py", "md"}
"""`vlgrpo.json` (an export's prompt contract) and `config.yaml` are files, not modules."""
_MODULE_FILE = r"`(?P<path>(?:vlgrpo/)?[\w/]+)\.py`"
BY_FILE = (re.compile(_MODULE_FILE + r"'s `(?P<name>\w+)`"), re.compile(r"`(?P<name>\w+)`(?:\(\))? in " + _MODULE_FILE))
"""A name given with its module's file: `rollout/hf.py`'s `decode_loop`, `union_std` in `vlgrpo/grpo/advantages.py`."""
CLASS_ATTR = re.compile(r"`([A-Z]\w*)\.(\w+)[`(]")


def doc_python_names() -> list[tuple[str, str]]:
    """(file:line, `vlgrpo.module.name` or `vlgrpo.module:name`) of each vlgrpo module, function, class or constant
    the docs name: dotted (with or without `vlgrpo.`), as a registry target (`module:name`), or with its file."""
    found = []
    for doc in DOCS:
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            names = [m.group(1) for m in PY_NAME.finditer(line) if m.group(1).rsplit(".", 1)[-1] not in FILE_SUFFIXES]
            for m in (m for rx in BY_FILE for m in rx.finditer(line)):
                module = m["path"].removeprefix("vlgrpo/")
                if (ROOT / "vlgrpo" / f"{module}.py").is_file():
                    names.append(f"{module.replace('/', '.')}.{m['name']}")
            found += [(f"{doc.name}:{no}", n if n.startswith("vlgrpo.") else f"vlgrpo.{n}") for n in names]
    return found


def resolve(name: str) -> object:
    """The object `vlgrpo.a.b.c` or `vlgrpo.a.b:c` names: the longest importable module, then attributes."""
    path, _, attr = name.partition(":")
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:] + ([attr] if attr else []):
            obj = getattr(obj, part)
        return obj
    raise ModuleNotFoundError(name)


def test_every_python_name_the_docs_give_resolves():
    names = doc_python_names()
    assert len(names) >= 60  # the docs hold that many: a broken collector must not pass silently
    missing = []
    for where, name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{where}: {name} ({e})")
    assert not missing, "Python names in the docs that do not exist:\n" + "\n".join(missing)


def vlgrpo_classes() -> dict[str, list[str]]:
    """{class name: the modules defining it} over the package."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "vlgrpo").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


def has_attribute(cls: type, attr: str) -> bool:
    """A class attribute or method, a field (annotated), or an attribute its methods set (`self.step_fn = …`)."""
    if hasattr(cls, attr) or any(attr in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    stores = (n for n in ast.walk(ast.parse(inspect.getsource(cls))) if isinstance(getattr(n, "ctx", None), ast.Store))
    return any(isinstance(n, ast.Attribute) and n.attr == attr and ast.unparse(n.value) == "self" for n in stores)


def test_every_attribute_of_a_vlgrpo_class_the_docs_name_exists():
    """`CheckedRows.draw`, `Trainer.step_fn()`: the class is vlgrpo's (other projects' classes are not checked)."""
    classes, checked, missing = vlgrpo_classes(), 0, []
    for doc in DOCS:
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            for cls_name, attr in CLASS_ATTR.findall(line):
                for module in classes.get(cls_name, []):
                    checked += 1
                    if not has_attribute(resolve(f"{module}:{cls_name}"), attr):
                        missing.append(f"{doc.name}:{no}: {cls_name}.{attr} ({module})")
    assert checked >= 20 and not missing, "class attributes in the docs that do not exist:\n" + "\n".join(missing)


# ---------------------------------------------------------------- metrics

METRIC_NAMESPACES = ("data", "eval", "grpo", "memory", "reward", "rollout", "sync", "timing", "train", "vision")
"""STYLE.md's namespaces (reward, timing, vision, grpo, memory, eval) and the trainer's others."""
_SEGMENT = r"[\w*<>{}\[\]]+"
DOC_METRIC = re.compile(rf"`((?:{'|'.join(METRIC_NAMESPACES)})(?:/{_SEGMENT})+)`")
"""`reward/accuracy`, `timing/<phase>`, `grpo/clip_frac_*`, `rollout/logprob_abs_diff[_max]`; not a path
(`data/models/`, `rollout/decode.py`)."""
CODE_METRIC = re.compile(rf"(?:{'|'.join(METRIC_NAMESPACES)})(?:/[\w{{}}]+)+")
PLACEHOLDER = re.compile(r"<[^>]*>|\{[^}]*\}|\*")


def code_metrics() -> tuple[set[str], set[str]]:
    """(the metric names the package writes, as templates with `{}` where an f-string or `"reward/" + name` fills in;
    the words those fills can be: every identifier-like string constant of the package, `"encoder_calls"` of
    `f"vision/{k}"` among them)."""

    def template(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and (left := template(node.left)):
            return left + "{}"
        return None

    names, words = set(), set()
    for path in sorted((ROOT / "vlgrpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = template(node)
            if text is not None and CODE_METRIC.fullmatch(text):
                names.add(text)
            elif isinstance(node, ast.Constant) and re.fullmatch(r"\w+", str(node.value)):
                words.add(node.value)
    return names, words


def _regex(template: str, fill: str) -> re.Pattern:
    return re.compile(fill.join(re.escape(part) for part in template.split("{}")))


def emitted(doc: str, code: str, words: set[str]) -> bool:
    """Whether the code's name or template `code` writes the doc's `doc` (a name, or a template where the doc says
    `<phase>` or `*`). What a doc name puts in a code template's `{}` must be a word of the package."""
    m = _regex(code, "([^/]+)").fullmatch(doc)
    if m and all("{}" in fill or fill in words for fill in m.groups()):
        return True
    return "{}" in doc and _regex(doc, ".+").fullmatch(code) is not None


def metric_problem(name: str, names: set[str], words: set[str]) -> str | None:
    """Why a metric the docs name is not one the code writes; None when it is (each `[optional]` part both ways)."""
    opt = re.search(r"\[(\w*)\]", name)
    variants = [name[: opt.start()] + part + name[opt.end() :] for part in ("", opt[1])] if opt else [name]
    for variant in (PLACEHOLDER.sub("{}", v) for v in variants):
        if not any(emitted(variant, code, words) for code in names):
            return f"no metric the code writes is {variant}"
    return None


def test_every_metric_the_docs_name_is_written_by_the_code():
    names, words = code_metrics()
    spans = [
        (f"{doc.name}:{no}", m.group(1))
        for doc in DOCS
        for no, line in enumerate(doc.read_text().splitlines(), 1)
        for m in DOC_METRIC.finditer(line)
    ]
    assert len(spans) >= 100 and len(names) >= 50  # a broken collector must not pass silently
    bad = [f"{where}: `{name}`: {p}" for where, name in spans if (p := metric_problem(name, names, words))]
    assert not bad, "metrics the docs name that the code does not write:\n" + "\n".join(bad)


def test_the_name_checks_refuse_a_wrong_name():
    names, words = code_metrics()
    for good in ("vision/encoder_calls", "timing/<phase>", "grpo/clip_frac_*", "eval/pope/adversarial/f1", "eval/*"):
        assert metric_problem(good, names, words) is None, good
    for bad in ("vision/encoder_call", "reward/totl", "train/loss_scale", "timing/rollout/<phase>"):
        assert metric_problem(bad, names, words), bad
    assert metric_problem("rollout/logprob_abs_diff[_mean]", names, words) == (
        "no metric the code writes is rollout/logprob_abs_diff_mean"
    )
    for bad in ("vlgrpo.data.video.visual_source", "vlgrpo.grpo.losses:token_means"):
        with pytest.raises(AttributeError):
            resolve(bad)
    trainer = resolve("vlgrpo.trainer.loop:Trainer")
    assert has_attribute(trainer, "step_fn") and not has_attribute(trainer, "step")
