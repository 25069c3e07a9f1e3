"""``attnviz heads`` end to end: outputs, errors, Ctrl-C, the image, import rules, Ray."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.corpus.detectors import DETECTORS

from .builders import CORPUS, SPECS_BY_NAME, save_tiny
from .helpers import one_error_line
from .test_corpus import MINILM_TEXTS

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["heads", *args], env={"NO_COLOR": "1", "COLUMNS": "200"})


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("bert")))


@pytest.fixture()
def corpus(tmp_path: Path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return str(path)


def test_minilm_json_ranks_layer_0_head_2_first_on_previous(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("\n".join(MINILM_TEXTS) + "\n", encoding="utf-8")
    result = run(str(path), "--json", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # no progress bar outside a terminal, nothing else either
    data = json.loads(result.stdout)
    assert data["texts"] == 5 and data["partial"] is False
    assert len(data["scores"]) == len(DETECTORS) * 6 * 12
    prev = sorted((r for r in data["scores"] if r["detector"] == "previous"), key=lambda r: -r["mean"])
    assert (prev[0]["layer"], prev[0]["head"], prev[0]["n"]) == (0, 2, 5)
    assert prev[0]["mean"] > 0.99
    assert set(data["scores"][0]) == {"layer", "head", "detector", "mean", "sd", "n"}


def test_terminal_table_csv_and_json_agree(tiny_bert: str, corpus: str) -> None:
    table = run(corpus, "--model", tiny_bert, "--top", "2")
    assert table.exit_code == 0, table.output
    out = table.stdout
    assert "5 texts" in out
    for name in DETECTORS:
        assert name in out
    data = json.loads(run(corpus, "--model", tiny_bert, "--json").stdout)
    text = run(corpus, "--model", tiny_bert, "--csv").stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(data["scores"]) == len(DETECTORS) * 2 * 3
    for row, ref in zip(rows, data["scores"]):
        assert (int(row["layer"]), int(row["head"]), row["detector"], int(row["n"])) == (
            ref["layer"],
            ref["head"],
            ref["detector"],
            ref["n"],
        )
        assert float(row["mean"]) == ref["mean"] and float(row["sd"]) == ref["sd"]
    # The table's first head on "previous" is the JSON's best.
    best = max((r for r in data["scores"] if r["detector"] == "previous"), key=lambda r: r["mean"])
    line = next(line for line in out.splitlines() if line.startswith("previous"))
    assert f"L{best['layer']} h{best['head']} {best['mean']:.2f}" in line


def test_image_has_one_panel_per_detector_with_the_means(tiny_bert: str, corpus: str, tmp_path: Path) -> None:
    from attnviz.corpus.scan import Scan, ScanOptions
    from attnviz.corpus.sources import read_corpus
    from attnviz.engines import engine_provenance, load_engine
    from attnviz.render.image.heads import heads_figure

    engine = load_engine("own", tiny_bert, "cpu")
    report = Scan(engine, ScanOptions((0, 1))).run(read_corpus(corpus))
    fig = heads_figure(report, engine_provenance(engine))
    panels = [ax for ax in fig.axes if ax.images][: len(DETECTORS)]
    assert len(panels) == len(DETECTORS)
    for d, ax in enumerate(panels):
        assert ax.get_title(loc="left").startswith(DETECTORS[d])
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), np.clip(report.heads.mean[d], 0, 1))
    out = tmp_path / "heads.png"
    result = run(corpus, "--model", tiny_bert, "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_output_and_usage_fail_before_loading_a_model(corpus: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-model")
    assert "cannot tell the format" in one_error_line(run(corpus, "--model", missing, "-o", "x.gif"), 2)
    assert "no texts to scan" in one_error_line(run("--model", missing), 2)
    assert "not both" in one_error_line(run(corpus, "--probe", "induction", "--model", missing), 2)
    assert "unknown probe" in one_error_line(run("--probe", "copying", "--model", missing), 2)
    assert "pick one" in one_error_line(run(corpus, "--json", "--csv", "--model", missing), 2)


def test_a_bad_corpus_line_is_one_error_with_its_number(tiny_bert: str, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"text": "the cat sat"}\n{"body": "x"}\n')
    line = one_error_line(run(str(path), "--model", tiny_bert), 2)
    assert f"{path}:2: no 'text' field" in line
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert "holds no texts" in one_error_line(run(str(empty), "--model", tiny_bert), 2)


def test_long_texts_are_reported_on_stderr(tiny_bert: str, tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("the cat sat\n" + "the cat sat on the mat " * 20 + "\n", encoding="utf-8")
    skipped = run(str(path), "--model", tiny_bert, "--json")
    assert skipped.exit_code == 0, skipped.output
    assert json.loads(skipped.stdout)["skipped"] == 1
    assert f"skipped 1 text(s) longer than the model's 64 positions ({path}:2); --truncate" in skipped.stderr
    cut = run(str(path), "--model", tiny_bert, "--json", "--truncate")
    assert json.loads(cut.stdout)["truncated"] == 1 and "truncated 1 text(s) to 64 tokens" in cut.stderr


def test_induction_probe_on_a_tiny_llama(tmp_path: Path) -> None:
    path = str(save_tiny(SPECS_BY_NAME["llama"], tmp_path / "llama"))
    result = run("--probe", "induction", "--probe-texts", "4", "--probe-length", "8", "--model", path, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["texts"] == 4
    induction = [r for r in data["scores"] if r["detector"] == "induction"]
    assert len(induction) == 2 * 4 and all(r["n"] == 4 and 0 <= r["mean"] <= 1 for r in induction)
    too_long = run("--probe", "induction", "--probe-length", "40", "--model", path)
    assert "use --probe-length 31 or less" in one_error_line(too_long, 2)


def test_coreference_with_pairs(tiny_bert: str, tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        {"text": "the cat sat on the mat and it sat", "pronoun": "it", "referent": "cat", "candidates": ["mat"]},
        {"text": "the dog sat by the door", "pronoun": "dog", "referent": "door", "candidates": ["door"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    data = json.loads(run("--pairs", str(path), "--model", tiny_bert, "--json").stdout)
    coref = data["coreference"]
    assert coref["examples"] == 2
    # Nearest candidate: "mat" (wrong) for the first, "door" (right) for the second.
    assert coref["baseline_nearest"] == 0.5
    assert len(coref["heads"]) == 2 * 3 and {r["n"] for r in coref["heads"]} == {2}
    table = run("--pairs", str(path), "--model", tiny_bert).stdout
    assert "nearest candidate" in table and "0.50" in table


def test_ctrl_c_reports_the_texts_done_marked_partial(
    tiny_bert: str, corpus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnviz.corpus.scan

    real = attnviz.corpus.scan.score_batch
    calls = {"n": 0}

    def interrupted_second_time(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(attnviz.corpus.scan, "score_batch", interrupted_second_time)
    out = tmp_path / "heads.svg"
    result = run(corpus, "--model", tiny_bert, "--batch-size", "2", "--json", "-o", str(out))
    assert result.exit_code == 130, result.output
    data = json.loads(result.stdout)
    assert data["partial"] is True and data["texts"] == 2
    assert "interrupted: the results cover the first 2 texts (partial)" in result.stderr
    assert out.read_text(encoding="utf-8").rstrip().endswith("</svg>")
    # Interrupted before any batch finished: nothing to report, nothing written.
    calls["n"] = 1
    early = tmp_path / "early.svg"
    result = run(corpus, "--model", tiny_bert, "--batch-size", "8", "-o", str(early))
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert not early.exists() and list(tmp_path.glob(".early*")) == []


@pytest.fixture(scope="module")
def local_ray(own_engine):
    """One local Ray instance for the module's Ray tests, started by RayScan's own start-up
    (each start costs ~15 s of the suite's 2 cores; a RayScan that finds Ray running uses
    it and leaves it running)."""
    ray = pytest.importorskip("ray")
    from attnviz.corpus.distributed import RayScan
    from attnviz.corpus.scan import ScanOptions

    assert RayScan(own_engine, ScanOptions((0,)), None, device="cpu")._start()
    yield ray
    ray.shutdown()


def test_ray_path_equals_the_local_scan(own_engine, local_ray) -> None:
    """On the local Ray instance: the merged accumulators of the workers equal the
    single-process scan."""
    from attnviz.corpus.distributed import RayScan
    from attnviz.corpus.scan import Scan, ScanOptions
    from attnviz.corpus.sources import CorpusText, read_coref

    texts = [CorpusText(t, f"t:{i}") for i, t in enumerate(MINILM_TEXTS * 2)]
    pairs = list(read_coref(str(Path(__file__).resolve().parents[1] / "samples" / "minimal_pairs.tsv")))[:4]
    options = ScanOptions((0, 3), batch_size=4, window=1)
    local = Scan(own_engine, options).run(texts + pairs)
    # 4 batches, two out at a time on the one actor: merged as they come back.
    remote = RayScan(own_engine, options, None, device="cpu").run(texts + pairs)
    assert remote.texts == local.texts == 14
    np.testing.assert_array_equal(remote.heads.count, local.heads.count)
    np.testing.assert_allclose(remote.heads.mean, local.heads.mean, atol=1e-9)
    np.testing.assert_allclose(remote.heads.sd, local.heads.sd, atol=1e-9)
    assert remote.coref is not None and local.coref is not None
    np.testing.assert_array_equal(remote.coref.hits, local.coref.hits)


def test_ray_path_ablation_equals_the_local_scan(own_engine, local_ray) -> None:
    """heads --ablate --ray, on the local Ray instance: the workers' merged effect
    accumulators (zero-ablation, and mean-ablation with the corpus means shipped in the
    options) equal the single-process scan's, and the scan's own numbers are
    ablation.token_effects'."""
    from dataclasses import replace

    from attnviz.corpus.distributed import RayScan
    from attnviz.corpus.scan import Scan, ScanOptions
    from attnviz.corpus.sources import CorpusText
    from attnviz.measures.ablation import corpus_head_means, token_effects

    texts = [CorpusText(t, f"t:{i}") for i, t in enumerate(MINILM_TEXTS)]
    zero = ScanOptions((1, 4), batch_size=2, window=1, ablate="zero")
    means = corpus_head_means(own_engine, [own_engine.tokenize(t) for t in MINILM_TEXTS])  # (N, H, D)
    mean = replace(zero, ablate="mean", fill=means)
    for options in (zero, mean):
        local = Scan(own_engine, options).run(texts)
        remote = RayScan(own_engine, options, None, device="cpu").run(texts)  # 3 batches
        assert local_ray.is_initialized()  # the instance was used, not stopped
        assert remote.texts == local.texts == len(MINILM_TEXTS)
        np.testing.assert_array_equal(remote.heads.count, local.heads.count)
        np.testing.assert_allclose(remote.heads.mean, local.heads.mean, atol=1e-9)
        np.testing.assert_allclose(remote.heads.sd, local.heads.sd, atol=1e-9)
        # The local scan against the effects text by text (every real token is a sample).
        samples = [
            token_effects(own_engine, own_engine.tokenize(t), (1, 4), options.ablate, options.fill, "all")
            for t in MINILM_TEXTS
        ]
        every = np.concatenate(samples)  # (T, 2, H): every real token of every text
        a = local.heads.detectors.index("ablation")  # after the detectors (issue 39)
        assert int(local.heads.count[a]) == len(every)
        np.testing.assert_allclose(local.heads.mean[a], every.mean(0), atol=1e-9)
        np.testing.assert_allclose(local.heads.sd[a], every.std(0, ddof=1), atol=1e-9)
        assert every.max() > 0.01  # heads that matter: the comparison is not of zeros


def test_a_local_ray_that_does_not_come_up_is_one_line(
    tiny_bert: str, corpus: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray raises a bare Exception when its node misses its 30 s start-up (seen on 2 busy
    cores): one runtime error line with a hint, not an internal error."""
    ray = pytest.importorskip("ray")
    shut: list[bool] = []

    def slow_node(*args: object, **kwargs: object) -> None:
        raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "init", slow_node)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    line = one_error_line(run(corpus, "--model", tiny_bert, "--ray"), 1)
    assert "Ray could not start a local instance: The current node timed out during startup" in line
    assert "try again, or run without --ray" in line and shut == [True]
