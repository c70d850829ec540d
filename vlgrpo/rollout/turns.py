"""Multi-turn rollouts with tools ("thinking with images"): a turn stops at `</tool_call>`, the call runs
(`rollout/tools/`), its result comes back as a tool-response turn (a crop as a new image, an error as text), and the
model goes on, up to `max_turns` turns.

`ToolRollout` drives an engine through the multi-turn members of the RolloutEngine protocol (`base.py`: prompts given as
ids, kept KV, the engine's limits): the first turn is the engine's own grouped rollout; each later turn continues each
trajectory from its whole token ids (never re-tokenised), its images the prompt's followed by its crops (each crop keyed
by its pixels in the vision cache, so a region asked for again is a hit). The HF engine keeps each trajectory's KV from
turn to turn, so a turn prefills only the tool response and what follows it; vLLM's prefix caching finds the earlier
turns' blocks. A trajectory ends at `max_turns` turns ("max_turns") or where its next turn could pass `max_total_length`
tokens ("max_total_length"); both still hold a call the model made. A trajectory is one Completion: every token after
the prompt, `tool_mask` 1 on the tokens the tool-response turns inserted (the model did not sample them), the crops' PNG
bytes, and its conversation as chat messages that the processor's own chat template renders back to the ids the engine
fed (`trajectory_messages`). Knows nothing of rewards or losses.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field, replace

import jinja2
import torch
from PIL import Image

from vlgrpo.data.images import load_image
from vlgrpo.data.prompts import MAX_TOOL_TEXT_TOKENS, TOOL_RESPONSE, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN
from vlgrpo.policy.prompt import IMAGE_PAD, VISION_END, VISION_START, PromptInputs, build_prompt
from vlgrpo.rollout.base import RolloutEngine, SamplingParams
from vlgrpo.rollout.tools.calls import EXPECTED_CALL, TOOL_CALL_END, TOOL_CALL_START, ToolCallError, first_tool_call
from vlgrpo.rollout.tools.context import ToolContext
from vlgrpo.rollout.tools.table import run_tool, tool_schemas, tool_table
from vlgrpo.types import Completion, InputError, RolloutGroup, Sample


def with_tool_images(limits: dict[str, int], max_turns: int) -> dict[str, int]:
    """An engine's images-per-prompt limit raised by one crop per tool response (`max_turns` - 1 of them): the zoom
    tool's one image a call always fits; a tool returning more than the room left gets an error turn instead."""
    return {**limits, "image": limits.get("image", 0) + max_turns - 1}


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
    """The conversation after the prompt (`Completion.turns`)."""
    texts: list[str] = field(default_factory=list)
    """Each of the model's turns as it is read (`Completion.text`): opened as the prompt did, cut after a call."""
    finish_reason: str = ""
    pending: str | None = None
    """The text of the last turn when it stopped at a tool call (the call runs before the next turn)."""
    kv: object = None
    """The engine's KV of the trajectory so far (`HFEngine.last_kv`), when turns are reused."""
    calls: int = 0
    errors: int = 0
    crop_area: float = 0.0
    """Summed share of the original image each returned crop covers."""


