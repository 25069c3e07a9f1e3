"""Command lines drawn from the CLI's own grammar, and the promises every run must keep.

The grammar is read from the typer app itself (its click commands, their options, each
option's type and range), so an option or command added later is fuzzed without a
change here. Values come from pools chosen by the option's type, with a few known
option names (``--layer``, ``--model``, ``--file``...) given sharper pools: values in
and out of range, Unicode and control characters, missing and hostile files. Enum
options draw from their own choices. A valid case draws every value from pools the
option accepts and drops the combinations the CLI refuses (``consistent``), so that it
runs on a tiny BERT, GPT-2 or T5 or the packaged model and its output is checked.

Used by tests/test_fuzz.py (a few hundred examples in CI) and bench/fuzz.py (10,000).
"""

from __future__ import annotations

import json
import shutil
import signal
import time
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from attnviz.example import EXAMPLE

ALLOWED_EXIT_CODES = {0, 1, 2, 130}
# explore takes over the terminal (a Textual app; tested with Pilot in test_explore.py).
INTERACTIVE = {"explore"}
# --debug shows tracebacks by design; --ray starts a Ray cluster (seconds; test_distributed.py).
NEVER = {"debug", "help", "version", "ray", "ray_address"}
# --ablate and its knobs run L·H/batch forward passes per case (and up to --max-passes over a
# corpus): drawn in one case in ABLATE_ONE_IN that names them, and only with a --model that is
# not the packaged MiniLM (the tiny models and the broken ones: milliseconds a pass).
ABLATION = {"ablate", "ablate_with", "max_passes", "yes", "query_rule"}
ABLATE_ONE_IN = 4
PACKAGED = "all-MiniLM-L6-v2"
COMMAND_WEIGHTS = {"check": 1}  # every other command: 4


@dataclass(frozen=True)
class Param:
    """One parameter of a command, as the fuzzer needs it."""

    name: str
    opts: tuple[str, ...]  # empty for an argument
    kind: str  # "str", "int", "float", "path", "bool"
    multiple: bool
    required: bool
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()  # an Enum-typed option's values


def _choices(param: Any) -> tuple[str, ...]:
    import enum

    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(str(member.value) for member in annotation)
    return tuple(str(c) for c in getattr(getattr(param, "type", None), "choices", None) or ())


def _kind(param: Any) -> str:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    seen = [annotation]
    while seen:
        ann = seen.pop()
        origin = typing.get_origin(ann)
        if origin in (typing.Union, types.UnionType, list, tuple):
            seen.extend(a for a in typing.get_args(ann) if a is not type(None))
            continue
        for py, kind in ((bool, "bool"), (int, "int"), (float, "float"), (Path, "path"), (str, "str")):
            if isinstance(ann, type) and issubclass(ann, py):
                return kind
    click_type = type(getattr(param, "type", None)).__name__.lower()  # click proper
    for word, kind in (("bool", "bool"), ("int", "int"), ("float", "float"), ("path", "path")):
        if word in click_type:
            return kind
    return "str"


def grammar(app: Any) -> dict[str, list[Param]]:
    """command name -> its parameters, read from the typer app."""
    import typer.main

    group = typer.main.get_command(app)
    out: dict[str, list[Param]] = {}
    for name, command in sorted(group.commands.items()):  # type: ignore[attr-defined]
        if name in INTERACTIVE:
            continue
        params: list[Param] = []
        for p in command.params:
            if p.name in NEVER:
                continue
            is_option = type(p).__name__.endswith("Option") or bool(getattr(p, "opts", [""])[0].startswith("-"))
            kind = "bool" if getattr(p, "is_flag", False) else _kind(p)
            params.append(
                Param(
                    name=str(p.name),
                    opts=tuple(p.opts) if is_option else (),
                    kind=kind,
                    multiple=bool(getattr(p, "multiple", False)),
                    required=bool(p.required),
                    low=getattr(p, "min", None),
                    high=getattr(p, "max", None),
                    choices=_choices(p),
                )
            )
        out[name] = params
    return out


# --- value pools ------------------------------------------------------------------------

WORDS = ("the", "animal", "it", "street", "tired", "cat", "The", "IT", "didn", "'", ".", "[CLS]", "##al", "zebra")


