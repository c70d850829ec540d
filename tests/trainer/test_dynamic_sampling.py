"""Dynamic sampling driven through the Trainer: zero-variance groups are dropped, the batch is topped up with fresh
prompts for what is missing, and once the top-up rounds are spent the last round's dropped groups fill the batch."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config

from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state

REWARD = '''
import zlib


def odd_ids_constant(completion, id):
    """Constant on samples with an odd id number (their groups carry no signal); a hash of the text elsewhere."""
    if int(id.rsplit("-", 1)[1]) % 2:
        return 0.5
    return zlib.crc32(completion.encode()) % 997 / 997
'''


def _odd(sample_id: str) -> bool:
    return int(sample_id.rsplit("-", 1)[1]) % 2 == 1


def test_dynamic_sampling_tops_up_the_batch_through_the_trainer(tmp_path, tiny_model_dir, shapes_dir):
    (tmp_path / "reward.py").write_text(REWARD)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{tmp_path}/reward.py:odd_ids_constant': 1.0}}",
        "grpo.dynamic_sampling=true",
        "grpo.max_topup_rounds=2",
        "train.prompts_per_step=3",
        "train.steps=4",
    )
    state = build_state(cfg, progress=False)
    trainer = Trainer(state)
    asked, trained = [], []  # per step: the sample ids of each round; the ids of the groups the update trained on
    generate, collate = state.engine.generate, trainer._collate

    def observed_generate(samples, params, prompts=None):
        asked[-1].append([x.id for x in samples])
        return generate(samples, params, prompts)

    def observed_collate(groups, features):
        trained.append([g.sample.id for g in groups])
        return collate(groups, features)

    def step():
        asked.append([])
        return grpo_step()

    state.engine.generate, trainer._collate = observed_generate, observed_collate
    grpo_step, trainer.step_fn = trainer.step_fn, step
    history = trainer.train()
    state.close()
    B = 3
    for rounds, batch, row in zip(asked, trained, history):
        informative = [i for ids in rounds for i in ids if not _odd(i)]
        # round 1 asks for B prompts, each top-up for what is still missing, at most max_topup_rounds top-ups
        kept = 0
        for k, ids in enumerate(rounds):
            assert len(ids) == B - kept, (rounds, k)
            kept += sum(not _odd(i) for i in ids)
        assert len(rounds) == 3 or kept >= B
        assert row["grpo/sampling_rounds"] == len(rounds)
        assert row["grpo/dropped_groups"] == sum(_odd(i) for ids in rounds for i in ids)
        # the update trains on the informative groups first, filled from the last round's dropped ones if short
        fill = [i for i in rounds[-1] if _odd(i)][: max(0, B - len(informative))]
        assert batch == informative[:B] + fill, (rounds, batch)
        assert row["grpo/zero_adv_frac"] == pytest.approx(len(fill) / B)
    # the seeded draws cover a full top-up and rounds running out
    assert any(len(r) > 1 and sum(not _odd(i) for ids in r for i in ids) >= B for r in asked)
    assert any(len(r) == 3 for r in asked)
