"""Small hand-written files in each reasoning benchmark's published shape (MathVista's testmini.json, EasyR1's
Geometry3K parquet, R1-V's SuperCLEVR JSONL, MMMU's per-subject parquet), shared by the loader and scoring tests."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image


def png(color=(200, 10, 10), size=(32, 24)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def save_png(path, color=(200, 10, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(color))
    return path


def _meta(task, *skills):
    return {
        "split": "testmini",
        "language": "english",
        "source": "hand",
        "task": task,
        "context": "table",
        "grade": "college",
        "skills": list(skills),
    }


MATHVISTA_ROWS = {  # testmini.json's layout: rows keyed by pid, no `query`
    "1": {
        "question": "Average of the two bars?",
        "image": "images/1.jpg",
        "choices": None,
        "unit": None,
        "precision": 2,
        "answer": "1.45",
        "question_type": "free_form",
        "answer_type": "float",
        "pid": "1",
        "metadata": _meta("figure question answering", "statistical reasoning", "arithmetic reasoning"),
    },
    "2": {
        "question": "Which years?",
        "image": "images/2.jpg",
        "choices": None,
        "unit": None,
        "precision": None,
        "answer": "[2014, 2016]",
        "question_type": "free_form",
        "answer_type": "list",
        "pid": "2",
        "metadata": _meta("figure question answering", "statistical reasoning"),
    },
    "3": {
        "question": "Find the angle BOC.",
        "image": "images/3.jpg",
        "choices": ["135°", "140°", "145°", "150°"],
        "unit": None,
        "precision": None,
        "answer": "145°",
        "question_type": "multi_choice",
        "answer_type": "text",
        "pid": "3",
        "metadata": _meta("geometry problem solving", "geometry reasoning", "algebraic reasoning"),
    },
    "4": {
        "question": "How many cups?",
        "image": "images/4.jpg",
        "choices": None,
        "unit": "g",
        "precision": None,
        "answer": "3",
        "question_type": "free_form",
        "answer_type": "integer",
        "pid": "4",
        "metadata": _meta("visual question answering", "arithmetic reasoning"),
    },
    "5": {
        "question": "What is the slope?",
        "image": "images/5.jpg",
        "choices": None,
        "unit": None,
        "precision": 1,
        "answer": "0.8",
        "question_type": "free_form",
        "answer_type": "float",
        "pid": "5",
        "metadata": _meta("math word problem", "algebraic reasoning"),
    },
}


def mathvista_file(folder, name="tiny_testmini.json"):
    for pid in MATHVISTA_ROWS:
        save_png(folder / "images" / f"{pid}.jpg")
    path = folder / name
    path.write_text(json.dumps(MATHVISTA_ROWS, ensure_ascii=False, indent=1))
    return path


def geometry3k_file(folder):
    rows = [
        {"images": [{"bytes": png(), "path": None}], "problem": "<image>Find x.", "answer": "2\\sqrt{3}"},
        {"images": [{"bytes": png((0, 0, 200)), "path": None}], "problem": "<image>Find m\\angle 2.", "answer": "60"},
        {"images": [{"bytes": png((0, 200, 0)), "path": None}], "problem": "<image>Find y.", "answer": "\\frac{40}{3}"},
    ]
    path = folder / "data" / "test-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


SUPERCLEVR_ROWS = [  # R1-V's src/eval/prompts/superclevr_test200_counting_problems.jsonl, first three rows' shape
    {
        "image_path": "./images/superCLEVR_new_025000.png",
        "question": "How many different items are there in the image?",
        "ground_truth": 4,
    },
    {
        "image_path": "./images/superCLEVR_new_025001.png",
        "question": "How many different items are there in the image?",
        "ground_truth": 9,
    },
    {
        "image_path": "./images/superCLEVR_new_025002.png",
        "question": "How many different items are there in the image?",
        "ground_truth": 10,
    },
]


def superclevr_file(folder):
    for row in SUPERCLEVR_ROWS:
        save_png(folder / row["image_path"])
    path = folder / "superclevr_test3.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SUPERCLEVR_ROWS))
    return path


def mmmu_rows():
    image = {"bytes": png(), "path": "validation_Art_Theory_1_1.png"}
    none = {f"image_{k}": None for k in range(2, 8)}
    return [
        {
            "id": "validation_Art_Theory_1",
            "question": "<image 1> Which colour dominates?",
            "options": "['red', 'blue', 'green']",
            "explanation": "",
            "image_1": image,
            **none,
            "img_type": "['Paintings']",
            "answer": "B",
            "topic_difficulty": "Easy",
            "question_type": "multiple-choice",
            "subfield": "Colour",
        },
        {
            "id": "validation_Math_2",
            "question": "Compare <image 1> and <image 2>.",
            "options": "['same', 'different']",
            "explanation": "",
            "image_1": image,
            **none,
            "image_2": {"bytes": png((0, 0, 9)), "path": "b.png"},
            "img_type": "['Diagrams']",
            "answer": "A",
            "topic_difficulty": "Hard",
            "question_type": "multiple-choice",
            "subfield": "Geometry",
        },
        {
            "id": "validation_Physics_3",
            "question": "<image 1> What is the speed in m/s?",
            "options": "[]",
            "explanation": "",
            "image_1": image,
            **none,
            "img_type": "['Diagrams']",
            "answer": "1.5",
            "topic_difficulty": "Medium",
            "question_type": "open",
            "subfield": "Mechanics",
        },
    ]


def mmmu_folder(folder):
    """MMMU's hub layout: one folder per subject, validation and dev parquet files in each."""
    rows = mmmu_rows()
    for subject, subject_rows in (("Art_Theory", rows[:1]), ("Math", rows[1:2]), ("Physics", rows[2:])):
        (folder / subject).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(subject_rows), folder / subject / "validation-00000-of-00001.parquet")
        dev = [dict(r, id=r["id"].replace("validation", "dev")) for r in subject_rows]
        pq.write_table(pa.Table.from_pylist(dev), folder / subject / "dev-00000-of-00001.parquet")
    return folder