def texts() -> st.SearchStrategy[str]:
    """Sentences and words: plain, Unicode, control characters, empty, long."""
    return st.one_of(
        st.just(EXAMPLE),
        st.just(EXAMPLE),  # twice: about one case in four runs the real sentence
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join),
        st.text(max_size=40),  # any code point hypothesis likes, surrogates included
        st.text(st.characters(codec="utf-8"), min_size=1, max_size=60),
        st.text(st.characters(categories=["Cc", "Zs", "Cf", "Mn"]), max_size=8),
        st.sampled_from(["", " ", "\t\n", "\x00", "\u202e it", "\ufeffit", "it\x1b[31m", "😀 it 😀", "x" * 2000]),
        st.builds(lambda a, b: f"{a} {b}", st.sampled_from(WORDS), st.text(max_size=10)),
    )


def integers(low: int | None, high: int | None) -> st.SearchStrategy[str]:
    edges = [v for v in (low, high) if v is not None]
    near = [str(v + d) for v in edges for d in (-1, 0, 1)]
    lo = low if low is not None else -3
    valid = st.integers(lo, min(high if high is not None else lo + 20, lo + 300)).map(str)
    return st.one_of(
        valid,
        valid,  # twice: half the values are in range, so the command goes on to run
        st.sampled_from(near or ["0"]),
        st.sampled_from(["-1", "0", "10**9", "1e3", "", "x", "1.5", str(2**63), "9" * 40, "-" + "9" * 40, "٣"]),
        st.integers(-(2**70), 2**70).map(str),
    )


def layers() -> st.SearchStrategy[str]:
    n = st.integers(-8, 8).map(str)
    return st.one_of(
        st.sampled_from(
            ["all", "", "0", "-1", "5", "6", "0-200000000", "5-2", "1,1,1", "a", "0-", "-", "1.5", "9" * 5000]
        ),
        n,
        st.builds(lambda a, b: f"{a}-{b}", n, n),
        st.lists(n, min_size=1, max_size=4).map(",".join),
        texts(),
    )


@dataclass
class Files:
    """The files a fuzz run points options at: good and hostile, made once."""

    root: Path
    out: Path  # emptied before each example; nothing may be left here after a failure
    models: list[str] = field(default_factory=list)  # good ones first (see GOOD_MODELS)
    pairs: list[str] = field(default_factory=list)  # the good file first
    texts: list[str] = field(default_factory=list)  # --file / --target-file; good ones first
    corpora: list[str] = field(default_factory=list)  # heads' CORPUS; good ones first

    def outputs(self) -> list[str]:
        o = self.out
        return [
            str(o / "heads.png"), str(o / "heads.svg"), str(o / "heads.pdf"), str(o / "heads.gif"),
            str(o / "noext"), str(o / "missing" / "x.png"), str(o), "/proc/attnviz.png", "/sys/x.png",
            "/dev/null", "/dev/full", str(o / ("a" * 300 + ".png")), str(o / "sp ace é.png"), str(o / ".png"),
            "-", "", str(o / "view.html"), str(o / "a.npz"), str(o / "a.json"),
        ]  # fmt: skip

    def good_models(self) -> list[str]:
        return self.models[:GOOD_MODELS] + self.models[-1:]


GOOD_MODELS = 3  # files.models starts with a tiny BERT, GPT-2 and T5; the packaged model is last
SEQ2SEQ = "tiny-t5"  # the one encoder-decoder among them


