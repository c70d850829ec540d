"""Multi-turn rollouts with tools ("thinking with images"): a turn stops at `</tool_call>`, the call runs
(`rollout/tools.py`), its result comes back as a tool-response turn (a crop as a new image, an error as text), and the
model goes on, up to `max_turns` turns.

`ToolRollout` wraps an engine that can continue prompts given as ids (`generate_prompts`: the HF engine): the first
turn is the engine's own grouped rollout; each later turn continues each trajectory from its whole token ids, its
images the prompt's followed by its crops (each crop keyed by its pixels in the vision cache, so a region asked for
again is a hit). A trajectory is one Completion: every token after the prompt, `tool_mask` 1 on the tokens the
tool-response turns inserted (the model did not sample them), the crops' PNG bytes, and its turns as chat messages.
Knows nothing of rewards or losses.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field, replace

import torch
from PIL import Image

from vlgrpo.data.images import load_image
from vlgrpo.policy.prompt import IMAGE_PAD, VISION_END, VISION_START, PromptInputs, build_prompt
from vlgrpo.rollout.base import SamplingParams
from vlgrpo.rollout.tools import TOOL_CALL_END, ToolContext, first_tool_call, run_tool, tool_schemas, tool_table
from vlgrpo.types import Completion, InputError, RolloutGroup, Sample

TOOL_RESPONSE = "<|im_end|>\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
"""The turn a tool's result comes back in, as Qwen's templates render a `tool` message (a user turn wrapped in
<tool_response>), closing the model's turn before it and opening the next."""


@dataclass
class Trajectory:
    """One completion being rolled out over several turns."""

    sample: Sample
    prompt: PromptInputs
    images: list[Image.Image] = field(default_factory=list)
    """The sample's images (original pixels), then each image a tool returned: what `image_index` counts in. Loaded
    at the trajectory's first call: a trajectory that calls no tool decodes no image."""
    token_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    crops: list[bytes] = field(default_factory=list)
    grids: list[tuple[int, int, int]] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    finish_reason: str = ""
    pending: str | None = None
    """The text of the last turn when it stopped at a tool call (the call runs before the next turn)."""
    calls: int = 0
    errors: int = 0
    crop_area: float = 0.0
    """Summed share of the original image each returned crop covers."""


