"""errors.py's reasons and the CLI's one hint table (attnviz.cli.hints)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnviz
from attnviz.cli.hints import HINTS, hint_for
from attnviz.errors import (
    AttnvizError,
    LayerError,
    MemoryBudgetError,
    Reason,
    TokenNotFoundError,
    UnsupportedArchitectureError,
    UsageError,
)

PACKAGE = Path(attnviz.__file__).parent


def _reason_literals() -> list[tuple[str, int, str]]:
    """Every string given as ``reason=`` to a call in the package, and the reasons
    jsonread's ``_error(where, what, REASON, hint)`` is called with."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "reason" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    found.append((str(path.relative_to(PACKAGE)), node.lineno, kw.value.value))
            if isinstance(node.func, ast.Name) and node.func.id == "_error" and len(node.args) >= 3:
                arg = node.args[2]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((str(path.relative_to(PACKAGE)), node.lineno, arg.value))
    return found


def test_every_reason_given_in_the_package_is_a_member() -> None:
    literals = _reason_literals()
    assert len(literals) > 50  # the scan finds the raises (92 reason= today)
    unknown = [(where, line, value) for where, line, value in literals if value not in Reason._value2member_map_]
    assert unknown == []


def test_a_reason_is_coerced_to_the_enum_and_compares_as_its_string() -> None:
    exc = TokenNotFoundError("'x' is there twice", reason="ambiguous", count=2)
    assert exc.reason is Reason.AMBIGUOUS and exc.facts["reason"] is Reason.AMBIGUOUS
    assert exc.facts == {"reason": "ambiguous", "count": 2}  # what callers compared before the enum
    with pytest.raises(ValueError):
        UsageError("a typo in a reason", reason="ambigous")


def test_classes_without_a_reason_have_their_own() -> None:
    assert LayerError("layer 9", num_layers=6).reason is Reason.LAYER
    assert UnsupportedArchitectureError("no").reason is Reason.ARCHITECTURE
    assert MemoryBudgetError("too big", need=2, room=1, scope="forward").reason is Reason.MEMORY
    assert UsageError("plain").reason is None and "reason" not in UsageError("plain").facts


def test_hints_come_from_the_table_with_the_facts() -> None:
    assert hint_for(TokenNotFoundError("m", reason=Reason.AMBIGUOUS, count=3)) == "choose one with --occurrence 1..3"
    assert hint_for(TokenNotFoundError("m", reason=Reason.INDEX, count=7)) == "use --index 0..6"
    assert hint_for(LayerError("m", num_layers=6)) == "use --layer 0..5, N,M, A-B or all"
    assert hint_for(LayerError("m", hint="write it low to high: 3-1", num_layers=6)) == "write it low to high: 3-1"
    assert hint_for(UsageError("m", reason=Reason.PAGE_SIZE, fit=3)) == "keep at most 3 layers, e.g. --layer 0-2"
    assert hint_for(UsageError("m", reason=Reason.PIXELS, largest=90, command="show")).endswith("--dpi 90")
    # A reason the table does not hold keeps the library's own hint; no reason likewise.
    assert Reason.TYPE not in HINTS
    assert hint_for(UsageError("m", hint="the library's", reason=Reason.TYPE)) == "the library's"
    assert hint_for(AttnvizError("m", hint="plain")) == "plain"


def test_memory_budget_error_is_matched_by_its_class() -> None:
    from attnviz.engines import memory

    assert memory.MemoryBudgetError is MemoryBudgetError  # one class, defined in errors.py

    class Renamed(MemoryBudgetError):  # a subclass: the class decides, not its name
        pass

    for scope, words in (("scan", "--batch-size"), ("output", "--npz only"), ("forward", "--engine own")):
        hint = hint_for(Renamed("too big", need=2, room=1, scope=scope)) or ""
        assert words in hint and hint.endswith("--max-memory SIZE overrides")


def test_every_table_entry_gives_a_line() -> None:
    facts = {"count": 4, "fit": 2, "largest": 72, "num_layers": 6, "num_heads": 12, "largest_tokens": 900, "longest": 9}
    for reason, hint in HINTS.items():
        text = hint(UsageError("m", reason=reason, **facts)) if callable(hint) else hint
        assert text and "\n" not in text and "--" in text or "attnviz" in (text or ""), reason
