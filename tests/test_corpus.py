"""Corpora read streaming with clear errors; batched forward passes equal single ones;
the scan's scores equal an independent computation from transformers' attentions."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attnviz.corpus.detectors import DETECTORS, top_heads
from attnviz.corpus.scan import Scan, ScanOptions
from attnviz.corpus.sources import CorpusText, count_lines, induction_probe, read_coref, read_corpus
from attnviz.errors import UsageError
from attnviz.example import EXAMPLE
from attnviz.tokens import is_punctuation

from .builders import CORPUS, SPECS_BY_NAME, save_tiny

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "samples" / "minimal_pairs.tsv"
MINILM_TEXTS = [
    f"{EXAMPLE}.",
    "The cat sat on the mat, and the dog sat by the door.",
    "A small model can still show where each head looks!",
    "Paris is the capital of France; Paris is also a city of light.",
    "She read the book that he gave her yesterday.",
]


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# --- reading -------------------------------------------------------------------------


def test_text_corpus_skips_blank_lines_and_keeps_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, "c.txt", b"first text\n\n  \nsecond text\r\nthird")
    got = [(t.text, t.where) for t in read_corpus(path)]
    assert got == [("first text", f"{path}:1"), ("second text", f"{path}:4"), ("third", f"{path}:5")]
    assert count_lines(path) == 5


def test_line_count_is_only_for_regular_files(tmp_path: Path) -> None:
    # count_lines (the progress bar's total) read /dev/zero forever: `heads /dev/zero`
    # hung before its first line was read and refused (found by the fuzz).
    import os

    start = time.perf_counter()
    assert count_lines("/dev/zero") is None
    assert count_lines("x\x00y") is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert count_lines(str(fifo)) is None  # not opened: with no writer, open() would block
    assert time.perf_counter() - start < 5


def test_corpus_is_read_streaming(tmp_path: Path) -> None:
    # The bad line 3 is only met after the first texts have been handed out.
    path = write(tmp_path, "c.txt", b"one\ntwo\n\xff\xfe broken\n")
    texts = read_corpus(path)
    assert next(texts).text == "one"
    assert next(texts).text == "two"
    with pytest.raises(UsageError, match=r"c\.txt:3: not valid UTF-8 \(byte 0xff at column 1\)"):
        next(texts)


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("empty.txt", b"", r"holds no texts"),
        ("blank.txt", b"\n\n   \n", r"holds no texts"),
        ("bin.txt", b"fine\nab\x00\x01\x02\n", r"bin\.txt:2: a NUL byte at column 3: this looks like a binary file"),
        ("latin.txt", b"ok\ncaf\xe9\n", r"latin\.txt:2: not valid UTF-8 \(byte 0xe9 at column 4\)"),
        ("c.jsonl", b'{"text": "ok"}\n{"title": "x"}\n', r"c\.jsonl:2: no 'text' field \(keys: title\)"),
        ("d.jsonl", b'{"text": "ok"}\n{"text": 3}\n', r"d\.jsonl:2: 'text' is a int, not a string"),
        ("e.jsonl", b'{"text": "ok"}\n\n{"text": oops}\n', r"e\.jsonl:3: is not valid JSON"),
        ("f.jsonl", b'["text"]\n', r"f\.jsonl:1: a JSON list, not an object"),
    ],
)
def test_bad_corpora_name_the_line(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    path = write(tmp_path, name, data)
    with pytest.raises(UsageError, match=message):
        list(read_corpus(path))


def test_a_file_without_newlines_is_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnviz.corpus.sources

    monkeypatch.setattr(attnviz.corpus.sources, "MAX_LINE_BYTES", 1024)
    path = write(tmp_path, "blob.txt", b"short\n" + b"x" * 5000)
    texts = read_corpus(path)
    assert next(texts).text == "short"
    with pytest.raises(UsageError, match=r"blob\.txt:2: a line longer than"):
        next(texts)


def test_missing_corpus_and_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read corpus"):
        list(read_corpus(str(tmp_path / "nope.txt")))
    with pytest.raises(UsageError, match="is a directory"):
        list(read_corpus(str(tmp_path)))
    # A name no filesystem takes was an unchecked OSError from stat() (found by the fuzzer);
    # the message shows the first 80 characters.
    with pytest.raises(UsageError, match=r"cannot read corpus 'x{80}'…: File name too long") as info:
        list(read_corpus("x" * 2000))
    assert len(str(info.value)) < 200
    with pytest.raises(UsageError, match="a file name holds no NUL byte"):
        list(read_corpus("x\x00y"))


def test_jsonl_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "c.jsonl", b'{"text": "a b", "id": 1}\n{"text": "  "}\n{"text": "c"}\n')
    assert [t.text for t in read_corpus(path)] == ["a b", "c"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x y\nz\n")))
    assert [(t.text, t.where) for t in read_corpus("-")] == [("x y", "<stdin>:1"), ("z", "<stdin>:2")]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"text": "j"}\n')))
    assert [t.text for t in read_corpus("-", "jsonl")] == ["j"]


def test_coref_examples_from_tsv_and_jsonl(tmp_path: Path) -> None:
    examples = list(read_coref(str(PAIRS)))
    assert len(examples) == 20  # 10 pairs, sentence A and B each
    first, second = examples[0], examples[1]
    assert first.coref is not None and second.coref is not None
    assert (first.coref.pronoun, first.coref.referent, first.coref.candidates) == ("it", "animal", ("animal", "street"))
    assert second.text.endswith("too wide") and second.coref.referent == "street"
    line = {"text": "The dog chased the cat until it ran", "pronoun": "it", "referent": "dog", "candidates": ["cat"]}
    path = write(tmp_path, "p.jsonl", (json.dumps(line) + "\n").encode())
    (item,) = read_coref(path)
    assert item.coref is not None and item.coref.candidates == ("dog", "cat")
    bad = write(tmp_path, "q.jsonl", b'{"text": "x", "pronoun": "it"}\n')
    with pytest.raises(UsageError, match=r"q\.jsonl:1: no 'referent', 'candidates' field"):
        list(read_coref(bad))


def test_induction_probe_is_a_framed_sequence_repeated_twice(own_engine) -> None:
    probe = list(induction_probe(own_engine.tokenizer, count=3, length=7, seed=1))
    assert len(probe) == 3
    cls, sep = own_engine.tokenizer.token_to_id("[CLS]"), own_engine.tokenizer.token_to_id("[SEP]")
    for item in probe:
        ids = item.tokens.ids
        assert len(ids) == 16 and ids[0] == cls and ids[-1] == sep
        assert ids[1:8] == ids[8:15]
        assert item.tokens.special == (True,) + (False,) * 14 + (True,)
    again = list(induction_probe(own_engine.tokenizer, count=3, length=7, seed=1))
    assert [p.tokens.ids for p in again] == [p.tokens.ids for p in probe]


# --- batching ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "roberta", "gpt2", "llama", "distilbert"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_batched_forward_equals_each_text_alone(tmp_path: Path, name: str, engine_name: str) -> None:
    from attnviz.engines import load_engine

    engine = load_engine(engine_name, str(save_tiny(SPECS_BY_NAME[name], tmp_path / name)), "cpu")
    batch = [engine.tokenize(text) for text in CORPUS]
    lengths = {len(t) for t in batch}
    assert len(lengths) > 1, "the batch must need padding"
    out = engine.forward_batch(batch)
    for b, tokens in enumerate(batch):
        alone = engine.forward(tokens)
        n = len(tokens)
        for layer, (batched, single) in enumerate(zip(out.attentions, alone.attentions)):
            got = batched[b, :, :n, :n].numpy()
            np.testing.assert_allclose(got, single[0].numpy(), atol=1e-6, err_msg=f"{name} layer {layer} text {b}")
            # Padding keys get nothing.
            assert float(batched[b, :, :n, n:].abs().sum()) == 0.0


def test_roberta_positions_ignore_padding_whatever_the_pad_id() -> None:
    import torch

    from attnviz.architectures.bert import BertConfig
    from attnviz.architectures.roberta import RobertaEmbeddings

    emb = RobertaEmbeddings(BertConfig(vocab_size=10, hidden_size=6, num_attention_heads=2, pad_token_id=1))
    ids = torch.tensor([[0, 5, 6, 2, 0, 0]])  # padded with 0, which is <s>, not the pad id
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    assert emb.position_ids(ids, mask).tolist() == [[2, 3, 4, 5, 1, 1]]
    assert emb.position_ids(torch.tensor([[0, 5, 6, 2, 1, 1]])).tolist() == [[2, 3, 4, 5, 1, 1]]


def test_scan_in_batches_equals_one_text_at_a_time(own_engine) -> None:
    texts = [CorpusText(t, f"t:{i}") for i, t in enumerate(MINILM_TEXTS * 2)]
    layers = tuple(range(own_engine.num_layers))
    one = Scan(own_engine, ScanOptions(layers, batch_size=1)).run(texts)
    four = Scan(own_engine, ScanOptions(layers, batch_size=4, window=2)).run(texts)
    assert one.texts == four.texts == 10
    assert np.array_equal(one.heads.count, four.heads.count)
    np.testing.assert_allclose(four.heads.mean, one.heads.mean, atol=1e-6)
    np.testing.assert_allclose(four.heads.sd, one.heads.sd, atol=1e-6)


# --- against transformers ------------------------------------------------------------


def independent_scores(attentions: list[np.ndarray], ids: list[int], special: list[bool], labels: list[str]) -> dict:
    """Per-head scores of one text from transformers' (H, S, S) attentions, written as plain
    loops over queries straight from the README's definitions."""
    n = len(ids)
    queries = [i for i in range(n) if not special[i]]
    out: dict[str, np.ndarray] = {}

    def mean_over(qs: list[int], mass) -> np.ndarray:
        return np.array([[np.mean([mass(a[h], i) for i in qs]) for h in range(a.shape[0])] for a in attentions])

    out["previous"] = mean_over([i for i in queries if i >= 1], lambda a, i: a[i, i - 1])
    out["self"] = mean_over(queries, lambda a, i: a[i, i])
    out["sink"] = mean_over(queries, lambda a, i: sum(a[i, j] for j in range(n) if special[j]))
    out["punctuation"] = mean_over(
        queries, lambda a, i: sum(a[i, j] for j in range(n) if not special[j] and is_punctuation(labels[j]))
    )
    dup = [i for i in queries if any(ids[j] == ids[i] for j in range(i) if not special[j])]
    if dup:
        out["duplicate"] = mean_over(dup, lambda a, i: sum(a[i, j] for j in range(i) if ids[j] == ids[i]))
    return out


