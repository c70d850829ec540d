"""Reading the JSON / JSON Lines files users hand to vlgrpo (datasets, `vlgrpo data doctor`, `vlgrpo eval score`):
bytes in, (row number, value) out. A line that is not UTF-8 or not JSON comes back as a DataError naming the file,
the line and the byte offset, never raised here, so each caller decides whether it skips the row or stops.

Knows nothing of what a row holds. Lines end at "\\n" only (JSON Lines): U+2028 inside a string is text, not a break.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vlgrpo.data.schema import DataError

ACCEPTED = "vlgrpo reads UTF-8 JSON Lines (one JSON object per line, or one JSON array)"
_BOM = codecs.BOM_UTF8
"""Notepad and PowerShell 5 start UTF-8 files with it; it is dropped."""


def _not_utf8(source: str, line: int, offset: int, byte: int) -> DataError:
    return DataError(
        source,
        line,
        None,
        f"is not UTF-8: byte 0x{byte:02x} at byte offset {offset} (line {line}); "
        f"{ACCEPTED}: re-encode the file, e.g. `iconv -f latin1 -t utf-8 IN > OUT`",
    )


def iter_lines(path: str | Path) -> Iterator[tuple[int, str | DataError]]:
    """(1-based line number, text) of every non-blank line; a line that is not UTF-8 comes as a DataError and the
    lines after it are read on."""
    offset = 0
    with open(path, "rb") as f:
        for no, raw in enumerate(f, start=1):
            start = len(_BOM) if no == 1 and raw.startswith(_BOM) else 0
            try:
                line = raw[start:].decode("utf-8")
            except UnicodeDecodeError as e:
                yield no, _not_utf8(str(path), no, offset + start + e.start, raw[start + e.start])
            else:
                if line.strip():
                    yield no, line
            offset += len(raw)


def read_text(path: str | Path) -> str:
    """The whole file as UTF-8 text (a leading BOM dropped); raises a DataError naming the first byte that is not."""
    data = Path(path).read_bytes()
    start = len(_BOM) if data.startswith(_BOM) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = start + e.start
        raise _not_utf8(str(path), data.count(b"\n", 0, at) + 1, at, data[at]) from None


def _first_char(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(4096).removeprefix(_BOM).lstrip()[:1]


def json_rows(path: str | Path, documents: bool = False) -> Iterator[tuple[int, Any]]:
    """(row number, parsed value): each line of a JSON Lines file (numbered by line, blank lines skipped), or each
    element of a file holding one JSON array (LLaVA's and VLM-R1's .json files; numbered from 1), or, with
    `documents`, a file holding one JSON object as row 1 (a COCO instances file). A line that is not UTF-8 or not JSON
    comes as a DataError in place of its value."""
    path = Path(path)
    head = _first_char(path)
    if head == b"[" or (documents and head == b"{"):
        try:
            doc = json.loads(read_text(path))
        except DataError as e:  # not UTF-8: an array cannot be read in part; a JSONL file is read line by line
            if head == b"[":
                yield e.row, e
                return
        except json.JSONDecodeError as e:
            if head == b"[" and e.msg != "Extra data":  # "Extra data": several values, i.e. JSONL
                yield (
                    e.lineno,
                    DataError(
                        str(path),
                        e.lineno,
                        None,
                        f"malformed JSON array ({e.msg} at line {e.lineno}, column {e.colno})",
                    ),
                )
                return
        else:
            if isinstance(doc, list):
                yield from enumerate(doc, start=1)
                return
            if documents and isinstance(doc, dict):
                yield 1, doc
                return
    for no, line in iter_lines(path):
        if isinstance(line, DataError):
            yield no, line
            continue
        try:
            yield no, json.loads(line)
        except json.JSONDecodeError as e:
            yield no, DataError(str(path), no, None, f"malformed JSON ({e.msg} at column {e.colno})")


def read_json_rows(path: str | Path) -> list[tuple[int, Any]]:
    """(row number, parsed row) from JSON lines (POPE writes JSON lines named .json), a JSON array, or one JSON
    object (a single row, or a whole document such as COCO instances). The first line that is not UTF-8 or not JSON
    raises, naming the file, the line and (not UTF-8) the byte offset."""
    rows = []
    for no, row in json_rows(path, documents=True):
        if isinstance(row, DataError):
            raise row
        rows.append((no, row))
    return rows