def make_files(root: Path) -> Files:
    """Checkpoints (a good tiny BERT and broken copies of it), pairs files, an output dir."""
    import math

    from safetensors.torch import load_file, save_file

    from .builders import SPECS_BY_NAME, save_tiny

    root.mkdir(parents=True, exist_ok=True)
    files = Files(root=root, out=root / "out")
    files.out.mkdir(exist_ok=True)
    good = root / "tiny-bert"
    for name, spec in (("tiny-bert", "bert"), ("tiny-gpt2", "gpt2"), (SEQ2SEQ, "t5")):
        if not (root / name).exists():
            save_tiny(SPECS_BY_NAME[spec], root / name)

    def variant(name: str, change: Callable[[Path], None]) -> str:
        path = root / name
        if not path.exists():
            shutil.copytree(good, path)
            change(path)
        return str(path)

    def weights(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
        def apply(path: Path) -> None:
            t = load_file(str(path / "model.safetensors"))
            edit(t)
            save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})

        return apply

    def config(**changes: Any) -> Callable[[Path], None]:
        def apply(path: Path) -> None:
            c = json.loads((path / "config.json").read_text())
            c.update(changes)
            (path / "config.json").write_text(json.dumps(c))

        return apply

    def no_tokenizer(path: Path) -> None:
        for f in path.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
                f.unlink()

    def nan(t: dict[str, Any]) -> None:
        t["bert.encoder.layer.1.attention.self.query.weight"][0, 0] = math.nan

    def missing(t: dict[str, Any]) -> None:
        for k in [k for k in t if "layer.1.attention.self.key" in k]:
            del t[k]

    files.models = [
        str(good),
        str(root / "tiny-gpt2"),
        str(root / SEQ2SEQ),
        variant("nan", weights(nan)),
        variant("missing", weights(missing)),
        variant("no-tokenizer", no_tokenizer),
        variant("layers-1e5", config(num_hidden_layers=100_000)),
        variant("layers-1", config(num_hidden_layers=1)),
        variant("zero-width", config(hidden_size=0)),
        variant("string-heads", config(num_attention_heads="three")),
        variant("gpt2-type", config(model_type="gpt2")),
        variant("truncated", lambda p: (p / "model.safetensors").write_bytes(b"\x10\x00" + b"\x00" * 6 + b"{")),
        str(root / "does-not-exist"),
        "/dev/zero",
        "/proc",
        str(root / ("m" * 300)),
        "org/not-cached",
        "all-MiniLM-L6-v2",
    ]
    good_pairs = root / "pairs.tsv"
    good_pairs.write_text(
        f"sentence_a\tsentence_b\ttoken\ttargets\n{EXAMPLE}\t{EXAMPLE.replace('tired', 'wide')}\tit\tanimal,street\n"
    )
    bad_utf8 = root / "bad-utf8.tsv"
    bad_utf8.write_bytes(b"sentence_a\tsentence_b\ttoken\ttargets\n\xff\xfe\tb\tc\td\n")
    no_header = root / "no-header.tsv"
    no_header.write_text("a\tb\tc\td\n")
    long_line = root / "long-line.tsv"
    long_line.write_text("x" * 200_000)
    files.pairs = [str(good_pairs), str(bad_utf8), str(no_header), str(long_line), "/dev/zero", "/dev/null",
                   str(root / "missing.tsv"), str(root), "/proc/self/status"]  # fmt: skip
    sentence = root / "sentence.txt"
    sentence.write_text(EXAMPLE + "\n")
    german = root / "target.txt"
    german.write_text("Das Tier überquerte die Straße nicht, weil es zu müde war.\n")
    binary = root / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    empty = root / "empty.txt"
    empty.write_text("")
    files.texts = [str(sentence), str(german), str(bad_utf8), str(long_line), str(binary), str(empty),
                   "/dev/zero", "/dev/null", str(root / "missing.txt"), str(root), "-"]  # fmt: skip
    corpus = root / "corpus.txt"
    corpus.write_text(f"{EXAMPLE}\nThe cat sat on the mat.\n\nA B C D A B C D\n")
    jsonl = root / "corpus.jsonl"
    jsonl.write_text(json.dumps({"text": EXAMPLE}) + "\n" + json.dumps({"text": "The cat sat."}) + "\n")
    bad_jsonl = root / "bad.jsonl"
    bad_jsonl.write_text('{"text": 3}\n{"txt": "x"}\nnot json\n[1, 2]\n')
    files.corpora = [str(corpus), str(jsonl), str(bad_jsonl), str(bad_utf8), str(long_line), str(binary),
                     str(empty), "/dev/zero", "/dev/null", str(root / "missing.txt"), str(root), "-"]  # fmt: skip
    return files