def test_minilm_previous_token_head_and_scores_match_transformers(own_engine, hf_engine) -> None:
    layers = tuple(range(own_engine.num_layers))
    texts = [CorpusText(t, f"t:{i}") for i, t in enumerate(MINILM_TEXTS)]
    report = Scan(own_engine, ScanOptions(layers, batch_size=3)).run(texts)
    best = top_heads(report.heads, "previous", 1)[0]
    assert (best.layer, best.head) == (0, 2)
    assert best.mean > 0.99
    # The same scores from transformers' own attentions, one sentence at a time.
    per_text = []
    for text in MINILM_TEXTS:
        tokens = hf_engine.tokenize(text)
        out = hf_engine.model(**_hf_inputs(hf_engine, tokens), output_attentions=True)
        attentions = [a[0].detach().numpy().astype(np.float64) for a in out.attentions]
        per_text.append(independent_scores(attentions, list(tokens.ids), list(tokens.special), list(tokens.labels)))
    for name in ("previous", "self", "sink", "punctuation", "duplicate"):
        values = np.array([s[name] for s in per_text if name in s])  # (n, N, H)
        d = DETECTORS.index(name)
        assert report.heads.count[d] == len(values), name
        np.testing.assert_allclose(report.heads.mean[d], values.mean(0), atol=1e-5, err_msg=name)
        np.testing.assert_allclose(report.heads.sd[d], values.std(0, ddof=1), atol=1e-5, err_msg=name)


