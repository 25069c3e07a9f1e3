"""The memory estimate counts what comes after the pass (issue 25): ``show --all-tokens
--json`` at 8k tokens passed the forward pass's estimate and then died writing the JSON;
``heads`` on one 8k-token text reached 9.7 GB with no estimate and no ``--max-memory``.
Both now refuse with exit 2 and one line naming the estimate and the budget, before the
forward pass; a ``heads`` batch over the budget is split, and scores the same."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attnviz.corpus.scan import Scan, ScanOptions
from attnviz.corpus.sources import CorpusText
from attnviz.engines import load_engine, memory
from attnviz.engines.memory import MemoryBudgetError
from attnviz.pipeline import Selection, run

from .helpers import Done, in_process, save_tiny_bert

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "ran", "to", "the", "big", "red", "door"]
TEXT = " ".join(WORDS * 4)  # ~58 tokens of the tiny BERT's 64 positions


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("memout") / "bert")


@pytest.fixture(scope="module")
def eng(bert_dir: Path):  # type: ignore[no-untyped-def]
    return load_engine("own", str(bert_dir), "cpu")


def attnviz(*args: str) -> Done:
    return in_process(*args)


def one_line(result: Done, code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: "), result.stderr
    return lines[0]


def test_each_output_costs_its_bytes_per_kept_weight(eng) -> None:  # type: ignore[no-untyped-def]
    n, layers = 50, [0, 1]
    kept = len(layers) * eng.num_heads * n * n  # every row: (N, H, S, S) floats
    bare = memory.estimate(eng.shape, eng.sizes, n, layers, None)
    assert bare.output == 0 and bare.total == bare.forward
    for writes, per in ((("json",), 4), (("json-plain",), 64), (("npz",), 6), (("json", "npz"), 10)):
        est = memory.estimate(eng.shape, eng.sizes, n, layers, None, writes)
        assert est.forward == bare.forward
        assert est.output == per * kept
    one = memory.estimate(eng.shape, eng.sizes, n, layers, 1, ("json",))
    assert one.output == 4 * len(layers) * eng.num_heads * n  # one query: its rows only
    with pytest.raises(ValueError, match="unknown outputs"):
        memory.estimate(eng.shape, eng.sizes, n, layers, None, ("csv",))


def test_the_json_is_counted_before_the_forward_pass(eng, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    tokens = eng.tokenize(TEXT)
    layers = list(range(eng.num_layers))
    est = memory.estimate(eng.shape, eng.sizes, len(tokens), layers, None, ("json",))
    calls: list[int] = []
    real = eng.forward
    monkeypatch.setattr(eng, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    budget = est.forward + est.output // 2  # the pass fits, the pass and its JSON do not
    with pytest.raises(MemoryBudgetError, match="to write the JSON") as err:
        run(tokens, eng, Selection(writes=("json",)), max_memory=budget)
    assert calls == []
    assert err.value.facts["need"] == est.total and err.value.facts["room"] == budget
    assert run(tokens, eng, Selection(), max_memory=budget).attention.weights.shape[2] == len(tokens)
    assert calls == [1]


def test_show_all_tokens_json_over_the_budget_is_one_line(bert_dir: Path, eng) -> None:  # type: ignore[no-untyped-def]
    n = len(eng.tokenize(TEXT))
    layers = list(range(eng.num_layers))
    json_est = memory.estimate(eng.shape, eng.sizes, n, layers, None, ("json",))
    bare = memory.estimate(eng.shape, eng.sizes, n, layers, None)
    budget = (json_est.total + bare.total) // 2  # the pass fits, the pass and its JSON do not
    base = ["show", TEXT, "--all-tokens", "--model", str(bert_dir), "--max-memory", str(budget)]
    line = one_line(attnviz(*base, "--json"), 2)
    assert "with its JSON needs about" in line and "to write the JSON" in line
    assert f"the budget of {memory.human(budget)}" in line and "--max-memory SIZE overrides" in line
    base[-1] = str(json_est.total + 1024)  # a budget the estimate fits runs, and writes the JSON
    ok = attnviz(*base, "--json")
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["weights"]) == len(layers)


def test_heads_one_text_over_the_budget_is_one_line(bert_dir: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "one.txt"
    corpus.write_text(TEXT + "\n")
    line = one_line(attnviz("heads", str(corpus), "--model", str(bert_dir), "--max-memory", "1KB", "--json"), 2)
    assert f"scanning text {corpus}:1 (" in line and " tokens) needs about " in line
    assert "the budget of 1.0 KB" in line and "--max-memory SIZE overrides" in line
    bad = one_line(attnviz("heads", str(corpus), "--model", str(bert_dir), "--max-memory", "lots"), 2)
    assert "cannot read the memory size 'lots'" in bad


def test_heads_refuses_before_the_forward_pass(eng, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[int] = []
    real = eng.forward_batch
    monkeypatch.setattr(eng, "forward_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    scan = Scan(eng, ScanOptions((0, 1), max_memory=1024))
    with pytest.raises(MemoryBudgetError, match=r"scanning text t:0 \(\d+ tokens\)"):
        scan.run([CorpusText(TEXT, "t:0")])
    assert calls == []


def test_a_batch_over_the_budget_is_split_and_scores_the_same(eng, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    texts = [CorpusText(" ".join(WORDS[i:] + WORDS[:i]) * 2, f"t:{i}") for i in range(8)]
    sizes: list[int] = []
    real = eng.forward_batch
    monkeypatch.setattr(eng, "forward_batch", lambda batch, **k: sizes.append(len(batch)) or real(batch, **k))
    whole = Scan(eng, ScanOptions((0, 1), batch_size=8, max_memory=2**40)).run(texts)
    assert sizes == [8]
    longest = max(len(eng.tokenize(t.text)) for t in texts)
    detectors = len(ScanOptions((0, 1)).config.detectors)
    two = memory.estimate_scan(eng.shape, eng.sizes, 2, longest, 2, detectors).total
    sizes.clear()
    split = Scan(eng, ScanOptions((0, 1), batch_size=8, max_memory=two)).run(texts)
    assert sizes == [2, 2, 2, 2]  # halved until each half fits
    assert split.texts == whole.texts == 8
    np.testing.assert_array_equal(split.heads.count, whole.heads.count)
    np.testing.assert_allclose(split.heads.mean, whole.heads.mean, atol=1e-9)


def test_show_all_tokens_json_peak_stays_within_its_estimate(tmp_path: Path) -> None:
    """Issue 38: `show --all-tokens --json` at 8k tokens peaked at 4.9 GB, past the estimate
    it printed: beside the document it built a dict per query it never wrote (1.6 GB over
    the 10-token run's peak at 2,048 tokens where 580 MiB was estimated). A child process's
    peak RSS over a 3-token run's, at 1,200 tokens of a tiny Llama, is within the estimate."""
    import subprocess
    import sys

    from .builders import SPECS_BY_NAME, copy_with_config, save_tiny

    base = save_tiny(SPECS_BY_NAME["llama"], tmp_path / "base")
    model = copy_with_config(base, tmp_path / "long", max_position_embeddings=2048)
    long_text = tmp_path / "long.txt"
    long_text.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(1199)))
    probe = (
        "import resource, sys\n"
        "from attnviz.cli import app\n"
        "try:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(f'PEAK {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
    )

    def peak(*args: str) -> int:
        cmd = [sys.executable, "-c", probe, "show", *args, "--all-tokens", "--json", "--model", str(model)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.stdout.startswith("{"), done.stderr[-500:]
        return int(done.stderr.rsplit("PEAK ", 1)[1]) * 1024

    over = peak("--file", str(long_text)) - peak("the cat sat")
    eng = load_engine("own", str(model), "cpu")
    n = len(eng.tokenize(long_text.read_text()))
    est = memory.estimate(eng.shape, eng.sizes, n, list(range(eng.num_layers)), None, ("json",))
    assert n == 1200 and over <= est.total, (memory.human(over), memory.human(est.total))