class ToolRollout:
    """A RolloutEngine whose completions may call tools: `engine` must offer `generate_prompts` (the HF engine)."""

    def __init__(self, engine, tools: tuple[str, ...], max_turns: int):
        if max_turns < 1:
            raise InputError(f"max_turns must be >= 1, got {max_turns}")
        if not hasattr(engine, "generate_prompts"):
            raise InputError(
                f"tools need an engine that continues prompts from ids (hf); {type(engine).__name__} does not yet"
            )
        tool_table(tuple(tools))  # a bad tool list fails here, before any decoding
        self.engine, self.tools, self.max_turns = engine, tuple(tools), max_turns
        self.schemas = tool_schemas(self.tools)
        self.reset_stats()

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def update_weights(self, named_params=None, version: int = 0) -> None:
        self.engine.update_weights(named_params, version)

    def stats(self) -> dict[str, float]:
        n = max(self._counts["trajectories"], 1)
        tools = {
            "tools/calls_per_sample": self._counts["calls"] / n,
            "tools/turns": self._counts["turns"] / n,
            "tools/errors": float(self._counts["errors"]),
            "tools/crop_area": self._counts["crop_area"] / max(self._counts["crops"], 1),
        }
        return {**self.engine.stats(), **tools}

    def reset_stats(self) -> None:
        self._counts = dict.fromkeys(("trajectories", "calls", "turns", "errors", "crops", "crop_area"), 0)
        if hasattr(self.engine, "reset_stats"):
            self.engine.reset_stats()

    # ------------------------------------------------------------ turns

    def generate(self, samples: list[Sample], params: SamplingParams) -> list[RolloutGroup]:
        """Turn 1 as the engine's grouped rollout; then each trajectory stopped at a call gets its tool response and
        one more turn, until none is pending or `max_turns` turns were taken."""
        e = self.engine
        for s in samples:
            if s.video is not None:
                raise InputError(f"sample '{s.id}': tools are not supported on video rows yet (images only)")
        prompts = [build_prompt(s, e.processor, e.geometry, **e.prompt_kw, tools=self.schemas) for s in samples]
        params = replace(params, stop=[*params.stop, TOOL_CALL_END])
        first = e.generate_prompts(samples, prompts, params)
        groups = [[self._start(g.sample, p, c) for c in g.completions] for g, p in zip(first, prompts)]
        flat = [t for group in groups for t in group]
        for turn in range(1, self.max_turns):
            going = [t for t in flat if t.pending is not None]
            if not going:
                break
            prompts_next = [self._respond(t) for t in going]
            seed = None if params.seed is None else params.seed + turn
            outs = e.generate_prompts(
                [t.sample for t in going], prompts_next, replace(params, completions_per_prompt=1, seed=seed)
            )
            for t, out in zip(going, outs):
                self._take(t, out.completions[0])
        self._counts["trajectories"] += len(flat)
        return [
            RolloutGroup(g.sample, list(p.input_ids), [self._completion(t) for t in group], g.policy_version)
            for g, p, group in zip(first, prompts, groups)
        ]

    def _start(self, sample: Sample, prompt: PromptInputs, c: Completion) -> Trajectory:
        t = Trajectory(sample, prompt)
        self._take(t, c)
        return t

    def _take(self, t: Trajectory, c: Completion) -> None:
        """Append one turn the model sampled; it is pending when it stopped at a tool call."""
        tok = self.engine.processor.tokenizer
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        t.token_ids += c.token_ids
        t.tool_mask += [0] * len(c.token_ids)
        t.logprobs += list(c.logprobs or [math.nan] * len(c.token_ids))
        called = c.finish_reason == "stop" and TOOL_CALL_END in text
        text = text[: text.index(TOOL_CALL_END) + len(TOOL_CALL_END)] if called else c.text[len(t.prompt.opened) :]
        t.turns.append({"role": "assistant", "content": [{"type": "text", "text": t.prompt.opened + text}]})
        t.pending, t.finish_reason = (text if called else None), c.finish_reason
        self._counts["turns"] += 1

    def _respond(self, t: Trajectory) -> PromptInputs:
        """Run the pending call, append its tool-response turn (tool_mask 1) -> the prompt of the next turn."""
        call = first_tool_call(t.pending or "")
        if not t.images:
            t.images = [load_image(i) for i in t.sample.images]
        result = run_tool(
            call, ToolContext(t.images, self.engine.prompt_kw["box_format"], self.engine.geometry), self.tools
        )
        t.calls += 1
        self._counts["calls"] += 1
        parts, blocks = [], []
        for image in result.images if result.error is None else []:
            image = image.convert("RGB")
            png = io.BytesIO()
            image.save(png, format="PNG")
            grid = self.engine.geometry.grid_thw(image.height, image.width)
            blocks.append(
                VISION_START + IMAGE_PAD * (grid[1] * grid[2] // self.engine.geometry.merge_size**2) + VISION_END
            )
            parts.append({"type": "image", "image": len(t.crops)})
            t.images.append(image)
            t.crops.append(png.getvalue())
            t.grids.append(grid)
            area = image.width * image.height / (t.images[0].width * t.images[0].height)
            t.crop_area += area
            self._counts["crops"] += 1
            self._counts["crop_area"] += area
        words = result.error if result.error is not None else (result.text or "")
        if result.error is not None:
            t.errors += 1
            self._counts["errors"] += 1
        if words:
            parts.append({"type": "text", "text": words})
        t.turns.append({"role": "tool", "content": parts})
        ids = self.engine.processor.tokenizer(
            TOOL_RESPONSE.format("".join(blocks) + words) + t.prompt.opened, add_special_tokens=False
        )["input_ids"]
        t.token_ids += ids
        t.tool_mask += [1] * len(ids)
        t.logprobs += [math.nan] * len(ids)
        t.pending = None
        return continuation(t, self.engine.processor.tokenizer)

    def _completion(self, t: Trajectory) -> Completion:
        """The trajectory as one Completion; its text is the model's turns (each opening as the prompt did), so a
        one-turn completion's text is the engine's own."""
        text = "".join(p["text"] for turn in t.turns if turn["role"] == "assistant" for p in turn["content"])
        return Completion(
            list(t.token_ids),
            text,
            "max_turns" if t.pending is not None else t.finish_reason,
            list(t.logprobs),
            tool_mask=list(t.tool_mask) if t.calls else None,
            images=list(t.crops),
            turns=list(t.turns) if t.calls else [],
        )


def continuation(t: Trajectory, tokenizer) -> PromptInputs:
    """The prompt of a trajectory's next turn: its prompt's ids and everything after them, the crops' grids and
    sources after the prompt's images (in the order of their <|image_pad|> runs)."""
    ids = t.prompt.input_ids + t.token_ids
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    grids = torch.cat([t.prompt.image_grid_thw, torch.tensor(t.grids, dtype=torch.long).reshape(-1, 3)])
    return PromptInputs(
        input_ids=ids,
        mm_token_type_ids=[1 if i == image_id else 0 for i in ids],
        image_grid_thw=grids,
        video_grid_thw=None,
        sources=[*t.prompt.sources, *t.crops],
        opened=t.prompt.opened,
    )


def crop_names(sample: Sample, c: Completion, folder: str) -> list[str]:
    """File names for a completion's crops: `<folder>/<sample id>_<k>.png`."""
    stem = re.sub(r"[^\w.-]+", "_", sample.id)
    return [f"{folder}/{stem}_{k}.png" for k in range(len(c.images))]


def trajectory_messages(sample: Sample, c: Completion, names: list[str]) -> list[dict]:
    """The trajectory in the Hugging Face chat format: the sample's question and images, then the completion's turns,
    its k-th crop's image part naming `names[k]`."""
    image = [{"type": "image", "image": i if isinstance(i, str) else "(image bytes)"} for i in sample.images]
    turns = [
        {
            "role": turn["role"],
            "content": [{**p, "image": names[p["image"]]} if p["type"] == "image" else p for p in turn["content"]],
        }
        for turn in c.turns
    ]
    return [{"role": "user", "content": [*image, {"type": "text", "text": sample.question}]}, *turns]
