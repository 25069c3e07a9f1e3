"""Hostile JSON for every JSON reader, through the command line (tests/fuzz_hostile.py).

Each drawn document is planted in one input (a JSONL corpus, a coreference file,
config.json, tokenizer.json, tokenizer_config.json, a safetensors header, a shard index)
and the real command line reads it: exit 2 (or 1) with one error line and no traceback,
or exit 0 with the good file's answer. ATTNVIZ_FUZZ_JSON_EXAMPLES sets the count
(bench/fuzz.py runs thousands).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz_grammar import Files, make_files, models_loaded_once
from .fuzz_hostile import Hostile, hostile_cases, json_problems

EXAMPLES = int(os.environ.get("ATTNVIZ_FUZZ_JSON_EXAMPLES", "40"))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    files: Files = make_files(tmp_path_factory.mktemp("fuzz-json"))
    with models_loaded_once():
        yield Hostile(files)


@pytest.mark.parametrize("target", ["corpus", "coref", "config", "tokenizer", "tokenizer_config", "header", "index"])
def test_every_good_file_answers(hostile: Hostile, target: str) -> None:
    # The reference the property compares against: each good input runs and answers.
    import json

    planted = hostile.plant(target, json.dumps(hostile.templates[target]).encode())
    good = hostile.good_answer(planted)
    assert good.exit_code == 0 and good.problems == (), good.stderr[-500:]


@pytest.mark.parametrize("target", ["config", "header", "index", "corpus", "coref", "tokenizer", "tokenizer_config"])
def test_nesting_and_digits_are_refused_in_one_line(hostile: Hostile, target: str) -> None:
    for literal in ("[" * 100_000 + "]" * 100_000, "9" * 5_000, "NaN"):
        template = hostile.templates[target]
        key = sorted(template)[0]
        text = json.dumps({**template, key: "@@"}).replace('"@@"', literal)
        outcome = json_problems(hostile, hostile.plant(target, text.encode()))
        assert outcome.exit_code == 2 and outcome.problems == (), (target, literal[:9], outcome.stderr[-500:])


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(data=st.data())
def test_hostile_json_keeps_every_promise(hostile: Hostile, data: st.DataObject) -> None:
    planted = data.draw(hostile_cases(hostile), label="case")
    outcome = json_problems(hostile, planted)
    assert outcome.problems == (), (planted.target, planted.document[:200], outcome.exit_code, outcome.stderr[-800:])