def value_for(param: Param, files: Files) -> st.SearchStrategy[str]:
    """A strategy of command-line strings for one option or argument: in and out of range."""
    key = param.opts[0] if param.opts else param.name
    sharper: dict[str, st.SearchStrategy[str]] = {
        "--layer": layers(),
        "--model": st.one_of(st.sampled_from(files.good_models()), st.sampled_from(files.models), texts()),
        "--device": st.sampled_from(["cpu", "auto", "cuda", "cuda:7", "mps", "tpu", "", "cpu:0"]),
        "--pairs": st.sampled_from(files.pairs),
        "--token": st.one_of(st.sampled_from(["it", "animal", "street", "the", "tired", "it:2", "the:9"]), texts()),
        "--target": st.one_of(st.sampled_from(["animal", "street", "the:2", "it", "cat"]), texts()),
        "--vs": st.one_of(st.just(EXAMPLE.replace("tired", "wide")), texts()),
        "--file": st.sampled_from(files.texts),
        "--target-file": st.sampled_from(files.texts),
        "corpus": st.one_of(st.sampled_from(files.corpora), texts()),
        "--max-memory": st.sampled_from(["8GB", "1KB", "0", "-1GB", "1e400GB", "nanGB", "16 GiB", "x", ""]),
        "--figsize": st.sampled_from(["6x3", "0x0", "1e9x1e9", "-1x2", "nanx2", "6", "x", ""]),
        "--vmax": st.sampled_from(["auto", "1", "0", "-0.5", "2", "nan", "inf", "x", ""]),
        "--heads": st.one_of(st.sampled_from(["0", "mean,max", "99", "-1", "mean,mean", ",", "x", ""]), texts()),
        "--exclude": st.one_of(st.sampled_from(["none", "special,none", "adjacent,", "x", ""]), texts()),
    }
    if key in sharper:
        return sharper[key]
    if param.choices:
        near = [param.choices[0].upper(), param.choices[0] + "\x00", " " + param.choices[-1], "", "x"]
        return st.one_of(st.sampled_from(param.choices), st.sampled_from(near))
    if param.kind == "int":
        return integers(param.low, param.high)
    if param.kind == "float":
        return st.sampled_from(["0", "0.5", "1", "-1", "nan", "inf", "1e309", "x", ""])
    if param.kind == "path":
        return st.one_of(st.sampled_from(files.outputs()[:3]), st.sampled_from(files.outputs() + files.pairs))
    return texts()


def valid_for(param: Param, files: Files, command: str) -> st.SearchStrategy[str]:
    """A value the option accepts, so that a case gets past its checks and runs."""
    key = param.opts[0] if param.opts else param.name
    out = files.out
    known: dict[str, list[str]] = {
        "--layer": ["all", "0", "0-1", "-1", "0,1", "1"],  # the tiny models have two layers
        "--model": files.good_models(),
        "--engine": ["own", "own", "hf"],
        "--device": ["cpu", "auto"],
        "--dtype": ["float32", "float32", "bfloat16"],
        "--pairs": files.pairs[:1],
        # "anim" and "##al": parts of a word (a piece query under --words, issue 25)
        "--token": ["it", "animal", "street", "because:1", "anim", "##al", "東京"],
        "--target": ["animal", "street", "because"],
        "--vs": [EXAMPLE.replace("tired", "wide")],
        "--index": ["0", "3", "-1", "2", "4"],
        "--occurrence": ["1"],
        "--file": files.texts[:1],
        "--target-file": files.texts[:1],  # the decoder reads the sentence again: --token finds its words
        "--target-text": [EXAMPLE],
        "--pair": ["Nobody knew why."],
        "--sentence": [EXAMPLE, "The cat sat on the mat."],
        "--heads": ["0", "0,1", "mean", "max", "mean,max", "1,mean"],
        "--figsize": ["6x3", "3.5x2"],
        "--fontsize": ["8", "6.5", "12"],
        "--vmax": ["auto", "1", "0.5"],
        "--cmap": ["viridis", "magma", "Blues"],
        "--max-memory": ["8GB", "800MB"],
        "--exclude": ["special", "none", "special,punct", "adjacent"],
        "--npz": [str(out / "a.npz")],
        "--png": [str(out / "a.png")],
        "--output": (
            [str(out / "a.png"), str(out / "a.svg")]
            if command == "heads"
            else [str(out / "a.png"), str(out / "a.svg"), str(out / "a.pdf"), str(out / "view.html")]
        ),  # fmt: skip
        "--dpi": ["50", "72", "100"],
        "--probe": ["induction"],
        "--format": ["auto"],
        "--probe-texts": ["1", "3", "8"],
        "--probe-length": ["1", "4", "12"],
        "--batch-size": ["1", "2", "8"],
        "--local-k": ["0", "1", "3"],
        "--limit": ["1", "3", "10"],
        "--seed": ["0", "7"],
        "--query-rule": ["all", "last"],
        "--max-passes": ["100", "20000"],
        "corpus": files.corpora[:2],
    }
    if command == "explain":  # one layer and one head, in range on every good model (2 layers, 3 heads)
        known.update({"--layer": ["0", "1"], "--head": ["0", "1", "2"], "--key": ["animal", "street", "the"]})
    if key in known:
        return st.sampled_from(known[key])
    if param.choices:
        return st.sampled_from(param.choices)
    if param.kind == "int":
        low = param.low if param.low is not None else 0
        return st.integers(low, min(param.high if param.high is not None else low + 5, low + 100)).map(str)
    if param.kind == "path":
        return st.sampled_from(files.outputs()[:3])
    return st.sampled_from(WORDS[:5])


