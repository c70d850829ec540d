"""Experiment (#59 item 3): a pointing reward for the zoom demo's tool arm, beside accuracy.

`pointing(completion, sample, ctx)` is 1 when the completion's first zoom call crops a region that holds the asked
cell's shape (`meta.target`) whole, read as the tool reads the box (`demo.tools.crop_hits`), else 0. Used as a user
reward: reward.recipe={accuracy: 1.0, "dev/zoom_pointing.py:pointing": 0.5}. Log: dev/LOG.md.
"""

from __future__ import annotations


def pointing(completion: str, sample, ctx) -> float:
    from vlgrpo.demo.tools import crop_hits

    hits, _ = crop_hits([sample], [completion], ctx.box_format, ctx.geometry)
    return float(hits)
