"""Pretrain the tiny Qwen2.5-VL on synthetic shapes captions and instructions, so RL starts from a model that
already reads images.

One command rebuilds `data/models/<name>/` deterministically (fixed seeds, one thread, fixed scene streams):
0. init the tiny model (`vlgrpo.tiny.init_tiny`); stage 0 trains its vision tower alone on dense per-token labels,
   the stand-in for the pretrained CLIP / SigLIP encoder a real VLM starts from (a random tower's features were
   measured to stay unread by the LM for 1,200+ caption steps); then the merger is calibrated on unlabeled scenes,
1. stage 1 (LLaVA's "alignment"): vision tower frozen, merger + language model learn captions,
2. stage 2 (LLaVA's "whole model"): the tower joins at a lower learning rate, every rate decays,
3. stage 3 (instructions): tower frozen again, a fresh optimiser; "List the red shapes." / "List each circle." /
   "List each red circle." (the shapes' name list, or "none") and "Find each red circle." (their grounding JSON)
   with the captions mixed in: the question-conditioned lookup and localisation the demo needs,
4. evaluate greedy captions and instructions on held-out scenes and zero-shot demo-style questions, write the model
   card (dev/pretrain_card.py).

Two caption tasks alternate step by step in stages 1-2: "Detect the shapes." (grounding JSON) and "Name the shapes."
(a name list).

A caption names every object left to right as Qwen2.5-VL's own grounding output:
`[{"bbox_2d": [x1, y1, x2, y2], "label": "red circle"}, ...]`, boxes in pixels of the *resized* input.
Training never sees the demo's question templates or its scenes: see SEED STREAMS below.

    OMP_NUM_THREADS=1 .venv/bin/python dev/pretrain_tiny.py            # the shipped model
    OMP_NUM_THREADS=1 .venv/bin/python dev/pretrain_tiny.py --steps-scale 0.05 --out /tmp/t  # a quick check
    OMP_NUM_THREADS=1 .venv/bin/python dev/pretrain_tiny.py --from-stage2 /tmp/saved  # stage 3 on a saved build
    .venv/bin/python dev/pretrain_tiny.py --card-only     # rewrite README.md from pretrain.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.data.prompts import instruction
from vlgrpo.data.synth import COLOURS, KINDS, SHAPES, draw_scene, make_sample
from vlgrpo.data.synth import scene_names as names
from vlgrpo.models import count_parameters, load_model
from vlgrpo.rewards.boxes import from_original_pixels, to_original_pixels
from vlgrpo.tiny import TinySpec, calibrate_merger, init_tiny

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling pretrain_card.py, also when loaded by path
from pretrain_card import model_card  # noqa: E402

# SEED STREAMS. The demo draws its scenes from random.Random(seed * 1000 + split) with small seeds (0, 1, 2, ...);
# ours start at 7e11, out of its reach for any seed below 7e8.
TRAIN_STREAM = 700_000_000_001  # training scenes, one endless stream read in order
CAPTION_EVAL_STREAM = 700_000_000_002  # held-out scenes for the caption metrics
VISION_STREAM = 700_000_000_005  # stage 0 scenes
CALIBRATION_STREAM = 700_000_000_003  # unlabeled scenes for the merger calibration
ZERO_SHOT_STREAM = 700_000_000_004  # demo-style questions (synth.make_sample), evaluation only
INSTRUCT_STREAM = 700_000_000_006  # stage 3 scenes and instructions
INSTRUCT_EVAL_STREAM = 700_000_000_007  # held-out scenes for the instruction metrics
PAD_STREAM = 700_000_000_008  # the FILLERS of stage 1-2 prompts

CAPTION_PROMPT = "Detect the shapes."  # -> grounding JSON, left to right
NAMES_PROMPT = "Name the shapes."  # -> "blue square, red circle": what is there, in a fixed colour-then-shape order
FILLERS = (
    "Look carefully.",
    "Be brief.",
    "Use the image.",
    "Boxes are [x1, y1, x2, y2] in pixels.",
    "No extra words.",
    "Answer in one line.",
    "Say none if there is none.",
    "Keep the order.",
    "Write the labels in lower case.",
    "Give pixel values.",
    "Check every shape.",
)
"""Generic sentences appended to prompts by two opt-in experiments: `--pad-sentences N` (0..N after each stage 1-2
prompt) and `--vary-prompts` (0-3 in a `restyle`d stage-3 row). Why: the shipped base is keyed on its exact prompts.
Measured on it (100 held-out caption scenes): "Detect the shapes." puts 0.18 of the first boxes at IoU >= 0.5,
"Detect the shapes. Be brief." answers `none` to every scene. Padding stages 1-2 with up to 6 of them (a full build,
2026-12-02) cost the localisation instead: caption boxes at IoU >= 0.5 after stage 2 0.01 against 0.367 unpadded,
and the finished model was worse at every skill (docs/demo-seeds.md)."""
CAPTION_RE = re.compile(r'\{"bbox_2d": \[(\d+), (\d+), (\d+), (\d+)\], "label": "(\w+) (\w+)"\}')


@dataclass
class Settings:
    image_size: int = 112  # 16 image tokens: enough for 3 shapes and their positions
    max_shapes: int = 3
    batch: int = 16  # captions per step
    stage0_steps: int = 2000  # vision encoder alone, dense per-token labels
    vision0_lr: float = 1e-3
    stage1_steps: int = 1200  # tower frozen
    stage2_steps: int = 2500  # everything trains
    lr: float = 1e-3  # merger + language model, stage 1
    lr2: float = 5e-4  # merger + language model, stage 2 (start of its cosine)
    vision_lr: float = 2e-4  # vision tower, stage 2 (start of its cosine)
    warmup: int = 100
    stage3_steps: int = 4000  # instructions: tower frozen, a fresh optimiser
    lr3: float = 1e-3  # merger + language model, stage 3 (start of its cosine)
    vary_prompts: bool = False  # stage 3: paraphrases, fillers and wrappers (`restyle`); an experiment, see FILLERS
    pad_sentences: int = 0  # stages 1-2: each prompt gets 0..pad_sentences FILLERS; an experiment, see FILLERS
    single_steps: int = 0  # the first single_steps steps show one shape per scene (a curriculum: what before where)
    names_every: int = 2  # every names_every-th step teaches name lists instead of grounding captions (0: never)
    seed: int = 0
    calibration_images: int = 256
    merger_std: float = 0.05
    merger_lr_scale: float = 1.0  # the merger's learning rate relative to the LM's
    eval_scenes: int = 200
    eval_every: int = 500
    zero_shot_questions: int = 800  # round-robin over 4 kinds: 200 per kind
    spec: TinySpec = field(default_factory=TinySpec)


def default_spec() -> TinySpec:
    """The shipped size: init-tiny's language model (GRPO's cost is mostly the LM's: the demo freezes and caches the
    vision features) with a wider, deeper vision tower, which must read shape and position; and an M-RoPE base of 10
    instead of 10,000.

    Why the small base: the tower's positions are relative only (2D rotary), so on a blank canvas an image token
    cannot tell where it is, and absolute position must come from the LM's M-RoPE over the 4 x 4 token grid. M-RoPE
    gives the width axis the lowest frequencies (mrope_section (4, 6, 6) of 16): at base 10,000 they are 0.0032 rad
    per position and less, so the four columns differ by under 0.01 rad and no weight can tell them apart (the base
    built that way placed boxes worse than a constant guess: centre error 28.8 px against 22.4 px). At base 10 the
    width frequencies are 0.24-0.12 rad per position and the height ones 0.56-0.27."""
    return TinySpec(vision_hidden=128, vision_depth=4, vision_heads=4, vision_intermediate=256, rope_theta=10.0)


# ---------------------------------------------------------------- captions and batches


def caption(shapes, size: int, geometry: ProcessorGeometry) -> str:
    """Every object left to right (then top to bottom) as Qwen2.5-VL grounding JSON, boxes in resized pixels."""
    ordered = sorted(shapes, key=lambda s: (s.box[0], s.box[1]))
    boxes = from_original_pixels([s.box for s in ordered], "qwen2_5", (size, size), geometry)
    return json.dumps([{"bbox_2d": [round(v) for v in b], "label": s.name} for s, b in zip(ordered, boxes)])


def prompt_ids(processor, geometry: ProcessorGeometry, size: int, text: str = CAPTION_PROMPT) -> list[int]:
    """A chat-templated prompt with its image pad expanded (as `vlgrpo.policy.prompt.build_prompt`)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text = text.replace("<|image_pad|>", "<|image_pad|>" * geometry.num_image_tokens(size, size))
    return processor.tokenizer(text)["input_ids"]