class ToolRollout:
    """A RolloutEngine whose completions may call tools, over `engine` (HF, vLLM).
    `max_total_length`: the longest sequence a trajectory may reach (prompt, turns, tool responses; None: the engine's
    `max_model_len` where it has one (vLLM), else no bound but `max_turns`). `reuse_turns=False` re-prefills each
    turn whole on the HF engine too (the baseline `benchmarks/bench_turns.py` compares with)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tools: tuple[str, ...],
        max_turns: int,
        max_total_length: int | None = None,
        reuse_turns: bool = True,
    ):
        if max_turns < 1:
            raise InputError(f"max_turns must be >= 1, got {max_turns}")
        tool_table(tuple(tools))  # a bad tool list fails here, before any decoding
        self.reuse_turns = reuse_turns
        self.engine, self.tools, self.max_turns = engine, tuple(tools), max_turns
        self.max_total_length = max_total_length or engine.max_model_len
        """Tokens a trajectory may reach: the given budget, else the engine's context (vLLM's max_model_len)."""
        self.max_images = engine.max_images
        """Images a conversation may hold (vLLM's limit_mm_per_prompt); None: no bound (HF)."""
        self.schemas = tool_schemas(self.tools)
        self.tool_role = tool_response_role(engine.processor)
        """How the template takes a tool's result back: "tool" or "user" messages (`tool_response_role`)."""
        self.reset_stats()

    @property
    def holds_own_weights(self) -> bool:
        return self.engine.holds_own_weights

    @property
    def reuse(self) -> bool:
        """Each trajectory's KV kept from turn to turn (the HF engine's `continue_prompts`): a turn prefills only what
        came after it. False: each turn's prompt prefilled whole (vLLM finds the earlier turns in its prefix cache)."""
        return self.reuse_turns and self.engine.keeps_turns

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
            "tools/over_length": float(self._counts["over_length"]),
            "tools/cut_calls": float(self._counts["cut_calls"]),
        }
        return {**self.engine.stats(), **tools}

    def reset_stats(self) -> None:
        self._counts = dict.fromkeys(
            ("trajectories", "calls", "turns", "errors", "crops", "crop_area", "over_length", "cut_calls"), 0
        )
        self.engine.reset_stats()

    # ------------------------------------------------------------ turns

    def generate(
        self, samples: list[Sample], params: SamplingParams, prompts: list[PromptInputs] | None = None
    ) -> list[RolloutGroup]:
        """Turn 1 as the engine's grouped rollout; then each trajectory stopped at a call gets its tool response and
        one more turn, until none is pending or `max_turns` turns were taken. `prompts`: the caller's, built with
        the tools' schemas (the trainer's rows); None: built here."""
        e = self.engine
        for s in samples:
            if s.video is not None:
                raise InputError(f"sample '{s.id}': tools are not supported on video rows yet (images only)")
        if prompts is None:
            prompts = [build_prompt(s, e.processor, e.geometry, **e.prompt_kw, tools=self.schemas) for s in samples]
        params = replace(params, stop=[*params.stop, TOOL_CALL_END])
        reuse = self.reuse
        first = e.generate_prompts(samples, prompts, params, keep_kv=reuse)
        groups = [[self._start(g.sample, p, c) for c in g.completions] for g, p in zip(first, prompts)]
        flat = [t for group in groups for t in group]
        for t, kv in zip(flat, e.last_kv if reuse else []):
            t.kv = kv
        for turn in range(1, self.max_turns):
            going = [t for t in flat if t.pending is not None]
            if not going:
                break
            nexts = [(t, self._respond(t, params.max_new_tokens)) for t in going]
            going, prompts_next = [t for t, p in nexts if p is not None], [p for _, p in nexts if p is not None]
            if not going:
                break
            seed = None if params.seed is None else params.seed + turn
            one = replace(params, completions_per_prompt=1, seed=seed)
            going_samples = [t.sample for t in going]
            if reuse:
                outs = e.continue_prompts(going_samples, prompts_next, [t.kv for t in going], one)
                for t, kv in zip(going, e.last_kv):
                    t.kv = kv
            else:
                outs = e.generate_prompts(going_samples, prompts_next, one)
            for t, out in zip(going, outs):
                self._take(t, out.completions[0])
        for t in flat:
            t.kv = None  # the KV is the rollout's working memory only
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
        t.texts.append(t.prompt.opened + text)
        t.turns.append(
            {"role": "assistant", "content": [{"type": "text", "text": t.prompt.opening + fed_text(tok, c)}]}
        )
        t.pending, t.finish_reason = (text if called else None), c.finish_reason
        self._counts["turns"] += 1
        # A call cut by max_new_tokens is scored as any completion cut there (finish "length"): not masked like an
        # over-turn trajectory, else opening a call near the limit would be a way out of a wrong answer's advantage.
        # Its unclosed call is no answer (`rewards.extract.final_turn`).
        self._counts["cut_calls"] += (
            c.finish_reason == "length" and TOOL_CALL_START in text.rsplit(TOOL_CALL_END, 1)[-1]
        )

    def _respond(self, t: Trajectory, max_new_tokens: int) -> PromptInputs | None:
        """Run the pending call, append its tool-response turn (tool_mask 1) -> the prompt of the next turn; None
        (the trajectory ends, "max_total_length") when that prompt and one more turn could pass the length budget."""
        text = t.pending or ""
        call = first_tool_call(text)
        if call is None:  # the turn stopped at a </tool_call> that closes no block
            call = ToolCallError(f"{TOOL_CALL_END} without its opening tag; {EXPECTED_CALL}", text, 0, len(text))
        if not t.images:
            t.images = [load_image(i) for i in t.sample.images]
        result = run_tool(
            call, ToolContext(t.images, self.engine.prompt_kw["box_format"], self.engine.geometry), self.tools
        )
        room = None if self.max_images is None else self.max_images - len(t.images)
        turn = response_turn(result, self.engine.geometry, self.engine.processor.tokenizer, t.prompt.opening, room)
        images, grids, words, error, ids = turn.images, turn.grids, turn.words, turn.error, turn.ids
        t.calls += 1
        self._counts["calls"] += 1
        t.pending = None
        total = len(t.prompt.input_ids) + len(t.token_ids) + len(ids) + max_new_tokens
        if self.max_total_length is not None and total > self.max_total_length:
            t.finish_reason = "max_total_length"
            self._counts["over_length"] += 1
            return None
        parts = []
        for image, grid in zip(images, grids):
            parts.append({"type": "image", "image": len(t.crops)})
            area = image.width * image.height / (t.images[0].width * t.images[0].height)
            t.images.append(image)
            t.crops.append(png_bytes(image))
            t.grids.append(grid)
            t.crop_area += area
            self._counts["crops"] += 1
            self._counts["crop_area"] += area
        if error is not None:
            t.errors += 1
            self._counts["errors"] += 1
        if words:
            parts.append({"type": "text", "text": words})
        t.turns.append(tool_message(self.tool_role, parts))
        t.token_ids += ids
        t.tool_mask += [1] * len(ids)
        t.logprobs += [math.nan] * len(ids)
        return continuation(t, self.engine.processor.tokenizer)

    def _completion(self, t: Trajectory) -> Completion:
        """The trajectory as one Completion; its text is the model's turns as read (`Trajectory.texts`), so a
        one-turn completion's text is the engine's own."""
        return Completion(
            list(t.token_ids),
            "".join(t.texts),
            ("max_turns" if t.pending is not None else t.finish_reason),
            list(t.logprobs),
            tool_mask=list(t.tool_mask) if t.calls else None,
            images=list(t.crops),
            turns=list(t.turns) if t.calls else [],
            prompt_messages=list(t.prompt.messages) if t.calls else [],
        )


