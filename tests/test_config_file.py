"""The config file and the environment never give a traceback: a hostile config.toml
(deep, huge, a 5,000-digit number, a directory, a symlink loop) is one stderr line naming
it with exit 2, read no further than 64 KiB; an XDG_CONFIG_HOME that ``stat`` refuses is
no config file. Real processes: the import-time probes run as a user's would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MAX_CONFIG_BYTES = 64 * 1024  # attnviz.cli.conventions.MAX_CONFIG_BYTES


def cli(*args: str, xdg: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNVIZ_", "MPLCONFIGDIR"))}
    return subprocess.run(
        [sys.executable, "-m", "attnviz", *args],
        capture_output=True,
        text=True,
        env={**clean, "XDG_CONFIG_HOME": str(xdg), **env},
        timeout=120,
    )


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    return lines[0]


def _config(xdg: Path) -> Path:
    (xdg / "attnviz").mkdir(parents=True, exist_ok=True)
    return xdg / "attnviz" / "config.toml"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("x = " + "[" * 60_000, "nested too deeply"),  # RecursionError in tomllib, under 64 KiB
        ("engine = " + "7" * 5000, "cannot read the config file"),  # ValueError: int digits limit
        ('engine = "own"\n# ' + "x" * MAX_CONFIG_BYTES, "at most 64 KiB"),
    ],
    ids=["deep", "digits", "big"],
)
@pytest.mark.parametrize("args", [("--version",), ("--help",), ("show", "x", "--token", "x")])
def test_a_hostile_config_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str, says: str, args: tuple[str, ...]
) -> None:
    path = _config(tmp_path)
    path.write_text(content, encoding="utf-8")
    line = one_line(cli(*args, xdg=tmp_path), 2)
    assert says in line and str(path) in line, line


def test_a_1_gib_config_file_is_refused_before_reading_it(tmp_path: Path) -> None:
    path = _config(tmp_path)
    with path.open("wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of zeros on no disk
    line = one_line(cli("--version", xdg=tmp_path), 2)
    assert "1,073,741,824 bytes" in line and "at most 64 KiB" in line, line


@pytest.mark.parametrize("kind", ["directory", "symlink_loop", "fifo"])
def test_a_config_file_that_cannot_be_read_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    path = _config(tmp_path)
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink_loop":
        os.symlink(path, path)
    else:
        os.mkfifo(path)
    line = one_line(cli("--version", xdg=tmp_path), 2)
    assert "config file" in line and str(path) in line, line


def test_an_xdg_config_home_stat_refuses_is_no_config_file(tmp_path: Path) -> None:
    """5,000 characters: every stat under it is ENAMETOOLONG, at import (matplotlib's probe)
    and in the config lookup; nothing can be there, so there is no config file."""
    long = Path(str(tmp_path) + ("/" + "d" * 250) * 20)
    done = cli("--version", xdg=long)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.startswith("attnviz ")
    env = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"}
    probe = subprocess.run(
        [sys.executable, "-c", "import attnviz.render, os; print(os.environ['MPLCONFIGDIR'])"],
        capture_output=True,
        text=True,
        env={**env, "XDG_CONFIG_HOME": str(long)},
        timeout=120,
    )
    assert probe.returncode == 0 and "Traceback" not in probe.stderr, probe.stderr[-2000:]
    assert Path(probe.stdout.strip()).is_dir()  # a private directory instead


@pytest.mark.parametrize("flag", ["--show-completion", "--install-completion"])
@pytest.mark.parametrize("detected", [None, "sh"])
def test_completion_without_a_detectable_shell_names_the_explicit_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, detected: str | None
) -> None:
    import shellingham
    from typer.testing import CliRunner

    from attnviz.cli import app

    def detect() -> tuple[str, str]:
        if detected is None:
            raise shellingham.ShellDetectionFailure()
        return detected, f"/bin/{detected}"

    monkeypatch.setattr(shellingham, "detect_shell", detect)
    monkeypatch.setenv("HOME", str(tmp_path))  # nothing installed in the real home, whatever happens
    result = CliRunner().invoke(app, [flag], env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert "_ATTNVIZ_COMPLETE=source_bash attnviz" in result.output and "not supported" not in result.output
    assert not list(tmp_path.rglob("*attnviz*"))  # nothing written


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_a_1_gib_tokenizer_json_is_refused_before_parsing(tmp_path: Path, engine: str) -> None:
    """Parsed whole, it took 2.3 GB before its refusal; the largest real ones are ~35 MB."""
    import shutil

    from .helpers import save_tiny_bert

    model = save_tiny_bert(tmp_path / "bert")
    (model / "tokenizer.json").unlink()
    with (model / "tokenizer.json").open("wb") as f:
        f.truncate(1 << 30)
    done = cli("show", "the cat", "--token", "cat", "--model", str(model), "--engine", engine, xdg=tmp_path / "x")
    line = one_line(done, 2)
    assert "tokenizer.json" in line and "1,073,741,824 bytes" in line, line
    shutil.rmtree(model)
