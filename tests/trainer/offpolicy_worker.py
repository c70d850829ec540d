"""Run under `torchrun --nproc_per_node 2`: ZeRO-3 training with a stand-in for vLLM, an engine that holds its OWN
copy of the weights (loaded before ZeRO-3 partitions anything) and receives the trainer's gathered weights through
`update_weights` after every step, as the vLLM engine does. The trainer then runs its post-sync check and its
rollout IS weights from its own (partitioned, collective) forward. Writes rank{r}.json. Used by
test_distributed.py::test_zero3_checks_an_off_policy_engine_after_every_sync."""

import json
import sys

import torch

from vlgrpo.config import load_config
from vlgrpo.models import load_model
from vlgrpo.rollout.hf import HFEngine
from vlgrpo.trainer.loop import Trainer
from vlgrpo.trainer.state import build_state


class OwnWeightsEngine:
    """The HF engine over a separate model copy: sampled log-probs come from that copy, synced by name."""

    def __init__(self, model, state):
        d = state.cfg.data
        self.model = model.eval()
        self.inner = HFEngine(
            self.model, state.lm.processor, state.cache, d.answer_format, state.reward_ctx.box_format, d.system_prompt
        )
        self.policy_version, self.synced = 0, 0

    def generate(self, samples, params, prompts=None):
        return self.inner.generate(samples, params, prompts)

    def update_weights(self, named_params, version):
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_params:  # every rank iterates: the ZeRO-3 gather is collective
                if name in own:
                    own[name].copy_(tensor)
                    self.synced += 1
        self.policy_version = self.inner.policy_version = version

    def stats(self):
        return {"rollout/params_pushed": float(self.synced)}

    def reset_stats(self):
        self.synced = 0


def main(config_path: str, out_dir: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config_path, list(overrides))
    copy = load_model(cfg.model.name_or_path).model  # before build_state: not partitioned
    state = build_state(cfg, progress=False)
    state.engine, state.engine_needs_weights = OwnWeightsEngine(copy, state), True
    state.engine_logprobs_differ = True  # as vLLM's: the trainer measures the gap and weights the loss
    history = Trainer(state).train()
    with open(f"{out_dir}/rank{torch.distributed.get_rank()}.json", "w") as f:
        json.dump({"history": history}, f)
    state.close()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
