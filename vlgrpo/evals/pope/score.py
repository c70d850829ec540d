"""POPE scorer: answer parsers (the original rule, VLMEvalKit's, strict) and per-split yes/no metrics.

Reads predictions in POPE's JSON-lines format (question_id, text = the model's answer, label, optional split), so
outputs produced elsewhere score the same way as ours. Pure Python: knows nothing of models or how answers were made.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path

from vlgrpo.data.jsonl import read_json_rows
from vlgrpo.data.schema import DataError
from vlgrpo.evals.pope.build import SPLITS
from vlgrpo.registry import POPE_PARSER
from vlgrpo.rewards.extract import final_turn, strip_answer_tags
from vlgrpo.types import InputError

YES, NO, UNKNOWN = "yes", "no", "unknown"
PARSERS = POPE_PARSER.names
RATES = ("accuracy", "precision", "recall", "f1", "yes_ratio")


def parse_pope(text: str) -> str:
    """The original POPE rule (RUCAIBox/POPE `evaluate.py`): keep the text before the first '.', drop commas, split
    on single spaces; "no" iff a word is exactly `No`, `not` or `no`, else "yes" (never unknown).

    Reproduced as is, quirks included: "NO" or "Nope" read as yes, and so does "No" glued to a newline ("No\\nIt")."""
    text = strip_answer_tags(text)
    if "." in text:
        text = text.split(".")[0]
    words = text.replace(",", "").split(" ")
    return NO if ("No" in words or "not" in words or "no" in words) else YES


_VLM_PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_DIGIT_COMMA_DIGIT = re.compile(r"(\d)(,)(\d)")
_PERIOD_NOT_BEFORE_DIGIT = re.compile(r"\.(?!\d)")


def _vlmevalkit_punctuation(text: str) -> str:
    """VLMEvalKit's `process_punctuation`: each mark is deleted when it touches a space somewhere in the text (or the
    text has a digit,digit), else replaced by a space; then periods not followed by a digit are deleted. Its period
    regex `(?!<=\\d)(\\.)(?!\\d)` has a lookahead typo that makes it equal to `\\.(?!\\d)`, and `re.UNICODE` is passed
    as `count`, so at most 32 periods go; both kept."""
    out = text
    digit_comma = _DIGIT_COMMA_DIGIT.search(text) is not None
    for p in _VLM_PUNCT:
        out = out.replace(p, "" if (p + " " in text or " " + p in text or digit_comma) else " ")
    return _PERIOD_NOT_BEFORE_DIGIT.sub("", out, count=int(re.UNICODE))


def parse_vlmevalkit(text: str) -> str:
    """VLMEvalKit's `YOrN_Extraction` (vlmeval/dataset/utils/yorn.py, with `process_punctuation` from
    vlmeval/smp/misc.py): lower-case, strip punctuation, split on whitespace; "yes" if the word yes appears without
    no, "no" if no appears without yes, otherwise unknown."""
    words = _vlmevalkit_punctuation(strip_answer_tags(text).lower()).split()
    has_yes, has_no = "yes" in words, "no" in words
    if has_yes and not has_no:
        return YES
    if has_no and not has_yes:
        return NO
    return UNKNOWN


def parse_strict(text: str) -> str:
    """Exactly "yes" or "no" once case, surrounding whitespace and punctuation are stripped ("**Yes.**" -> yes);
    anything longer ("Yes, there is") is unknown. Measures instruction following as well as the answer."""
    t = strip_answer_tags(text).strip(string.whitespace + string.punctuation).lower()
    return t if t in (YES, NO) else UNKNOWN


def parse_answer(text: str, parser: str = "pope") -> str:
    """ "yes", "no" or "unknown" for a model answer, by the named parser (one of PARSERS)."""
    if parser not in PARSERS:
        raise InputError(f"--parser {parser!r} is not accepted; use one of {', '.join(PARSERS)}")
    return POPE_PARSER.load(parser)(final_turn(text))  # a tool trajectory: its last turn


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def pope_metrics(preds: list[str], labels: list[str]) -> dict:
    """Confusion counts and rates, positive class "yes". preds are yes/no/unknown, labels yes/no.

    An unknown prediction is wrong for accuracy, is not a "yes" (outside precision's denominator, not in
    yes_ratio) and, on a yes question, is a miss for recall. Rates with a zero denominator are 0.0 (the original
    script divides by zero there). With the `pope` parser nothing is unknown and these are the original formulas."""
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    pairs = list(zip(preds, labels))
    tp, fp = pairs.count((YES, YES)), pairs.count((YES, NO))
    tn, fn = pairs.count((NO, NO)), pairs.count((NO, YES))
    n, positives = len(pairs), labels.count(YES)
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, positives)
    return {
        "n": n,
        "accuracy": _ratio(tp + tn, n),
        "precision": precision,
        "recall": recall,
        "f1": _ratio(2 * precision * recall, precision + recall),
        "yes_ratio": _ratio(tp + fp, n),
        "unknown": preds.count(UNKNOWN),
        "tp": tp,
        "fp": fp,
        "tn": tn,
        "fn": fn,
    }


@dataclass
class Prediction:
    question_id: str
    text: str
    label: str
    split: str


def read_predictions(path: str | Path, default_split: str = "all") -> list[Prediction]:
    """Rows of POPE's format: question_id, text (the model's answer), label (yes/no), optional split.

    Accepts JSON lines (the usual) or one JSON array. Errors name the file, row and field; a question_id repeated
    within a split is an error (concatenated split files need a `split` key per row)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), None, None, "does not exist")
    rows = read_json_rows(path)
    out, seen = [], set()
    for no, row in rows:
        out.append(_prediction(row, str(path), no, default_split))
        key = (out[-1].split, out[-1].question_id)
        if key in seen:
            problem = f"{key[1]} repeats in split '{key[0]}' (concatenated files need a 'split' key per row)"
            raise DataError(str(path), no, "question_id", problem)
        seen.add(key)
    if not out:
        raise DataError(str(path), None, None, "holds no predictions")
    return out


