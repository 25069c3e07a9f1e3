"""Hostile JSON for every JSON input the CLI reads, planted and run through the command line.

``hostile_json(template)`` draws one document as bytes: nesting 100,000 deep, numbers of
5,000 digits, huge strings, NaN/Infinity literals, duplicate keys, a value of the wrong
JSON type at one key of the real file, a truncated copy, a BOM, invalid UTF-8.
``plant(target, doc, files)`` writes it where one reader reads it (a JSONL corpus line
for ``heads``, the coreference file of ``heads --pairs``, a model directory's
config.json, tokenizer.json or tokenizer_config.json, a safetensors header, a shard
index) and returns the command line that reads it.

The promise (``json_problems``): exit 2 (or 1) with exactly one error line and no
traceback, within the time limit; exit 0 only when the answer is the good file's answer
(a harmless change, such as a wrong type at a key inference never reads).

Used by tests/test_fuzz_hostile.py and bench/fuzz.py (``--json-cases``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from attnviz.example import EXAMPLE

from .fuzz_grammar import Files, Outcome, run_case

TARGETS = ("corpus", "coref", "config", "tokenizer", "tokenizer_config", "header", "index")
BOM = b"\xef\xbb\xbf"
FILE_NAMES = {
    "config": "config.json",
    "tokenizer": "tokenizer.json",
    "tokenizer_config": "tokenizer_config.json",
    "index": "model.safetensors.index.json",
}


def _scalar_or_wrong() -> st.SearchStrategy[Any]:
    """A JSON value of any type (what a key holds when it holds the wrong one)."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
        st.lists(st.integers(-3, 3), max_size=3),
        st.dictionaries(st.text(max_size=4), st.integers(0, 3), max_size=2),
    )


def _paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    """Every key path of a parsed document, to depth 3 (lists: their first two items)."""
    out: list[tuple[Any, ...]] = []
    if depth >= 3:
        return out
    if isinstance(value, dict):
        for key, child in value.items():
            out.append((*prefix, key))
            out.extend(_paths(child, (*prefix, key), depth + 1))
    elif isinstance(value, list):
        for i, child in enumerate(value[:2]):
            out.append((*prefix, i))
            out.extend(_paths(child, (*prefix, i), depth + 1))
    return out


def _json_type(value: Any) -> str:
    """JSON's own types (an int and a float are both a number; a bool is not one)."""
    if isinstance(value, bool) or value is None:
        return repr(value) if value is None else "bool"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)  # type: ignore[index]
    return copy


