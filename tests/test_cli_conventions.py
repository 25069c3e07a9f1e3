"""The command-line conventions (issue 24): one meaning per short flag, help in the house
style with an example that runs, bad values in the tool's words, a closed pipe that ends
quietly, environment and config-file defaults, forced colour, shell completion."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.example import EXAMPLE

from .helpers import one_error_line

runner = CliRunner()
GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)  # type: ignore[attr-defined]


def run(*args: str, **env: str):
    return runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200", **env})


def cli(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attnviz", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test reads its own (empty) config directory, never the user's."""
    home = tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    for var in ("ATTNVIZ_MODEL", "ATTNVIZ_ENGINE", "ATTNVIZ_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    return home


# --- 2. one meaning per short flag -------------------------------------------------------


def test_each_short_flag_means_one_long_option_in_every_command() -> None:
    meanings: dict[str, set[str]] = defaultdict(set)
    for name in COMMANDS:
        for param in GROUP.commands[name].params:  # type: ignore[attr-defined]
            longs = [o for o in param.opts if o.startswith("--")]
            for short in (o for o in param.opts + param.secondary_opts if not o.startswith("--")):
                meanings[short].add(longs[0] if longs else param.name)
    clashes = {short: longs for short, longs in meanings.items() if len(longs) > 1}
    assert not clashes, clashes
    assert meanings["-s"] == {"--sentence"} and meanings["-t"] == {"--token"}


# --- 5. help in the house style; 4. bad values in our words ------------------------------


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_help_is_in_the_house_style(name: str) -> None:
    result = run(*([name] if name else []), "--help")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert not re.search(r"<(?!s>)[a-z_\[\]|]+>", text), text  # no <str>, <int>, <own|hf> (<s> is a token)
    assert not re.search(r"\{[A-Z_]+\}", text), text  # no {SENTENCE} in the usage line
    for python in ("<str>", "<int>", "<float>", "<path>", "list[", "NoneType", "x>=", "x<="):
        assert python not in text, python
    assert "Value error" not in text and "Input should" not in text
    if name:
        assert text.rstrip().splitlines()[-1].strip().startswith("attnviz " + name), text


def test_check_part_help_names_no_option_check_lacks() -> None:
    text = run("check", "--help").stdout
    part = text.split("  --part ")[1].split("--json")[0]
    assert "--token" not in part and "encoder" in part
    options = {o for p in GROUP.commands["check"].params for o in p.opts} | {"--help"}  # type: ignore[attr-defined]
    for flag in re.findall(r"--[a-z][a-z-]+", text):
        assert flag in options, flag


def _example(name: str) -> list[str]:
    lines = run(name, "--help").stdout.rstrip().splitlines()
    assert lines[-3].strip() == "Example:", lines[-3:]
    return shlex.split(lines[-1].strip())


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "explore"])
def test_each_help_ends_with_an_example_that_runs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_model: None
) -> None:
    """In-process (the start-up is test_cli's and the pipe tests' below): the example's
    argv, run in an empty directory, exits 0 and prints or writes something."""
    argv = _example(name)
    assert argv[0] == "attnviz" and argv[1] == name
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, argv[1:])
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() or any(tmp_path.iterdir()), "the example printed and wrote nothing"
    assert "error" not in done.stderr


def test_explore_example_runs_in_a_terminal(tmp_path: Path) -> None:
    """The explorer's example, in a pseudo-terminal: it starts, draws, and quits on q."""
    from .test_explore import run_in_pty

    argv = _example("explore")
    assert argv[:2] == ["attnviz", "explore"]
    screen = run_in_pty(argv[1:], (b"quit", b"6 layers"))
    assert b"animal" in screen


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["show", "x", "--token", "x", "--engine", "hff"], "--engine must be own or hf, not 'hff'"),
        (["compare", "x", "--token", "x", "--sort", "wieght"], "--sort must be weight, entropy, sink, distance, delta or effect"),  # noqa: E501
        (["export", "x", "--token", "x", "-o", "a.png", "--dtype", "f16"], "--dtype must be float32, bfloat16 or"),
        (["compare", "x", "--token", "x", "--top", "abc"], "--top takes a whole number, not 'abc'"),
        (["compare", "x", "--token", "x", "--top", "0"], "--top must be in N >= 1, not '0'"),
        (["export", "x", "-o", "a.png", "--dpi", "5"], "--dpi must be in 10..2400, not '5'"),
        (["show", "x", "--token", "x", "--device", "cude"], "--device must be auto, cpu, cuda, cuda:N or mps, not 'cude'"),  # noqa: E501
    ],
)  # fmt: skip
def test_bad_values_are_refused_in_our_words(args: list[str], words: str, no_model: list[str]) -> None:
    line = one_error_line(run(*args), 2)
    assert words in line, line
    assert "Value error" not in line and "Input should" not in line and "hint:" in line
    assert no_model == []


