"""How well a model localises the demo's grounding targets when asked in the pretrained base's own words: a probe
of where the box skill is lost between the base and the demo's SFT model (docs/demo-seeds.md).

For the first N box questions ("Locate the red circle.") of a demo data split, greedy, one thread:
- `find`: the base's instruction "Find each red circle." -> the first box of the answer;
- `detect`: the base's caption "Detect the shapes." -> the first box labelled with the asked name.
Each reports Acc@0.5 (the demo's grounding metric, over all N questions), how many answers had a box, and the
median centre error in x and y (original pixels) of those boxes.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/probe_grounding.py data/models/shapes-tiny-qwen2_5_vl runs/demo/data
    OMP_NUM_THREADS=1 .venv/bin/python scripts/probe_grounding.py runs/demo/sft_model runs/demo/data
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from PIL import Image

from vlgrpo.data.images import ProcessorGeometry
from vlgrpo.models import load_model
from vlgrpo.rewards.boxes import to_original_pixels

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling pretrain_tiny.py
from pretrain_tiny import CAPTION_PROMPT, greedy, iou, parse_caption, prompt_ids  # noqa: E402

LOCATE = "Locate the "


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
    asks = {"find": ([f"Find each {x}." for x in names], [None] * len(rows)),
            "detect": ([CAPTION_PROMPT] * len(rows), names)}
    result = {}
    for task, (prompts, labels) in asks.items():
        texts = greedy(lm.model, lm.processor, [prompt_ids(lm.processor, geometry, w, p) for p in prompts], images, 112)
        boxes = [asked_box(t, label) for t, label in zip(texts, labels)]
        preds = [to_original_pixels([b], "qwen2_5", (w, h), geometry)[0] if b else None for b in boxes]
        result[task] = score(preds, [r["boxes"][0] for r in rows])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Qwen2.5-VL model directory (the base, or a demo's sft_model / grpo_model)")
    ap.add_argument("data", type=Path, help="a demo data directory (train/val/test.jsonl and images/)")
    ap.add_argument("--split", default="test")
    ap.add_argument("-n", type=int, default=150, help="box questions to ask (the demo evaluates 150)")
    args = ap.parse_args()
    for task, m in probe(args.model, args.data, args.split, args.n).items():
        print(f"{task:7s} Acc@0.5 {m['acc50']:.3f}  answered {m['answered']:.3f}  "
              f"median centre error x {m['median_dx']:.1f} px, y {m['median_dy']:.1f} px")


if __name__ == "__main__":
    main()
