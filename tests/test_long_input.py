"""Long input: reading the text from a file or standard input, and its limits."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from attnviz.errors import UsageError
from attnviz.tokens import read_text


def test_reads_utf8_and_drops_bom_and_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffThe café is closed.\nIt opens at nine.\r\n".encode())
    assert read_text(path) == "The café is closed.\nIt opens at nine."
    path.write_text("two final newlines\n\n", encoding="utf-8")
    assert read_text(path) == "two final newlines\n"  # only the file's line ending goes


def test_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from a pipe\n")))
    assert read_text("-") == "from a pipe"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfeU\x00T\x00F\x00", "not UTF-8 text (byte 0 is 0xff)"),
        (b"  \n\t\n", "holds no text"),
        (b"x" * 101, "larger than"),
    ],
)
def test_refuses_bad_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=re.escape(message)):
        read_text(path, max_bytes=100)


def test_refuses_missing_paths_and_directories(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_text(tmp_path / "nope.txt")
    with pytest.raises(UsageError, match="is a directory"):
        read_text(tmp_path)
