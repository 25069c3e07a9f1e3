"""``heads`` scores a block of query rows at a time (issue 38): one 8,183-token text took
9.7 GB as whole (1, H, S, S) float64 matrices and each detector's (S, S) targets. The own
engine now streams each layer's rows to the detectors (nn.rows.streaming) and the detectors
score a block at a time (corpus.detectors.BlockScorer); the scores are those of whole
matrices, held here to transformers' eager weights scored the whole-matrix way."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from attnviz.corpus import detectors
from attnviz.corpus.detectors import DETECTORS, DetectorConfig, HeadAccumulator, detector_masks, features
from attnviz.corpus.scan import Scan, ScanOptions
from attnviz.corpus.sources import CorpusText
from attnviz.engines import load_engine, memory
from attnviz.nn import rows

from .builders import SPECS_BY_NAME, copy_with_config, save_tiny

WORDS = ["the", "cat", "sat", "on", "a", "mat", ",", "and", "the", "dog", "ran", "."]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = save_tiny(SPECS_BY_NAME["llama"], tmp_path_factory.mktemp("scanrows") / "base")
    return copy_with_config(base, base.parent / "long", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("scanrows") / "bert")


def _text(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def _whole_matrix_scores(weights: list[np.ndarray], text: detectors.TextFeatures, causal: bool) -> np.ndarray:
    """The whole-matrix formula, written out: (D, N, H) means over the eligible queries."""
    config = DetectorConfig()
    queries, targets, visible = detector_masks(text, len(text), causal, config)
    out = np.zeros((len(DETECTORS), len(weights), weights[0].shape[1]))
    for n, w in enumerate(weights):
        w = w[0].astype(np.float64)  # (H, S, S)
        mass = np.einsum("hqk,dqk->dhq", w, targets.astype(np.float64))  # (D, H, S)
        p = np.where(visible[None], w, 0.0)
        p = p / p.sum(-1, keepdims=True)
        ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
        log_v = np.log(np.maximum(visible.sum(-1), 1))
        mass[DETECTORS.index("entropy")] = np.clip(np.divide(ent, log_v, out=np.zeros_like(ent), where=log_v > 0), 0, 1)
        count = queries.sum(-1)[:, None]
        out[:, n] = (mass * queries[:, None]).sum(-1) / np.maximum(count, 1)
    return out


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_streamed_scores_equal_whole_matrices_of_transformers(
    family: str, llama: Path, bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks made tiny (rows of 7 and 3 queries) so that a 60-token text takes many; the
    own engine's streamed scores equal transformers' eager weights scored whole."""
    from transformers import AutoModel

    path = llama if family == "llama" else bert
    monkeypatch.setattr(rows, "CHUNK_ELEMENTS", 7 * 4 * 60)  # 7 rows of 4 heads × 60 keys
    monkeypatch.setattr(detectors, "SCORE_ELEMENTS", 3 * (5 * 4 + 2 * len(DETECTORS)) * 60)
    eng = load_engine("own", str(path), "cpu")
    tokens = eng.tokenize(_text(58))
    seen: list[tuple[int, int, int]] = []
    real = eng.forward_batch

    def spy(batch, **kw):  # type: ignore[no-untyped-def]
        sink = kw["blocks"]
        kw["blocks"] = lambda layer, start, stop, w: seen.append((layer, start, stop)) or sink(layer, start, stop, w)
        return real(batch, **kw)

    monkeypatch.setattr(eng, "forward_batch", spy)
    layers = tuple(range(eng.num_layers))
    report = Scan(eng, ScanOptions(layers, max_memory=2**40)).run([CorpusText(tokens.text, "t:1")])
    assert report.texts == 1
    assert max(stop - start for _, start, stop in seen) < len(tokens) // 4  # never a whole layer
    model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([list(tokens.ids)]), output_attentions=True)
    theirs = [a.numpy() for a in out.attentions]
    expected = _whole_matrix_scores(theirs, features(tokens.ids, tokens.special, tokens.labels), eng.shape.causal)
    np.testing.assert_allclose(report.heads.mean, expected, atol=2e-6, rtol=0)


