"""Golden tests (#52): vlgrpo's reasoning suites against the benchmarks' own scoring code, vendored as oracles in
tests/evals/oracles/ (MathVista's calculate_score.py, MMMU's eval_utils.py, R1-V's counting rule, EasyR1's math
reward on mathruler). Each table row is a model completion for a problem of the benchmark (real testmini, MMMU
validation and R1-V rows, and completions in the shapes models write: letters, `(x)` forms, choice text, numbers with
units, lists, LaTeX, long reasoning, empty, garbage; some are real logged outputs, named in their comment).

What each side reads, per benchmark, so that the comparison means something:
- MathVista: its pipeline has GPT-4 extract the answer (extract_answer.py) and then normalises that string. No model
  runs here, so the official `normalize_extracted_answer` gets the very string vlgrpo's parsers read (the prediction
  row's `extracted`; "" when they read nothing, what MathVista's extraction gives an empty response). The test
  compares normalisation and comparison, not extraction.
- MMMU: `parse_multi_choice_response` / `parse_open_response` read the whole completion, as MMMU's
  main_parse_and_eval.py reads a response; vlgrpo reads the answer its parsers read. MMMU's random guess (no option
  found) is stubbed to return "guess", a verdict that equals neither True nor False, so every row where MMMU would
  guess is a listed departure. The gold MMMU compares with is answer_dict_val.json's (a list where there are several).
- SuperCLEVR: R1-V's regex reads the whole completion. The suite's `r1v_rule` must agree on every row; its `correct`
  (our parsers) agrees except for the listed departures.
- Geometry3K: EasyR1's reward (whitespace clean-up, the last `\\boxed{}`, mathruler's `grade_answer`) and the suite both
  read the whole completion.

vlgrpo's verdicts come from each suite's own `score`, on Samples its loader read, as `vlgrpo eval` runs them. A row
outside its benchmark's DEPARTURES must agree with the official verdict; a row inside must disagree, so the lists stay
exact; each departure's reason is quoted word for word in docs/evals.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from oracles import easyr1_official, mmmu_official, r1v_official
from oracles import mathvista_official as mathvista

from vlgrpo.evals.reasoning.loaders import load_geometry3k, load_mathvista, load_mmmu, load_superclevr
from vlgrpo.evals.reasoning.suite import GEOMETRY3K, MATHVISTA, MMMU, SUPERCLEVR
from vlgrpo.rewards import RewardContext
from vlgrpo.types import Completion

DOCS = Path(__file__).resolve().parents[2] / "docs" / "evals.md"


def suite_rows(suite, samples, texts) -> list[dict]:
    """The prediction rows of `suite.score`, the code `vlgrpo eval` scores with."""
    _, _, rows = suite.score(samples, [Completion([], t, "stop") for t in texts], RewardContext(), "pope")
    return rows


def check_table(table: list[tuple], official: dict, ours: dict, departures: dict[str, str]) -> None:
    ids = [row[0] for row in table]
    assert len(ids) >= 30 and len(set(ids)) == len(ids) and set(departures) <= set(ids)
    assert {True, False} <= set(official.values()), "the table should hold rows the official code calls right and wrong"
    differ = {i for i in ids if official[i] != ours[i]}
    unexpected = {i: (official[i], ours[i]) for i in ids if i in differ and i not in departures}
    assert not unexpected, f"rows where vlgrpo disagrees with the official code, (official, vlgrpo): {unexpected}"
    agreeing = [i for i in departures if i not in differ]
    assert not agreeing, f"DEPARTURES rows that agree with the official code now (drop them from the list): {agreeing}"
    doc = " ".join(DOCS.read_text().split())
    for reason in set(departures.values()):
        assert " ".join(reason.split()) in doc, f"docs/evals.md does not list the departure: {reason}"


# ---------------------------------------------------------------- MathVista

_UV = ["(u1, u2) = (0, 0)", "(u1, u2) = (1, 0)", "(u1, u2) = (0, 1)", "(u1, u2) = (1, 1)"]
_MUSIC = ["MusicLDM (mix-up)", "MusicLDM (original)", "MusicLDM (BLM)", "MusicLDM (BAM)", "MuBERT"]
MATHVISTA_PROBLEMS = {  # testmini.json's pid: (answer, answer_type, precision, unit, choices); "fx" is hand-made
    "168": ("(b)", "text", None, None, ["(c)", "(a)", "(e)", "(d)", "(b)"]),
    "849": ("(b)", "text", None, None, ["(c)", "(d)", "(a)", "(b)", "(e)"]),
    "151": ("(u1, u2) = (0, 0)", "text", None, None, _UV),
    "762": ("(0, 0)", "text", None, None, ["(0, 0)", "(-1, 0)", "(2, 0)"]),
    "895": ("MuBERT", "text", None, None, _MUSIC),
    "fx": ("f(x) = x^3", "text", None, None, ["f(x) = x^2 + 1", "f(x) = 2x", "f(x) = x^3", "f(x) = |x|"]),
    "3": ("145°", "text", None, None, ["135°", "140°", "145°", "150°"]),
    "30": ("70°", "text", None, None, ["60°", "70°", "80°", "85°"]),
    "8": ("Yes", "text", None, None, ["Yes", "No"]),
    "20": ("No", "text", None, None, ["Yes", "No"]),
    "2": ("1000", "integer", None, "g", None),
    "27": ("11", "integer", None, "years", None),
    "917": ("1", "integer", None, None, None),
    "942": ("0", "integer", None, None, None),
    "1": ("1.2", "float", 1, None, None),
    "108": ("51.04", "float", 2, None, None),
    "506": ("[2014, 2016]", "list", None, None, None),
    "225": ("[0, 2, 0, 2, 1, 7, 1, 2, 0, 3, 0, 6]", "list", None, None, None),
}

_REFUSAL = "The question does not provide enough information to determine the value of f(0)."
MATHVISTA_TABLE = [  # (row, pid, completion)
    ("mv01", "168", "<think>Saturation grows outwards.</think><answer>(b)</answer>"),  # "(b)" is letter B: "(a)"
    ("mv02", "168", "<answer>(e)</answer>"),  # letter E, the fifth choice, "(b)"
    ("mv03", "168", "<answer>E</answer>"),
    ("mv04", "168", "* Therefore, the answer is (E)."),  # Bard's response (its last line)
    ("mv05", "168", "<answer>b</answer>"),  # lower case is no letter: the closest choice, "(b)"
    ("mv06", "849", "<answer>(b)</answer>"),  # Bard's extraction "(b)": letter B, "(d)", logged wrong
    ("mv07", "849", "<answer>D</answer>"),
    ("mv08", "151", "<answer>N/A</answer>"),  # GPT-4's extraction: the closest choice, logged right
    ("mv09", "151", "<answer>(u1, u2) = (1, 0)</answer>"),  # "(u1, u2)" holds no one-letter "(x)"
    ("mv10", "151", "Therefore, the function reaches its local maximum at (u1, u2) = (0, 0)."),
    ("mv11", "762", "<answer>(0, 0)</answer>"),
    ("mv12", "762", "<answer>(2, 0)</answer>"),
    ("mv13", "895", "<answer>MuBERT</answer>"),
    ("mv14", "895", "\\boxed{E}"),
    ("mv15", "895", "<answer>MusicLDM (BAM)</answer>"),
    ("mv16", "fx", "<answer>f(x) = x^3</answer>"),  # "(x)" is letter X, out of range: the closest to "X", "f(x) = 2x"
    ("mv17", "fx", "<answer>C</answer>"),
    ("mv18", "fx", "<answer>(C) f(x) = x^3</answer>"),  # the first "(x)" is "(C)"
    ("mv19", "3", "<answer>145°</answer>"),
    ("mv20", "3", "<answer>146°</answer>"),  # a tie at distance 1: the first, 140°
    ("mv21", "3", "∠BOC = 180°\n答案:C"),  # Claude's response: "答案:C" is closest to the first choice
    ("mv22", "3", ""),  # empty: MathVista's closest choice to "" is the first shortest, 135°, wrong anyway
    ("mv23", "30", "<answer>B</answer>"),
    ("mv24", "30", "<answer>70</answer>"),
    ("mv25", "30", "<answer>" + "Let me reconsider. " * 60 + "70°</answer>"),  # 1,143 characters
    ("mv26", "20", ""),  # empty: the shortest choice is "No", the gold
    ("mv27", "20", "<think>There is no such object.</think><answer>No</answer>"),
    ("mv28", "8", "<answer>yes</answer>"),
    ("mv29", "8", "Answer: A"),
    ("mv30", "8", "<answer>No.</answer>"),
    ("mv31", "2", "<answer>1000</answer>"),
    ("mv32", "2", "<answer>1,000</answer>"),
    ("mv33", "2", "<answer>1000 g</answer>"),
    ("mv34", "2", "<answer>250</answer>"),  # Bard's extraction
    ("mv35", "27", "<answer>11.0</answer>"),
    ("mv36", "27", "<answer>eleven</answer>"),
    ("mv37", "27", "<answer>Sorry, I can't help with images of people yet.</answer>"),  # Bard's, no number
    ("mv38", "917", "<answer>4/3</answer>"),  # ChatGPT's extraction, logged wrong; 4/3 truncates to 1
    ("mv39", "942", f"<answer>{_REFUSAL}</answer>"),  # GPT-4's extraction, logged wrong
    ("mv40", "1", "<answer>1.2</answer>"),
    ("mv41", "1", "<answer>1.15</answer>"),  # round(1.15, 1) == 1.1
    ("mv42", "1", "<answer>1.2 cm</answer>"),
    ("mv43", "108", "<answer>51.0449</answer>"),
    ("mv44", "108", "<answer>\\frac{1276}{25}</answer>"),
    ("mv45", "108", "<answer>51.05</answer>"),  # Bard's extraction
    ("mv46", "506", "<answer>[2014, 2016]</answer>"),
    ("mv47", "506", "<answer>[2014,2016]</answer>"),
    ("mv48", "506", "<answer>2014 and 2016</answer>"),
    ("mv49", "225", "<answer>[0, 2, 2, 4, 4, 6, 6, 0, 0, 6, 6, 4, 4, 2, 2, 0]</answer>"),  # Claude's extraction
    ("mv50", "225", "<answer>[0, 2, 0, 2, 1, 7, 1, 2, 0, 3, 0, 6]</answer>"),
]

MV_EMPTY = (
    "No answer read is wrong; MathVista maps an empty extraction to the closest choice, the shortest "
    "(its `--ignore_empty_extractions` flag gives our verdict)."
)
MV_NUMBER = (
    "Our parsers read a number out of the answer (`1,000`, `1000 g`, `eleven`, `\\frac{1276}{25}`, `4/3`) where "
    "MathVista's `float()` needs GPT-4's extraction to have done so; prose holding one number reads as that number "
    "(pid 942's refusal ending in `f(0)` reads as 0)."
)
MV_LIST = (
    "A list answer is compared as Python prints it (`[2014,2016]` equals `[2014, 2016]`); MathVista compares the "
    "extracted string as it is."
)
MV_LONG = "A runaway answer is cut to its first 1,000 characters before the edit distance to the choices."
MATHVISTA_DEPARTURES = {
    "mv25": MV_LONG,
    "mv26": MV_EMPTY,
    "mv32": MV_NUMBER,
    "mv33": MV_NUMBER,
    "mv36": MV_NUMBER,
    "mv38": MV_NUMBER,
    "mv39": MV_NUMBER,
    "mv42": MV_NUMBER,
    "mv44": MV_NUMBER,
    "mv47": MV_LIST,
}


def test_mathvista_against_its_calculate_score(tmp_path):
    rows = {
        pid: {"pid": pid, "question": "Q?", "image": f"images/{pid}.jpg", "choices": c, "unit": u, "precision": p}
        | {"answer": a, "question_type": "multi_choice" if c else "free_form", "answer_type": t, "metadata": {}}
        for pid, (a, t, p, u, c) in MATHVISTA_PROBLEMS.items()
    }
    (tmp_path / "golden_testmini.json").write_text(json.dumps(rows, ensure_ascii=False))
    samples = {s.meta["pid"]: s for s in load_mathvista(tmp_path / "golden_testmini.json", check_images=False)}
    predictions = suite_rows(MATHVISTA, [samples[p] for _, p, _ in MATHVISTA_TABLE], [t for *_, t in MATHVISTA_TABLE])
    official, ours = {}, {}
    for (row, pid, _), prediction in zip(MATHVISTA_TABLE, predictions, strict=True):
        answer, answer_type, precision, _, choices = MATHVISTA_PROBLEMS[pid]
        question_type = "multi_choice" if choices else "free_form"
        extraction = prediction["extracted"] or ""
        normalized = mathvista.normalize_extracted_answer(extraction, choices, question_type, answer_type, precision)
        official[row], ours[row] = mathvista.safe_equal(normalized, answer), prediction["correct"]
    check_table(MATHVISTA_TABLE, official, ours, MATHVISTA_DEPARTURES)


# ---------------------------------------------------------------- MMMU

_THEORIES = ["James-Lange Theory", "Cannon-Bard Theory", "Schachter-Singer Theory", "Cranberry-Melon Theory"]
_NOT_ENOUGH = "Not enough information to tell."
MMMU_PROBLEMS = {  # validation id: (answer_dict_val.json's ground truth, options); no options: an open question
    "validation_Math_1": ("C", ["1", "2", "Not exist"]),
    "validation_Design_4": ("A", ["Josef Albers", "George Eastman", "Gosnell Hall", "Tea Server 1925"]),
    "validation_Psychology_4": ("B", _THEORIES),
    "validation_Chemistry_1": ("B", ["Yes.", "No.", "Not sure."]),
    "validation_Physics_1": ("A", ["To the left", "To the right", "Towards the top of the page", "There is no force."]),
    "validation_Economics_1": ("A", ["0", "700", "1400", "3418"]),
    "validation_Computer_Science_1": ("A", ["P1", "P2", "P3", "There is a deadlock", _NOT_ENOUGH]),
    "validation_Chemistry_23": ("6.5", []),
    "validation_Electronics_27": ("-120", []),
    "validation_Finance_10": ("2000000", []),
    "validation_Geography_4": (["Tampa", "Florida"], []),  # the hub's parquet holds "['Tampa', 'Florida']"
    "validation_Psychology_20": ("embryonic", []),
    "validation_Manage_21": ("9.20", []),
    "validation_Biology_10": ("1/64", []),
}
_REASONING = "We compare the options one by one; option (B) points the wrong way, and so does (C). " * 55
_COT = "- (A) James-Lange: arousal first.\n- (B) Cannon-Bard: both at once.\n- (C) Schachter-Singer: a label."

MMMU_TABLE = [  # (row, id without "validation_", completion)
    ("mm01", "Math_1", "B"),  # real: LLaVA-1.5-13B's response in MMMU's example outputs, as each row marked real
    ("mm02", "Math_1", "(C)"),
    ("mm03", "Math_1", "<think>From the left the limit is 1, from the right it is 2.</think><answer>C</answer>"),
    ("mm04", "Math_1", "Answer: \\( \\text{C} \\)"),  # GPT-4o's form: neither side reads a letter in LaTeX
    ("mm05", "Design_4", "A) Josef Albers"),  # real
    ("mm06", "Design_4", "<answer>George Eastman</answer>"),
    ("mm07", "Psychology_4", "C) Schachter-Singer Theory"),  # real
    ("mm08", "Psychology_4", "The answer is (B) Cannon-Bard Theory."),
    ("mm09", "Psychology_4", "<answer>(A) is tempting, but (B) fits better</answer>"),
    ("mm10", "Psychology_4", _COT + "\nThe passage describes arousal and feeling at the same time.\n\nAnswer: B"),
    ("mm11", "Chemistry_1", "A"),  # real
    ("mm12", "Chemistry_1", "No."),  # the option is "No." with its full stop; the response loses it
    ("mm13", "Chemistry_1", "The molecule is not chiral, so the answer is no. (B)"),
    ("mm14", "Physics_1", "A"),  # real
    ("mm15", "Physics_1", "To the left"),
    ("mm16", "Physics_1", "The charge is positive, so the force points to the left, not up the page.\nAnswer: A"),
    ("mm17", "Physics_1", _REASONING + "So the answer is (A)."),  # 4,700 characters on one line
    ("mm18", "Economics_1", "0"),
    ("mm19", "Economics_1", "The deadweight loss is 0 because the market is efficient."),
    ("mm20", "Economics_1", "<think>Supply meets demand.</think><answer>\\boxed{A}</answer>"),
    ("mm21", "Economics_1", "B"),  # real
    ("mm22", "Computer_Science_1", "D"),  # real
    ("mm23", "Computer_Science_1", ""),
    ("mm24", "Computer_Science_1", "I cannot determine this from the image alone, sorry."),
    ("mm25", "Computer_Science_1", "**Answer: A**"),  # GPT-4o's form
    ("mm26", "Computer_Science_1", "<think>P1 holds R1 and waits for nothing.</think>\n<answer>A</answer>"),
    ("mo01", "Chemistry_23", "6.5"),
    ("mo02", "Chemistry_23", _REASONING * 2 + "Therefore the pH of the buffer is 6.5"),  # 9,400 characters
    ("mo03", "Chemistry_23", "<think>The pKa is 4.8, and the ratio adds 1.7.</think><answer>6.5</answer>"),
    ("mo04", "Chemistry_23", "The pH is 7.2"),
    ("mo05", "Chemistry_23", "The pH of the buffer is 6.5.\nCheck: adding base raises it to 7.0"),
    ("mo06", "Electronics_27", "The phase is -120 degrees"),
    ("mo07", "Electronics_27", "120"),
    ("mo08", "Electronics_27", "θ = −120°"),  # a Unicode minus: both read 120
    ("mo09", "Finance_10", "The present value is $2,000,000."),
    ("mo10", "Finance_10", "2e6"),
    ("mo11", "Finance_10", "2 million"),
    ("mo12", "Geography_4", "Tampa"),
    ("mo13", "Geography_4", "<answer>Florida</answer>"),
    ("mo14", "Geography_4", "The city is Orlando"),
    ("mo15", "Psychology_20", "embryonic stage"),
    ("mo16", "Manage_21", "The ratio is 9.2."),
    ("mo17", "Biology_10", "1/64"),
    ("mo18", "Biology_10", "0.015625"),  # the gold is the string "1/64"
]

MMMU_REGION = (
    "vlgrpo parses the answer its parsers read (the answer block, `\\boxed{}`, the `Answer:` line, else the last "
    "line); MMMU parses the whole response, where an option letter or a number in the reasoning can decide."
)
MMMU_GUESS = (
    "When no option can be read, MMMU picks a random letter (right one time in n); vlgrpo scores the row wrong."
)
MMMU_SHORT_TEXT = (
    "An option's text is looked for in an answer of any length; MMMU looks for it only in a response of more than 5 "
    "words, and guesses otherwise."
)
MMMU_DEPARTURES = {
    "mm03": MMMU_REGION,
    "mm04": MMMU_GUESS,
    "mm05": MMMU_SHORT_TEXT,
    "mm06": MMMU_SHORT_TEXT,
    "mm07": MMMU_SHORT_TEXT,
    "mm10": MMMU_REGION,
    "mm12": MMMU_GUESS,
    "mm15": MMMU_SHORT_TEXT,
    "mm18": MMMU_SHORT_TEXT,
    "mm20": MMMU_REGION,
    "mm23": MMMU_GUESS,
    "mm24": MMMU_GUESS,
    "mm25": MMMU_REGION,
    "mo05": MMMU_REGION,
}


def mmmu_official_verdict(completion: str, gold, options: list[str]) -> bool | str:
    """MMMU's verdict on the whole completion; "guess" where it would pick a random letter."""
    if not options:
        return mmmu_official.eval_open(gold, mmmu_official.parse_open_response(completion))
    letters = [chr(ord("A") + i) for i in range(len(options))]
    parsed = mmmu_official.parse_multi_choice_response(completion, letters, dict(zip(letters, options)))
    return "guess" if parsed == "guess" else mmmu_official.eval_multi_choice(gold, parsed)


