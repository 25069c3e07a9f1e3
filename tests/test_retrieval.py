"""Retrieval and copy scores (measures/retrieval.py, corpus/needles.py, heads --probe
retrieval): the rule on hand-worked rows; the scores against transformers' own
generate(output_attentions=True) with Wu et al.'s rule applied by hand; a planted case on
the sample model (its indirect-object circuit copies the name); the command line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnviz.corpus.needles import NeedleSpec, cases, parts, run_probe, score_case  # noqa: E402
from attnviz.engines import load_engine  # noqa: E402
from attnviz.generation import generate  # noqa: E402
from attnviz.measures.retrieval import (  # noqa: E402
    choosing_keys,
    copy_scores,
    parse_depths,
    parse_lengths,
    retrieval_counts,
)
from tests.builders import SPECS_BY_NAME, save_tiny  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "circuits-2l"
NEEDLE_FILE = Path(__file__).resolve().parents[1] / "samples" / "needle_ioi.json"
IOI = "When Mary and John went to the store , John gave a drink to"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval")
    return {name: save_tiny(SPECS_BY_NAME[name], root / name) for name in ("llama", "gpt2", "bert")}


def _written(prompt: list[int], ids: list[int], first: np.ndarray, rows: list[np.ndarray]) -> SimpleNamespace:
    return SimpleNamespace(prompt=SimpleNamespace(ids=prompt), ids=ids, first_rows=first, rows=rows)


def test_the_rule_on_hand_worked_rows() -> None:
    # Prompt 5 7 9 4 (needle 7 9 at [1, 3)); 1 layer, 2 heads; written 7, 9, 5.
    prompt = [5, 7, 9, 4]
    first = np.array([[[0.1, 0.6, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]]])  # h0 -> key 1 (7), h1 -> key 0 (5)
    after_7 = np.array([[[0.1, 0.1, 0.5, 0.2, 0.1], [0.0, 0.0, 0.0, 0.0, 1.0]]])  # h0 -> 2 (9); h1 -> 4 (7)
    after_9 = np.array([[[0.9, 0, 0, 0, 0, 0.1], [0, 0, 0, 0, 0, 1.0]]])  # h0 -> 0 (5); h1 -> 5 (9)
    gen = _written(prompt, [7, 9, 5], first, [after_7, after_9, np.zeros((1, 2, 7))])
    # Step 1 writes 7: h0's key 1 holds 7 inside the needle; h1's key 0 holds 5.
    # Step 2 writes 9: h0's key 2 holds 9 inside; h1's key 4 (the written 7) does not hold 9.
    # Step 3 writes 5: h0's key 0 holds 5 but outside the needle; h1's key 5 holds 9.
    np.testing.assert_array_equal(retrieval_counts(gen, (1, 3)), [[2, 0]])
    np.testing.assert_allclose(copy_scores(gen), [[1.0, 0.0]])
    keys = choosing_keys(gen)
    assert [k.tolist() for k in keys] == [[[1, 0]], [[2, 4]], [[0, 5]]]
    # Rows kept as strongest keys already give the same.
    kept = _written(prompt, [7, 9, 5], first.argmax(-1), [after_7.argmax(-1), after_9.argmax(-1), np.zeros((1, 2))])
    np.testing.assert_array_equal(retrieval_counts(kept, (1, 3)), [[2, 0]])


def test_lengths_and_depths_parse() -> None:
    assert parse_lengths("1k, 4k,32K,500") == (1024, 4096, 32768, 500)
    assert parse_depths("0,0.25,1") == (0.0, 0.25, 1.0)
    for bad in ("0", "k", "1.5k", "-3"):
        with pytest.raises(ValueError):
            parse_lengths(bad)
    with pytest.raises(ValueError, match="not a depth"):
        parse_depths("0,1.5")


def test_cases_put_the_needle_at_each_depth(saved: dict[str, Path]) -> None:
    engine = load_engine("own", str(saved["llama"]), "cpu")
    spec = NeedleSpec((24, 40), (0.0, 0.5, 1.0), needle_length=4, seed=3)
    p = parts(engine.tokenizer, spec)
    built = list(cases(p, spec))
    assert [(c.length, c.depth) for c in built] == [(a, b) for a in range(2) for b in range(3)]
    for c in built:
        assert len(c.ids) == spec.lengths[c.length]
        assert c.ids[c.span[0] : c.span[1]] == c.needle == p.needle and len(c.needle) == 4
        assert c.ids[c.span[0] - 2 : c.span[0]] == c.ids[-2:] == p.key  # the key asks for the needle
        # The haystack holds no needle or key token: a copy of the needle comes from the needle.
        rest = c.ids[len(p.prefix) : c.span[0] - 2] + c.ids[c.span[1] : -2]
        assert not set(rest) & set(p.needle + p.key)
    assert built[0].span[0] == len(p.prefix) + 2 and built[2].span[1] == len(built[2].ids) - 2


def _by_hand(path: Path, ids: tuple[int, ...], count: int, span: tuple[int, int]) -> tuple[list[int], np.ndarray]:
    """transformers' greedy generate with every step's weights; Wu et al.'s rule by loops."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=count,
            do_sample=False,
            output_attentions=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    sequence = out.sequences[0].tolist()
    written = sequence[len(ids) :]
    layers, heads = len(out.attentions[0]), out.attentions[0][0].size(1)
    counts = np.zeros((layers, heads), dtype=int)
    for step, token in enumerate(written):
        for layer in range(layers):
            for head in range(heads):
                key = int(out.attentions[step][layer][0, head, -1].argmax())
                if span[0] <= key < span[1] and sequence[key] == token:
                    counts[layer, head] += 1
    return written, counts


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_scores_equal_transformers_generate_by_hand(saved: dict[str, Path], name: str) -> None:
    engine = load_engine("own", str(saved[name]), "cpu")
    spec = NeedleSpec((24, 48), (0.0, 0.5, 1.0), needle_length=4, seed=1)
    report = run_probe(engine, spec, tuple(engine.shape.layers))
    assert report.cases == 6 and not report.partial
    for case in cases(parts(engine.tokenizer, spec), spec):
        written, counts = _by_hand(saved[name], case.ids, len(case.needle), case.span)
        got = score_case(engine, case, tuple(engine.shape.layers))
        np.testing.assert_array_equal(got.counts, counts)
        np.testing.assert_allclose(report.scores[case.length, case.depth], counts / 4)
        assert got.copied == sum(w == n for w, n in zip(written, case.needle, strict=False))
    # The strongest keys themselves (not only the counts, which a random model keeps near 0).
    case = next(cases(parts(engine.tokenizer, spec), spec))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(saved[name]), attn_implementation="eager").eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([case.ids]), max_new_tokens=4, do_sample=False, output_attentions=True,
            return_dict_in_generate=True, pad_token_id=0,
        )  # fmt: skip
    tokens = __import__("attnviz.corpus.needles", fromlist=["case_tokens"]).case_tokens(engine, case)
    gen = generate(engine, tokens, 4, keep=lambda rows: rows.argmax(-1))
    for step, keys in enumerate(choosing_keys(gen)):
        expected = torch.stack([a[0, :, -1].argmax(-1) for a in out.attentions[step]]).numpy()
        np.testing.assert_array_equal(keys, expected)