# Hold the --token words the valid pool draws; 東京 is two words for BERT (issue 25).
SHORT = ("it animal", "the animal it", "it", "it 東京 animal")
HOSTILE, MOSTLY_VALID, VALID = 0, 9, 10  # in ten values, how many come from the valid pools
MODES = [HOSTILE, MOSTLY_VALID, VALID]


@st.composite
def command_lines(draw: Any, commands: dict[str, list[Param]], files: Files) -> list[str]:
    """One command line: a command, some of its options (sometimes none, sometimes an unknown
    one), each with a drawn value; arguments in place.

    Three kinds of case, in equal shares: hostile (every value from the hostile pools),
    mostly valid (each value valid nine times in ten) and valid (every value valid and the
    options made consistent, so the command runs and its output is checked)."""
    # Commands drawn in proportion to their cost: `check` runs two engines on five
    # sentences (seconds), the others one forward pass (milliseconds).
    name = draw(st.sampled_from([c for c in sorted(commands) for _ in range(COMMAND_WEIGHTS.get(c, 4))]))
    valid_share = draw(st.sampled_from(MODES))

    def value(param: Param) -> str:
        valid = draw(st.integers(0, 9)) < valid_share
        return str(draw(valid_for(param, files, name) if valid else value_for(param, files)))

    chosen: list[tuple[Param, str, str | None]] = []  # (param, flag or "", value)
    for param in commands[name]:
        if not param.opts:  # an argument: usually present, often the real sentence
            if valid_share == VALID or draw(st.integers(0, 9)) > 0:
                real = valid_share and param.name == "sentence" and (valid_share == VALID or draw(st.integers(0, 4)))
                # Short sentences too: compare on 2-3 words was an IndexError (issue 25).
                sentence = draw(st.sampled_from([EXAMPLE, EXAMPLE, EXAMPLE, *SHORT])) if real else None
                chosen.append((param, "", sentence if sentence is not None else value(param)))
            continue
        likely = param.required or param.opts[0] in ("--token", "--target")
        if not (param.required and valid_share == VALID) and draw(st.integers(0, 9)) >= (
            9 if likely else (2 if valid_share == VALID else 3)
        ):
            continue
        times = draw(st.integers(1, 3)) if param.multiple else 1
        for _ in range(times):
            flag = draw(st.sampled_from(param.opts))
            chosen.append((param, flag, None if param.kind == "bool" else value(param)))
    if any(c[0].name in ABLATION for c in chosen) and not ablation_allowed(chosen, files, draw):
        chosen = [c for c in chosen if c[0].name not in ABLATION]
    if valid_share == VALID:
        chosen = consistent(name, commands[name], chosen, files)
    argv = [name]
    for _, flag, val in chosen:
        argv += [flag] if flag else []
        argv += [] if val is None else [val]
    if not valid_share and draw(st.integers(0, 9)) == 0:
        argv.append(draw(st.sampled_from(["--bogus", "-Z", "--json=3", "--", "--help"])))
    return argv


