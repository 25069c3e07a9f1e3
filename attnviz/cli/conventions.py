"""The conventions of the command line that typer does not give as we want them.

- Help in the house style: an argument shows its metavar (``SENTENCE``, not
  ``SENTENCE <str>``), the usage line writes a required one bare (``SENTENCE``, not
  ``{SENTENCE}``), choices read ``[own|hf]`` and ranges ``N >= 1``.
- Bad values in the tool's own words: ``--engine must be own or hf, not 'hff'`` instead of
  pydantic's ``Value error, 'hff' is not one of 'own', 'hf'``; the value's origin (the
  command line, an ATTNVIZ_* variable or the config file) is named.
- Defaults from the environment (ATTNVIZ_MODEL, ATTNVIZ_ENGINE, ATTNVIZ_DEVICE) and from
  ``$XDG_CONFIG_HOME/attnviz/config.toml``: the command line wins over the environment,
  the environment over the file (click's default_map sits below its envvar).

Imported by ``attnviz --help``: nothing heavy here (tomllib only when a file exists).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperArgument, TyperOption

try:  # typer >= 0.26 vendors click
    from typer._click import exceptions as click_exc
    from typer._click.core import ParameterSource
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_exc  # type: ignore[no-redef]
    from click.core import ParameterSource  # type: ignore[assignment]

# The defaults a user may set outside the command line: config key -> variable.
ENV_VARS: dict[str, str] = {
    "model": "ATTNVIZ_MODEL",
    "engine": "ATTNVIZ_ENGINE",
    "device": "ATTNVIZ_DEVICE",
    "model_name": "ATTNVIZ_MODEL_NAME",  # the root options: what outputs call the model
    "provenance": "ATTNVIZ_PROVENANCE",
}
DEVICE_RE = re.compile(r"(auto|cpu|mps|cuda(:\d+)?)")


def config_path() -> Path:
    """``$XDG_CONFIG_HOME/attnviz/config.toml`` (``~/.config`` when the variable is unset)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "attnviz" / "config.toml"


class ConfigError(Exception):
    """A config file that cannot be read or holds what we do not know."""


MAX_CONFIG_BYTES = 64 * 1024  # three short keys: anything larger is not a config file
# stat errors that mean "nothing is there": no such file, a file where a directory should
# be, a path too long to exist (an XDG_CONFIG_HOME of 5,000 characters).
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG)


def read_config() -> dict[str, str]:
    """The defaults of the config file ({} when there is none), checked for unknown keys
    and non-string values; the values themselves are checked as options are.

    Raises:
        ConfigError: the file exists and cannot be read whole (a directory, a FIFO, a
            symlink loop, no permission, over ``MAX_CONFIG_BYTES``, not UTF-8, not TOML,
            nested past the parser's recursion limit, a number of 5,000 digits), or holds
            an unknown key or a non-string value. Never more than 64 KiB is read.
    """
    path = config_path()
    try:
        info = path.stat()
    except OSError as exc:
        if exc.errno in _ABSENT:
            return {}
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"the config file {path} is not a regular file")
    too_big = f"the config file {path} is {{:,}} bytes; a config file holds at most {MAX_CONFIG_BYTES // 1024} KiB"
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(too_big.format(info.st_size))
    import tomllib

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # it may have grown since the stat
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(too_big.format(len(raw)))
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except RecursionError:
        raise ConfigError(f"cannot read the config file {path}: nested too deeply") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as exc:
        # ValueError: a number past Python's integer-string limit, among others.
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot read the config file {path}: {reason}") from None
    for key, value in data.items():
        if key not in ENV_VARS:
            raise ConfigError(f"unknown key {key!r} in the config file {path} (known: {', '.join(ENV_VARS)})")
        if not isinstance(value, str):
            raise ConfigError(f'{key} in the config file {path} must be a string, e.g. {key} = "..."')
    return data


def default_map(group: Any, config: dict[str, str]) -> dict[str, Any]:
    """The config file's defaults for every command that takes the option."""
    out: dict[str, Any] = {p.name: config[p.name] for p in group.params if p.name in config}  # the root's own
    for name, command in group.commands.items():
        names = {p.name for p in command.params}
        picked = {k: v for k, v in config.items() if k in names}
        if picked:
            out[name] = picked
    return out