@st.composite
def hostile_json(draw: Any, template: Any) -> bytes:
    """One hostile document, as bytes, built around ``template`` (the real file's parsed value)."""
    good = json.dumps(template).encode()
    kind = draw(
        st.sampled_from(
            (
                "deep",
                "deep-open",
                "digits",
                "float-digits",
                "string",
                "constant",
                "duplicate",
                "wrong-type",
                "truncated",
                "bom",
                "utf8",
                "surrogate",
                "empty",
                "scalar",
            )  # fmt: skip
        ),
        label="kind",
    )
    if kind in ("deep", "deep-open"):
        n = draw(st.sampled_from((100_000, 5_000, 1_000, 65)))
        bracket = draw(st.sampled_from(("[", '{"a":')))
        close = "]" if bracket == "[" else "}"
        body = bracket * n + "1" + (close * n if kind == "deep" else "")
        return _at_key(draw, template, body)
    if kind == "digits":
        return _at_key(
            draw, template, draw(st.sampled_from(("", "-"))) + "7" * draw(st.sampled_from((5_000, 4_301, 101)))
        )
    if kind == "float-digits":
        return _at_key(
            draw, template, draw(st.sampled_from(("1." + "3" * 5_000, "1e99999", "-1e-99999", "0." + "0" * 200 + "1")))
        )
    if kind == "string":
        size = draw(st.sampled_from((1 << 20, 17 << 20)))
        return _at_key(draw, template, '"' + "x" * size + '"')
    if kind == "constant":
        return _at_key(draw, template, draw(st.sampled_from(("NaN", "Infinity", "-Infinity"))))
    if kind == "duplicate" and isinstance(template, dict) and template:
        key = draw(st.sampled_from(sorted(template)))
        other = json.dumps(draw(_scalar_or_wrong()))
        text = good.decode()
        return ("{" + json.dumps(key) + ": " + other + ", " + text[1:]).encode()
    if kind == "wrong-type":
        paths = _paths(template)
        if paths:
            path = draw(st.sampled_from(paths), label="path")
            old = _json_type(_get(template, path))
            new = draw(_scalar_or_wrong().filter(lambda v: _json_type(v) != old), label="value")
            return json.dumps(_replace(template, path, new)).encode()
        return json.dumps(draw(_scalar_or_wrong())).encode()
    if kind == "truncated":
        return good[: draw(st.integers(0, max(0, len(good) - 1)))]
    if kind == "bom":
        return BOM + good
    if kind == "utf8":
        cut = draw(st.integers(0, len(good)))
        return good[:cut] + draw(st.sampled_from((b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82"))) + good[cut:]
    if kind == "surrogate":
        return _at_key(draw, template, '"\\udc80"')
    if kind == "empty":
        return draw(st.sampled_from((b"", b" ", b"\n", b"null", b"\x00")))
    return json.dumps(draw(_scalar_or_wrong())).encode()  # a document that is not an object


def _at_key(draw: Any, template: Any, literal: str) -> bytes:
    """``template`` with ``literal`` (raw JSON text) as the value of one of its top keys."""
    if not isinstance(template, dict) or not template:
        return literal.encode()
    key = draw(st.sampled_from(sorted(template)), label="key")
    marker = "\u0000ATTNVIZ-FUZZ\u0000"
    text = json.dumps({**template, key: marker})
    return text.replace(json.dumps(marker), literal, 1).encode()


@dataclass
class Planted:
    target: str
    argv: list[str]
    document: bytes


class Hostile:
    """Good copies of each JSON input, and where to plant a hostile one (made once)."""

    def __init__(self, files: Files) -> None:
        from safetensors.torch import load_file, save_file

        self.files = files
        self.root = files.root / "hostile"
        self.root.mkdir(exist_ok=True)
        self.model = Path(files.models[0])  # the tiny BERT
        self.sharded = self.root / "sharded"
        if not self.sharded.exists():
            shutil.copytree(self.model, self.sharded)
            tensors = load_file(str(self.sharded / "model.safetensors"))
            (self.sharded / "model.safetensors").unlink()
            names = sorted(tensors)
            halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
            weight_map = {}
            for shard, held in halves.items():
                save_file({n: tensors[n] for n in held}, str(self.sharded / shard), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(held, shard))
            index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
            (self.sharded / "model.safetensors.index.json").write_text(json.dumps(index))
        self.templates = {
            "corpus": {"text": EXAMPLE},
            "coref": {"text": EXAMPLE, "pronoun": "it", "referent": "animal", "candidates": ["animal", "street"]},
            "config": json.loads((self.model / "config.json").read_text()),
            "tokenizer": json.loads((self.model / "tokenizer.json").read_text()),
            "tokenizer_config": json.loads((self.model / "tokenizer_config.json").read_text()),
            "header": self._header(self.model / "model.safetensors")[1],
            "index": json.loads((self.sharded / "model.safetensors.index.json").read_text()),
        }
        self.good: dict[str, Outcome] = {}
        self.count = 0

    @staticmethod
    def _header(path: Path) -> tuple[int, Any, bytes]:
        import struct

        data = path.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        return length, json.loads(data[8 : 8 + length]), data[8 + length :]

    def plant(self, target: str, document: bytes) -> Planted:
        """Write ``document`` where ``target``'s reader reads it; the command line that reads it."""
        import struct

        # a fresh directory per case: models_loaded_once caches engines by path
        for old in self.root.glob("case-*"):
            shutil.rmtree(old)
        self.count += 1
        case = self.root / f"case-{self.count}"
        case.mkdir()
        show = ["show", EXAMPLE, "--token", "it", "--layer", "1", "--json"]
        if target in ("corpus", "coref"):
            good = json.dumps(self.templates[target]).encode()
            path = case / "input.jsonl"
            # a good line first: the hostile one must not be skipped once the scan started
            path.write_bytes(good + b"\n" + document.replace(b"\n", b" ") + b"\n")
            argv = ["heads", str(path), "--json"] if target == "corpus" else ["heads", "--pairs", str(path), "--json"]
            return Planted(target, argv + ["--model", str(self.model)], document)
        source = self.sharded if target == "index" else self.model
        model = case / "model"
        shutil.copytree(source, model)
        if target == "header":
            _, _, data = self._header(self.model / "model.safetensors")
            (model / "model.safetensors").write_bytes(struct.pack("<Q", len(document)) + document + data)
        else:
            name = FILE_NAMES[target]
            (model / name).write_bytes(document)
        return Planted(target, [*show, "--model", str(model)], document)

    def good_answer(self, planted: Planted) -> Outcome:
        """The same command line on the good file (cached per target)."""
        from attnviz.cli import app

        if planted.target not in self.good:
            again = self.plant(planted.target, json.dumps(self.templates[planted.target]).encode())
            if planted.target == "header":  # the header as the file holds it, byte for byte
                model = Path(again.argv[-1])
                shutil.copy(self.model / "model.safetensors", model / "model.safetensors")
            self.good[planted.target] = run_case(app, again.argv, self.files)
        return self.good[planted.target]


def json_problems(hostile: Hostile, planted: Planted, limit_s: int = 60) -> Outcome:
    """Run a planted case; its outcome with every broken promise listed."""
    from attnviz.cli import app

    outcome = run_case(app, planted.argv, hostile.files, limit_s=limit_s)
    problems = list(outcome.problems)
    if outcome.exit_code == 0 and planted.target in ("corpus", "coref"):
        # another text is a fine answer; a line no strict JSON reader takes is not
        if not _strict_line(planted.document.replace(b"\n", b" "), planted.target):
            problems.append(f"exit 0 on a {planted.target} line that is not a valid record")
    elif outcome.exit_code == 0:
        good = hostile.good_answer(planted)
        if good.exit_code != 0:
            problems.append(f"the good {planted.target} file fails (exit {good.exit_code}): {good.stderr[-300:]}")
        elif _answer(outcome.stdout) != _answer(good.stdout):
            problems.append(f"exit 0 with an answer that differs from the good {planted.target} file's")
    elif outcome.exit_code not in (1, 2):
        problems.append(f"exit {outcome.exit_code}, not 2 (or 1)")
    return Outcome(outcome.argv, outcome.exit_code, outcome.stdout, outcome.stderr, outcome.seconds, tuple(problems))


def _strict_line(line: bytes, target: str) -> bool:
    """What a strict reader takes as a JSONL line: blank, or a UTF-8 JSON object within
    the bounds (64 levels, 100-character numbers, no NaN) with the record's fields."""
    import re

    if not line.strip():
        return True
    try:
        text = line.decode("utf-8")
        if re.search(r"[-+.eE0-9]{101,}", text):
            return False
        value = json.loads(text, parse_constant=lambda name: 1 / 0)
    except (ValueError, ZeroDivisionError, RecursionError):
        return False
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((c, level + 1) for c in (item.values() if isinstance(item, dict) else item))
    if deepest > 64 or not isinstance(value, dict) or not isinstance(value.get("text"), str):
        return False
    if target == "corpus":
        return True
    fields = [value.get("pronoun"), value.get("referent")]
    candidates = value.get("candidates")
    return all(isinstance(f, str) and f.strip() for f in fields) and isinstance(candidates, list)


def _answer(stdout: str) -> Any:
    """The numbers of a --json answer (provenance such as the model path left out)."""
    try:
        printed = json.loads(stdout)
    except ValueError:
        return stdout
    if isinstance(printed, dict):
        return {k: v for k, v in printed.items() if k not in ("model", "provenance", "source", "seconds", "elapsed")}
    return printed


@st.composite
def hostile_cases(draw: Any, hostile: Hostile) -> Planted:
    target = draw(st.sampled_from(TARGETS), label="target")
    document = draw(hostile_json(hostile.templates[target]), label="document")
    return hostile.plant(target, document)
