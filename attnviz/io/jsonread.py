"""The one reader of JSON input, with bounds: size, nesting depth, number length.

Every JSON document attnviz reads (config.json, a shard index, a safetensors header,
tokenizer.json, a JSONL corpus line, a coreference file) goes through ``loads``, so a
hostile file fails the same way everywhere: one ``JSONInputError`` naming the file (and
line), never a RecursionError (100,000 nested brackets), a ValueError from int() (a
5,000-digit integer passes Python's 4,300-digit limit for str -> int) or a MemoryError,
and never a NaN or Infinity (not JSON: a NaN in config.json would be a silent NaN answer).

    loads(text, where, max_bytes=..., max_depth=..., max_number=...)

Python's C parser bounds the depth itself (a RecursionError near 1,000 levels, caught
here); below that, the parsed value's depth is measured without recursion. Stdlib only.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import UsageError

MAX_DEPTH = 64  # real configs nest 4-6 deep; tokenizer.json about 8
MAX_NUMBER = 100  # characters of one number literal: float64 needs about 25
MAX_BYTES = 64 * 2**20


class JSONInputError(UsageError):
    """A JSON input that is not JSON, or breaks a bound. facts: ``where``, ``reason``
    ("syntax", "depth", "number", "size", "type")."""


def depth(value: Any) -> int:
    """The deepest nesting of arrays and objects in a parsed value (iterative: no
    recursion, linear in the number of values)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def loads(
    text: str | bytes,
    where: str,
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_number: int = MAX_NUMBER,
    hint: str | None = None,
) -> Any:
    """``text`` parsed as JSON, within the bounds.

    Raises:
        JSONInputError: naming ``where``: too big, nested deeper than ``max_depth``, a
            number literal longer than ``max_number`` characters, or not JSON.
    """
    hint = hint or "the file is corrupt or not what its name says"
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise _error(where, f"is {len(text):,} bytes; more than {max_bytes:,} is refused", "size", hint)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _error(where, f"is not UTF-8 (byte {exc.start + 1})", "syntax", hint) from None
    elif len(text) > max_bytes:  # characters: at least as many bytes
        raise _error(where, f"is over {max_bytes:,} bytes; it is refused", "size", hint)

    def number(kind: type) -> Any:
        def parse(literal: str) -> Any:
            if len(literal) > max_number:
                raise _error(
                    where, f"holds a number of {len(literal):,} characters; {max_number} is the most", "number", hint
                )
            value = kind(literal)
            if kind is float and not math.isfinite(value):  # 1e99999 overflows to inf
                raise _error(where, f"holds {literal}, which no float64 holds", "number", hint)
            return value

        return parse

    def constant(name: str) -> Any:  # NaN, Infinity, -Infinity: Python writes them, JSON has none
        raise _error(where, f"holds {name}, which is not JSON (RFC 8259 has no NaN or Infinity)", "number", hint)

    too_deep = f"nests more than {max_depth} levels deep; that is refused"
    try:
        value = json.loads(text, parse_int=number(int), parse_float=number(float), parse_constant=constant)
    except JSONInputError:
        raise
    except RecursionError:  # the C parser's own bound (~1,000 levels): caught, not a crash
        raise _error(where, too_deep, "depth", hint) from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        detail = f"line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "bad value"
        raise _error(where, f"is not valid JSON ({msg} at {detail})", "syntax", hint) from None
    if depth(value) > max_depth:
        raise _error(where, too_deep, "depth", hint)
    return value


def _error(where: str, what: str, reason: str, hint: str) -> JSONInputError:
    return JSONInputError(f"{where} {what}", hint=hint, where=where, reason=reason)