def test_mmmu_against_its_eval_utils(tmp_path, monkeypatch):
    monkeypatch.setattr(mmmu_official, "random", SimpleNamespace(choice=lambda letters: "guess"))
    rows = [
        {"id": i, "question": "<image 1> Q?", "options": str(o), "answer": str(g), "image_1": "1.png"}
        | {"question_type": "multiple-choice" if o else "open"}
        for i, (g, o) in MMMU_PROBLEMS.items()
    ]
    (tmp_path / "golden_mmmu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = {s.id: s for s in load_mmmu(tmp_path / "golden_mmmu.jsonl", check_images=False)}
    ids = [f"validation_{name}" for _, name, _ in MMMU_TABLE]
    predictions = suite_rows(MMMU, [samples[i] for i in ids], [t for *_, t in MMMU_TABLE])
    official = {row: mmmu_official_verdict(t, *MMMU_PROBLEMS[i]) for (row, _, t), i in zip(MMMU_TABLE, ids)}
    ours = {row: p["correct"] for (row, *_), p in zip(MMMU_TABLE, predictions, strict=True)}
    check_table(MMMU_TABLE, official, ours, MMMU_DEPARTURES)


# ---------------------------------------------------------------- SuperCLEVR (R1-V)

_LOOP = "".join(f"{k}. {n}\n" for k, n in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", [7, 6, 5, 4, 3, 2, 1, 5, 3] * 3))
_FOUR = (
    "There are four distinct objects in the image: a cyan fighter, a red van, a cyan mountain bike, and a green "
    "mountain bike."
)
SUPERCLEVR_TABLE = [  # (row, ground truth, completion); "real": Qwen2-VL-2B's output in R1-V's src/eval/logs
    ("sc01", 4, f"<think>\n    {_FOUR}\n    </think>\n<answer>\n    4\n    </answer>"),  # real
    ("sc02", 9, "<think>\nA. 10\n</think>\n<answer>\n10\n</answer>"),  # real
    ("sc03", 10, "<think>\nA. 10\nB. 9\nB. 9\n</think>\n<answer>\nB. 9\n</answer>"),  # real
    ("sc04", 8, "<think>\nA. 8\nB. 7\nC. 6\nD. 5\n\n</think>\n<answer>\nA. 8\n</answer>"),  # real
    ("sc05", 8, "<think>\nA. 10\nB. 9\nC. 8\nD. 7\n</think>\n<answer>\nC. 8\n</answer>"),  # real
    ("sc06", 7, f"<think>\n{_LOOP}</think>\n<answer>Q</answer>"),  # real's shape
    ("sc07", 6, f"<think>\n{_LOOP}"),  # cut at max_new_tokens inside the reasoning, real's shape
    ("sc08", 5, f"<think>\n{_LOOP}W. 2\nX. 5"),  # cut, its last line holding a number
    ("sc09", 7, "<think>\n1. **Bus**: brown.\n\nSo, there are 6 different items.\n</think>\n\n<answer>\n6\n</answer>"),
    ("sc10", 10, "<answer>10</answer>"),  # the 100-step GRPO checkpoint's outputs, real
    ("sc11", 9, "<answer>10</answer>"),
    ("sc12", 5, "<answer>4</answer>"),
    ("sc13", 4, "<answer> 4 </answer>"),
    ("sc14", 4, "<answer>04</answer>"),
    ("sc15", 4, "<answer>4.0</answer>"),
    ("sc16", 9, "<answer>There are 9 objects</answer>"),
    ("sc17", 9, "<answer>nine</answer>"),
    ("sc18", 9, "<answer>9.</answer>"),
    ("sc19", 10, "<think>Ten objects.</think> \\boxed{10}"),
    ("sc20", 4, "There are 4 items."),
    ("sc21", 4, "<answer>4</answer> Wait, I missed one. <answer>5</answer>"),
    ("sc22", 5, "<answer>4</answer> Wait, I missed one. <answer>5</answer>"),
    ("sc23", 4, "<answer>4"),
    ("sc24", 4, "<answer>-4</answer>"),
    ("sc25", 4, "<answer>4 or 5</answer>"),
    ("sc26", 3, "<think>three items</think><answer>3</answer>"),
    ("sc27", 3, "<think>3</think>"),
    ("sc28", 3, ""),
    ("sc29", 6, "<answer>\n6\n</answer>"),
    ("sc30", 6, "<ANSWER>6</ANSWER>"),
    ("sc31", 12, "<answer>12</answer>"),
    ("sc32", 2, "<answer>1</answer>"),
]

SC_READS_MORE = (
    "`accuracy` reads the count with our parsers (`9 objects`, `nine`, `4.0`, `A. 8`, `\\boxed{10}`, an `Answer:` "
    "or last line without tags); R1-V wants digits alone between `<answer>` tags. `accuracy_r1v_rule` is R1-V's rule "
    "exactly."
)
SC_SEVERAL = "Several answer blocks are no answer to our parsers; R1-V reads the first `<answer>N</answer>`."
SUPERCLEVR_DEPARTURES = {
    "sc04": SC_READS_MORE,
    "sc05": SC_READS_MORE,
    "sc08": SC_READS_MORE,
    "sc15": SC_READS_MORE,
    "sc16": SC_READS_MORE,
    "sc17": SC_READS_MORE,
    "sc18": SC_READS_MORE,
    "sc19": SC_READS_MORE,
    "sc20": SC_READS_MORE,
    "sc21": SC_SEVERAL,
    "sc27": SC_READS_MORE,
    "sc30": SC_READS_MORE,
}


def test_superclevr_against_r1vs_counting_rule(tmp_path):
    rows = [
        {"image_path": f"./images/{row}.png", "question": "How many?", "ground_truth": n}
        for row, n, _ in SUPERCLEVR_TABLE
    ]
    (tmp_path / "golden_superclevr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = load_superclevr(tmp_path / "golden_superclevr.jsonl", check_images=False)
    predictions = suite_rows(SUPERCLEVR, samples, [t for *_, t in SUPERCLEVR_TABLE])
    official = {row: r1v_official.r1v_correct(t, n) for row, n, t in SUPERCLEVR_TABLE}
    rule = {row: p["r1v_rule"] for (row, *_), p in zip(SUPERCLEVR_TABLE, predictions, strict=True)}
    assert rule == official  # accuracy_r1v_rule is R1-V's rule: no departure
    ours = {row: p["correct"] for (row, *_), p in zip(SUPERCLEVR_TABLE, predictions, strict=True)}
    check_table(SUPERCLEVR_TABLE, official, ours, SUPERCLEVR_DEPARTURES)


# ---------------------------------------------------------------- Geometry3K (EasyR1, mathruler)

GEOMETRY3K_TABLE = [  # (row, gold as in EasyR1's test file, completion)
    ("g01", "2\\sqrt{3}", "<think>x = 2 sqrt 3</think> so x = \\boxed{\\sqrt{12}}"),
    ("g02", "2\\sqrt{3}", "<think>By the 30-60-90 triangle.</think>\n\\boxed{2\\sqrt{3}}"),
    ("g03", "2\\sqrt{3}", "<think>...</think> \\boxed{x=2\\sqrt{3}}"),
    ("g04", "2\\sqrt{3}", "<think>...</think> \\boxed{3.46}"),
    ("g05", "2\\sqrt{3}", "<think>...</think> \\boxed{2√3}"),
    ("g06", "60", "<think>Vertical angles.</think> \\boxed{60}"),
    ("g07", "60", "<think>...</think> \\boxed{60^\\circ}"),
    ("g08", "60", "<think>...</think> \\boxed{60°}"),
    ("g09", "60", "<think>...</think> \\boxed{60 \\text{ degrees}}"),
    ("g10", "60", "<think>...</think> \\boxed{m\\angle 2 = 60}"),
    ("g11", "60", "<think>...</think><answer>60</answer>"),
    ("g12", "60", "<think>...</think><answer>\\boxed{60}</answer>"),
    ("g13", "60", "The angles are supplementary.\nThe answer is 60."),
    ("g14", "60", "\\boxed{30} Wait, that is its complement: \\boxed{60}"),
    ("g15", "60", "\\boxed{60} Wait, that is its supplement: \\boxed{120}"),
    ("g16", "60", "< think >Vertical angles.< / think >\\boxed{60}"),  # Qwen2.5-VL-32B's spacing, cleaned by EasyR1
    ("g17", "60", "\\boxed{60"),
    ("g18", "60", ""),
    ("g19", "\\frac{40}{3}", "<think>...</think> \\boxed{\\frac{40}{3}}"),
    ("g20", "\\frac{40}{3}", "<think>...</think> \\boxed{40/3}"),
    ("g21", "\\frac{40}{3}", "<think>...</think> \\boxed{13.33}"),
    ("g22", "\\frac{40}{3}", "<think>...</think> \\boxed{13\\frac{1}{3}}"),
    ("g23", "\\frac{40}{3}", "<think>...</think> \\boxed{\\frac{40}{3} \\approx 13.33}"),
    ("g24", "8.5", "<think>...</think> \\boxed{\\frac{17}{2}}"),
    ("g25", "8.5", "<think>...</think> \\boxed{8.50}"),
    ("g26", "5", "<think>...</think> \\boxed{5 \\text{ cm}}"),
    ("g27", "5", "<think>...</think> \\boxed{5m}"),
    ("g28", "4\\sqrt{2}", "<think>...</think> \\boxed{\\sqrt{32}}"),
    ("g29", "4\\sqrt{2}", "<think>...</think> \\boxed{5.66}"),
    ("g30", "7", "<think>...</think> \\boxed{\\sqrt{49}}"),
    ("g31", "7", "<think>...</think> \\fbox{7}"),
    ("g32", "\\frac{1}{2}", "<think>...</think> \\boxed{\\frac{2}{4}}"),
    ("g33", "\\frac{1}{2}", "<think>...</think> \\boxed{0.5}"),
    ("g34", "3", "<think>...</think> \\boxed{-3}"),
    ("g35", "1200", "<think>...</think> \\boxed{1,200}"),
    ("g36", "5", "<think>...</think> \\boxed{about 5}"),
]

G3K_REGION = (
    "Without a `\\boxed{}`, vlgrpo reads the answer block, an `\\fbox{}`, the `Answer:` line or the last line; "
    "EasyR1 grades the last `\\boxed{}` only."
)
G3K_MATH_VERIFY = (
    "math_verify (the rewards' math verifier) is more lenient than mathruler: it accepts an unreduced fraction "
    "(`\\frac{2}{4}` for `\\frac{1}{2}`), an expression equal to an integer gold (`\\sqrt{49}` for 7), a degree sign "
    "(`60°`), a unit glued to the number (`5m`), the right side of an equation (`m\\angle 2 = 60`) and a number "
    "among words (`\\frac{40}{3} \\approx 13.33`, `about 5`)."
)
GEOMETRY3K_DEPARTURES = {
    "g08": G3K_MATH_VERIFY,
    "g10": G3K_MATH_VERIFY,
    "g11": G3K_REGION,
    "g13": G3K_REGION,
    "g23": G3K_MATH_VERIFY,
    "g27": G3K_MATH_VERIFY,
    "g30": G3K_MATH_VERIFY,
    "g31": G3K_REGION,
    "g32": G3K_MATH_VERIFY,
    "g36": G3K_MATH_VERIFY,
}


def test_geometry3k_against_easyr1s_math_reward(tmp_path):
    rows = [{"images": ["1.png"], "problem": "<image>Find x.", "answer": gold} for _, gold, _ in GEOMETRY3K_TABLE]
    (tmp_path / "golden_geometry3k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = load_geometry3k(tmp_path / "golden_geometry3k.jsonl", check_images=False)
    predictions = suite_rows(GEOMETRY3K, samples, [t for *_, t in GEOMETRY3K_TABLE])
    official = {row: easyr1_official.easyr1_accuracy(t, gold) == 1.0 for row, gold, t in GEOMETRY3K_TABLE}
    ours = {row: p["correct"] for (row, *_), p in zip(GEOMETRY3K_TABLE, predictions, strict=True)}
    check_table(GEOMETRY3K_TABLE, official, ours, GEOMETRY3K_DEPARTURES)