def fed_text(tokenizer, c: Completion) -> str:
    """A turn's sampled tokens as text, as they were fed back to the model: every token, special ones too, but the
    EOS that ended the turn (the template closes the turn itself). A turn that ends on a special token with finish
    "stop" ended on EOS: a stop string is matched on the text without special tokens."""
    ids = c.token_ids
    if c.finish_reason == "stop" and ids and ids[-1] in tokenizer.all_special_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


def tool_response_role(processor) -> str:
    """How this processor's chat template takes a tool's result back, decided once per processor: "tool" when it
    renders a `tool` message as the tool-response turn the model reads (`TOOL_RESPONSE`, as Qwen3-VL's and Qwen3.5's
    templates do), else "user": the result goes back as a user message holding the <tool_response> tags itself
    (Qwen2.5-VL's template writes a `tool` message as a `<|im_start|>tool` turn the model never saw)."""
    probe = [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "w"}]},
    ]
    want = "a" + TOOL_RESPONSE.format(VISION_START + IMAGE_PAD + VISION_END + "w")
    try:
        text = processor.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    except jinja2.TemplateError:  # a template may refuse the role (its raise_exception): then not "tool"
        return "user"
    return "tool" if want in text else "user"


def tool_message(role: str, parts: list[dict]) -> dict:
    """A tool-response turn as a chat message the template renders as `TOOL_RESPONSE`: `parts` (its images', then its
    text's) in a `tool` message, or (role "user") in a user message between the <tool_response> tags."""
    if role == "tool":
        return {"role": "tool", "content": parts}
    tags = [{"type": "text", "text": TOOL_RESPONSE_OPEN}, {"type": "text", "text": TOOL_RESPONSE_CLOSE}]
    return {"role": "user", "content": [tags[0], *parts, tags[1]]}


