"""The product and the research stay apart: nothing in `vlgrpo` imports a benchmark or a research script (they import
`vlgrpo`), and `make test` collects neither."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_vlgrpo_never_imports_benchmarks_or_dev():
    outside = {p.stem for folder in ("benchmarks", "dev") for p in (ROOT / folder).glob("*.py")} | {"benchmarks", "dev"}
    found = []
    for path in sorted((ROOT / "vlgrpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in outside]
    assert outside >= {"bench_vs_trl", "pretrain_tiny"} and not found, found


def test_make_test_collects_no_research_test():
    import tomllib

    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert testpaths == ["tests"] and not list((ROOT / "tests").glob("test_p*_tiny.py"))
    assert (ROOT / "dev" / "tests" / "test_pretrain_tiny.py").is_file()


def test_the_package_names_no_issue_and_no_research_target():
    import re

    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "vlgrpo").rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bissue #\d+|seed_targets", line)
    ]
    assert not found, found


def test_the_formatter_owns_the_layout():
    """`make test` runs `make lint` first (ruff check, ruff format --check) over every Python folder, and no line opts
    out of the formatter."""
    makefile = (ROOT / "Makefile").read_text()
    assert "test-main: lint" in makefile and "ruff format --check $(LINT_PATHS)" in makefile
    assert "LINT_PATHS := vlgrpo tests benchmarks dev scripts" in makefile
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in ("vlgrpo", "tests", "benchmarks", "dev", "scripts")
        for p in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "fmt: " + "skip" in line or "fmt: " + "off" in line
    ]
    assert not found, found