def _prediction(row, source: str, no: int, default_split: str) -> Prediction:
    if not isinstance(row, dict):
        raise DataError(source, no, None, f"each row must be a JSON object, got {type(row).__name__}")
    qid = row.get("question_id")
    if qid is None or isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise DataError(source, no, "question_id", f"is required (an integer or string), got {qid!r}")
    answer = row.get("text")
    if not isinstance(answer, str):
        raise DataError(source, no, "text", f"must be the model's answer as a string, got {answer!r}")
    label = row.get("label")
    if not isinstance(label, str) or label.strip().lower() not in (YES, NO):
        raise DataError(source, no, "label", f"must be 'yes' or 'no', got {label!r}")
    split = row.get("split", default_split)
    if not isinstance(split, str) or not split:
        raise DataError(source, no, "split", f"must be a non-empty string, got {split!r}")
    return Prediction(str(qid), answer, label.strip().lower(), split)


def score_predictions(preds: list[Prediction], parser: str = "pope") -> dict:
    """{"parser", "splits": {split: pope_metrics}, "mean": the five rates averaged over splits}.

    Splits are listed random, popular, adversarial first, then any others in file order."""
    by_split: dict[str, list[Prediction]] = {}
    for p in preds:
        by_split.setdefault(p.split, []).append(p)
    order = sorted(by_split, key=lambda s: SPLITS.index(s) if s in SPLITS else len(SPLITS))
    splits = {
        s: pope_metrics([parse_answer(p.text, parser) for p in by_split[s]], [p.label for p in by_split[s]])
        for s in order
    }
    mean = {k: sum(m[k] for m in splits.values()) / len(splits) for k in RATES}
    return {"parser": parser, "splits": splits, "mean": mean}


def format_report(result: dict) -> str:
    """A fixed-width table of the per-split metrics (the CLI's non-JSON output)."""
    head = f"{'split':<12}{'n':>6}" + "".join(f"{k:>11}" for k in RATES) + f"{'unknown':>9}"
    lines = [f"POPE, parser '{result['parser']}'", head]
    for split, m in result["splits"].items():
        lines.append(f"{split:<12}{m['n']:>6}" + "".join(f"{m[k]:>11.4f}" for k in RATES) + f"{m['unknown']:>9}")
    if len(result["splits"]) > 1:
        lines.append(f"{'mean':<12}{'':>6}" + "".join(f"{result['mean'][k]:>11.4f}" for k in RATES))
    return "\n".join(lines)