def test_a_long_library_message_is_cut_after_a_whole_sentence() -> None:
    from attnviz.io.safeio import whole_sentences

    hf = (
        "Cannot find an appropriate cached snapshot folder for the specified revision on the local disk and "
        "outgoing traffic has been disabled. To enable repo look-ups and downloads online, pass "
        "'local_files_only=False' as input."
    )
    assert whole_sentences(hf, 160) == hf.split(" To enable")[0]
    assert whole_sentences("word " * 100, 40).endswith("word…")
    assert whole_sentences("short. one") == "short. one"


def test_the_offline_error_is_whole(tmp_path: Path) -> None:
    done = run("show", "x", "--token", "x", "--model", "nobody/no-such-model", HF_HUB_OFFLINE="1")
    assert done.exit_code == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    reason = line.split("could not be downloaded (")[1].split(") (hint:")[0]
    assert reason.endswith((".", "…")) and not reason.endswith(" a"), reason
    assert line.endswith("--model DIR)")


# --- 3. a closed pipe ends quietly --------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["show", "--help"],
        ["show", EXAMPLE, "--token", "it"],
        ["show", EXAMPLE, "--token", "it", "--json"],
        ["compare", EXAMPLE, "--token", "it"],
        ["heads", "--probe", "induction", "--probe-texts", "4", "--csv"],
        ["check", "--json"],
    ],
)
def test_a_pipe_closed_early_ends_quietly(args: list[str]) -> None:
    """The reader is gone before the first byte (``| head -0``): exit 0, stderr empty."""
    read, write = os.pipe()
    os.close(read)  # a real pipe, closed at the reading end: every write gets EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "attnviz", *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=600
        )
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_head_reads_one_line_and_attnviz_ends_quietly() -> None:
    shell = f"{shlex.quote(sys.executable)} -m attnviz show {shlex.quote(EXAMPLE)} --token it | head -1"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {shell}; echo status=${{PIPESTATUS[0]}} >&2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.stdout.count("\n") == 1 and "all-MiniLM-L6-v2" in done.stdout
    assert done.stderr.strip() == "status=0", done.stderr


# --- 6. defaults from the environment and the config file ---------------------------------


def test_env_vars_are_shown_in_help() -> None:
    text = " ".join(run("show", "--help").stdout.split())
    for var in ("ATTNVIZ_MODEL", "ATTNVIZ_ENGINE", "ATTNVIZ_DEVICE"):
        assert f"env var: {var}" in text, var


def _engine_of(*args: str, **env: str) -> str:
    result = run("show", "The cat sat", "--token", "cat", "--layer", "0", "--json", *args, **env)
    assert result.exit_code == 0, result.output
    import json

    return str(json.loads(result.stdout)["provenance"]["engine"])


def test_command_line_beats_environment_beats_config_file(_no_user_config: Path, shared_model: None) -> None:
    config = _no_user_config / "attnviz" / "config.toml"
    config.parent.mkdir()
    config.write_text('engine = "hf"\n', encoding="utf-8")
    assert _engine_of() == "hf"  # the file
    assert _engine_of(ATTNVIZ_ENGINE="own") == "own"  # the environment over the file
    config.write_text('engine = "own"\n', encoding="utf-8")
    assert _engine_of(ATTNVIZ_ENGINE="hf") == "hf"
    assert _engine_of("--engine", "own", ATTNVIZ_ENGINE="hf") == "own"  # the command line over both


def test_model_from_the_environment(tmp_path: Path, minilm_dir: Path) -> None:
    result = run("show", "The cat sat", "--token", "cat", "--layer", "0", "--json", ATTNVIZ_MODEL="./no/such/dir")
    line = one_error_line(result, 2)
    assert "no/such/dir" in line and "ATTNVIZ_MODEL" in line, line


