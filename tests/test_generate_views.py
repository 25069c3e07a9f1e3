"""--generate in every view (compare, export's images and page, show's full view): the
written tokens join the text the views read, marked «like this», and the reading options
apply to them as to any token. References: the cached generation's own rows (proved equal
to full passes in test_generate.py), and the same views over the continued text given as
plain text (re-tokenized: an independent road to the same tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnviz.engines import load_engine  # noqa: E402
from attnviz.generation import extend_tokens, generate  # noqa: E402
from attnviz.result import Attention  # noqa: E402
from tests.builders import SPECS_BY_NAME, build_tiny, save_tiny  # noqa: E402
from tests.helpers import in_process, one_error_line  # noqa: E402

PROMPT = "the cat sat on the mat and the dog"
COUNT = 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("genviews")
    out = {name: save_tiny(SPECS_BY_NAME[name], root / name) for name in ("gpt2", "llama", "bert")}
    base = root / "base"  # a GPT-2 saved without its LM head
    build_tiny(SPECS_BY_NAME["gpt2"]).transformer.save_pretrained(base)
    for f in out["gpt2"].glob("*token*"):
        (base / f.name).write_bytes(f.read_bytes())
    out["base"] = base
    return out


def _written(path: Path, count: int = COUNT, prompt: str = PROMPT) -> tuple[list[int], list[str], int, str]:
    engine = load_engine("own", str(path), "cpu")
    tokens = engine.tokenize(prompt)
    gen = generate(engine, tokens, count)
    assert gen.tokens is not None
    return gen.ids, list(gen.tokens.labels[gen.given :]), gen.given, gen.tokens.text


# --- the continued text's tokens ----------------------------------------------------


def _bpe(tmp_path: Path) -> object:
    """A byte-level BPE tokenizer (GPT-2's kind) trained here, with an end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    text = [
        "the cat sat on the mat and the dog ran off",
        "a café où l'on mange, 東京で働く",
        "tokens split into pieces",
    ]
    tok.train_from_iterator(text * 20, trainer)
    return tok


@pytest.mark.parametrize(
    ("prompt", "more"), [("the cat sat", " on the mat and"), ("a", " café où l'on"), ("the", " 東京で働く")]
)
def test_extend_tokens_equals_the_tokenizers_own_reading(tmp_path: Path, prompt: str, more: str) -> None:
    from attnviz.tokens import tokenize

    tok = _bpe(tmp_path)
    base, whole = tokenize(tok, prompt), tokenize(tok, prompt + more)  # type: ignore[arg-type]
    written = whole.ids[len(base.ids) :]
    assert whole.ids[: len(base.ids)] == base.ids  # the test's premise: the prompt's tokens stay
    got = extend_tokens(tok, base, written)
    assert got.text == prompt + more and got.ids == whole.ids and got.written_start == len(base.ids)
    # Each written token spans what the tokenizer itself says it spans (bytes of one
    # character split over tokens: the last of them carries the character).
    for i in range(len(base.ids), len(got.ids)):
        a, b = got.offsets[i]
        assert (a, b) == whole.offsets[i] or (a, b) == (0, 0), (i, got.offsets[i], whole.offsets[i])
    assert "".join(got.text[a:b] for a, b in got.offsets[len(base.ids) :]).replace(" ", "") == more.replace(" ", "")
    # Only the written tokens are marked.
    assert [label.startswith("«") for label in got.labels] == [i >= len(base.ids) for i in range(len(got))]
    eos = tok.token_to_id("<|endoftext|>")  # type: ignore[attr-defined]
    ended = extend_tokens(tok, base, [*written, eos])
    assert ended.special[-1] and ended.offsets[-1] == (0, 0) and ended.text == got.text


# --- the views ----------------------------------------------------------------------


def test_show_full_view_of_a_written_token_is_the_generations_row(saved: dict[str, Path], tmp_path: Path) -> None:
    """show --generate with an output of the full view (--npz): the first written token's
    rows, as the cached generation computed them."""
    path = saved["llama"]
    engine = load_engine("own", str(path), "cpu")
    gen = generate(engine, engine.tokenize(PROMPT), 3)
    out = tmp_path / "g.npz"
    done = in_process("show", PROMPT, "-m", str(path), "--generate", "3", "--npz", str(out))
    assert done.returncode == 0, done.stderr
    assert "«…»: written by the model (--generate): tokens" in done.stdout
    att = Attention.load_npz(out)
    assert att.tokens.written_start == gen.given and att.queries == (gen.given,)
    assert list(att.tokens.ids[gen.given :]) == gen.ids
    rows, keys = att.rows(gen.given), gen.given + 1  # every key; the later ones masked
    np.testing.assert_allclose(rows[..., :keys], gen.rows[0].numpy(), atol=1e-5, rtol=0)
    assert not rows[..., keys:].any()