def ablation_allowed(chosen: list[tuple[Param, str, str | None]], files: Files, draw: Any) -> bool:
    """--ablate (and its knobs) stay in one case in ABLATE_ONE_IN, and only where a --model
    is given that is not the packaged model (whose 72 heads over a corpus take seconds)."""
    models = [c[2] for c in chosen if c[0].opts and c[0].opts[0] == "--model"]
    small = bool(models) and all(Path(str(m)).name != PACKAGED and str(m) != PACKAGED for m in models)
    return small and draw(st.integers(0, ABLATE_ONE_IN - 1)) == 0


def consistent(
    command: str, params: list[Param], chosen: list[tuple[Param, str, str | None]], files: Files
) -> list[tuple[Param, str, str | None]]:
    """Drop the options a valid case must not combine (each rule is a usage error the CLI
    owes the user, and is fuzzed by the other two kinds of case)."""

    def key(item: tuple[Param, str, str | None]) -> str:
        return item[0].opts[0] if item[0].opts else item[0].name

    def has(k: str) -> bool:
        return any(key(c) == k for c in chosen)

    def drop(*keys: str) -> None:
        chosen[:] = [c for c in chosen if key(c) not in keys]

    def add(flag: str, value: str) -> None:
        chosen.append((next(p for p in params if flag in p.opts), flag, value))

    if has("sentence"):
        drop("--file")
    if command == "check":
        drop("--list")  # the families table: every model type transformers knows, not this model
    # One kind of query; --occurrence only after one --token.
    if has("--token"):
        drop("--index", "--all-tokens")
        words = [c for c in chosen if key(c) == "--token"]
        if len(words) > 1:
            drop("--occurrence")
            for i, c in enumerate(words):  # distinct words (the valid ones share no token)
                if c[2] in [w[2] for w in words[:i]]:
                    chosen.remove(c)
        if any(":" in (c[2] or "") for c in words):
            drop("--occurrence")  # it:1 -n 1 would look for the text "it:1"
    else:
        drop("--occurrence")
        if has("--index"):
            drop("--all-tokens")
    if has("--no-renorm") and not has("--hide-special"):
        drop("--no-renorm")
    model = next((c[2] for c in chosen if key(c) == "--model"), files.models[-1])
    if Path(str(model)).name == SEQ2SEQ:
        drop("--pair", "--vs", "--pairs")
        if has("--target-file"):
            drop("--target-text")
        if any(c[1] and c[2] == str(files.out / "view.html") for c in chosen):
            drop("--output")  # the page shows self-attention over one text
            add("--output", str(files.out / "a.png"))
        if has("--part") and not (has("--target-text") or has("--target-file")):
            drop("--part")
    else:
        drop("--target-text", "--target-file", "--part")
        if "gpt2" in str(model):
            drop("--pair")
    if command == "show" and not (has("--token") or has("--index") or has("--all-tokens")):
        add("--token", "it")
    if command in ("show", "compare", "heads") and has("--ablate"):
        drop("--all-tokens", "--rollout")  # nothing to ablate (refusals the other kinds draw)
        if command == "show" and not (has("--token") or has("--index")):
            add("--token", "it")
    elif has("--ablate-with") or has("--max-passes") or has("--yes") or has("--query-rule"):
        drop("--ablate-with", "--max-passes", "--yes", "--query-rule")
    if command == "explain":
        if not (has("--token") or has("--index")):
            add("--token", "it")
        for flag in ("--layer", "--head"):
            if not has(flag):
                add(flag, "0")
        if has("--output"):
            drop("--output")  # explain writes a page only (.html)
            add("--output", str(files.out / "explain.html"))
    matrix = any(key(c) == "--view" and c[2] == "matrix" for c in chosen)
    if command == "export" and not (has("--token") or has("--index") or matrix):
        add("--token", "it")
    if command == "compare":
        drop("--heads")  # compare ranks every head
        if has("--pairs") or has("--vs"):
            drop("--pair", "--target-text", "--target-file", "--part")
        if has("--pairs"):
            drop("sentence", "--file", "--vs", "--token", "--target", "--index", "--occurrence")
        elif not (has("--token") or has("--index")):
            add("--token", "it")
        elif has("--vs"):
            drop("--index")
            if not has("--target"):
                drop("--vs")
    if command == "heads":
        if has("--probe"):
            drop("corpus")
        elif not has("corpus"):
            add("--probe", "induction")
        if has("--json"):
            drop("--csv")
    return chosen