def _hf_inputs(engine, tokens) -> dict:
    import torch

    ids = torch.tensor([tokens.ids])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_induction_probe_on_a_tiny_decoder_matches_transformers(tmp_path: Path, name: str) -> None:
    import torch
    from transformers import AutoModel

    from attnviz.engines import load_engine

    path = save_tiny(SPECS_BY_NAME[name], tmp_path / name)
    engine = load_engine("own", str(path), "cpu")
    length = 12
    probe = list(induction_probe(engine.tokenizer, count=6, length=length, seed=3))
    layers = tuple(range(engine.num_layers))
    report = Scan(engine, ScanOptions(layers, batch_size=4)).run(probe)
    d = DETECTORS.index("induction")
    assert report.texts == 6 and report.heads.count[d] == 6
    model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    scores = []
    for item in probe:
        ids = list(item.tokens.ids)
        with torch.no_grad():
            att = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        start = 1 if item.tokens.special[0] else 0  # llama frames with <s>, gpt2 adds nothing
        per_head = []
        for a in att:
            a = a[0].numpy().astype(np.float64)  # (H, S, S)
            qs = [i for i in range(start, len(ids)) if any(ids[j] == ids[i] for j in range(start, i - 1))]
            per_head.append(
                [
                    np.mean([sum(a[h, i, j + 1] for j in range(start, i - 1) if ids[j] == ids[i]) for i in qs])
                    for h in range(a.shape[0])
                ]
            )
        scores.append(per_head)
    np.testing.assert_allclose(report.heads.mean[d], np.mean(scores, axis=0), atol=1e-5)


