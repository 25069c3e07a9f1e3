"""Generation with attention (attnviz/generation/, nn/cache.py): the own engine's cached
steps against transformers' greedy generate (token for token) and against one full pass
over prompt + continuation (row for row); the hf engine through transformers' generate."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from attnviz.engines import load_engine  # noqa: E402
from attnviz.errors import UsageError  # noqa: E402
from attnviz.generation import CACHED_FAMILIES, Sampling, generate  # noqa: E402
from tests.builders import SPECS_BY_NAME, build_tiny, save_tiny  # noqa: E402
from tests.builders.families_2026 import SPECS_2026  # noqa: E402
from tests.builders.families_a import CAUSALITY_SPECS, FAMILY_A_SPECS  # noqa: E402
from tests.builders.families_b import SPECS_B  # noqa: E402
from tests.builders.families_c import SPECS_C  # noqa: E402

PROMPT = "the cat sat on the mat and the dog"
COUNT = 8
# Every claimed family's tiny checkpoints (sliding windows: mistral, gemma2, gemma3_text, cohere2;
# chunks: llama4_text; soft-capping: gemma2; sinks: gpt_oss; ALiBi: bloom, falcon-alibi;
# latent attention: deepseek; GQA: llama and the rest; learned positions: gpt2, opt).
_ALL = {
    spec.name: spec
    for spec in (*SPECS_BY_NAME.values(), *FAMILY_A_SPECS, *CAUSALITY_SPECS, *SPECS_B, *SPECS_C, *SPECS_2026)
}
FAMILIES = sorted(name for name, spec in _ALL.items() if spec.head == "causal" and spec.model_type in CACHED_FAMILIES)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generate")
    return {name: save_tiny(_ALL[name], root / name) for name in FAMILIES}


def _hf_greedy(path: Path, ids: list[int], count: int, model_class: str | None = None) -> list[int]:
    import transformers

    # Mistral 4: AutoModelForCausalLM maps only its wrapper; the spec names the class.
    cls = getattr(transformers, model_class or "AutoModelForCausalLM")
    model = cls.from_pretrained(str(path), attn_implementation="eager", experts_implementation="eager").eval()
    eos = model.config.eos_token_id
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=count,
            do_sample=False,
            pad_token_id=eos if isinstance(eos, int) else 0,
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("name", FAMILIES)
def test_own_generation_equals_transformers_and_full_passes(saved: dict[str, Path], name: str) -> None:
    engine = load_engine("own", str(saved[name]), "cpu")
    tokens = engine.tokenize(PROMPT)
    got = generate(engine, tokens, COUNT)
    # 1. Token for token what transformers' greedy generate writes.
    assert got.ids == _hf_greedy(saved[name], list(tokens.ids), COUNT, _ALL[name].model_class)
    assert len(got.rows) == len(got.ids) > 0
    # 2. Each written token's rows equal one full pass's rows over prompt + continuation
    #    (the eager reference of the same stack, every row).
    full = torch.tensor([list(tokens.ids) + got.ids])
    with torch.inference_mode():
        reference = engine.model(full, fused=False).attentions  # per layer (1, H, S, S)
    for i, position in enumerate(got.positions):
        rows = got.rows[i]  # (layers, H, position + 1)
        assert rows.shape[-1] == position + 1
        expected = torch.stack([w[0, :, position, : position + 1] for w in reference]).float()
        torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "llama", "gemma2"])
def test_hf_engine_generation_equals_own(saved: dict[str, Path], name: str) -> None:
    own = load_engine("own", str(saved[name]), "cpu")
    hf = load_engine("hf", str(saved[name]), "cpu")
    tokens = own.tokenize(PROMPT)
    a, b = generate(own, tokens, COUNT, layers=[0, 1]), generate(hf, tokens, COUNT, layers=[0, 1])
    assert a.ids == b.ids and a.stopped == b.stopped
    for x, y in zip(a.rows, b.rows, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_sampling_is_seeded_and_top_p_one_token_is_greedy(saved: dict[str, Path]) -> None:
    engine = load_engine("own", str(saved["llama"]), "cpu")
    tokens = engine.tokenize(PROMPT)
    first = generate(engine, tokens, COUNT, sampling=Sampling(sample=True, temperature=1.5, seed=3))
    again = generate(engine, tokens, COUNT, sampling=Sampling(sample=True, temperature=1.5, seed=3))
    assert first.ids == again.ids
    # A nucleus so small only the top token stays: sampling becomes greedy.
    tiny = generate(engine, tokens, COUNT, sampling=Sampling(sample=True, top_p=1e-9, seed=5))
    assert tiny.ids == generate(engine, tokens, COUNT).ids


def test_stops_at_eos(saved: dict[str, Path], tmp_path: Path) -> None:
    engine = load_engine("own", str(saved["gpt2"]), "cpu")
    tokens = engine.tokenize(PROMPT)
    greedy = generate(engine, tokens, COUNT)
    # Make the second written token the end-of-sequence token: generation stops there.
    engine.files.config["eos_token_id"] = greedy.ids[1]
    stopped = generate(engine, tokens, COUNT)
    assert stopped.ids == greedy.ids[:2] and stopped.stopped == "eos"


def test_bad_requests_refused_before_model_work(saved: dict[str, Path], tmp_path: Path) -> None:
    engine = load_engine("own", str(saved["gpt2"]), "cpu")
    tokens = engine.tokenize(PROMPT)
    for count in (0, -3):
        with pytest.raises(UsageError, match="must be at least 1"):
            generate(engine, tokens, count)
    limit = engine.max_positions
    assert limit is not None
    with pytest.raises(UsageError, match=f"{len(tokens.ids)} tokens plus {limit} to write pass the model's {limit}"):
        generate(engine, tokens, limit)
    bert = load_engine("own", str(save_tiny(SPECS_BY_NAME["bert"], tmp_path / "bert")), "cpu")
    with pytest.raises(UsageError, match="not a decoder"):
        generate(bert, bert.tokenize(PROMPT), 4)
    # A base model saved without its LM head.
    base = tmp_path / "base"
    build_tiny(SPECS_BY_NAME["gpt2"]).transformer.save_pretrained(base)
    for f in saved["gpt2"].glob("*token*"):
        (base / f.name).write_bytes(f.read_bytes())
    with pytest.raises(UsageError, match="no language-model head"):
        generate(load_engine("own", str(base), "cpu"), tokens, 4)


# --- the command line and the Python face -------------------------------------------


def test_show_generate_json_is_the_generation(saved: dict[str, Path]) -> None:
    import json

    from tests.helpers import in_process

    path = str(saved["llama"])
    done = in_process("show", PROMPT, "-m", path, "--generate", "5", "--layer", "1", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    engine = load_engine("own", path, "cpu")
    expected = generate(engine, engine.tokenize(PROMPT), 5, layers=[1])
    assert doc["written_ids"] == expected.ids and doc["layers"] == [1] and not doc["partial"]
    given = doc["given"]
    assert given == len(engine.tokenize(PROMPT).ids)
    # Written tokens are marked among the labels; given ones are not.
    assert all(label.startswith("«") for label in doc["tokens"][given:])
    assert not any(label.startswith("«") for label in doc["tokens"][:given])
    for step, rows in zip(doc["steps"], expected.rows, strict=True):
        torch.testing.assert_close(torch.tensor(step["rows"]), rows, atol=1e-5, rtol=0)


def test_show_generate_terminal_views(saved: dict[str, Path]) -> None:
    from tests.helpers import in_process

    path = str(saved["gpt2"])
    done = in_process("show", PROMPT, "-m", path, "--generate", "3")
    assert done.returncode == 0, done.stderr
    engine = load_engine("own", path, "cpu")
    expected = generate(engine, engine.tokenize(PROMPT), 3)
    assert f"continuation: {expected.text.strip()}" in done.stdout
    # One block per written token, one line per layer, each head's strongest key.
    assert done.stdout.count(" at position ") == 3
    layers = engine.shape.num_layers
    assert sum(line.startswith("  L") for line in done.stdout.splitlines()) == 3 * layers
    word = expected.pieces[0]
    one = in_process("show", PROMPT, "-m", path, "--generate", "3", "--token", word, "--layer", "0")
    assert one.returncode == 0, one.stderr
    heads = engine.shape.num_heads
    assert sum(line.startswith("  L0 h") for line in one.stdout.splitlines()) == heads * expected.pieces.count(word)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--generate", "0"), "--generate 0: the number of tokens to write must be at least 1"),
        (("--generate", "-2"), "--generate -2"),
        (("--temperature", "0.5"), "add --generate N"),
        (("--generate", "2", "--pair", "a dog"), "--pair cannot be combined with --generate"),
        (("--generate", "2", "--sample", "--top-p", "0"), "top-p 0.0 must lie in (0, 1]"),
    ],
)
def test_show_generate_refusals_before_loading(args: tuple[str, ...], needle: str, tmp_path: Path) -> None:
    from tests.helpers import in_process, one_error_line

    # The model directory does not exist: the option errors come before any loading.
    done = in_process("show", PROMPT, "-m", str(tmp_path / "absent"), *args)
    line = one_error_line(_result(done), 2)
    assert needle in line


def test_show_generate_refusals_with_the_numbers(saved: dict[str, Path], tmp_path: Path) -> None:
    from tests.helpers import in_process, one_error_line

    engine = load_engine("own", str(saved["gpt2"]), "cpu")
    given, limit = len(engine.tokenize(PROMPT).ids), engine.max_positions
    done = in_process("show", PROMPT, "-m", str(saved["gpt2"]), "--generate", str(limit))
    line = one_error_line(_result(done), 2)
    assert f"the prompt's {given} tokens plus {limit} to write pass the model's {limit} positions" in line
    bert = save_tiny(SPECS_BY_NAME["bert"], tmp_path / "bert")
    line = one_error_line(_result(in_process("show", PROMPT, "-m", str(bert), "--generate", "2")), 2)
    assert "not a decoder" in line
    absent = in_process("show", PROMPT, "-m", str(saved["gpt2"]), "--generate", "2", "--token", "zzz")
    assert "no written token is zzz" in one_error_line(_result(absent), 2)


def test_inspect_generate(saved: dict[str, Path]) -> None:
    import attnviz

    engine = load_engine("own", str(saved["qwen2"]), "cpu")
    expected = generate(engine, engine.tokenize(PROMPT), 4)
    got = attnviz.inspect(PROMPT, model=str(saved["qwen2"]), generate=4)
    assert isinstance(got, type(expected)) and got.ids == expected.ids and got.text == expected.text
    hf = attnviz.inspect(PROMPT, model=str(saved["qwen2"]), engine="hf", generate=4, layers="0")
    assert isinstance(hf, type(expected)) and hf.ids == expected.ids
    torch.testing.assert_close(hf.rows[0], expected.rows[0][:1], atol=1e-5, rtol=0)
    with pytest.raises(UsageError, match="at least 1"):
        attnviz.inspect(PROMPT, model=str(saved["qwen2"]), generate=0)


def _result(done: object) -> object:
    """A ``helpers.Done`` as ``one_error_line`` reads a CliRunner result."""
    from types import SimpleNamespace

    d = done  # type: ignore[assignment]
    return SimpleNamespace(
        exit_code=d.returncode,  # type: ignore[attr-defined]
        stdout=d.stdout,  # type: ignore[attr-defined]
        stderr=d.stderr,  # type: ignore[attr-defined]
        output=d.stdout + d.stderr,  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_ctrl_c_keeps_what_was_written(saved: dict[str, Path], engine_name: str) -> None:
    engine = load_engine(engine_name, str(saved["gpt2"]), "cpu")
    tokens = engine.tokenize(PROMPT)
    full = generate(engine, tokens, COUNT)
    seen: list[str] = []

    def interrupt(_: int, label: str) -> None:
        seen.append(label)  # streamed as chosen
        if len(seen) == 3:
            raise KeyboardInterrupt

    cut = generate(engine, tokens, COUNT, on_token=interrupt)
    assert cut.partial and cut.stopped == "interrupted"
    assert cut.ids == full.ids[:2] and len(cut.rows) == 2 and seen == full.pieces[:3]
    for a, b in zip(cut.rows, full.rows, strict=False):
        torch.testing.assert_close(a, b)