# --- running one case and checking the promises ---------------------------------------


class Hang(BaseException):
    """A case ran past its time limit (a BaseException: nothing in attnviz may catch it)."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@dataclass(frozen=True)
class Outcome:
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    seconds: float
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Environment:
    """What a case runs under: the terminal width users set (0 and 1 printed nothing, with
    exit 0) and standard output's encoding (``PYTHONIOENCODING=ascii``: the header's
    ``·``), issue 25. In-process, the encoding is CliRunner's charset (its stderr is
    backslash-escaped, as Python's own is)."""

    columns: str = "120"
    charset: str = "utf-8"

    def to_dict(self) -> dict[str, str]:
        return {"COLUMNS": self.columns, "PYTHONIOENCODING": self.charset}


@st.composite
def environments(draw: Any) -> Environment:
    """Mostly the default; a width of 0, 1, 40 or 300, an ASCII or Latin-1 stdout."""
    columns = draw(st.sampled_from(["120"] * 6 + ["0", "1", "40", "300"]))
    charset = draw(st.sampled_from(["utf-8"] * 6 + ["ascii", "ascii", "latin-1"]))
    return Environment(columns, charset)


def run_case(
    app: Any, argv: list[str], files: Files, limit_s: int = 120, environment: Environment | None = None
) -> Outcome:
    """Run one command line in-process and list every broken promise."""
    from typer.testing import CliRunner

    environment = environment or Environment()

    for leftover in files.out.iterdir():
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    start = time.perf_counter()
    try:
        with time_limit(limit_s):
            runner = CliRunner(charset=environment.charset)
            result = runner.invoke(app, argv, env={"NO_COLOR": "1", "COLUMNS": environment.columns})
    except Hang as exc:
        return Outcome(argv, -1, "", "", time.perf_counter() - start, (str(exc),))
    seconds = time.perf_counter() - start
    code = result.exit_code
    out, err = result.stdout, result.stderr
    problems: list[str] = []
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        problems.append(f"uncaught {type(result.exception).__name__}: {result.exception}")
    if code not in ALLOWED_EXIT_CODES:
        problems.append(f"exit code {code}")
    if "Traceback (most recent call last)" in out + err:
        problems.append("a traceback")
    errors = [line for line in err.splitlines() if line.startswith("attnviz: error:")]
    if any("rerun with --debug" in line for line in errors):
        problems.append("an internal error (an exception no check turned into a message)")
    if code in (1, 2, 130) and "--help" not in argv:
        # `check` reports a failed comparison as its table and exit 1: that is its answer.
        answered = argv[0] == "check" and code == 1 and out.strip() and not errors
        if not answered and len(errors) != 1:
            problems.append(f"{len(errors)} error lines on failure")
        if errors and err.strip().splitlines()[-1] != errors[-1]:
            problems.append("the error is not the last stderr line")
    prints = argv[0] in ("show", "compare") and "--help" not in argv and "--all-tokens" not in argv
    if code == 0 and prints and not out.strip():
        problems.append("exit 0 with nothing on stdout")
    if code == 0 and "--json" in argv and "--help" not in argv and out.strip():
        try:
            printed = json.loads(out, parse_constant=_no_constants)
        except ValueError as exc:
            problems.append(f"--json printed invalid JSON ({exc})")
        else:
            if argv[0] == "show":
                problems += weight_problems(argv, printed)
    if code == 0 and "--help" not in argv:
        problems += written_problems(argv, files)
    left = sorted(p.name for p in files.out.iterdir())
    if any(name.endswith(".tmp") for name in left):
        problems.append(f"temp file left: {left}")
    if code != 0 and left:
        problems.append(f"files left after a failure: {left}")
    return Outcome(argv, code, out, err, seconds, tuple(problems))