SAMPLE = Path(__file__).parent.parent / "samples" / "circuits-2l"
IOI = "When Mary and John went to the store , John gave a drink to"


@pytest.mark.parametrize("name", ["gpt2", "circuits-2l"])
def test_compare_reads_a_written_token_with_words_norms_and_ablation(saved: dict[str, Path], name: str) -> None:
    """compare --generate --words --measure norm --ablate --token WRITTEN ranks the heads as
    the same command does over the continued text given whole (re-tokenized). (The tiny
    random models write ids past their tokenizers' vocabularies but for GPT-2's on PROMPT;
    the sample model is trained.)"""
    where, prompt = (saved[name], PROMPT) if name in saved else (SAMPLE, IOI)
    path = str(where)
    ids, labels, given, text = _written(where, prompt=prompt)
    word = labels[-1].strip("«»")
    occurrence = text.split().count(word)  # the last written token is the word's last occurrence
    options = ("--words", "--measure", "norm", "--ablate", "--json", "--token", f"{word}:{occurrence}")
    done = in_process("compare", prompt, "-m", path, "--generate", str(COUNT), *options)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["given"] == given and doc["written"] == labels
    assert doc["measure"] == "norm" and any(step.startswith("words") for step in doc["steps"])
    plain = in_process("compare", text, "-m", path, *options)
    assert plain.returncode == 0, plain.stderr
    ref = json.loads(plain.stdout)
    assert "given" not in ref
    assert len(doc["rows"]) == len(ref["rows"])
    for ours, theirs in zip(doc["rows"], ref["rows"], strict=True):
        assert (ours["layer"], ours["head"]) == (theirs["layer"], theirs["head"])
        assert [w for _, w in ours["top"]] == pytest.approx([w for _, w in theirs["top"]], abs=1e-5)
        assert [t.strip("«»") for t, _ in ours["top"]] == [t for t, _ in theirs["top"]]
        for key in ("entropy", "effect", "kl"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-5), key
    assert doc["ablation"]["lm"] == "causal"


def test_compare_without_token_ranks_the_first_written_token(saved: dict[str, Path]) -> None:
    path = str(saved["gpt2"])
    _, labels, _, _ = _written(saved["gpt2"])
    done = in_process("compare", PROMPT, "-m", path, "--generate", str(COUNT), "--layer", "1")
    assert done.returncode == 0, done.stderr
    assert f"'{labels[0]}' → each token" in done.stdout
    assert "«…»: written by the model (--generate)" in done.stdout
    hf = in_process("compare", PROMPT, "-m", path, "--engine", "hf", "--generate", str(COUNT), "--layer", "1")
    assert hf.returncode == 0, hf.stderr
    assert f"'{labels[0]}' → each token" in hf.stdout


