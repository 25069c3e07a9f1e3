"""The library's arguments are type-checked before anything runs, with one clear error
(issue 25: ``inspect(..., index=1.5)`` returned token 1; ``inspect(b"...")`` failed deep
inside)."""

from __future__ import annotations

from typing import Any

import pytest

import attnviz
from attnviz.errors import UsageError


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"sentence": b"The cat sat", "token": "cat"}, "sentence must be a str (decode bytes first"),
        ({"index": 1.5}, "index must be an int or None, not float 1.5"),
        ({"index": True}, "index must be an int or None, not bool True"),
        ({"token": "cat", "occurrence": "1"}, "occurrence must be an int or None, not str '1'"),
        ({"token": 5}, "token must be a str, a list of str or None"),
        ({"token": ["cat", 2]}, "token must be a str, a list of str or None"),
        ({"token": "cat", "layers": 1.0}, "layers must be None, an int"),
        ({"token": "cat", "layers": [0, "1"]}, "layers must be None, an int"),
        ({"token": "cat", "words": "yes"}, "words must be True or False"),
        ({"token": "cat", "heads": "mean"}, "heads must be a list of str"),
        ({"token": "cat", "model": 3}, "model must be a path, a model name, a transformers model or None"),
        ({"token": "cat", "engine": None}, "engine must be a str"),
        ({"token": "cat", "max_memory": 1.5e9}, "max_memory must be a number of bytes"),
    ],
)
def test_wrong_argument_types_are_one_usage_error(kwargs: dict[str, Any], words: str, no_model: list[str]) -> None:
    arguments = {"sentence": "The cat sat", **kwargs}
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace("[", r"\[")) as info:
        attnviz.inspect(**arguments)
    assert str(info.value).startswith("inspect(): ")
    assert info.value.facts["reason"] == "type"
    assert no_model == []
