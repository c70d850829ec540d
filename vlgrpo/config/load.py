"""Loading the configuration: defaults <- YAML (only what differs) <- `a.b=c` overrides, then `validate.validate`.
Also saving and attribute docstrings.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from vlgrpo.config.schema import CHOICES, RENAMED_KEYS, Config, ConfigError
from vlgrpo.config.validate import get_key, validate
from vlgrpo.registry import BY_KEY

# ---------------------------------------------------------------- merging dicts into dataclasses


def _unknown_key(key: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
    hint = f" Did you mean '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}'. Accepted keys here: {', '.join(sorted(valid))}.{hint}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value to the annotated field type, or explain why it cannot be."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if not math.isfinite(value):  # .inf / .nan would only surface later, as a NaN loss
            raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        word = {True: "on", False: "off"}.get(value) if isinstance(value, bool) else None
        if word in CHOICES.get(key, ()):  # YAML 1.1 reads on / off (data.thinking, train.routing_replay) as booleans
            return word
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return str(value)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    return value


def _apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for k, v in values.items():
        key = f"{prefix}{k}"
        if k not in names:
            raise _unknown_key(key, names)
        current = getattr(obj, k)
        if dataclasses.is_dataclass(current):
            if not isinstance(v, dict):
                raise ConfigError(f"config key '{key}' is a section; give a mapping of its keys, got {v!r}")
            _apply(current, v, key + ".")
        else:
            setattr(obj, k, _coerce(v, hints[k], key))


def _dotted_to_nested(overrides: list[str]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value (e.g. train.lr=1e-5)")
        path, raw = item.split("=", 1)
        value = _parse_yaml(raw, f"override '{item}'") if raw.strip() else ""
        node = nested
        parts = path.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return nested


def _parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data; a syntax error names `source` (the file or the override) and the line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for k, v in values.items():
        keys |= _leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}"}
    return keys


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- the prompt contract of model.name_or_path (its vlgrpo.json, when it has one) <- YAML file (only
    what differs) <- dotted overrides; then validate."""
    cfg = Config()
    explicit: set[str] = set()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        data = _parse_yaml(path.read_text(), f"config file '{path}'") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}")
        data = _renamed(data, f"config file '{path}'")
        try:
            _apply(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        explicit |= _leaf_keys(data)
    if overrides:
        nested = _renamed(_dotted_to_nested(overrides), "override")
        _apply(cfg, nested)
        explicit |= _leaf_keys(nested)
    _apply_checkpoint_contract(cfg, explicit)
    _canonical_values(cfg)
    validate(cfg)
    return cfg


def _deprecated(message: str) -> None:
    print(f"[vlgrpo] deprecated: {message}", file=sys.stderr)


def _renamed(values: dict[str, Any], source: str) -> dict[str, Any]:
    """`values` with every former key (RENAMED_KEYS) moved to its current name, each move reported once."""
    for old, new in RENAMED_KEYS.items():
        *old_path, old_leaf = old.split(".")
        node = values
        for part in old_path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_leaf not in node:
            continue
        value = node.pop(old_leaf)
        *new_path, new_leaf = new.split(".")
        target = values
        for part in new_path:
            target = target.setdefault(part, {})
        if new_leaf in target:
            raise ConfigError(f"{source} sets both '{old}' (its former name) and '{new}': keep only '{new}'")
        target[new_leaf] = value
        _deprecated(f"config key '{old}' is now '{new}' ({source}); the old name still works")
    return values


def _canonical_values(cfg: Config) -> None:
    """Former option names of registry keys (grpo.ratio=gspo) -> their current names, each reported."""
    for key, registry in BY_KEY.items():
        value = get_key(cfg, key)
        if isinstance(value, str):
            current, message = registry.canonical(value)
            if message:
                section, leaf = key.rsplit(".", 1)
                setattr(get_key(cfg, section), leaf, current)
                _deprecated(message)


def _apply_checkpoint_contract(cfg: Config, explicit: set[str]) -> None:
    """A checkpoint that vlgrpo exported says how it was prompted: those settings become the defaults."""
    from vlgrpo.config.contract import apply_contract, read_contract

    if not Path(cfg.model.name_or_path).is_dir():
        return
    contract = read_contract(cfg.model.name_or_path)
    if contract is not None:
        for note in apply_contract(cfg, contract, explicit):
            print(f"[vlgrpo] warning: {note}", file=sys.stderr)


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the fully resolved config (every key) as YAML; a run directory always holds one."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal under each field), for docs/--help."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value).strip()  # type: ignore[union-attr]
    return docs