@dataclass
class ResponseTurn:
    """A tool's result as the tool-response turn the model reads next."""

    ids: list[int]
    """The turn's tokens: it closes the model's turn, carries the images' pads and the words, opens the next turn."""
    images: list[Image.Image]
    """The images that came back (RGB), in the order of their pad runs."""
    grids: list[tuple[int, int, int]]
    words: str
    """The text part: the tool's text, or its error."""
    error: str | None


def response_turn(result, geometry, tokenizer, opening: str, room: int | None = None) -> ResponseTurn:
    """`result` (a ToolResult) rendered as the tool-response turn (`TOOL_RESPONSE`), each image's pads counted from
    its size as the processor resizes it, `opening` (what the generation prompt writes of a turn,
    `PromptInputs.opening`) after it. More images than `room` (None: no bound) turn into an error text: the
    conversation could not hold them."""
    error, images = result.error, [i.convert("RGB") for i in result.images] if result.error is None else []
    if room is not None and len(images) > room:
        error = (
            f"Error: the tool returned {len(images)} image(s), but the conversation has room for {max(room, 0)} more"
        )
        images = []
    grids = [geometry.grid_thw(i.height, i.width) for i in images]
    words = _bounded(error if error is not None else (result.text or ""), tokenizer)
    blocks = "".join(VISION_START + IMAGE_PAD * (g[1] * g[2] // geometry.merge_size**2) + VISION_END for g in grids)
    ids = tokenizer(TOOL_RESPONSE.format(blocks + words) + opening, add_special_tokens=False)["input_ids"]
    return ResponseTurn(ids, images, grids, words, error)


def _bounded(words: str, tokenizer) -> str:
    """A tool's text as the model reads it: at most MAX_TOOL_TEXT_TOKENS tokens (the length budget counts no more)."""
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    return words if len(ids) <= MAX_TOOL_TEXT_TOKENS else tokenizer.decode(ids[:MAX_TOOL_TEXT_TOKENS])


def png_bytes(image: Image.Image) -> bytes:
    """An image as PNG bytes: how a crop travels in a Completion and is keyed in the vision cache."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


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
        opening=t.prompt.opening,
    )


def crop_names(sample: Sample, c: Completion, folder: str) -> list[str]:
    """File names for a completion's crops: `<folder>/<sample id>_<k>.png`."""
    stem = re.sub(r"[^\w.-]+", "_", sample.id)
    return [f"{folder}/{stem}_{k}.png" for k in range(len(c.images))]


def trajectory_messages(sample: Sample, c: Completion, names: list[str]) -> list[dict]:
    """The trajectory in the Hugging Face chat format, as the model saw it: the prompt's messages (`prompt_messages`),
    their image parts naming the sample's images (a path, or "(image bytes)"), then the completion's turns, its k-th
    crop's image part naming `names[k]`. The processor's `apply_chat_template(messages[:k], tools=<the schemas>,
    add_generation_prompt=True)` with these images gives the ids the engine fed the turn that follows, token for token
    where the model's sampled tokens are the tokenizer's own encoding of their text."""
    own = iter([i if isinstance(i, str) else "(image bytes)" for i in sample.images])
    prompt = [_named(m, lambda p: next(own)) for m in c.prompt_messages]
    return [*prompt, *(_named(m, lambda p: names[p["image"]]) for m in c.turns)]


def _named(message: dict, name) -> dict:
    """`message` with each image part's `image` set to `name(part)` (a string content stays as it is)."""
    if isinstance(message["content"], str):
        return dict(message)
    parts = [{**p, "image": name(p)} if p["type"] == "image" else p for p in message["content"]]
    return {**message, "content": parts}
