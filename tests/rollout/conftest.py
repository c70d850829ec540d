"""Fixtures of the rollout tests: loaded tiny models (one per arch per module) and shapes samples."""

from __future__ import annotations

import pytest

from vlgrpo.data.adapters import load_samples
from vlgrpo.models import load_model


@pytest.fixture(scope="module")
def load(tiny_model_dir, spread):
    """arch -> a freshly loaded tiny model, its LM weights spread out (seeded) so that greedy decoding varies.

    The random init decodes one repeated token; scaled-up weights give varied sequences, which makes
    "same greedy tokens" a test that can fail.
    """

    def get(arch: str = "qwen2_5_vl", spread_by: float = 0.0, **kw):
        lm = load_model(tiny_model_dir(arch), **kw)
        if spread_by:
            spread(lm.model, spread_by)
        return lm.model.eval(), lm.processor

    return get


@pytest.fixture(scope="module")
def samples(shapes_dir):
    return load_samples(shapes_dir / "train.jsonl").samples
