"""Progress beats from inside long pieces of work (an eval batch, a checkpoint file hashed, a weight-sync tensor) for
whoever watches this process for progress: the trainer's watchdog listens while a run trains.

At the bottom of the layers, so any layer can beat; it knows nothing of who listens, and a beat with no listener costs
a function call.
"""

from __future__ import annotations

from collections.abc import Callable

_listeners: list[Callable[[str], None]] = []


def beat(what: str) -> None:
    """Progress inside a long phase: `what` names it ("eval batch", "checksum step_4/backend.pt", ...)."""
    for listener in list(_listeners):
        listener(what)


def listen(listener: Callable[[str], None]) -> None:
    _listeners.append(listener)


def unlisten(listener: Callable[[str], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)
