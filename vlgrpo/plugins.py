"""User functions named in a config as `module:function` or `path/to/file.py:function`, loaded on use: the one loader
that user rewards (`vlgrpo.rewards.registry`) and user tools (`vlgrpo.rollout.tools`) share.

Imports nothing of vlgrpo: every layer may read it. Callers wrap its ValueError in their own InputError.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path


def load_callable(spec: str, what: str) -> Callable:
    """The function `spec` names; `what` is the kind of entry ("reward", "tool"), used in the messages and in the
    module name a file is loaded under (`vlgrpo_user_<what>_<stem>`, so two kinds never share a module).

    A file is executed anew on every call (callers cache what they resolve). ValueError naming the entry and what
    went wrong: the module or file cannot be imported, or has no callable of that name.
    """
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            module_spec = importlib.util.spec_from_file_location(f"vlgrpo_user_{what}_{path.stem}", path)
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no such file {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as e:  # noqa: BLE001 - any import-time failure is reported the same way
        raise ValueError(f"{what} '{spec}': cannot load '{target}' ({type(e).__name__}: {e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{what} '{spec}': '{target}' has no function '{attr}'")
    return fn
