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


def _reason_arguments() -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """Every ``reason=`` given to a call in the package, split into the ``Reason.X`` members
    named and any other expression (a string literal, say), plus the reasons jsonread's
    ``_error(where, what, REASON, hint)`` is called with (strings, checked as values)."""
    members, others = [], []
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg != "reason":
                    continue
                value = kw.value
                named = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                if named and value.value.id == "Reason":  # type: ignore[attr-defined]
                    members.append((where, node.lineno, value.attr))
                elif not isinstance(value, ast.Name) and not (
                    isinstance(value, ast.Attribute) and value.attr == "reason"
                ):
                    # (a variable or another error's ``.reason`` passes a reason along)
                    others.append((where, node.lineno, ast.unparse(value)))
            if isinstance(node.func, ast.Name) and node.func.id == "_error" and len(node.args) >= 3:
                arg = node.args[2]
                text = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(text, str) and text not in Reason._value2member_map_:
                    others.append((where, node.lineno, text))
    return members, others


def test_every_reason_given_in_the_package_is_a_named_member() -> None:
    members, others = _reason_arguments()
    assert len(members) > 100  # the scan finds the raises (143 reason=Reason.X today)
    unknown = [(where, line, name) for where, line, name in members if name not in Reason.__members__]
    assert unknown == []
    assert others == []  # no reason passed as a string: a typo would only fail when raised


def test_a_reason_may_still_be_given_by_value() -> None:
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