def test_long_texts_are_skipped_and_counted_or_truncated(tmp_path: Path) -> None:
    from attnviz.engines import load_engine

    engine = load_engine("own", str(save_tiny(SPECS_BY_NAME["bert"], tmp_path / "bert")), "cpu")
    long = " ".join(["the cat sat on the mat"] * 20)  # 120 words > 64 positions
    texts = [CorpusText("the cat sat", "c:1"), CorpusText(long, "c:2"), CorpusText("a dog", "c:3")]
    layers = (0, 1)
    skipped = Scan(engine, ScanOptions(layers)).run(texts)
    assert (skipped.texts, skipped.skipped, skipped.skipped_where, skipped.truncated) == (2, 1, ("c:2",), 0)
    scan = Scan(engine, ScanOptions(layers, truncate=True))
    prepared = scan.tokenize(texts[1])
    assert prepared is not None and len(prepared.tokens) == 64
    assert prepared.tokens.pieces[0] == "[CLS]" and prepared.tokens.pieces[-1] == "[SEP]"
    truncated = Scan(engine, ScanOptions(layers, truncate=True)).run(texts)
    assert (truncated.texts, truncated.skipped, truncated.truncated) == (3, 0, 1)


def test_coreference_accuracy_matches_transformers(own_engine, hf_engine) -> None:
    layers = tuple(range(own_engine.num_layers))
    examples = list(read_coref(str(PAIRS)))
    report = Scan(own_engine, ScanOptions(layers, batch_size=8)).run(examples)
    assert report.coref is not None and report.coref.total == 20
    hits = np.zeros((len(layers), own_engine.num_heads))
    nearest = 0
    for item in examples:
        tokens = hf_engine.tokenize(item.text)
        prepared = Scan(hf_engine, ScanOptions(layers)).tokenize(item)
        coref = prepared.coref
        out = hf_engine.model(**_hf_inputs(hf_engine, tokens), output_attentions=True)
        for n, a in enumerate(out.attentions):
            rows = a[0].detach().numpy()[:, list(coref.pronoun), :].mean(1)  # (H, S)
            for h in range(rows.shape[0]):
                ranked = [j for j in np.argsort(-rows[h], kind="stable") if not tokens.special[j]]
                ranked = [j for j in ranked if j not in coref.pronoun]
                hits[n, h] += ranked[0] in coref.referent
        p = coref.pronoun[0]
        nearest += min(coref.candidates, key=lambda c: (min(abs(p - i) for i in c), c[0])) == coref.referent
    np.testing.assert_array_equal(report.coref.hits, hits)
    assert report.coref.baseline == nearest / 20


def test_interrupted_scan_reports_whole_batches_only(own_engine) -> None:
    layers = (0,)

    def texts():
        for i in range(10):
            if i == 6:
                raise KeyboardInterrupt
            yield CorpusText(MINILM_TEXTS[i % len(MINILM_TEXTS)], f"t:{i}")

    scan = Scan(own_engine, ScanOptions(layers, batch_size=2, window=1))
    with pytest.raises(KeyboardInterrupt):
        scan.run(texts())
    report = scan.report(partial=True)
    assert report.partial and report.texts == 6
    assert report.heads.count[DETECTORS.index("previous")] == 6
