"""--generate's refusals on either engine: each comes before any pass and before a written
token reaches stderr (one error line, exit 2, nothing on stdout), and hf generation writes
nothing to stderr but the continuation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from tests.builders import SPECS_BY_NAME, build_tiny, save_tiny  # noqa: E402
from tests.helpers import in_process, one_error_line  # noqa: E402

PROMPT = "the cat sat on the mat"


def _result(done: object) -> SimpleNamespace:
    """A ``helpers.Done`` as ``one_error_line`` reads a CliRunner result."""
    d = done
    return SimpleNamespace(exit_code=d.returncode, stdout=d.stdout, stderr=d.stderr, output=d.stdout + d.stderr)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """GPT-2 and Llama with their LM heads, and each one's base model saved without it."""
    root = tmp_path_factory.mktemp("genrefuse")
    out: dict[str, Path] = {}
    for name, body in (("gpt2", "transformer"), ("llama", "model")):
        out[name] = save_tiny(SPECS_BY_NAME[name], root / name)
        base = root / f"{name}-base"
        getattr(build_tiny(SPECS_BY_NAME[name]), body).save_pretrained(base)
        for f in out[name].glob("*token*"):
            (base / f.name).write_bytes(f.read_bytes())
        out[f"{name}-base"] = base
    return out


def _no_causal_lm_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any load of a causal LM (the hf engine's generation) fails the test."""
    import transformers

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a causal LM was loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize("engine", ["own", "hf"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("command", [("show", PROMPT), ("show", PROMPT, "--words"), ("compare", PROMPT)])
def test_a_base_decoder_without_its_head_is_refused_on_either_engine(
    command: tuple[str, ...], family: str, engine: str, saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers would load the base as a causal LM with a random or tied head and write.
    import transformers

    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(saved[f"{family}-base"]))
    assert loaded is not None  # the silent wrong answer the refusal prevents
    _no_causal_lm_load(monkeypatch)
    base = saved[f"{family}-base"]
    done = in_process(*command, "-m", str(base), "--engine", engine, "--generate", "3")
    line = one_error_line(_result(done), 2)
    assert line == (
        f"attnviz: error: --generate 3: {base} has no language-model head: it cannot write text "
        "(hint: generation needs a checkpoint saved from a *ForCausalLM class)"
    )


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_a_decoder_with_its_head_still_writes(engine: str, saved: dict[str, Path]) -> None:
    import json

    done = in_process("show", PROMPT, "-m", str(saved["gpt2"]), "--engine", engine, "--generate", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["written_ids"]) == 3


# --- what hf generation writes to stderr --------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_generation_streams_the_continuation_and_nothing_else(
    family: str, saved: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers 5 warns (FutureWarning) that generate's ``past_key_values`` will be renamed.
    import sys
    import warnings

    from attnviz.cli.generating import write
    from attnviz.engines import load_engine
    from attnviz.generation import GREEDY

    engine = load_engine("hf", str(saved[family]), "cpu")
    tokens = engine.tokenize(PROMPT)
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the continuation streams
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gen = write(engine, tokens, 3, GREEDY, json_out=False)
    assert [str(w.message) for w in caught] == []
    out, err = capsys.readouterr()
    assert out == ""
    assert len(gen.pieces) == 3
    assert err == f"writing: {PROMPT}" + "".join(f" {p}" for p in gen.pieces) + "\n"


def test_hf_generation_leaves_a_pipe_s_stderr_empty(saved: dict[str, Path]) -> None:
    import json
    import subprocess
    import sys

    args = ("show", PROMPT, "-m", str(saved["gpt2"]), "--engine", "hf", "--generate", "3", "--json")
    done = subprocess.run([sys.executable, "-m", "attnviz", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert len(json.loads(done.stdout)["written_ids"]) == 3


# --- refusals that depend on the model and the options come before writing ----------


class _Terminal:
    """The current stderr (CliRunner's), claiming to be a terminal: the continuation streams."""

    def __getattr__(self, name: str) -> object:
        import sys

        return getattr(sys.stderr, name)

    def isatty(self) -> bool:
        return True


def _streaming(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """--generate streams to the (CliRunner's) stderr as to a terminal; returns the list
    that counts the generate calls."""
    import attnviz.cli.generating
    import attnviz.generation

    calls: list[int] = []
    real = attnviz.generation.generate

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attnviz.cli.generating, "sys", SimpleNamespace(stderr=_Terminal()))
    monkeypatch.setattr(attnviz.generation, "generate", counted)
    return calls


REFUSED = [
    ("hf", ("show", PROMPT, "--measure", "norm"), "the norm measure needs each head's value projection and W^O"),
    ("hf", ("compare", PROMPT, "--measure", "norm"), "the norm measure needs each head's value projection and W^O"),
    ("hf", ("export", PROMPT, "--measure", "norm", "-o", "{out}/x.png"), "the norm measure needs"),
    ("own", ("show", PROMPT, "--words", "--heads", "7"), "head 7 is out of range: this model has"),
    ("hf", ("show", PROMPT, "--words", "--layer", "9"), "layer 9 is out of range: this model has"),
    ("own", ("compare", PROMPT, "--layer", "9"), "layer 9 is out of range: this model has"),
]


@pytest.mark.parametrize(("engine", "command", "needle"), REFUSED)
def test_refusals_from_model_and_options_come_before_any_written_token(
    engine: str,
    command: tuple[str, ...],
    needle: str,
    saved: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    calls = _streaming(monkeypatch)
    args = [a.format(out=tmp_path) for a in command]
    done = in_process(*args, "-m", str(saved["gpt2"]), "--engine", engine, "--generate", "4")
    assert needle in one_error_line(_result(done), 2)  # stderr: that line alone, no streamed text
    assert calls == []
    assert not list(tmp_path.glob("x.*"))


def test_the_streaming_the_refusal_tests_rely_on_shows(saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _streaming(monkeypatch)
    done = in_process("show", PROMPT, "--words", "-m", str(saved["gpt2"]), "--engine", "hf", "--generate", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"writing: {PROMPT} ") and calls == [1]