def test_planted_the_sample_models_name_mover_copies_the_name() -> None:
    """circuits-2l writes the indirect object ("Mary", its card's IOI accuracy 1.0); the head
    whose strongest key is "Mary" as it writes it is a copy head, found by hand with
    transformers, and the only head the rule counts for a needle "Mary and John"."""
    engine = load_engine("own", str(SAMPLE), "cpu")
    tokens = engine.tokenize(IOI)
    gen = generate(engine, tokens, 1)
    assert gen.pieces == ["Mary"]
    mary = tokens.pieces.index("Mary")
    written, counts = _by_hand(SAMPLE, tokens.ids, 1, (mary, mary + 3))
    assert written == gen.ids
    np.testing.assert_array_equal(retrieval_counts(gen, (mary, mary + 3)), counts)
    assert counts.sum() >= 1  # at least one head copies the name
    np.testing.assert_allclose(gen.copy_scores(), counts)  # one step: every copy here is of "Mary"


def test_heads_probe_retrieval_on_the_sample_model(tmp_path: Path) -> None:
    from tests.helpers import in_process

    args = ("heads", "--probe", "retrieval", "-m", str(SAMPLE), "--needle-file", str(NEEDLE_FILE))
    done = in_process(*args, "--lengths", "24,40", "--depths", "0,1", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    engine = load_engine("own", str(SAMPLE), "cpu")
    spec = NeedleSpec((24, 40), (0.0, 1.0), file=NEEDLE_FILE)
    report = run_probe(engine, spec, (0, 1))
    assert doc["cases"] == 4 and doc["lengths"] == [24, 40] and doc["needle_tokens"] == 4
    best = doc["heads"][0]
    top = report.ranking(1)[0]
    assert (best["layer"], best["head"]) == top
    assert best["cases"] == np.round(report.head_depths(*top), 6).tolist()
    assert best["score"] > 0  # the name mover copies "Mary" out of the needle at depth 0
    table = in_process(*args, "--lengths", "24,40", "--depths", "0,1", "--top", "2")
    assert table.returncode == 0
    assert f"L{top[0]} h{top[1]}" in table.stdout and "length × depth" in table.stdout


def _result(done: object) -> object:
    d = done
    return SimpleNamespace(
        exit_code=d.returncode,  # type: ignore[attr-defined]
        stdout=d.stdout,  # type: ignore[attr-defined]
        stderr=d.stderr,  # type: ignore[attr-defined]
        output=d.stdout + d.stderr,  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ("--lengths", "32,60"),
            "a prompt of 60 tokens plus the 8-token needle written after it passes the model's 64",
        ),
        (("--lengths", "1.5k"), "--lengths '1.5k': '1.5k' is not a positive number of tokens"),
        (("--depths", "0,2"), "--depths '0,2': 2 is not a depth in [0, 1]"),
        (("--csv",), "--csv cannot be combined with --probe retrieval"),
        (("--lengths", "8"), "a prompt of 8 tokens cannot hold the 12 tokens of needle, key and question"),
    ],
)
def test_refusals_with_the_numbers(saved: dict[str, Path], extra: tuple[str, ...], needle: str) -> None:
    from tests.helpers import in_process, one_error_line

    done = in_process("heads", "--probe", "retrieval", "-m", str(saved["gpt2"]), "--depths", "0", *extra)
    assert needle in one_error_line(_result(done), 2)