@pytest.mark.parametrize(
    ("content", "env", "words"),
    [
        ('engine = "hff"\n', {}, "--engine must be own or hf, not 'hff' (from {config})"),
        ("", {"ATTNVIZ_ENGINE": "hff"}, "--engine must be own or hf, not 'hff' (from ATTNVIZ_ENGINE)"),
        ('device = "gpu"\n', {}, "--device must be auto, cpu, cuda, cuda:N or mps, not 'gpu' (from {config})"),
        ("", {"ATTNVIZ_DEVICE": "gpu"}, "(from ATTNVIZ_DEVICE)"),
        ('colour = "red"\n', {}, "unknown key 'colour' in the config file {config}"),
        ("engine = 3\n", {}, "engine in the config file {config} must be a string"),
        ("engine = \n", {}, "cannot read the config file {config}"),
    ],
)
def test_a_bad_default_is_refused_naming_where_it_came_from(
    content: str, env: dict[str, str], words: str, _no_user_config: Path, no_model: list[str]
) -> None:
    config = _no_user_config / "attnviz" / "config.toml"
    if content:
        config.parent.mkdir()
        config.write_text(content, encoding="utf-8")
    line = one_error_line(run("show", "x", "--token", "x", **env), 2)
    assert words.format(config=config) in line, line
    assert no_model == []


# --- 7. colour ----------------------------------------------------------------------------

TRUE_COLOUR_CELL = re.compile(r"\x1b\[[0-9;]*48;2;\d+;\d+;\d+m")


@pytest.mark.parametrize(
    ("env", "true_colour"),
    [
        ({"FORCE_COLOR": "1"}, True),
        ({"FORCE_COLOR": "1", "COLORTERM": "truecolor"}, True),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ({}, False),
    ],
)
def test_forced_colour_draws_the_true_colour_heatmap_in_a_pipe(
    env: dict[str, str], true_colour: bool, shared_model: None
) -> None:
    """In-process: CliRunner's stdout is no terminal, as a pipe is not; the colour comes
    from the environment alone (``colour_settings``), which the runner sets and unsets."""
    unset: dict[str, str | None] = {k: None for k in ("FORCE_COLOR", "NO_COLOR", "COLORTERM", "TERM")}
    done = runner.invoke(app, ["show", "The cat sat", "--token", "cat", "--layer", "0"], env={**unset, **env})
    assert done.exit_code == 0, done.output
    assert bool(TRUE_COLOUR_CELL.search(done.stdout)) is true_colour
    if not true_colour:
        # No colour of any depth (bold, dim and italic are no colour: no-color.org).
        assert not re.search(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])[;m]", done.stdout)


def test_colour_settings_rule() -> None:
    from attnviz.render.terminal import colour_settings

    assert colour_settings({"FORCE_COLOR": "1"}) == {"force_terminal": True, "color_system": "truecolor"}
    assert colour_settings({"FORCE_COLOR": "1", "NO_COLOR": "1"}) == {}
    assert colour_settings({"COLORTERM": "truecolor"}) == {}  # a terminal's export alone colours no pipe
    assert colour_settings({"FORCE_COLOR": ""}) == {}


# --- 1. shell completion ------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_a_named_shell_is_printed_whatever_the_parent_shell(shell: str) -> None:
    """``sh -c 'attnviz --show-completion bash'`` (a Dockerfile's RUN): the parent is sh,
    which has no script; the shell named after the flag is the one printed."""
    done = subprocess.run(
        ["sh", "-c", f'exec "{sys.executable}" -m attnviz --show-completion {shell}'],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    marker = {"bash": "complete -o default -F", "zsh": "compdef", "fish": "complete --command attnviz --no-files"}
    assert marker[shell] in done.stdout and "_ATTNVIZ_COMPLETE" in done.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_for_each_shell(shell: str) -> None:
    done = cli("--show-completion", shell, env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert done.returncode == 0, done.stderr
    assert "_ATTNVIZ_COMPLETE" in done.stdout
    marker = {"bash": "complete -o default -F", "zsh": "compdef", "fish": "complete --command attnviz --no-files"}
    assert marker[shell] in done.stdout, done.stdout


def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    """The bash script, sourced in a real bash, completes sub-commands and options."""
    script = cli("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}).stdout
    shim = tmp_path / "attnviz"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m attnviz "$@"\n')
    shim.chmod(0o755)
    probe = (
        f"{script}\n"
        'COMP_WORDS=(attnviz sh); COMP_CWORD=1; _attnviz_completion attnviz; echo "${COMPREPLY[@]}"\n'
        'COMP_WORDS=(attnviz compare --so); COMP_CWORD=2; _attnviz_completion attnviz; echo "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    lines = done.stdout.strip().splitlines()
    assert lines[0].split() == ["show"], done
    assert "--sort" in lines[1].split(), done


@pytest.mark.parametrize("args", [["show"], ["show", "--token", "it"], ["export", "-o", "a.png"], ["compare"]])
def test_no_text_is_said_first(args: list[str], no_model: list[str]) -> None:
    """No sentence at all: the error asks for the text, not for a token of a text not given."""
    line = one_error_line(run(*args), 2)
    assert "give a text" in line or "give a sentence" in line, line
    assert "which token" not in line and no_model == []
