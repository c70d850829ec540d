"""Reading JSON Lines: a line that is not UTF-8 is a row error naming the file, the line and the byte offset, like a
malformed JSON line (skipped and reported when training, fatal when loading strictly); a UTF-8 BOM is accepted."""

import json

import pytest

from vlgrpo.data.adapters import load_samples
from vlgrpo.data.schema import DataError


def _row(sid: str, question: str = "How many?") -> bytes:
    return (
        json.dumps(
            {"id": sid, "image": "img.png", "question": question, "answer": "2", "answer_type": "number"},
            ensure_ascii=False,
        ).encode()
        + b"\n"
    )


def test_a_latin1_line_is_a_row_error_with_its_line_and_byte_offset(tmp_path):
    latin1 = _row("b", "Combien de caf\u00e9s ?").decode().encode("latin-1")  # 'é' as the single byte 0xe9
    path = tmp_path / "d.jsonl"
    path.write_bytes(_row("a") + b"\n" + latin1 + _row("c"))  # a blank line 2: the latin-1 row is line 3
    offset = len(_row("a")) + 1 + latin1.index(b"\xe9")
    with pytest.raises(DataError) as e:
        load_samples(path)
    assert (e.value.source, e.value.row, e.value.field) == (str(path), 3, None)
    assert f"row 3: is not UTF-8: byte 0xe9 at byte offset {offset} (line 3)" in str(e.value)
    assert "UTF-8 JSON Lines" in str(e.value)
    result = load_samples(path, errors="skip")  # what the trainer does: the row is skipped and reported
    assert [s.id for s in result.samples] == ["a", "c"] and [e.row for e in result.errors] == [3]


def test_a_json_array_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(b"[\n" + _row("a").rstrip() + b",\n" + _row("b", "caf\u00e9").decode().encode("cp1252") + b"]")
    with pytest.raises(DataError, match=r"d.json, row 3: is not UTF-8: byte 0xe9 at byte offset \d+ \(line 3\)"):
        load_samples(path)


def test_a_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _row("a") + _row("b"))  # what Notepad and PowerShell 5 write
    assert [s.id for s in load_samples(path).samples] == ["a", "b"]
