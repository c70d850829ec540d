"""Count the work a GRPO trainer does on a Qwen-VL model through forward hooks, the same way for any trainer.

`PassCounter.attach(model)` hooks the vision tower (`visual`, merger inside) and the inner Qwen-VL model (the module
that owns `visual` and the language model). It knows nothing of the trainer that calls the model: TRL and vlgrpo are
counted by the same code. Used by benchmarks/bench_vs_trl.py.
"""

from __future__ import annotations

import time

import torch

from vlgrpo.policy.prefill import core_model
from vlgrpo.vision_cache import find_visual


class PassCounter:
    """Vision-encoder images, prompt tokens and decode steps forwarded, counted by hooks.

    - `encoder_calls` / `images_encoded`: calls of `visual`, and the rows of the `grid_thw` each call receives
      (one row per image).
    - `prompt_tokens`: in every forward of the inner Qwen-VL model whose `input_ids` hold image tokens (the
      forwards that process a prompt: generation prefill, whole-row log-prob passes, vlgrpo's shared prefix), the
      prompt tokens of each such row. A row's prompt is found by matching the row, from its first non-pad token,
      against the known prompt token ids of the data set; a row that matches none raises, so a mismatch between the
      two trainers' prompts cannot go unnoticed. Decode steps and vlgrpo's completion pass carry no image token and
      add nothing.
    - `decode_forwards` / `decode_seconds`: forwards of one new token per row (generation decode steps) and their
      wall time, to compare the decode work that both trainers share.
    """

    def __init__(self, prompts: list[list[int]], image_token_id: int, pad_id: int) -> None:
        self.image_token_id, self.pad_id = image_token_id, pad_id
        self._by_len: dict[int, torch.Tensor] = {}
        for p in {tuple(p) for p in prompts}:
            stacked = self._by_len.get(len(p))
            row = torch.tensor([p], dtype=torch.long)
            self._by_len[len(p)] = row if stacked is None else torch.cat([stacked, row])
        self._handles: list = []
        self.reset()

    def reset(self) -> None:
        self.encoder_calls = self.images_encoded = self.prompt_tokens = self.prompt_forwards = 0
        self.decode_forwards, self.decode_seconds, self._t0 = 0, 0.0, None

    def pop(self) -> dict[str, float]:
        out = {
            "encoder_calls": self.encoder_calls,
            "images_encoded": self.images_encoded,
            "prompt_tokens": self.prompt_tokens,
            "prompt_forwards": self.prompt_forwards,
            "decode_forwards": self.decode_forwards,
            "decode_seconds": self.decode_seconds,
        }
        self.reset()
        return out

    def attach(self, model: torch.nn.Module) -> PassCounter:
        """Hook one model (policy or reference copy); call once per distinct model object."""
        self._handles.append(find_visual(model).register_forward_pre_hook(self._on_visual, with_kwargs=True))
        self._handles.append(core_model(model).register_forward_pre_hook(self._on_core, with_kwargs=True))
        self._handles.append(core_model(model).register_forward_hook(self._after_core))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- hooks
    def _on_visual(self, module, args, kwargs) -> None:
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        if grid is None:
            raise RuntimeError("vision tower called without grid_thw: cannot count images")
        self.encoder_calls += 1
        self.images_encoded += int(grid.shape[0])

    def _on_core(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            if kwargs.get("inputs_embeds") is not None:
                raise RuntimeError("Qwen-VL model called with inputs_embeds only: prompt tokens cannot be counted")
            return
        if ids.shape[1] == 1:  # a decode step: timed until the forward returns
            self._t0 = time.perf_counter()
            return
        rows = (ids == self.image_token_id).any(dim=1).nonzero().flatten().tolist()
        if rows:
            self.prompt_forwards += 1
        for r in rows:
            self.prompt_tokens += self.prompt_length(ids[r])

    def _after_core(self, module, args, output) -> None:
        if self._t0 is not None:
            self.decode_forwards += 1
            self.decode_seconds += time.perf_counter() - self._t0
            self._t0 = None

    def prompt_length(self, row: torch.Tensor) -> int:
        """Length of the known prompt this row starts with (after left padding); raises when none matches."""
        real = (row != self.pad_id).nonzero()
        start = int(real[0]) if len(real) else 0
        rest = row[start:].cpu()
        for n, prompts in self._by_len.items():
            if n <= len(rest) and bool((prompts == rest[:n]).all(dim=1).any()):
                return n
        raise RuntimeError(
            f"a forward row with image tokens starts with none of the {sum(len(p) for p in self._by_len.values())} "
            f"known prompts (first ids {rest[:12].tolist()}): the trainers render different prompts"
        )


class PhaseTimer:
    """Wall time spent inside chosen methods of an object (wrapped on the instance), accumulated until `pop`."""

    def __init__(self) -> None:
        self._acc: dict[str, float] = {}

    def wrap(self, obj, method: str, phase: str) -> None:
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self._acc[phase] = self._acc.get(phase, 0.0) + time.perf_counter() - t0

        setattr(obj, method, timed)

    def pop(self) -> dict[str, float]:
        out, self._acc = self._acc, {}
        return out