def test_sampling_is_seeded(saved: dict[str, Path]) -> None:
    path = str(saved["gpt2"])
    args = ("compare", PROMPT, "-m", path, "--generate", "6", "--sample", "--temperature", "2", "--json")
    one, two = in_process(*args, "--seed", "3"), in_process(*args, "--seed", "3")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["written"] == json.loads(two.stdout)["written"]
    engine = load_engine("own", path, "cpu")
    from attnviz.generation import Sampling

    expected = generate(engine, engine.tokenize(PROMPT), 6, sampling=Sampling(True, 2.0, 1.0, 3))
    assert json.loads(one.stdout)["written"] == list(expected.tokens.labels[expected.given :])  # type: ignore[union-attr]


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_export_images_of_a_generation(saved: dict[str, Path], tmp_path: Path, suffix: str) -> None:
    path = str(saved["gpt2"])
    out = tmp_path / f"g{suffix}"
    done = in_process("export", PROMPT, "-m", path, "--generate", "3", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0
    if suffix == ".svg":
        svg = out.read_text(encoding="utf-8")
        _, labels, _, _ = _written(saved["gpt2"], 3)
        assert "written by the model" in svg and all(label in svg for label in labels)
    matrix = tmp_path / f"m{suffix}"
    done = in_process("export", PROMPT, "-m", path, "--generate", "3", "--view", "matrix", "-o", str(matrix))
    assert done.returncode == 0, done.stderr


def test_export_pages_of_a_generation(saved: dict[str, Path], tmp_path: Path) -> None:
    path = str(saved["gpt2"])
    _, labels, given, _ = _written(saved["gpt2"], 3)
    page = tmp_path / "g.html"
    done = in_process("export", PROMPT, "-m", path, "--generate", "3", "-o", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text(encoding="utf-8")
    assert all(json.dumps(label)[1:-1] in html or label in html for label in labels)
    legend = f"written by the model (--generate): tokens {given}-{given + 2}, after {given} given"
    assert legend in html or json.dumps(legend)[1:-1] in html
    rows = tmp_path / "r.html"
    done = in_process("export", PROMPT, "-m", path, "--generate", "3", "--rows", "-o", str(rows))
    assert done.returncode == 0, done.stderr
    # Row mode: every written token's rows.
    assert "row mode, 3 query row(s)" in done.stderr
    page = rows.read_text(encoding="utf-8")
    assert legend in page or json.dumps(legend)[1:-1] in page


# --- refusals -----------------------------------------------------------------------

COMMANDS = {
    "compare": ("compare", PROMPT),
    "export-png": ("export", PROMPT, "-o", "{out}/x.png"),
    "export-html": ("export", PROMPT, "-o", "{out}/x.html"),
    "show": ("show", PROMPT, "--words"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("count", "needle"), [("0", "--generate 0: "), ("-3", "--generate -3: ")])
def test_a_count_below_one_is_refused_before_loading(command: str, count: str, needle: str, tmp_path: Path) -> None:
    args = [a.format(out=tmp_path) for a in COMMANDS[command]]
    done = in_process(*args, "-m", str(tmp_path / "absent"), "--generate", count)
    line = one_error_line(done_result(done), 2)
    assert needle in line and "at least 1" in line
    assert not list(tmp_path.glob("x.*"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_models_that_cannot_write_are_refused_with_the_numbers(
    command: str, saved: dict[str, Path], tmp_path: Path
) -> None:
    args = [a.format(out=tmp_path) for a in COMMANDS[command]]
    bert = in_process(*args, "-m", str(saved["bert"]), "--generate", "2")
    assert "not a decoder" in one_error_line(done_result(bert), 2)
    base = in_process(*args, "-m", str(saved["base"]), "--generate", "2")
    assert "no language-model head" in one_error_line(done_result(base), 2)
    engine = load_engine("own", str(saved["gpt2"]), "cpu")
    given, limit = len(engine.tokenize(PROMPT).ids), engine.max_positions
    long = in_process(*args, "-m", str(saved["gpt2"]), "--generate", str(limit))
    line = one_error_line(done_result(long), 2)
    assert f"the prompt's {given} tokens plus {limit} to write pass the model's {limit} positions" in line
    assert not list(tmp_path.glob("x.*"))


def test_sampling_options_without_generate_are_refused(tmp_path: Path) -> None:
    for args in (("compare", PROMPT, "--token", "cat"), ("export", PROMPT, "-o", str(tmp_path / "x.png"))):
        done = in_process(*args, "-m", str(tmp_path / "absent"), "--top-p", "0.5")
        assert "add --generate N" in one_error_line(done_result(done), 2)
    done = in_process("compare", PROMPT, "-m", str(tmp_path / "absent"), "--generate", "2", "--vs", "a dog")
    assert "--vs cannot be combined with --generate" in one_error_line(done_result(done), 2)


def done_result(done: object) -> object:
    """A ``helpers.Done`` as ``one_error_line`` reads a CliRunner result."""
    from types import SimpleNamespace

    d: object = done
    return SimpleNamespace(
        exit_code=d.returncode,  # type: ignore[attr-defined]
        stdout=d.stdout,  # type: ignore[attr-defined]
        stderr=d.stderr,  # type: ignore[attr-defined]
        output=d.stdout + d.stderr,  # type: ignore[attr-defined]
    )
