"""Run under torchrun: one GRPO update per loss variant on fixed groups, with SGD, through the trainer's own phases 5
and 7 (`Trainer.advantages`, `Trainer._update`, the backend's step). Used by test_union_batch.py.

    torchrun --nproc_per_node N union_worker.py CFG OUT RANKS [overrides]

N == RANKS: each rank updates on its own share of the groups (rank 1's completions are 3x longer than rank 0's,
and rank 0 holds half as many);
N == 1: one process updates on the union of the RANKS shares. out/result.pt (rank 0) holds, per variant, every
rank's advantages, the change of every weight divided by -lr, i.e. the gradient the optimiser stepped on, and the
update's logged metrics (reduced over the ranks).
"""

import sys
from pathlib import Path

import torch

LR = 1.0
GROUPS = {0: 1, 1: 2, 2: 2}
"""Groups each rank holds: the ranks' sequence counts differ too (each still fits one micro-batch of 8 completions, so
ZeRO-3's accumulation count, which every rank shares, is 1 on every rank)."""
CASES = [  # (aggregation, ratio, advantage): every aggregation, GSPO's sequence ratio, the batch-scaled advantages
    ("token-mean", "token", "group"),
    ("seq-mean-token-mean", "token", "group"),
    ("seq-mean-token-sum-norm", "token", "group_mean"),
    ("seq-mean-token-mean", "sequence", "group"),
    ("token-mean", "token", "batch"),
]
LENGTHS = {0: [2, 3, 4, 5], 1: [6, 9, 12, 15], 2: [3, 4, 6, 7]}
"""Completion lengths of each rank's groups: rank 1's about 3x rank 0's, so per-rank token means weigh them apart."""


class SGD(torch.optim.SGD):
    """The optimiser the backends build (AdamW) made plain SGD: the weight change of one step is -lr x the gradient.
    A class, as AdamW is (DeepSpeed subclasses AdamW when imported)."""

    def __init__(self, params, lr, weight_decay=0.0, **_):
        super().__init__(params, lr=lr)


def groups_of(state, rank: int, samples) -> tuple[list, torch.Tensor]:
    """Rank `rank`'s fixed groups (G = 4 completions of known lengths over plain text tokens) and their rewards."""
    from vlgrpo.types import Completion, RolloutGroup

    tok = state.tokenizer
    vocab = tok("a red circle left of two blue squares and one green triangle", add_special_tokens=False)["input_ids"]
    groups, rewards = [], []
    for k in range(GROUPS[rank]):
        j = sum(GROUPS[r] for r in range(rank)) + k
        gen = torch.Generator().manual_seed(j)
        completions = []
        for length in LENGTHS[rank]:
            ids = [vocab[int(i)] for i in torch.randint(len(vocab), (length,), generator=gen)]
            completions.append(Completion(token_ids=ids, text=tok.decode(ids), finish_reason="stop"))
        sample = samples[j]
        groups.append(RolloutGroup(sample, state.rows.prompt(sample).input_ids, completions))
        rewards += [(1 + rank) * r for r in (0.1 * j, 1.0, 0.5, 2.0)]  # rank 2's spread is 3x rank 0's
    return groups, torch.tensor(rewards)


def main(config_path: str, out_dir: str, ranks: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    torch.optim.AdamW = SGD  # before the backend builds its optimiser
    from vlgrpo.config import load_config
    from vlgrpo.data.adapters import load_samples
    from vlgrpo.trainer.group import leave_group
    from vlgrpo.trainer.loop import Trainer
    from vlgrpo.trainer.ranks import gather_from_ranks, rank_world
    from vlgrpo.trainer.state import build_state

    cfg = load_config(config_path, list(overrides))
    state = build_state(cfg, progress=False)
    rank, world = rank_world()
    samples = load_samples(cfg.data.train, cfg.data.format).samples
    mine = [rank] if world == int(ranks) else list(range(int(ranks)))  # a share, or the union of every share
    groups, rewards = [], []
    for r in mine:
        g, rw = groups_of(state, r, samples)
        groups, rewards = groups + g, rewards + [rw]
    rewards = torch.cat(rewards)
    G = len(groups[0].completions)
    group_ids = torch.arange(len(groups)).repeat_interleave(G)
    with state.backend.rollout_weights(full=False):
        features = state.cache.get_rows([state.rows.prompt(g.sample).sources for g in groups])
    start = Path(out_dir) / f"start_{world}"  # every variant steps from the same weights: the backend's own save
    start.mkdir(exist_ok=True)
    state.backend.save(start)
    result = {}
    for aggregation, ratio, advantage in CASES:
        if world > 1:
            torch.distributed.barrier()  # rank 0 has written what every rank loads
        state.backend.load(start)
        state.cfg.grpo.aggregation, state.cfg.grpo.ratio, state.cfg.grpo.advantage = aggregation, ratio, advantage
        trainer = Trainer(state)
        adv, _ = trainer.advantages(rewards, group_ids)
        batch = trainer._collate(groups, features)
        before = {n: w.double() for n, w in state.backend.named_weights()}  # collective under ZeRO-3
        _, means = trainer._update(batch, adv.to(state.device), None, None)
        metrics = means.reduce(gather_from_ranks)  # the logged values, over every rank (a collective)
        after = {n: w.double() for n, w in state.backend.named_weights()}
        all_adv = [adv] if world == 1 else [None] * world
        if world > 1:
            torch.distributed.all_gather_object(all_adv, adv)
        result[f"{aggregation}/{ratio}/{advantage}"] = {
            "advantages": torch.cat(all_adv),
            "metrics": metrics,
            "gradient": {n: (before[n] - after[n]) / LR for n in before if not torch.equal(before[n], after[n])},
        }
    if rank == 0:
        torch.save(result, f"{out_dir}/result.pt")
    state.close()
    leave_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
    from vlgrpo.trainer.group import exit_rank

    exit_rank(0)
