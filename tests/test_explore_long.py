"""attnviz explore on a long text: the rows of the cursor's token by the row path, drawn
as compact rows (render.compact), checked against transformers' eager attention."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.pipeline import Selection
from attnviz.render.compact import binned, strip_bins
from attnviz.render.terminal import shade
from attnviz.tui.app import ExploreApp
from attnviz.tui.views import ROW_WINDOW, explore_reading, long_reading

pytestmark = pytest.mark.anyio

N = 600  # tokens: with a 1 MiB budget, past the full matrices (11 MiB), within the rows (150 KiB)
BUDGET = 2**20
LAYERS, HEADS = 2, 4
SIZE = (120, 40)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _decoder(directory: Path) -> Path:
    """A tiny random Llama (2 layers, 4 query heads over 2 kv heads) and a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(61)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _decoder(tmp_path_factory.mktemp("long") / "decoder")


TEXT = " ".join(f"w{(i * 7) % 61}" for i in range(N - 1))  # + <s>: N tokens


@pytest.fixture(scope="module")
def reference(model: Path) -> np.ndarray:
    """(layers, heads, N, N): transformers' eager weights, the independent reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model)(TEXT, return_tensors="pt")["input_ids"]
    assert ids.shape[1] == N
    hf = AutoModelForCausalLM.from_pretrained(model, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(ids, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).float().numpy()


def _screen(app: ExploreApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def _check(app: ExploreApp, reference: np.ndarray, query: int, layer: int) -> None:
    """The view is the compact rows of ``query`` in ``layer``: each head's strip the shades
    of the reference row's bins, its strongest keys the reference's, H + 12 lines at most."""
    text = app.query_one("#view").text  # type: ignore[attr-defined]
    lines = text.splitlines()
    assert lines[0].startswith(f"layer {layer} · ")
    assert len(lines) <= HEADS + 12
    heads = [ln for ln in lines if re.match(r"^\s*h\d+ ", ln)]
    assert len(heads) == HEADS
    rows = app.long.rows_for(query)  # type: ignore[union-attr]
    assert rows is not None
    for h, line in enumerate(heads):
        ref = reference[layer, h, query]  # (N,)
        strip = line[line.index("│") + 1 : line.rindex("│")]
        cols, bins = strip_bins(rows, query, len(strip))
        assert len(bins) == len(strip) and cols == list(range(N))
        sums = binned(ref, bins)
        for cell, (a, _), total in zip(strip, bins, sums):
            if a > query:
                assert cell == "-" and total == 0
            elif cell != "·":
                assert cell == shade(float(total)), (layer, h, a, strip)
        # The strongest key: the reference's largest weight, at its position.
        top = re.search(r"@(\d+) (1\.0|\.\d\d)", line)
        assert top is not None
        assert ref[int(top.group(1))] == pytest.approx(ref.max(), abs=1e-5)
        assert float(top.group(2)) == pytest.approx(ref.max(), abs=0.006)


def test_a_long_text_is_refused_only_past_the_rows(model: Path) -> None:
    engine = load_engine("own", str(model), "cpu")
    with pytest.raises(UsageError) as full:
        explore_reading(engine, TEXT, Selection(), budget=BUDGET)
    assert full.value.facts["reason"] == "explore_size"
    first, _ = long_reading(engine, TEXT, Selection(), budget=BUDGET)
    assert first.attention.queries == tuple(range(ROW_WINDOW))  # rows of one window, not N × N
    assert first.attention.weights.shape == (LAYERS, HEADS, ROW_WINDOW, N)
    with pytest.raises(UsageError) as rows:
        long_reading(engine, TEXT, Selection(), budget=4 * LAYERS * HEADS * N * ROW_WINDOW - 1)
    assert rows.value.facts["reason"] == "explore_size" and "query rows" in rows.value.message


async def test_the_explorer_draws_the_compact_rows_of_a_long_text(
    model: Path, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")  # shade glyphs: the cells can be read back
    engine = load_engine("own", str(model), "cpu")
    start = 300
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(start),)), budget=BUDGET)
    app = ExploreApp(first.attention, None, query=start, rows=rows)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        _check(app, reference, start, 0)
        assert len(_screen(app).splitlines()) <= SIZE[1]
        await pilot.press("up")  # the next layer: the same rows, from memory
        await pilot.pause()
        _check(app, reference, start, 1)
        await pilot.press("right")  # within the window: no forward pass
        await pilot.pause()
        _check(app, reference, start + 1, 1)
        assert "rows" not in app._busy
        await pilot.press(*["right"] * ROW_WINDOW)  # past the window: its rows are computed
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        _check(app, reference, start + 1 + ROW_WINDOW, 1)
        assert f"token {start + 1 + ROW_WINDOW} " in _screen(app)
        await pilot.press("v")  # the other views need full matrices: said, not drawn
        await pilot.pause()
        assert "compact rows" in _screen(app)
        _check(app, reference, start + 1 + ROW_WINDOW, 1)


def _index(position: int):  # type: ignore[no-untyped-def]
    from attnviz.select import Query

    return Query(index=position)
