"""How well a model localises the demo's grounding targets when asked in the pretrained base's own words: a probe
of where the box skill is lost between the base and the demo's SFT model (docs/demo-seeds.md).

For the first N box questions ("Locate the red circle.") of a demo data split, greedy, one thread:
- `find`: the base's instruction "Find each red circle." -> the first box of the answer;
- `detect`: the base's caption "Detect the shapes." -> the first box labelled with the asked name.
Each reports Acc@0.5 (the demo's grounding metric, over all N questions), how many answers had a box, and the
median centre error in x and y (original pixels) of those boxes.

`--distance` asks whether the box readout depends on how far the answer sits from the image: teacher-forced on
the base's own captions, the share of the boxes' tens and ones digits and of the other caption tokens predicted
right, with each scene's own image and with another scene's (what the text alone predicts), when the caption is
moved k positions away from the image: `shift` adds k to the M-RoPE positions of every token after the image (the
same tokens), `sentences` puts k generic sentences after the prompt (pretrain_tiny.FILLERS).

`--positions` asks instead whether the language model's image tokens carry an object's position as content: a ridge
probe, per layer, from the hidden state of the image token holding an object's centre to that centre (absolute) and
to its offset within the token's cell, fitted on 70 % of the objects of fresh scenes and scored (mean absolute error,
px) on the rest, next to always guessing the mean.

    OMP_NUM_THREADS=1 .venv/bin/python dev/probe_grounding.py data/models/shapes-tiny-qwen2_5_vl runs/demo/data
    OMP_NUM_THREADS=1 .venv/bin/python dev/probe_grounding.py runs/demo/sft_model runs/demo/data
    OMP_NUM_THREADS=1 .venv/bin/python dev/probe_grounding.py data/models/shapes-tiny-qwen2_5_vl --positions
    OMP_NUM_THREADS=1 .venv/bin/python dev/probe_grounding.py data/models/shapes-tiny-qwen2_5_vl --distance
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch
from PIL import Image

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.data.synth import draw_scene
from vlgrpo.models import load_model
from vlgrpo.rewards.boxes import from_original_pixels, to_original_pixels
from vlgrpo.rewards.grounding import iou  # the demo's grounding eval scores with it

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling pretrain_tiny.py
from pretrain_tiny import (  # noqa: E402
    CAPTION_EVAL_STREAM,
    CAPTION_PROMPT,
    FILLERS,
    PromptCache,
    caption,
    encode,
    greedy,
    parse_caption,
    prompt_ids,
)

LOCATE = "Locate the "
POSITION_STREAM = 123  # the scenes of `--positions` (a demo with seed 0 draws from 0, 1 and 2)


def asked_box(text: str, name: str | None) -> tuple[int, ...] | None:
    """The first box of a grounding-JSON answer (name None) or the first one labelled `name`; None without one."""
    boxes = [b for colour, shape, b in parse_caption(text) if name is None or f"{colour} {shape}" == name]
    return boxes[0] if boxes else None


def score(preds: list[tuple | None], golds: list[list[int]]) -> dict[str, float]:
    """Acc@0.5 over every question (no box = a miss), the share answered with a box, and the median |centre error|
    in x and y over the answered ones; boxes xyxy in the same pixels."""
    answered = [(p, g) for p, g in zip(preds, golds) if p is not None]
    dx = [abs(p[0] + p[2] - g[0] - g[2]) / 2 for p, g in answered]
    dy = [abs(p[1] + p[3] - g[1] - g[3]) / 2 for p, g in answered]
    return {
        "acc50": sum(iou(p, g) >= 0.5 for p, g in answered) / len(golds),
        "answered": len(answered) / len(golds),
        "median_dx": statistics.median(dx) if dx else float("nan"),
        "median_dy": statistics.median(dy) if dy else float("nan"),
    }


def probe(model_dir: str, data_dir: Path, split: str, n: int) -> dict[str, dict[str, float]]:
    """`score` of the `find` and `detect` asks over the first n "Locate the ..." questions of data_dir/split.jsonl."""
    lm = load_model(model_dir)
    geometry = ProcessorGeometry.from_processor(lm.processor)
    rows = [json.loads(line) for line in (data_dir / f"{split}.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["answer_type"] == "box" and r["question"].startswith(LOCATE)][:n]
    if not rows:
        raise SystemExit(f"{data_dir / f'{split}.jsonl'}: no '{LOCATE}...' box questions (a `vlgrpo data synth` split)")
    names = [r["question"][len(LOCATE) :].rstrip(".") for r in rows]
    sizes = sorted({tuple(r["image_size"]) for r in rows})
    if len(sizes) != 1 or sizes[0][0] != sizes[0][1]:
        raise SystemExit(f"{data_dir}: image sizes {sizes}; the probe batches square images of one size")
    (w, h), images = sizes[0], [Image.open(data_dir / r["image"]).convert("RGB") for r in rows]
    asks = {
        "find": ([f"Find each {x}." for x in names], [None] * len(rows)),
        "detect": ([CAPTION_PROMPT] * len(rows), names),
    }
    result = {}
    for task, (prompts, labels) in asks.items():
        texts = greedy(lm.model, lm.processor, [prompt_ids(lm.processor, geometry, w, p) for p in prompts], images, 112)
        boxes = [asked_box(t, label) for t, label in zip(texts, labels)]
        preds = [to_original_pixels([b], "qwen2_5", (w, h), geometry)[0] if b else None for b in boxes]
        result[task] = score(preds, [r["boxes"][0] for r in rows])
    return result


def ridge_mae(x: torch.Tensor, y: torch.Tensor, train: float = 0.7, ridge: float = 1e-2) -> torch.Tensor:
    """Mean absolute error per column of y on the held-out rows, of a ridge regression (with a bias) fitted on the
    first `train` share of the rows."""
    x = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    y, n = y.double(), int(len(x) * train)
    w = torch.linalg.solve(x[:n].T @ x[:n] + ridge * torch.eye(x.shape[1], dtype=x.dtype), x[:n].T @ y[:n])
    return (x[n:] @ w - y[n:]).abs().mean(0)


@torch.no_grad()
def position_probe(model_dir: str, scenes: int = 400, size: int = 112) -> list[dict[str, float]]:
    """Per hidden-state layer (0: the merger's output): the held-out MAE (px) of the object centre from its token's
    state, absolute (`abs_x`, `abs_y`) and within the token's cell (`cell_x`, `cell_y`), and of the mean guesses."""
    lm = load_model(model_dir)
    lm.model.eval()
    geometry = ProcessorGeometry.from_processor(lm.processor)
    cell, cols = geometry.factor, geometry.resized_hw(size, size)[1] // geometry.factor
    rng = random.Random(POSITION_STREAM)
    drawn = [draw_scene(rng, size, 3) for _ in range(scenes)]
    ids = prompt_ids(lm.processor, geometry, size, CAPTION_PROMPT)
    image_id = lm.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    states: list[list[torch.Tensor]] = []
    centres = []
    for i in range(0, scenes, 50):
        batch = encode(lm.processor, [ids] * len(drawn[i : i + 50]), [im for im, _ in drawn[i : i + 50]], None)
        hidden = lm.model(**batch, output_hidden_states=True).hidden_states
        at = (batch["input_ids"][0] == image_id).nonzero().squeeze(1)  # the same prompt in every row
        for j, (_, shapes) in enumerate(drawn[i : i + 50]):
            for s in shapes:
                ((x1, y1, x2, y2),) = from_original_pixels([s.box], "qwen2_5", (size, size), geometry)  # resized px
                cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
                k = int(cy // cell) * cols + int(cx // cell)
                states.append([h[j, at[k]] for h in hidden])
                centres.append([cx, cy, cx % cell, cy % cell])
    y = torch.tensor(centres)
    n = int(len(y) * 0.7)
    guess = (y[n:] - y[:n].mean(0)).abs().mean(0)
    out = []
    for layer in range(len(states[0])):
        err = ridge_mae(torch.stack([row[layer] for row in states]), y)
        out.append(
            {
                "abs_x": err[0],
                "abs_y": err[1],
                "cell_x": err[2],
                "cell_y": err[3],
                "guess_abs_x": guess[0],
                "guess_abs_y": guess[1],
                "guess_cell_x": guess[2],
                "guess_cell_y": guess[3],
            }
        )
    return [{k: round(float(v), 2) for k, v in row.items()} for row in out]


@torch.no_grad()
def distance_probe(model_dir: str, moves=(0, 1, 2, 4, 8), scenes: int = 200, size: int = 112) -> list[dict]:
    """Per way of moving the caption (`shift`: M-RoPE positions, `sentences`: FILLERS after the prompt), per distance
    k and per image (the scene's own, or the next scene's): the teacher-forced accuracy of the caption's tens digits,
    ones digits and other tokens on the caption-eval scenes."""
    lm = load_model(model_dir)
    lm.model.eval()
    tok, geometry = lm.processor.tokenizer, ProcessorGeometry.from_processor(lm.processor)
    rng = random.Random(CAPTION_EVAL_STREAM)
    drawn = [draw_scene(rng, size, 3) for _ in range(scenes)]
    images, targets = [im for im, _ in drawn], [caption(shapes, size, geometry) for _, shapes in drawn]
    is_digit = torch.tensor([tok.decode([i]).strip().isdigit() for i in range(len(tok))])
    end, out, cached = tok.convert_tokens_to_ids("<|vision_end|>"), [], PromptCache(lm.processor, geometry, size)
    runs = (
        (m, k, i)
        for m in ("shift", "sentences")
        for k in moves
        for i in ("own", "other")
        if m == "shift" or k <= len(FILLERS)
    )  # k sentences are k distinct FILLERS: 11 at most
    for move, k, image in runs:
        pad = random.Random(k)
        words = k if move == "sentences" else 0
        prompts = [cached(" ".join([CAPTION_PROMPT, *pad.sample(FILLERS, words)])) for _ in drawn]
        batch = encode(lm.processor, prompts, images if image == "own" else images[1:] + images[:1], targets)
        labels = batch.pop("labels")[:, 1:]
        positions, _ = lm.model.model.get_rope_index(
            batch["input_ids"],
            batch["mm_token_type_ids"],
            batch["image_grid_thw"],
            attention_mask=batch["attention_mask"],
        )
        after = (batch["input_ids"] == end).long().cumsum(1) > 0  # <|vision_end|> and every token after it
        positions = positions + (k if move == "shift" else 0) * after.long()
        right = lm.model(**batch, position_ids=positions).logits[:, :-1].argmax(-1) == labels
        scored = labels != -100
        digit = is_digit[labels.clamp(min=0)] & scored
        tens = digit & torch.cat([digit[:, 1:], torch.zeros_like(digit[:, :1])], 1)  # a digit before a digit
        out.append(
            {
                "move": move,
                "k": k,
                "image": image,
                "tens": float(right[tens].float().mean()),
                "ones": float(right[digit & ~tens].float().mean()),
                "other": float(right[scored & ~digit].float().mean()),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Qwen2.5-VL model directory (the base, or a demo's sft_model / grpo_model)")
    ap.add_argument("data", type=Path, nargs="?", help="a demo data directory (train/val/test.jsonl and images/)")
    ap.add_argument("--split", default="test")
    ap.add_argument("-n", type=int, default=150, help="box questions to ask (the demo evaluates 150)")
    ap.add_argument("--positions", action="store_true", help="the image tokens' position content, per layer")
    ap.add_argument("--distance", action="store_true", help="the caption's box digits against the prompt's length")
    ap.add_argument("--moves", default="0,1,2,4,8", help="--distance: the distances k to move the caption, e.g. 0,8,96")
    args = ap.parse_args()
    if args.positions:
        for layer, m in enumerate(position_probe(args.model)):
            print(
                f"layer {layer}: centre x {m['abs_x']:.1f} y {m['abs_y']:.1f} px (mean guess {m['guess_abs_x']:.1f} "
                f"{m['guess_abs_y']:.1f}); within the cell x {m['cell_x']:.1f} y {m['cell_y']:.1f} px (mean guess "
                f"{m['guess_cell_x']:.1f} {m['guess_cell_y']:.1f})"
            )
        return
    if args.distance:
        for m in distance_probe(args.model, moves=tuple(int(k) for k in args.moves.split(","))):
            print(
                f"{m['move']:9s} {m['k']:2d}, {m['image']:5s} image: tens digits {m['tens']:.3f}, ones digits "
                f"{m['ones']:.3f}, other tokens {m['other']:.3f}"
            )
        return
    if args.data is None:
        ap.error("a data directory is needed unless --positions")
    for task, m in probe(args.model, args.data, args.split, args.n).items():
        print(
            f"{task:7s} Acc@0.5 {m['acc50']:.3f}  answered {m['answered']:.3f}  "
            f"median centre error x {m['median_dx']:.1f} px, y {m['median_dy']:.1f} px"
        )


if __name__ == "__main__":
    main()