class PromptCache:
    """`prompt_ids` memoised by prompt text: stage 3 asks the same few instructions over and over."""

    def __init__(self, processor, geometry: ProcessorGeometry, size: int) -> None:
        self.processor, self.geometry, self.size, self.ids = processor, geometry, size, {}

    def __call__(self, text: str) -> list[int]:
        if text not in self.ids:
            self.ids[text] = prompt_ids(self.processor, self.geometry, self.size, text)
        return self.ids[text]


def encode(processor, prompts: list[list[int]], images, targets: list[str] | None) -> dict[str, torch.Tensor]:
    """Right-padded rows prompt + target + <|im_end|>, labels on the target only; left-padded prompts when
    `targets` is None (generation)."""
    tok = processor.tokenizer
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    rows = [p + tok(t)["input_ids"] + [tok.eos_token_id] for p, t in zip(prompts, targets)] if targets else prompts
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (r, p) in enumerate(zip(rows, prompts)):
        at = slice(0, len(r)) if targets else slice(width - len(r), width)
        ids[i, at], mask[i, at] = torch.tensor(r), 1
        if targets:
            labels[i, len(p) : len(r)] = torch.tensor(r[len(p) :])
    pix = processor.image_processor(images=images, return_tensors="pt")
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == image_id).long(),
        "pixel_values": pix["pixel_values"],
        "image_grid_thw": pix["image_grid_thw"],
    }
    return {**out, "labels": labels} if targets else out


# ---------------------------------------------------------------- caption quality


def parse_caption(text: str) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(m[4], m[5], tuple(int(v) for v in m[:4])) for m in CAPTION_RE.findall(text)]


def iou(a, b) -> float:
    w, h = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, w) * max(0.0, h)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def score_caption(text: str, shapes, size: int, geometry: ProcessorGeometry) -> dict[str, float]:
    """One scene's verdicts; boxes compared in original pixels, each gold object matched to one prediction."""
    gold = sorted(shapes, key=lambda s: (s.box[0], s.box[1]))
    pred = parse_caption(text)
    pred_boxes = to_original_pixels([p[2] for p in pred], "qwen2_5", (size, size), geometry)
    first = pred[0] if pred else ("", "", ())
    free_any, free_named = list(range(len(pred))), list(range(len(pred)))
    box_hits = object_hits = 0
    for g in gold:  # greedy one-to-one matching, any label (box) and same label (object)
        best = max(free_any, key=lambda j: iou(g.box, pred_boxes[j]), default=None)
        if best is not None and iou(g.box, pred_boxes[best]) >= 0.5:
            box_hits += 1
            free_any.remove(best)
        named = [j for j in free_named if (pred[j][0], pred[j][1]) == (g.colour, g.shape)]
        best = max(named, key=lambda j: iou(g.box, pred_boxes[j]), default=None)
        if best is not None and iou(g.box, pred_boxes[best]) >= 0.5:
            object_hits += 1
            free_named.remove(best)
    return {
        "parsed": float(bool(pred)),
        "first_colour": float(first[0] == gold[0].colour),
        "first_shape": float(first[1] == gold[0].shape),
        "count": float(len(pred) == len(gold)),
        "all_objects": float(sorted(p[:2] for p in pred) == sorted((g.colour, g.shape) for g in gold)),
        "box_iou50": box_hits / len(gold),
        "object_iou50": object_hits / len(gold),
    }


