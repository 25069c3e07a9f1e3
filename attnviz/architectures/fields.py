"""Reading one config.json value: "missing" and "zero" told apart, then checked.

``config.get(key) or default`` reads a 0 (or 0.0, "", []) as "unset" and answers for
another model than the one transformers runs: ``partial_rotary_factor: 0`` became full
rotary, GPT-Neo's ``window_size: 0`` became 256. Here a key is unset only when it is
absent or null; any other value is the value, and it is checked against its range. A
value out of range raises ``ValueError`` naming the key, which the family loader turns
into a ``ModelLoadError`` (exit 2) naming config.json.

Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
_INT_LIMIT = 2**31  # as checkpoint.validate_config bounds the sizes it knows

__all__ = ["fraction", "given", "number", "sequence", "text", "whole"]


def given(config: Mapping[str, Any], key: str, default: T) -> Any | T:
    """``config[key]`` when present and not null, else ``default`` (0 and "" are values)."""
    value = config.get(key)
    return default if value is None else value


def _shown(value: Any) -> str:
    text_ = repr(value)
    return text_ if len(text_) <= 40 else text_[:40] + "…"


def whole(config: Mapping[str, Any], key: str, default: Any, *, low: int = 1, name: str | None = None) -> int:
    """A whole number of at least ``low`` (``default`` when unset; it may be an int or None
    only when the caller accepts None back)."""
    value = given(config, key, default)
    label = name or key
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{label} is {_shown(value)}; it must be a whole number")
    if value < low:
        raise ValueError(f"{label} is {value}; it must be at least {low}")
    if value >= _INT_LIMIT:  # a size or a window no tensor index reaches (1e308 is integral)
        raise ValueError(f"{label} is {_shown(value)}; it must be below {_INT_LIMIT}")
    return value


def number(
    config: Mapping[str, Any],
    key: str,
    default: float,
    *,
    above: float | None = None,
    low: float | None = None,
    high: float | None = None,
    name: str | None = None,
) -> float:
    """A finite number, strictly above ``above`` and within [``low``, ``high``] where given."""
    value = given(config, key, default)
    label = name or key
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{label} is {_shown(value)}; it must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{label} is {value}; it must be a finite number")
    if above is not None and value <= above:
        raise ValueError(f"{label} is {value}; it must be above {above:g}")
    if low is not None and value < low:
        raise ValueError(f"{label} is {value}; it must be at least {low:g}")
    if high is not None and value > high:
        raise ValueError(f"{label} is {value}; it must be at most {high:g}")
    return value


def fraction(config: Mapping[str, Any], key: str, default: float, *, name: str | None = None) -> float:
    """A number in (0, 1]: a share of something that must not vanish (a rotary factor)."""
    return number(config, key, default, above=0.0, high=1.0, name=name)


def text(config: Mapping[str, Any], key: str, default: str) -> str:
    """A string (an activation's name); "" is a value, and no activation is called that."""
    value = given(config, key, default)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is {_shown(value)}; it must be a non-empty string")
    return value


def sequence(config: Mapping[str, Any], key: str, default: Sequence[Any]) -> Sequence[Any]:
    """A list (``layer_types``, ``mlp_only_layers``); an empty list is a value."""
    value = given(config, key, default)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{key} is {_shown(value)}; it must be a list")
    return value