MAGIC = {".png": b"\x89PNG\r\n\x1a\n", ".pdf": b"%PDF-", ".npz": b"PK\x03\x04", ".html": b"<!DOCTYPE html>"}


def written_problems(argv: list[str], files: Files) -> list[str]:
    """After a success, each file named by -o/--output/--png/--npz is there, whole, in its
    format (read by its first bytes; an SVG is XML that closes)."""
    problems = []
    for flag, path in zip(argv, argv[1:], strict=False):
        if flag not in ("-o", "--output", "--png", "--npz") or not path.startswith(str(files.out)):
            continue
        target = Path(path)
        if not target.is_file():
            problems.append(f"{flag} {target.name}: no file after exit 0")
            continue
        data = target.read_bytes()
        suffix = target.suffix.lower()
        if suffix == ".svg":
            whole = data.rstrip().endswith(b"</svg>")
        elif suffix == ".html":  # the doctype is case-insensitive (explain's page writes it lower-case)
            whole = data[: len(MAGIC[suffix])].upper() == MAGIC[suffix].upper() and b"</html>" in data[-64:]
        else:
            whole = data.startswith(MAGIC.get(suffix, b""))
        if not data or not whole:
            problems.append(f"{flag} {target.name}: not a whole {suffix or 'file'} ({len(data)} bytes)")
    return problems


def weight_problems(argv: list[str], printed: Any) -> list[str]:
    """No silent wrong answers in `show --json`: every weight is a number in [0, 1], and
    every row is a distribution (sums to 1) unless the run asked for rows that are not:
    --no-renorm (the special tokens' share left out) or a max-over-heads row."""
    problems: list[str] = []
    low_precision = any(a in argv for a in ("bfloat16", "float16"))
    tolerance = 2e-2 if low_precision else 1e-4  # six decimals each, up to ~60 keys

    def rows(x: Any) -> Iterator[list[Any]]:
        if isinstance(x, list) and x and not isinstance(x[0], list):
            yield x
        elif isinstance(x, list):
            for item in x:
                yield from rows(item)

    for doc in printed if isinstance(printed, list) else [printed]:
        if not isinstance(doc, dict) or "weights" not in doc:
            problems.append("show --json printed no weights")
            continue
        norm = doc.get("measure") == "norm"  # raw norms α·‖f(x)‖: not shares, no bound but ≥ 0
        asked = [v for f, v in zip(argv, argv[1:], strict=False) if f == "--measure"]
        if norm != (asked[-1:] == ["norm"]):
            problems.append(f"show --json says measure {doc.get('measure')!r} for {argv}")
        check_sums = not norm and "--no-renorm" not in argv and "max" not in doc.get("heads", [])
        for row in rows(doc["weights"]):
            top = float("inf") if norm else 1 + 1e-6
            if not all(isinstance(w, (int, float)) and -1e-6 <= w <= top for w in row):
                problems.append(f"a {'norm below 0' if norm else 'weight outside [0, 1]'}: {row[:8]}")
                break
            if check_sums and abs(sum(row) - 1) > tolerance:
                problems.append(f"a row that sums to {sum(row):.6f}, not 1")
                break
    return problems


def _no_constants(name: str) -> Any:
    raise ValueError(f"bare {name}")


@contextmanager
def models_loaded_once() -> Iterator[dict[Any, Any]]:
    """Cache engines by (engine, model, device): a fuzz case costs its own work, not a
    model load (errors are raised again every time, never cached)."""
    import torch

    import attnviz.engines as engines

    # One thread: on a busy machine torch's pool spins (0.5 s per MiniLM forward measured
    # on 2 shared cores, against ~20 ms on one thread); the fuzz is about behaviour.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    real = engines.load_engine
    cache: dict[Any, Any] = {}

    def cached(name: str = "own", model: Any = None, device: str = "auto", dtype: str = "float32", **given: Any) -> Any:
        spec = str(getattr(model, "path", model))
        key = (name, spec, device, dtype)
        if key not in cache:  # a tokenizer passed in (explain's) is the checkpoint's own
            cache[key] = real(name, model, device, dtype, **given)
        return cache[key]

    engines.load_engine = cached  # type: ignore[assignment]
    try:
        yield cache
    finally:
        engines.load_engine = real
        torch.set_num_threads(threads)