@torch.no_grad()
def greedy(model, processor, prompts: list[list[int]], images, max_new_tokens: int) -> list[str]:
    """Greedy completions, 50 rows per generate call; the model's train/eval mode is restored."""
    was_training, texts = model.training, []
    model.eval()
    for i in range(0, len(prompts), 50):
        batch = encode(processor, prompts[i : i + 50], images[i : i + 50], None)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
        texts += processor.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return texts


def caption_quality(model, processor, geometry, s: Settings, n: int) -> tuple[dict, list]:
    """Greedy grounding captions and name lists of the first n held-out scenes (CAPTION_EVAL_STREAM): mean verdicts
    (`names_exact`: the name list is exactly right) and a few examples."""
    rng = random.Random(CAPTION_EVAL_STREAM)
    scenes = [draw_scene(rng, s.image_size, s.max_shapes) for _ in range(n)]
    images = [img for img, _ in scenes]
    texts = greedy(model, processor, [prompt_ids(processor, geometry, s.image_size)] * n, images, 112)
    listed = greedy(model, processor, [prompt_ids(processor, geometry, s.image_size, NAMES_PROMPT)] * n, images, 24)
    verdicts = [score_caption(t, sh, s.image_size, geometry) for t, (_, sh) in zip(texts, scenes)]
    means = {k: round(sum(v[k] for v in verdicts) / n, 4) for k in verdicts[0]}
    means["names_exact"] = round(sum(t.strip() == names(sh) for t, (_, sh) in zip(listed, scenes)) / n, 4)
    examples = [
        {"gold": caption(sh, s.image_size, geometry), "pred": t, "names_gold": names(sh), "names_pred": u}
        for t, u, (_, sh) in zip(texts[:4], listed, scenes)
    ]
    return means, examples


# ---------------------------------------------------------------- zero-shot demo-style questions

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FIRST_WORD = {
    "count": re.compile(r"\d+"),
    "colour": re.compile("|".join(COLOURS)),
    "exist": re.compile(r"\b(?:yes|no)\b", re.IGNORECASE),
}


def judge(kind: str, text: str, gold: str, gold_box, size: int, geometry) -> tuple[bool, bool]:
    """(strict, lenient) verdicts. Strict: the answer (inside <answer> tags, else the whole completion) is the gold
    answer exactly, or for `ground` its first box has IoU >= 0.5. Lenient: the first number / colour / yes-no word
    anywhere in the completion is the gold answer (a caption that happens to start with the asked colour counts)."""
    tagged = ANSWER_RE.search(text)
    answer = (tagged.group(1) if tagged else text).strip()
    if kind == "ground":
        boxes = parse_caption(answer) or parse_caption(text)
        if not boxes:
            return False, False
        hit = iou(to_original_pixels([boxes[0][2]], "qwen2_5", (size, size), geometry)[0], gold_box) >= 0.5
        return hit, hit
    first = FIRST_WORD[kind].search(text)
    return answer.lower() == gold, bool(first) and first.group(0).lower() == gold


def zero_shot(model, processor, geometry, s: Settings, workdir: Path) -> dict:
    """Accuracy per question kind on the demo's questions and instructions (`synth.make_sample`, scenes from
    ZERO_SHOT_STREAM, never trained on), greedy, 64 new tokens, answer format `answer`."""
    rng = random.Random(ZERO_SHOT_STREAM)
    samples = [
        make_sample(rng, i, s.image_size, KINDS, workdir, "zero-shot", s.max_shapes)
        for i in range(s.zero_shot_questions)
    ]
    pad = "<|image_pad|>" * geometry.num_image_tokens(s.image_size, s.image_size)
    prompts = []
    for x in samples:
        question = f"{x.question} {instruction(x.answer_type, 'answer', 'qwen2_5')}"
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(processor.tokenizer(text.replace("<|image_pad|>", pad))["input_ids"])
    images = [Image.open(workdir / Path(x.image).name).convert("RGB") for x in samples]
    texts = greedy(model, processor, prompts, images, 64)
    result: dict = {"questions": {}, "strict": {}, "lenient": {}, "examples": []}
    for kind in KINDS:
        rows = [(x, t) for x, t in zip(samples, texts) if x.task == f"shapes/{kind}"]
        verdicts = [judge(kind, t, x.answer, x.boxes[0] if x.boxes else None, s.image_size, geometry) for x, t in rows]
        result["questions"][kind] = len(rows)
        result["strict"][kind] = round(sum(v[0] for v in verdicts) / len(rows), 4)
        result["lenient"][kind] = round(sum(v[1] for v in verdicts) / len(rows), 4)
        result["examples"].append(
            {"question": rows[0][0].question, "gold": rows[0][0].answer, "completion": rows[0][1]}
        )
    return result


# ---------------------------------------------------------------- stage 0: the vision encoder


