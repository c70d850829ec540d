"""`vlgrpo` command line (the top layer; nothing imports it): main (the parser, train, eval, demo), data (`vlgrpo data
...`), plan (`vlgrpo plan`), tools (cache, model, reward, export). `python -m vlgrpo.cli` runs it."""

from vlgrpo.cli.main import main

__all__ = ["main"]