def test_block_scorer_equals_whole_matrices_with_padding_and_junk() -> None:
    """Padded texts of a batch, blocks of any size: text_scores (now blocked) equals the
    whole-matrix formula; junk in padding rows and columns changes nothing."""
    rng = np.random.default_rng(0)
    texts = [
        features([5, 6, 5, 7, 6, 5, 9], [True, False, False, False, False, False, True], list("[ab,ab]")),
        features([1, 2, 1, 2], [False] * 4, ["x", "y", "x", "."]),
    ]
    size = 7
    w = rng.random((2, 2, 3, size, size))  # (N, B, H, S, S)
    for b, t in enumerate(texts):
        w[:, b, :, : len(t), len(t) :] = 5.0  # junk in padding keys
        w[:, b, :, len(t) :] = 7.0  # and padding queries
        w[:, b, :, : len(t), : len(t)] /= w[:, b, :, : len(t), : len(t)].sum(-1, keepdims=True)
    for causal in (False, True):
        whole = np.stack(
            [
                _whole_matrix_scores([w[n, b : b + 1, :, : len(t), : len(t)] for n in range(2)], t, causal)
                for b, t in enumerate(texts)
            ]
        )  # (B, D, N, H)
        for step in (1, 2, 7):
            scorer = detectors.BlockScorer(texts, size, causal, DetectorConfig(), 2, 3)
            for n in range(2):
                for start in range(0, size, step):
                    scorer.add(n, start, w[n, :, :, start : start + step])
            scores, valid = scorer.scores()
            np.testing.assert_allclose(
                np.where(valid[:, :, None, None], scores, 0), np.where(valid[:, :, None, None], whole, 0), atol=1e-12
            )


def test_scoring_memory_is_bounded_by_blocks_not_the_text(llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1,500-token text: what the scan allocates through numpy (tracemalloc sees numpy,
    not torch) stays far below one layer's float64 matrices, S² · H · 8 bytes (72 MB);
    the whole-matrix scoring took several times that. The blocks the engine streams hold
    at most CHUNK_ELEMENTS weights (64 MiB of float32 at any length)."""
    eng = load_engine("own", str(llama), "cpu")
    monkeypatch.setattr(rows, "CHUNK_ELEMENTS", 1 << 20)  # 4 MiB blocks of rows
    text = _text(1500)
    n = len(eng.tokenize(text))
    matrix = n * n * eng.num_heads * 8
    scan = Scan(eng, ScanOptions((0, 1), max_memory=2**40))
    tracemalloc.start()
    try:
        report = scan.run([CorpusText(text, "t:1")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.texts == 1 and report.heads.count.min() == 1
    assert peak < matrix / 2, (peak, matrix)
    # The estimate at issue 38's 8,183 tokens: blocks and scoring steps, no layer's matrix
    # (one float32 layer is 1.07 GB); where whole matrices are kept, they are counted.
    long, layer = 8183, 8183 * 8183 * eng.num_heads * 4
    streamed = memory.estimate_scan(eng.shape, eng.sizes, 1, long, 2, len(DETECTORS))
    assert streamed.attention < layer / 2
    kept = memory.estimate_scan(eng.shape, eng.sizes, 1, long, 2, len(DETECTORS), norms=True)
    assert kept.attention > 2 * layer


def test_norm_measure_and_hf_engine_score_as_before(llama: Path) -> None:
    """The paths that keep whole matrices (the norm measure; transformers) feed the same
    blocked scorer: the hf engine's scores equal the own engine's streamed ones."""
    text = _text(40)
    own = Scan(load_engine("own", str(llama), "cpu"), ScanOptions((0, 1), max_memory=2**40)).run(
        [CorpusText(text, "t")]
    )
    hf = Scan(load_engine("hf", str(llama), "cpu"), ScanOptions((0, 1), max_memory=2**40)).run([CorpusText(text, "t")])
    np.testing.assert_allclose(own.heads.mean, hf.heads.mean, atol=2e-6)
    norm = Scan(load_engine("own", str(llama), "cpu"), ScanOptions((0, 1), measure="norm", max_memory=2**40))
    shares = norm.run([CorpusText(text, "t")]).heads
    assert isinstance(shares, HeadAccumulator) and np.isfinite(shares.mean).all()
    assert not np.allclose(shares.mean, own.heads.mean)  # the norm shares, not the weights


@pytest.mark.parametrize("family", ["deberta-v3", "t5", "gemma2", "gpt_oss"])
def test_every_kind_of_attention_scans_as_transformers(family: str, tmp_path: Path) -> None:
    """Families the streamed rows reach another way: DeBERTa's layers score in full by
    themselves and stream nothing (their matrices go to the detectors after the pass: they
    scored 0 at first), T5's position bias, Gemma 2's soft-capping and gpt-oss's sinks go
    through the blocked eager function. Each scan equals transformers' on a padded batch."""
    from .builders.families_a import SPECS_A_BY_NAME
    from .builders.families_b import SPECS_B_BY_NAME

    specs = {**SPECS_BY_NAME, **SPECS_A_BY_NAME, **SPECS_B_BY_NAME}
    path = save_tiny(specs[family], tmp_path / family)
    texts = [CorpusText(_text(13), "a"), CorpusText("a dog ran far", "b")]
    scans = []
    for engine in ("own", "hf"):
        eng = load_engine(engine, str(path), "cpu")
        options = ScanOptions(tuple(range(eng.num_layers)), batch_size=2, max_memory=2**40)
        scans.append(Scan(eng, options).run(texts).heads)
    assert scans[0].count.max() == 2
    np.testing.assert_allclose(scans[0].mean, scans[1].mean, atol=2e-6)
    assert np.abs(scans[0].mean).max() > 0.01
