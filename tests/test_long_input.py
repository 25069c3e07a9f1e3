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


# --- through the command line -------------------------------------------------------

from typer.testing import CliRunner  # noqa: E402

from attnviz.cli import app  # noqa: E402

from .builders import SPECS_BY_NAME, save_tiny  # noqa: E402
from .helpers import one_error_line  # noqa: E402

runner = CliRunner()


def run(*args: str, stdin: str | None = None):
    return runner.invoke(app, list(args), input=stdin, env={"NO_COLOR": "1", "COLUMNS": "200"})


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GQA and a sliding window; 64 positions."""
    return save_tiny(SPECS_BY_NAME["qwen2"], tmp_path_factory.mktemp("cli") / "qwen2")


TEXT = "the cat sat on the mat and the dog sat by the door because it was too tired"


def _json(*args: str, stdin: str | None = None) -> dict:
    import json

    result = run(*args, "--json", stdin=stdin)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_file_and_stdin_give_what_the_argument_gives(qwen: Path, tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_text(TEXT + "\n", encoding="utf-8")
    common = ("--model", str(qwen), "--token", "it", "--device", "cpu")
    direct = _json("show", TEXT, *common)
    assert _json("show", "--file", str(path), *common) == direct
    assert _json("show", "-", *common, stdin=TEXT + "\n") == direct
    assert _json("show", "--file", "-", *common, stdin=TEXT) == direct
    rows = _json("compare", "--file", str(path), *common)
    assert rows and rows == _json("compare", TEXT, *common)


def test_export_reads_a_file(qwen: Path, tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "it.png"
    result = run("export", "--file", str(path), "--model", str(qwen), "--token", "it", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("show", TEXT, "--file", "x.txt", "--token", "it"), "give the text or --file, not both"),
        (("show", "--token", "it"), "give a text (or --file PATH)"),
        (("show", "--file", "/nonexistent/t.txt", "--token", "it"), "/nonexistent/t.txt does not exist"),
        (
            ("show", TEXT, "--token", "it", "--dtype", "float64"),
            "--dtype must be float32, bfloat16 or float16, not 'float64'",
        ),
        (("show", TEXT, "--token", "it", "--max-memory", "lots"), "cannot read the memory size 'lots'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(qwen: Path, args: tuple[str, ...], message: str) -> None:
    line = one_error_line(run(*args, "--model", str(qwen)), 2)
    assert message in line


def test_a_text_longer_than_the_positions_is_exit_2(qwen: Path, tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text(" ".join([TEXT] * 10), encoding="utf-8")  # ~170 tokens; the model reads 64
    line = one_error_line(run("show", "--file", str(path), "--model", str(qwen), "--index", "-1"), 2)
    assert "this model reads at most 64" in line


def test_the_memory_guard_stops_the_run_with_the_way_out(qwen: Path) -> None:
    line = one_error_line(run("show", TEXT, "--model", str(qwen), "--index", "-1", "--max-memory", "1KB"), 2)
    assert "needs about" in line and "more than the budget of 1.0 KB" in line
    assert "--engine own" in line and "--max-memory SIZE overrides" in line


def test_dtype_runs_the_model_in_it(qwen: Path) -> None:
    out = _json("show", TEXT, "--model", str(qwen), "--token", "it", "--dtype", "bfloat16")
    ref = _json("show", TEXT, "--model", str(qwen), "--token", "it")
    assert out["provenance"]["dtype"] == "bfloat16"
    diff = max(
        abs(a - b)
        for la, lb in zip(out["weights"], ref["weights"], strict=True)
        for ha, hb in zip(la, lb, strict=True)
        for a, b in zip(ha, hb, strict=True)
    )
    assert 0 < diff <= 2e-2  # tests/test_rows.py: DTYPE_TOL