def cell_targets(shapes, size: int, geometry: ProcessorGeometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image token (row-major over the merged grid): colour id, shape id (-1: no object centre in the cell) and
    the centred object's box as (centre x, centre y) within the cell and (width, height), in cell units."""
    rh, rw = geometry.resized_hw(size, size)
    cell, gw = geometry.factor, rw // geometry.factor
    colour = torch.full(((rh // cell) * gw,), -1, dtype=torch.long)
    shape, box = colour.clone(), torch.zeros(len(colour), 8)
    for s, (x1, y1, x2, y2) in zip(
        shapes, from_original_pixels([s.box for s in shapes], "qwen2_5", (size, size), geometry)
    ):
        cx, cy = (x1 + x2) / 2 / cell, (y1 + y2) / 2 / cell
        k = min(int(cy), rh // cell - 1) * gw + min(int(cx), gw - 1)
        colour[k], shape[k] = COLOURS.index(s.colour), SHAPES.index(s.shape)
        box[k] = torch.tensor([cx % 1, cy % 1, (x2 - x1) / cell, (y2 - y1) / cell, x1 / rw, y1 / rh, x2 / rw, y2 / rh])
    return colour, shape, box


def vision_features(model, pix: dict) -> torch.Tensor:
    """The merger's output for a batch of images: [N image tokens, LM hidden]."""
    out = model.model.visual(pix["pixel_values"], grid_thw=pix["image_grid_thw"])
    out = getattr(out, "pooler_output", out)
    return out if isinstance(out, torch.Tensor) else torch.cat(list(out))


def pretrain_vision(model, processor, geometry, s: Settings, log: list[dict]) -> float:
    """Stage 0, the stand-in for a pretrained vision encoder (a real VLM starts from CLIP / SigLIP): the tower and
    merger learn dense per-token labels (the colour, shape and box of the object centred in each image token) through
    a linear head that is then thrown away. Returns the seconds it took."""
    torch.manual_seed(s.seed)
    head = torch.nn.Linear(model.config.get_text_config().hidden_size, 18)  # colour 6, shape 3, object 1, box 8
    params = [*model.model.visual.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=s.vision0_lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng, t0, window = random.Random(VISION_STREAM), time.perf_counter(), []
    for step in range(s.stage0_steps):
        for group in opt.param_groups:
            group["lr"] = (
                s.vision0_lr
                * min(1.0, (step + 1) / s.warmup)
                * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / s.stage0_steps)))
            )
        scenes = [draw_scene(rng, s.image_size, s.max_shapes) for _ in range(s.batch)]
        colour, shape, box = (
            torch.cat(t) for t in zip(*(cell_targets(sh, s.image_size, geometry) for _, sh in scenes))
        )
        out = head(
            vision_features(model, processor.image_processor(images=[im for im, _ in scenes], return_tensors="pt"))
        )
        obj = colour >= 0
        loss = (
            F.cross_entropy(out[obj, :6], colour[obj])
            + F.cross_entropy(out[obj, 6:9], shape[obj])
            + F.binary_cross_entropy_with_logits(out[:, 9], obj.float())
            + F.smooth_l1_loss(out[obj, 10:], box[obj])
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        window.append(
            [
                loss.item(),
                float((out[obj, :6].argmax(1) == colour[obj]).float().mean()),
                float((out[obj, 6:9].argmax(1) == shape[obj]).float().mean()),
                float((out[obj, 14:] - box[obj, 4:]).detach().abs().mean()) * s.image_size,
            ]
        )
        if (step + 1) % 50 == 0 or step + 1 == s.stage0_steps:
            m = [round(sum(v) / len(v), 4) for v in zip(*window)]
            print(
                f"[stage0] step {step + 1}/{s.stage0_steps} loss {m[0]} cell colour acc {m[1]} shape acc {m[2]} "
                f"absolute box error {m[3]:.1f} px "
                f"{(time.perf_counter() - t0) / (step + 1):.3f} s/step",
                flush=True,
            )
            log.append(
                {
                    "stage0_step": step + 1,
                    "loss": m[0],
                    "cell_colour_acc": m[1],
                    "cell_shape_acc": m[2],
                    "abs_box_error_px": round(m[3], 2),
                }
            )
            window = []
    return round(time.perf_counter() - t0, 1)


# ---------------------------------------------------------------- training


def parameter_groups(model) -> dict[str, list[torch.nn.Parameter]]:
    """tower (the ViT blocks and patch embedding), merger, lm (everything else: embeddings, decoder, head)."""
    groups: dict[str, list] = {"tower": [], "merger": [], "lm": []}
    for name, p in model.named_parameters():
        key = "merger" if ".visual.merger." in f".{name}" else "tower" if ".visual." in f".{name}" else "lm"
        groups[key].append(p)
    return groups


def learning_rates(step: int, s: Settings) -> tuple[float, float]:
    """(lm + merger lr, tower lr) at a 0-based step. Stage 1: warmup then constant, tower 0. Stage 2: a fresh
    warmup, then a cosine to 10 % for both."""
    if step < s.stage1_steps:
        return s.lr * min(1.0, (step + 1) / s.warmup), 0.0
    t = step - s.stage1_steps
    warm = min(1.0, (t + 1) / s.warmup)
    decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t / max(1, s.stage2_steps)))
    return s.lr2 * warm * decay, s.vision_lr * warm * decay


def fit(model, opt, batch: dict) -> float:
    """One optimiser step on a batch of rows (`encode`); returns its loss."""
    loss = model(**batch).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    return loss.item()


def train(model, processor, geometry, s: Settings, log: list[dict]) -> dict[str, float]:
    """Both stages over one scene stream; returns the seconds each stage took."""
    groups = parameter_groups(model)
    opt = torch.optim.AdamW(
        [{"params": groups["lm"]}, {"params": groups["tower"]}, {"params": groups["merger"]}],
        lr=s.lr,
        betas=(0.9, 0.98),
        weight_decay=0.01,
    )
    rng = random.Random(TRAIN_STREAM)
    pad_rng, prompts = random.Random(PAD_STREAM), PromptCache(processor, geometry, s.image_size)
    seconds, losses, t0 = {"stage1": 0.0, "stage2": 0.0, "evals": 0.0}, {}, time.perf_counter()
    total = s.stage1_steps + s.stage2_steps
    model.train()
    for step in range(total):
        stage = "stage1" if step < s.stage1_steps else "stage2"
        if step in (0, s.stage1_steps):
            for p in groups["tower"]:
                p.requires_grad_(stage == "stage2")
        lr, vision_lr = learning_rates(step, s)
        opt.param_groups[0]["lr"], opt.param_groups[1]["lr"] = lr, vision_lr
        opt.param_groups[2]["lr"] = lr * s.merger_lr_scale
        t = time.perf_counter()
        scenes = [draw_scene(rng, s.image_size, 1 if step < s.single_steps else s.max_shapes) for _ in range(s.batch)]
        task = "names" if s.names_every and step % s.names_every == 0 else "boxes"
        if task == "names":
            targets = [names(shapes) for _, shapes in scenes]
        else:
            targets = [caption(shapes, s.image_size, geometry) for _, shapes in scenes]
        texts = [
            " ".join(
                [
                    CAPTION_PROMPT if task == "boxes" else NAMES_PROMPT,
                    *pad_rng.sample(FILLERS, pad_rng.randint(0, s.pad_sentences)),
                ]
            )
            for _ in scenes
        ]
        loss = fit(model, opt, encode(processor, [prompts(t) for t in texts], [img for img, _ in scenes], targets))
        seconds[stage] += time.perf_counter() - t
        losses.setdefault(task, []).append(loss)
        if (step + 1) % 50 == 0 or step + 1 == total:
            done = step + 1 - (0 if stage == "stage1" else s.stage1_steps)
            means = {f"loss_{k}": round(sum(v) / len(v), 4) for k, v in sorted(losses.items())}
            print(
                f"[{stage}] step {step + 1}/{total} {means} lr {lr:.1e}/{vision_lr:.1e}"
                f" {seconds[stage] / done:.3f} s/step, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            log.append({"step": step + 1, **means})
            losses = {}
        if s.eval_every and (step + 1) % s.eval_every == 0 and step + 1 < total:
            t = time.perf_counter()
            quality, _ = caption_quality(model, processor, geometry, s, min(100, s.eval_scenes))
            seconds["evals"] += time.perf_counter() - t
            print(f"  captions of {min(100, s.eval_scenes)} held-out scenes: {quality}", flush=True)
            log[-1]["caption"] = quality
    return {k: round(v, 1) for k, v in seconds.items()}


# ---------------------------------------------------------------- stage 3: instructions

LIST_TASKS = ("list_colour", "list_shape", "list_name")
"""Stage 3's list instructions: the shapes of one colour ("List the red shapes."), of one kind ("List each
circle.") or of one name ("List each red circle."), as their name list, or `none` when there is none. Not the demo's
templates, but the question-conditioned lookup its counting, colour and existence questions need (measured: SFT on
the demo's own questions alone, 600 steps of existence questions, reached 0.62 from the caption-only base).

The key word is the one the demo's questions carry: "shapes" for a colour ("How many red shapes ..."), the singular
kind for a kind or a name ("What colour is the circle?", "Is there a red circle ..."). The tiny BPE has separate
tokens for "circle" and "circles" and the model has no language pretraining to relate them: keyed on "circles", the
lookup was 0.95 exactly right on its own instruction and the demo's SFT model still listed shapes of the asked
colour but another kind (seed 0: 95 of 95 false POPE "yes")."""
FIND_TASK = "find_name"
"""Stage 3's grounding instruction: "Find each red circle." -> the grounding JSON of those shapes (`none` when there
is none). The caption skill writes boxes in left-to-right order; this one writes the box of the asked name, which is
what a referring question ("Locate the red circle.") needs: from captions alone the demo's SFT model wrote one box
for every image (Acc@0.5 0.000 on seed 0 from a base with 0.20 of its caption boxes right)."""
INSTRUCT_MIX = ("boxes", "boxes", "names", FIND_TASK, FIND_TASK, FIND_TASK, *LIST_TASKS * 2)
"""One task per stage-3 step, drawn from this list."""
KEYS = {"list_colour": "colour", "list_shape": "shape", "list_name": "name", FIND_TASK: "name"}
NAMES_ALL = tuple(f"{c} {k}" for c in COLOURS for k in SHAPES)


PHRASES = {
    "Find each {}.": (
        "Find each {}.",
        "Find the {}.",
        "Show each {}.",
        "Where is the {}?",
        "Box the {}.",
        "Mark each {}.",
        "Point to the {}.",
        "Give the box of the {}.",
    ),
    "List each {}.": ("List each {}.", "Name each {}.", "Which {} is there?", "Tell me each {}.", "List the {} here."),
    "List the {} shapes.": (
        "List the {} shapes.",
        "Name the {} shapes.",
        "Which {} shapes are there?",
        "Show the {} shapes.",
    ),
}
"""Paraphrases of each stage-3 instruction (none is a demo template: no "How many", "What colour", "Is there" or
"Locate"), drawn when prompts vary."""
TAGS = ("out", "res", "reply", "list", "note", "ans", "result", "final", "step", "plan")
"""Tag names of the varied wrappers (not the demo's <think> / <answer>)."""


def restyle(rng: random.Random, template: str, value: str, target: str, about: str) -> tuple[str, str]:
    """A varied stage-3 row (`--vary-prompts`): a paraphrase of the instruction, 0-3 FILLERS, and one time in two a
    format to follow: the target inside a tag, or the asked shapes' names in one tag then the target in another (the
    shape of the demo's think-then-answer, with other tags). Meant to unkey the skills from the exact prompt
    (FILLERS)."""
    prompt = rng.choice(PHRASES.get(template, (template,))).format(value)
    prompt = " ".join([prompt, *rng.sample(FILLERS, rng.choice((0, 0, 1, 1, 2, 3)))])
    style, t1, t2 = rng.choice(("plain", "plain", "tag", "names")), *rng.sample(TAGS, 2)
    if style == "tag":
        return f"{prompt} Write it inside <{t1}> </{t1}>.", f"<{t1}>{target}</{t1}>"
    if style == "names":
        return (
            f"{prompt} Name them inside <{t1}> </{t1}>, then write it inside <{t2}> </{t2}>.",
            f"<{t1}>{about}</{t1}><{t2}>{target}</{t2}>",
        )
    return prompt, target


def instruct_row(
    task: str, rng: random.Random, shapes, size: int, geometry: ProcessorGeometry, vary: bool = False
) -> tuple[str, str]:
    """(prompt text, target) of one stage-3 task on a scene. A list or find asks for the colour / kind / name of one
    of the scene's n shapes or, one time in n + 1, for one drawn at random (then often absent). `vary`: `restyle`d."""
    if task == "boxes":
        template, value, target, hits = CAPTION_PROMPT, "", caption(shapes, size, geometry), shapes
    elif task == "names":
        template, value, target, hits = NAMES_PROMPT, "", names(shapes), shapes
    else:
        attr = KEYS[task]
        every = {"colour": COLOURS, "shape": SHAPES, "name": NAMES_ALL}[attr]
        value = rng.choice([getattr(x, attr) for x in shapes] + [rng.choice(every)])
        hits = [x for x in shapes if getattr(x, attr) == value]
        template = (
            "Find each {}." if task == FIND_TASK else "List the {} shapes." if attr == "colour" else "List each {}."
        )
        target = (caption(hits, size, geometry) if task == FIND_TASK else names(hits)) if hits else "none"
    if vary:
        return restyle(rng, template, value, target, names(hits) or "none")
    return template.format(value), target


def instruct(model, processor, geometry, s: Settings, log: list[dict]) -> dict[str, float]:
    """Stage 3 (LLaVA's instruction tuning, on our own templates): the tower frozen, merger + LM from a fresh AdamW
    at lr3 (warmup, cosine to 10 %), one INSTRUCT_MIX task per step on fresh scenes. Starts from the stage-2 weights
    as saved, so a build from a saved stage-2 model (`--from-stage2`) is the same computation."""
    torch.manual_seed(s.seed)
    groups = parameter_groups(model)
    for p in groups["tower"]:
        p.requires_grad_(False)
    params = groups["lm"] + groups["merger"]
    opt = torch.optim.AdamW(params, lr=s.lr3, betas=(0.9, 0.98), weight_decay=0.01)
    rng, prompts, losses = random.Random(INSTRUCT_STREAM), PromptCache(processor, geometry, s.image_size), {}
    seconds, t0 = {"stage3": 0.0, "stage3_evals": 0.0}, time.perf_counter()
    model.train()
    for step in range(s.stage3_steps):
        decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / s.stage3_steps))
        lr = s.lr3 * min(1.0, (step + 1) / s.warmup) * decay
        for group in opt.param_groups:
            group["lr"] = lr
        t = time.perf_counter()
        task = INSTRUCT_MIX[rng.randrange(len(INSTRUCT_MIX))]
        scenes = [draw_scene(rng, s.image_size, s.max_shapes) for _ in range(s.batch)]
        rows = [instruct_row(task, rng, shapes, s.image_size, geometry, s.vary_prompts) for _, shapes in scenes]
        batch = encode(processor, [prompts(q) for q, _ in rows], [img for img, _ in scenes], [a for _, a in rows])
        losses.setdefault(task, []).append(fit(model, opt, batch))
        seconds["stage3"] += time.perf_counter() - t
        if (step + 1) % 50 == 0 or step + 1 == s.stage3_steps:
            means = {f"loss_{k}": round(sum(v) / len(v), 4) for k, v in sorted(losses.items())}
            print(
                f"[stage3] step {step + 1}/{s.stage3_steps} {means} lr {lr:.1e} {seconds['stage3'] / (step + 1):.3f}"
                f" s/step, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            log.append({"stage3_step": step + 1, **means})
            losses = {}
        if s.eval_every and (step + 1) % s.eval_every == 0 and step + 1 < s.stage3_steps:
            t = time.perf_counter()
            log[-1]["instructions"] = instruction_quality(model, processor, geometry, s, min(100, s.eval_scenes))
            seconds["stage3_evals"] += time.perf_counter() - t
            print(f"  instructions on {min(100, s.eval_scenes)} held-out scenes: {log[-1]['instructions']}", flush=True)
    return {k: round(v, 1) for k, v in seconds.items()}


def instruction_quality(model, processor, geometry, s: Settings, n: int) -> dict[str, float]:
    """Greedy answers to each LIST_TASKS instruction and FIND_TASK on the first n held-out scenes
    (INSTRUCT_EVAL_STREAM): the rate of exactly right lists (find: of asked shapes found with their label and a box at
    IoU >= 0.5), and of right `none`s among the questions whose answer is `none`."""
    rng = random.Random(INSTRUCT_EVAL_STREAM)
    scenes = [draw_scene(rng, s.image_size, s.max_shapes) for _ in range(n)]
    out, prompts = {}, PromptCache(processor, geometry, s.image_size)
    for task in (*LIST_TASKS, FIND_TASK):
        rows = [instruct_row(task, rng, shapes, s.image_size, geometry) for _, shapes in scenes]
        texts = greedy(
            model,
            processor,
            [prompts(q) for q, _ in rows],
            [img for img, _ in scenes],
            112 if task == FIND_TASK else 24,
        )
        if task == FIND_TASK:  # the asked shapes found with the right label and a box at IoU >= 0.5
            asked = [q.removeprefix("Find each ").removesuffix(".") for q, _ in rows]
            found = [
                score_caption(t, [x for x in sh if x.name == name], s.image_size, geometry)["object_iou50"]
                for t, name, (_, a), (_, sh) in zip(texts, asked, rows, scenes)
                if a != "none"
            ]
            out[task] = round(sum(found) / len(found), 4)
        else:
            out[task] = round(sum(t.strip() == a for t, (_, a) in zip(texts, rows)) / n, 4)
        absent = [t.strip() == a for t, (_, a) in zip(texts, rows) if a == "none"]
        out[f"{task}_none"] = round(sum(absent) / len(absent), 4) if absent else None
    return out


# ---------------------------------------------------------------- the model card


# ---------------------------------------------------------------- the command


STAGE2_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "chat_template.jinja",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def build_stage2(out: Path, s: Settings, log: list[dict]) -> dict[str, float]:
    """Stages 0-2 into `out`: init, the vision encoder, the merger calibration, captions; returns their seconds."""
    shutil.rmtree(out, ignore_errors=True)
    init_tiny(out, "qwen2_5_vl", spec=s.spec, seed=s.seed)
    lm = load_model(str(out))
    geometry = ProcessorGeometry.from_processor(lm.processor)
    stage0_seconds = pretrain_vision(lm.model, lm.processor, geometry, s, log) if s.stage0_steps else 0.0
    lm.model.save_pretrained(out)
    with tempfile.TemporaryDirectory() as tmp:
        rng = random.Random(CALIBRATION_STREAM)
        images = [Path(tmp) / f"{i:04d}.png" for i in range(s.calibration_images)]
        for path in images:
            draw_scene(rng, s.image_size, s.max_shapes)[0].save(path)
        calibrate_merger(out, images, s.merger_std)
    torch.manual_seed(s.seed)
    lm = load_model(str(out))
    seconds = {"stage0": stage0_seconds, **train(lm.model, lm.processor, geometry, s, log)}
    lm.model.save_pretrained(out)
    return seconds


STAGE2_SETTINGS = (
    "image_size",
    "max_shapes",
    "batch",
    "stage0_steps",
    "vision0_lr",
    "stage1_steps",
    "stage2_steps",
    "lr",
    "lr2",
    "vision_lr",
    "warmup",
    "pad_sentences",
    "single_steps",
    "names_every",
    "seed",
    "calibration_images",
    "merger_std",
    "merger_lr_scale",
    "spec",
)
"""The settings stages 0-2 depend on: a saved stage-2 model is reused only when they all match."""


def reuse_stage2(src: Path, out: Path, s: Settings, log: list[dict]) -> dict[str, float]:
    """Copy a saved build's stage-2 model (`pretrain.json` records it) into `out`; returns the seconds its stages
    took then. Refuses a build whose stage 0-2 settings differ from `s`."""
    earlier = json.loads((src / "pretrain.json").read_text())
    stage2 = earlier.get("stage2", {"weights_sha256": earlier["weights_sha256"]})  # a build without stage 3
    mine = json.loads(json.dumps({k: v for k, v in asdict(s).items() if k in STAGE2_SETTINGS}))  # tuples as lists
    defaults = asdict(Settings())  # a setting added since that build ran at its default
    theirs = {k: earlier["settings"].get(k, defaults[k]) for k in STAGE2_SETTINGS}
    theirs["spec"] = {**asdict(TinySpec()), **theirs["spec"]}  # a TinySpec field added since: its default
    if mine != theirs:
        diff = sorted(k for k in STAGE2_SETTINGS if mine.get(k) != theirs.get(k))
        raise SystemExit(f"--from-stage2 {src}: its stage 0-2 settings differ from this command's in {diff}")
    if src.resolve() != out.resolve():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for name in STAGE2_FILES:
            shutil.copy2(src / name, out / name)
    if hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() != stage2["weights_sha256"]:
        raise SystemExit(
            f"--from-stage2 {src}: model.safetensors is not the stage-2 model its pretrain.json records "
            "(it already holds stage 3?)"
        )
    log.extend(e for e in earlier["loss_log"] if "stage3_step" not in e)
    return {k: earlier["seconds"][k] for k in ("stage0", "stage1", "stage2", "evals")}


def build(out: Path, s: Settings, command: str, from_stage2: Path | None = None) -> dict:
    """Every stage (stages 0-2 taken from a saved build with `from_stage2`); writes the model, pretrain.json and
    README.md into `out` and returns the figures."""
    t0, log = time.perf_counter(), []
    print(
        f"{s.stage0_steps} + {s.stage1_steps} + {s.stage2_steps} + {s.stage3_steps} steps x {s.batch} at "
        f"{s.image_size} px",
        flush=True,
    )
    if from_stage2 is None:
        seconds = build_stage2(out, s, log)
    else:
        seconds = reuse_stage2(from_stage2, out, s, log)
        t0 -= sum(seconds.values())
    stage2 = {
        "weights_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
        "source": "built here" if from_stage2 is None else str(from_stage2),
    }
    torch.manual_seed(s.seed)
    lm = load_model(str(out))  # stage 3 starts from the saved stage-2 model on either route
    geometry = ProcessorGeometry.from_processor(lm.processor)
    counts = count_parameters(lm.model)
    stage2["caption_quality"], _ = caption_quality(lm.model, lm.processor, geometry, s, s.eval_scenes)
    stage2["instructions"] = instruction_quality(lm.model, lm.processor, geometry, s, s.eval_scenes)
    print(f"stage 2: captions {stage2['caption_quality']}, instructions {stage2['instructions']}", flush=True)
    seconds.update(instruct(lm.model, lm.processor, geometry, s, log))
    lm.model.save_pretrained(out)
    t = time.perf_counter()
    quality, examples = caption_quality(lm.model, lm.processor, geometry, s, s.eval_scenes)
    instructions = instruction_quality(lm.model, lm.processor, geometry, s, s.eval_scenes)
    seconds["caption_eval"] = round(time.perf_counter() - t, 1)
    print(f"captions of {s.eval_scenes} held-out scenes: {quality}; instructions {instructions}", flush=True)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        zs = zero_shot(lm.model, lm.processor, geometry, s, Path(tmp))
    seconds["zero_shot_eval"] = round(time.perf_counter() - t, 1)
    print(f"zero-shot demo-style questions: strict {zs['strict']}, lenient {zs['lenient']}", flush=True)
    seconds["total"] = round(time.perf_counter() - t0, 1)
    weights = out / "model.safetensors"
    figures = {
        "command": command,
        "seconds": seconds,
        "parameters": counts,
        "size_mb": round(sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6, 2),
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "stage2": stage2,
        "image_size": s.image_size,
        "image_tokens": geometry.num_image_tokens(s.image_size, s.image_size),
        "caption_quality": quality,
        "caption_eval_scenes": s.eval_scenes,
        "caption_examples": examples,
        "instructions": instructions,
        "zero_shot": zs,
        "loss_log": log,
        "prompts": {"caption": CAPTION_PROMPT, "names": NAMES_PROMPT},
        "instruct_mix": list(INSTRUCT_MIX),
        "seed_streams": {
            "vision": VISION_STREAM,
            "train": TRAIN_STREAM,
            "caption_eval": CAPTION_EVAL_STREAM,
            "calibration": CALIBRATION_STREAM,
            "zero_shot": ZERO_SHOT_STREAM,
            "instruct": INSTRUCT_STREAM,
            "instruct_eval": INSTRUCT_EVAL_STREAM,
            "pad": PAD_STREAM,
        },
        "settings": asdict(s),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # kernels differ by ISA: so do the weights' bits
    }
    (out / "pretrain.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out / "README.md").write_text(model_card(out.name, figures))
    figures["size_mb"] = round(sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6, 2)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="data/models/shapes-tiny-qwen2_5_vl", help="model directory (replaced)")
    p.add_argument("--steps-scale", type=float, default=1.0, help="multiply every stage's steps (0.05: a quick check)")
    p.add_argument("--stage0-steps", type=int, default=Settings.stage0_steps)
    p.add_argument("--vision0-lr", type=float, default=Settings.vision0_lr)
    p.add_argument("--stage1-steps", type=int, default=Settings.stage1_steps)
    p.add_argument("--stage2-steps", type=int, default=Settings.stage2_steps)
    p.add_argument("--stage3-steps", type=int, default=Settings.stage3_steps)
    p.add_argument("--lr", type=float, default=Settings.lr)
    p.add_argument("--lr2", type=float, default=Settings.lr2)
    p.add_argument("--vision-lr", type=float, default=Settings.vision_lr)
    p.add_argument("--lr3", type=float, default=Settings.lr3)
    p.add_argument("--vary-prompts", action="store_true", help="stage 3 on `restyle`d prompts (an experiment)")
    p.add_argument(
        "--pad-sentences",
        type=int,
        default=Settings.pad_sentences,
        help="stages 1-2: up to this many FILLERS after each prompt (0, the default: the fixed prompts; an experiment)",
    )
    p.add_argument("--merger-std", type=float, default=Settings.merger_std)
    p.add_argument("--merger-lr", type=float, default=None, help="merger learning rate (default: the LM's)")
    p.add_argument("--single-steps", type=int, default=Settings.single_steps)
    p.add_argument("--names-every", type=int, default=Settings.names_every)
    p.add_argument("--eval-scenes", type=int, default=Settings.eval_scenes)
    p.add_argument("--eval-every", type=int, default=Settings.eval_every)
    p.add_argument("--zero-shot-questions", type=int, default=Settings.zero_shot_questions)
    p.add_argument("--spec", default="{}", help="TinySpec fields over the default size, as JSON: '{\"num_layers\": 2}'")
    p.add_argument(
        "--from-stage2",
        default=None,
        help="take stages 0-2 from this saved build (its pretrain.json "
        "records the stage-2 weights) instead of rebuilding them: the same result, 30 min sooner",
    )
    p.add_argument("--card-only", action="store_true", help="only rewrite README.md from the model's pretrain.json")
    a = p.parse_args(argv)
    if a.card_only:
        figures = json.loads((Path(a.out) / "pretrain.json").read_text())
        (Path(a.out) / "README.md").write_text(model_card(Path(a.out).name, figures))
        return 0
    if not 0 <= a.pad_sentences <= len(FILLERS):  # before any build step: random.sample would fail mid-stage-1
        p.error(f"--pad-sentences {a.pad_sentences}: accepted 0 to {len(FILLERS)} (there are {len(FILLERS)} FILLERS)")
    torch.set_num_threads(1)  # deterministic and polite: one core
    s = Settings(
        stage0_steps=round(a.stage0_steps * a.steps_scale),
        vision0_lr=a.vision0_lr,
        stage1_steps=round(a.stage1_steps * a.steps_scale),
        stage2_steps=round(a.stage2_steps * a.steps_scale),
        stage3_steps=round(a.stage3_steps * a.steps_scale),
        lr3=a.lr3,
        vary_prompts=a.vary_prompts,
        pad_sentences=a.pad_sentences,
        lr=a.lr,
        lr2=a.lr2,
        vision_lr=a.vision_lr,
        names_every=a.names_every,
        merger_std=a.merger_std,
        merger_lr_scale=(a.merger_lr / a.lr if a.merger_lr else 1.0),
        single_steps=round(a.single_steps * a.steps_scale),
        eval_scenes=a.eval_scenes,
        eval_every=a.eval_every,
        zero_shot_questions=a.zero_shot_questions,
        spec=TinySpec(**{**asdict(default_spec()), **json.loads(a.spec)}),
    )
    s.warmup = max(1, min(s.warmup, s.stage1_steps // 2 or 1))
    command = "OMP_NUM_THREADS=1 .venv/bin/python dev/pretrain_tiny.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    figures = build(Path(a.out), s, command.strip(), Path(a.from_stage2) if a.from_stage2 else None)
    print(
        f"wrote {a.out} ({figures['size_mb']} MB) in {figures['seconds']['total']:.0f} s; weights sha256 "
        f"{figures['weights_sha256'][:16]}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
