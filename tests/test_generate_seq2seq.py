"""Encoder-decoders write (attnviz/generation/seq2seq.py): the own engine's cached decoding
against transformers' greedy generate (token for token) and against one full pass over the
source and the written decoder text (decoder self-attention and cross-attention, row for
row); the hf engine through transformers' generate; the views on what was written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnviz.engines import load_engine  # noqa: E402
from attnviz.generation import Sampling, generate  # noqa: E402
from attnviz.generation.seq2seq import CACHED_SEQ2SEQ  # noqa: E402
from tests.builders import SPECS, build_tiny, save_tiny  # noqa: E402
from tests.builders.families_2026 import SPECS_2026  # noqa: E402
from tests.builders.families_a import CAUSALITY_SPECS, FAMILY_A_SPECS  # noqa: E402
from tests.builders.families_b import SPECS_B  # noqa: E402
from tests.builders.families_c import SPECS_C  # noqa: E402
from tests.helpers import in_process, one_error_line  # noqa: E402
from tests.test_generate_views import done_result  # noqa: E402

SOURCES = ("the cat sat on the mat", "a dog ran off and the cat sat")
COUNT = 6
TOL = 1e-5
_ALL = {spec.name: spec for spec in (*SPECS, *FAMILY_A_SPECS, *CAUSALITY_SPECS, *SPECS_B, *SPECS_C, *SPECS_2026)}
FAMILIES = sorted(name for name, spec in _ALL.items() if spec.head == "seq2seq")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generate-seq2seq")
    return {name: save_tiny(_ALL[name], root / name) for name in FAMILIES}


def test_every_claimed_encoder_decoder_family_is_tested() -> None:
    assert {_ALL[name].model_type for name in FAMILIES} == CACHED_SEQ2SEQ


def _hf_greedy(path: Path, ids: tuple[int, ...], count: int) -> list[int]:
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.inference_mode():
        # No cache: transformers' T5 cache is sized by the encoder's depth (the tiny T5s'
        # decoders are deeper); the search is the same.
        out = model.generate(torch.tensor([ids]), max_new_tokens=count, do_sample=False, num_beams=1, use_cache=False)
    return out[0, 1:].tolist()


@pytest.mark.parametrize("name", FAMILIES)
def test_own_generation_equals_transformers_and_full_passes(saved: dict[str, Path], name: str) -> None:
    engine = load_engine("own", str(saved[name]), "cpu")
    hf = load_engine("hf", str(saved[name]), "cpu")
    for source in SOURCES:
        tokens = engine.tokenize(source)
        gen = generate(engine, tokens, COUNT)
        assert gen.ids == _hf_greedy(saved[name], tokens.ids, COUNT), name
        assert gen.seq2seq and gen.tokens is not None and gen.tokens.written_start == 1
        assert gen.layers == tuple(range(engine.part_shape("decoder").num_layers))
        # One full pass over the source and the decoder text: every step's rows, both kinds.
        full = engine.forward_seq2seq(tokens, gen.tokens)
        for i, (rows, cross) in enumerate(zip(gen.rows, gen.cross, strict=True)):
            q = gen.given + i
            for slot, layer in enumerate(gen.layers):
                self_row = full.decoder.attentions[layer][0, :, q, : q + 1]
                torch.testing.assert_close(rows[slot], self_row, atol=TOL, rtol=0)
                torch.testing.assert_close(cross[slot], full.cross[layer][0, :, q], atol=TOL, rtol=0)
        # The hf engine: transformers' generate, the same tokens and rows.
        theirs = generate(hf, tokens, COUNT)
        assert theirs.ids == gen.ids
        for a, b in zip([*theirs.rows, *theirs.cross], [*gen.rows, *gen.cross], strict=True):
            torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_sampling_and_the_end_of_sequence(saved: dict[str, Path]) -> None:
    engine = load_engine("own", str(saved["bart"]), "cpu")
    tokens = engine.tokenize(SOURCES[0])
    one = generate(engine, tokens, COUNT, sampling=Sampling(True, 1.5, 0.9, 7))
    two = generate(engine, tokens, COUNT, sampling=Sampling(True, 1.5, 0.9, 7))
    assert one.ids == two.ids and len(one.rows) == len(one.cross) == len(one.ids)
    # BART forces its end-of-sequence token last (forced_eos_token_id), as generate does.
    greedy = generate(engine, tokens, 3)
    assert greedy.ids[-1] == 2 and greedy.stopped == "eos"


def test_attention_of_a_generation_is_its_rows(saved: dict[str, Path]) -> None:
    engine = load_engine("own", str(saved["t5"]), "cpu")
    gen = generate(engine, engine.tokenize(SOURCES[0]), 3)
    cross = gen.attention("cross")
    assert cross.part == "cross" and cross.queries == (1, 2, 3) and cross.keys.text == SOURCES[0]
    for i, rows in enumerate(gen.cross):
        assert (cross.weights[:, :, i] == rows.numpy()).all()
    own = gen.attention()
    assert own.part == "decoder" and own.weights.shape[-1] == len(gen.tokens or ())


# --- the command line ------------------------------------------------------------------


def test_show_compare_and_export_read_what_an_encoder_decoder_wrote(saved: dict[str, Path], tmp_path: Path) -> None:
    path = str(saved["bart"])
    engine = load_engine("own", path, "cpu")
    gen = generate(engine, engine.tokenize(SOURCES[0]), 3, layers=[0])
    done = in_process("show", SOURCES[0], "-m", path, "--generate", "3", "--layer", "0", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["part"] == "cross" and doc["given"] == 1 and doc["written_ids"] == gen.ids
    assert doc["keys"] == list(engine.tokenize(SOURCES[0]).labels)
    for step, rows in zip(doc["steps"], gen.cross, strict=True):
        torch.testing.assert_close(torch.tensor(step["rows"]), rows, atol=1e-5, rtol=0)
    ranked = in_process("compare", SOURCES[0], "-m", path, "--generate", "3", "--json")
    assert ranked.returncode == 0, ranked.stderr
    assert json.loads(ranked.stdout)["written"] == list((gen.tokens or ()).labels[1:])  # type: ignore[union-attr]
    decoder = in_process("compare", SOURCES[0], "-m", path, "--generate", "3", "--part", "decoder")
    assert decoder.returncode == 0 and "decoder self-attention" in decoder.stdout
    for name in ("x.png", "x.html"):
        out = tmp_path / name
        done = in_process("export", SOURCES[0], "-m", path, "--generate", "3", "-o", str(out))
        assert done.returncode == 0 and out.stat().st_size > 0, done.stderr


def test_encoder_decoder_refusals_with_the_numbers(saved: dict[str, Path], tmp_path: Path) -> None:
    from transformers import T5Model

    base = tmp_path / "t5-base"  # the tiny T5's base model, saved without its LM head
    T5Model(build_tiny(_ALL["t5"]).config).save_pretrained(base)
    for f in saved["t5"].glob("*token*"):
        (base / f.name).write_bytes(f.read_bytes())
    for args in (("show", SOURCES[0]), ("compare", SOURCES[0]), ("export", SOURCES[0], "-o", str(tmp_path / "x.png"))):
        line = one_error_line(done_result(in_process(*args, "-m", str(base), "--generate", "2")), 2)
        assert "no language-model head" in line and "T5Model" in line
        limit = load_engine("own", str(saved["bart"]), "cpu").max_positions
        long = in_process(*args, "-m", str(saved["bart"]), "--generate", str(limit))
        line = one_error_line(done_result(long), 2)
        assert f"the decoder's start token plus {limit} to write pass the model's {limit} positions" in line
    assert not (tmp_path / "x.png").exists()