def origin(ctx: Any, param: Any) -> str | None:
    """Where ``param``'s value came from when not from the command line."""
    if ctx is None or param is None or param.name is None:
        return None
    source = ctx.get_parameter_source(param.name)
    if source == ParameterSource.ENVIRONMENT:
        return str(param.envvar)
    if source == ParameterSource.DEFAULT_MAP:
        return str(config_path())
    return None


def origin_of(name: str) -> str | None:
    """Where the running command's option ``name`` (model, engine, device) came from, when
    not from the command line: the hints of errors found after parsing name it."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover
        from click import get_current_context  # type: ignore[no-redef]
    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    param = next((p for p in ctx.command.params if p.name == name), None)
    return origin(ctx, param)


def check_device(value: str | None) -> str | None:
    """--device's spelling, checked while parsing (whether it exists is checked on load)."""
    if value is not None and not DEVICE_RE.fullmatch(value):
        raise typer.BadParameter(f"must be auto, cpu, cuda, cuda:N or mps, not {value!r}")
    return value


# --- help --------------------------------------------------------------------------------


def _range(lo: Any, hi: Any) -> str | None:
    if lo is None and hi is None:
        return None
    if hi is None:
        return f"N >= {lo}"
    if lo is None:
        return f"N <= {hi}"
    return f"{lo}..{hi}"


def _choices(param: Any) -> list[str] | None:
    desc = getattr(param, "type_descriptor", None)
    if desc is None or not desc.is_choice:
        return None
    return [str(c.value) if isinstance(c, Enum) else str(c) for c in desc.choices or ()]


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # the metavar says it: SENTENCE, not SENTENCE <str>

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    def _get_number_range_help_str(self) -> str | None:
        return _range(self.min, self.max)


class _Option(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        if self.metavar is not None:
            return self.metavar
        choices = _choices(self)
        if choices:
            return "[" + "|".join(choices) + "]"
        shown = super().display_type_rich(ctx)
        return None if shown is None else shown.strip("<>").upper()

    def _get_number_range_help_str(self) -> str | None:
        if self.count and self.min == 0 and self.max is None:
            return None
        return _range(self.min, self.max)


def restyle(command: Any) -> None:
    """Give ``command``'s parameters the house style of help (in place)."""
    for param in command.params:
        if type(param) is TyperArgument:
            param.__class__ = _Argument
        elif type(param) is TyperOption:
            param.__class__ = _Option


# --- errors ------------------------------------------------------------------------------


def _or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def bad_parameter(exc: click_exc.BadParameter) -> tuple[str, str | None]:
    """A bad value's message and hint in the tool's words, naming where it came from."""
    param: Any = exc.param
    ctx = exc.ctx
    if param is None:
        return exc.format_message(), None
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")] or list(getattr(param, "opts", ()))
    flag = opts[0] if opts and getattr(param, "param_type_name", "") == "option" else param.human_readable_name
    cause = exc.__cause__
    value: Any = None
    kind = None
    if cause is not None and hasattr(cause, "errors"):
        first = cause.errors()[0] if cause.errors() else {}
        value, kind = first.get("input"), first.get("type")
    choices = _choices(param)
    got = "" if value is None else f", not {str(value)!r}"
    if choices:
        message = f"{flag} must be {_or(choices)}{got}"
    elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        message = f"{flag} must be in {_range(param.min, param.max)}{got}"
    elif kind in ("int_parsing", "int_from_float", "int_type"):
        message = f"{flag} takes a whole number{got}"
    elif kind in ("float_parsing", "float_type"):
        message = f"{flag} takes a number{got}"
    else:
        text = exc.message
        text = text.removeprefix("Value error, ")
        message = f"{flag} {text}" if text.startswith("must ") else f"{flag}: {text}"
    where = origin(ctx, param)
    if where is not None:
        message += f" (from {where})"
    command = ctx.command_path if ctx else "attnviz"
    hint = f"fix or unset {where}" if where is not None else f"see '{command} --help'"
    return message, hint


def example(*commands: str) -> str:
    """A command's epilog: the example that ends its --help, kept on one line each (click's
    ``\\b`` stops the re-wrapping) so it can be copied, and run by the tests."""
    return "Example:\n\n\b\n" + "\n".join(f"  {c}" for c in commands)