def test_refusals_of_models_that_do_not_write(saved: dict[str, Path], tmp_path: Path) -> None:
    from transformers import GPT2Model

    from tests.helpers import in_process, one_error_line

    bert = in_process("heads", "--probe", "retrieval", "-m", str(saved["bert"]), "--lengths", "16")
    assert "not a decoder" in one_error_line(_result(bert), 2)
    bare = tmp_path / "bare"
    GPT2Model.from_pretrained(str(saved["gpt2"])).save_pretrained(bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).write_bytes((saved["gpt2"] / name).read_bytes())
    done = in_process("heads", "--probe", "retrieval", "-m", str(bare), "--lengths", "16", "--needle-length", "2")
    assert "no language-model head" in one_error_line(_result(done), 2)
    stray = in_process("heads", "--probe", "induction", "-m", str(saved["gpt2"]), "--lengths", "16")
    assert "belong to --probe retrieval" in one_error_line(_result(stray), 2)


def test_show_generate_json_has_the_copy_scores(saved: dict[str, Path]) -> None:
    from tests.helpers import in_process

    done = in_process("show", IOI, "-m", str(SAMPLE), "--generate", "3", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    engine = load_engine("own", str(SAMPLE), "cpu")
    gen = generate(engine, engine.tokenize(IOI), 3)
    np.testing.assert_allclose(doc["copy_scores"], gen.copy_scores(), atol=1e-6)
    # By hand from the rows in the document: step i's choosing row is the previous token's.
    tokens = [*engine.tokenize(IOI).ids, *gen.ids]
    first = np.asarray(gen.first_rows).argmax(-1)
    keys = [first] + [np.asarray(s["rows"]).argmax(-1) for s in doc["steps"][:-1]]
    hand = np.mean([np.asarray(tokens)[k] == w for k, w in zip(keys, gen.ids, strict=True)], axis=0)
    np.testing.assert_allclose(doc["copy_scores"], hand, atol=1e-6)


def test_ray_equals_the_local_probe(saved: dict[str, Path]) -> None:
    pytest.importorskip("ray")
    engine = load_engine("own", str(saved["llama"]), "cpu")
    spec = NeedleSpec((24, 40), (0.0, 1.0), needle_length=3)
    local = run_probe(engine, spec, (0, 1))
    worker = {"model": str(saved["llama"]), "engine": "own", "dtype": "float32"}
    remote = run_probe(engine, spec, (0, 1), ray="local", worker=worker)
    assert remote.cases == local.cases == 4
    np.testing.assert_array_equal(remote.scores, local.scores)
    np.testing.assert_array_equal(remote.copied, local.copied)


def test_python_api_is_the_probe(saved: dict[str, Path]) -> None:
    import attnviz

    got = attnviz.retrieval(str(saved["llama"]), lengths=[24], depths=[0, 1], needle_length=3, seed=2, layers="1")
    engine = load_engine("own", str(saved["llama"]), "cpu")
    expected = run_probe(engine, NeedleSpec((24,), (0.0, 1.0), needle_length=3, seed=2), (1,))
    assert got.layers == (1,) and got.cases == 2
    np.testing.assert_array_equal(got.scores, expected.scores)
    with pytest.raises(attnviz.UsageError, match="passes the model's 64 positions"):
        attnviz.retrieval(str(saved["llama"]), lengths=[60], depths=[0])
    with pytest.raises(attnviz.UsageError, match="not scan"):
        attnviz.scan(probe="retrieval", model=str(saved["llama"]))
