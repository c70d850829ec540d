"""A saved trajectory (`rollout.turns.trajectory_messages`) replayed with plain transformers: for each of its assistant
turns, the processor's own chat template over the messages before it (`apply_chat_template(..., tools=...,
add_generation_prompt=True)`) and the processor over the images those messages name give the ids the engine fed that
turn. Tokens a model sampled that are not the tokenizer's encoding of their text cannot come back from text: after such
a turn the ids are not compared, the text is."""

from __future__ import annotations

import io
from dataclasses import dataclass, fields

from PIL import Image

from vlgrpo.rollout.turns import crop_names, trajectory_messages
from vlgrpo.types import Completion


@dataclass
class Replayed:
    """What a replay compared, summed over trajectories."""

    turns: int = 0
    """Assistant turns whose prompt was compared as text (every one)."""
    ids: int = 0
    """Of them, turns whose prompt ids were compared: every turn the model sampled before them encodes its own text."""
    after_crop: int = 0
    """Of the id-compared turns, those whose prompt holds a crop."""
    later: int = 0
    """Of the id-compared turns, those after the first (a tool response in their prompt)."""

    def __iadd__(self, other: Replayed) -> Replayed:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


def sampled_runs(c: Completion) -> list[tuple[int, int]]:
    """[start, end) of each turn the model sampled in `c.token_ids` (the runs of tool_mask 0)."""
    runs, start = [], None
    for i, m in enumerate([*c.tool_mask, 1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            runs.append((start, i))
            start = None
    return runs


def image_parts(messages: list[dict]) -> list[str]:
    """The names of the messages' image parts, in order (a string content holds none)."""
    return [
        p["image"] for m in messages if not isinstance(m["content"], str) for p in m["content"] if p["type"] == "image"
    ]


def replay(processor, prompt_ids: list[int], c: Completion, messages: list[dict], images: dict, tools, **switch):
    """Compare the prompt each assistant turn of `messages` replays to with what the engine fed it -> Replayed.
    `images`: each image part's name -> its PIL image; `switch`: enable_thinking, as data.thinking set it."""
    tok = processor.tokenizer
    runs = sampled_runs(c)
    starts = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(starts) == len(runs), (len(starts), len(runs))
    own_images = len(image_parts(messages[: starts[0]]))
    done, canonical = Replayed(), True
    for n, (k, (start, end)) in enumerate(zip(starts, runs)):
        text = processor.apply_chat_template(
            messages[:k], tools=tools, add_generation_prompt=True, tokenize=False, **switch
        )
        names = image_parts(messages[:k])
        ids = list(processor(text=[text], images=[images[i] for i in names] or None)["input_ids"][0])
        fed = prompt_ids + c.token_ids[:start]
        assert tok.decode(ids) == tok.decode(fed), f"turn {n + 1}: the replayed text differs"
        done.turns += 1
        if canonical:
            assert ids == fed, f"turn {n + 1}: the replayed ids differ"
            done.ids += 1
            done.after_crop += len(names) > own_images
            done.later += n > 0
        sampled = c.token_ids[start:end]
        canonical = canonical and tok(tok.decode(sampled), add_special_tokens=False)["input_ids"] == sampled
    return done


def replay_groups(processor, groups, schemas, thinking: str = "auto") -> Replayed:
    """Every trajectory of `groups` that called a tool saved as `trajectory_messages` (its crops under "crops/") and
    replayed; `thinking`: data.thinking (on / off set enable_thinking)."""
    switch = {} if thinking == "auto" else {"enable_thinking": thinking == "on"}
    done = Replayed()
    for g in groups:
        for c in g.completions:
            if not c.turns:
                continue
            names = crop_names(g.sample, c, "crops")
            messages = trajectory_messages(g.sample, c, names)
            images = {name: Image.open(io.BytesIO(png)) for name, png in zip(names, c.images)}
            images.update({path: Image.open(path) for path in g.sample.images})
            done += replay(processor, g.prompt_ids, c, messages, images, schemas, **switch)
    return done
