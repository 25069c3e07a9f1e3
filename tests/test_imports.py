"""Start-up cost and the import rules of DESIGN.md, checked in fresh interpreters: one
table of who may not import what, the package's import graph without a cycle, and the
layers (nothing imports the CLI or the package face; only the CLI names flags)."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "matplotlib", "textual")
MODEL = ("torch", "transformers")
UI = ("rich", "typer", "matplotlib", "textual")
STDLIB_ONLY = ("torch", "numpy", "rich", "typer", "matplotlib", "transformers", "textual")


def loaded_after(code: str) -> set[str]:
    """Modules in sys.modules after running ``code`` in a new interpreter: every name, so a
    rule may forbid a package ("torch") or one of its modules ("matplotlib.pyplot")."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


# The one table: importing the module (alone, in a fresh interpreter) must not load any of
# these. "attnviz.architectures.*" stands for every family module the registry names.
RULES: dict[str, tuple[str, ...]] = {
    "attnviz": ("torch", "transformers", "matplotlib", "rich", "typer", "textual", "IPython", "anywidget"),
    "attnviz.errors": STDLIB_ONLY,
    "attnviz.version": STDLIB_ONLY,
    "attnviz.shape": STDLIB_ONLY,
    "attnviz.select": STDLIB_ONLY,
    # The sub-packages' faces are docstrings: importing one loads nothing.
    "attnviz.nn": STDLIB_ONLY,
    "attnviz.measures": STDLIB_ONLY,
    "attnviz.io": STDLIB_ONLY,
    "attnviz.engines.support": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.engines.memory": ("torch", "rich", "typer", "matplotlib", "transformers", "textual"),
    "attnviz.measures.pairs": ("torch", "rich", "typer", "matplotlib", "transformers", "textual"),
    "attnviz.measures.metrics": ("torch", "rich", "typer", "matplotlib", "transformers", "textual"),
    "attnviz.nn.attention": ("rich", "matplotlib", "typer", "transformers", "textual"),
    "attnviz.nn.rows": ("rich", "matplotlib", "typer", "transformers", "textual"),
    "attnviz.architectures": ("rich", "matplotlib", "typer", "transformers", "textual"),
    "attnviz.architectures.bert": ("rich", "matplotlib", "typer", "transformers", "textual"),
    "attnviz.architectures.*": ("transformers",),
    "attnviz.tokens": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.result": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.transforms": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.measures.findings": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.io.models": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.pipeline": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.engines": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.engines.own": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.engines.hf": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.engines.hf_model": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.corpus.detectors": ("torch", "rich", "matplotlib", "typer", "transformers", "ray"),
    "attnviz.corpus.scan": ("torch", "rich", "matplotlib", "typer", "transformers", "ray"),
    "attnviz.corpus.sources": ("torch", "rich", "matplotlib", "typer", "transformers", "ray"),
    "attnviz.corpus.needles": ("torch", "rich", "matplotlib", "typer", "transformers", "ray"),
    "attnviz.measures.retrieval": ("torch", "rich", "matplotlib", "typer", "transformers", "ray", "textual"),
    "attnviz.render.terminal.retrieval": ("transformers", "typer", "torch", "matplotlib", "textual"),
    "attnviz.measures.norms": ("rich", "matplotlib", "typer", "transformers", "textual"),
    "attnviz.measures.explain": ("rich", "matplotlib", "typer", "transformers", "torch", "textual"),
    "attnviz.render.terminal.explain": ("transformers", "typer", "torch", "matplotlib", "textual"),
    "attnviz.render.html.explain": ("transformers", "typer", "torch", "matplotlib", "rich", "textual"),
    "attnviz.render.terminal": ("transformers", "typer", "torch", "matplotlib", "textual"),
    "attnviz.render.html": ("transformers", "typer", "torch", "matplotlib", "rich", "textual"),
    "attnviz.render.html.rows": ("transformers", "typer", "torch", "matplotlib", "rich", "textual"),
    "attnviz.render.terminal.check": ("transformers", "typer", "torch", "matplotlib", "textual"),
    "attnviz.render.terminal.shifts": ("transformers", "typer", "torch", "matplotlib", "textual"),
    "attnviz.render.terminal.tables": ("transformers", "typer", "torch", "matplotlib", "textual"),
    # The notebook renderer: the page in an iframe; IPython and anywidget only once a widget is made.
    "attnviz.render.notebook": (
        "transformers",
        "typer",
        "torch",
        "matplotlib",
        "rich",
        "textual",
        "IPython",
        "anywidget",
        "ipywidgets",
    ),  # fmt: skip
    "attnviz.engines.inmemory": ("rich", "matplotlib", "typer", "transformers", "torch", "textual", "IPython"),
    # matplotlib itself is the image renderer's, but never pyplot (global state).
    "attnviz.render.image": ("transformers", "typer", "torch", "rich", "textual", "matplotlib.pyplot"),
    "attnviz.render.image.layout": ("transformers", "typer", "torch", "rich", "textual", "matplotlib.pyplot"),
    "attnviz.render.terminal.heads": ("torch", "matplotlib", "transformers", "ray"),
    "attnviz.render.image.heads": ("torch", "rich", "transformers", "ray"),
    "attnviz.cli": ("transformers", "torch", "matplotlib", "textual", "ray"),
    "attnviz.cli.explore": ("transformers", "torch", "matplotlib", "textual"),
    # The explorer draws with the terminal renderers and reads weights: no model code,
    # and matplotlib only once a PNG is asked for.
    "attnviz.tui.app": ("transformers", "torch", "matplotlib", "typer"),
    "attnviz.tui.views": ("transformers", "torch", "matplotlib", "typer"),
    "attnviz.tui.widgets": ("transformers", "torch", "matplotlib", "typer"),
    "attnviz.tui.keys": ("transformers", "torch", "matplotlib", "typer"),
    "attnviz.tui.state": ("transformers", "torch", "matplotlib", "typer"),
}


def _imports(module: str) -> str:
    if module != "attnviz.architectures.*":
        return f"import {module}\n"
    from attnviz import architectures

    return "".join(f"import {m.__name__}\n" for m in sorted(set(architectures.registry().values()), key=str))


# One interpreter per rule cost ~25 s of the suite, most of it importing torch again for
# the rules that allow it. Instead a fresh interpreter (with torch imported first for those
# rules, or nothing) forks one child per rule: each child starts from the same clean
# state, imports the module, and reports its sys.modules. Sound as long as what was there
# before the fork holds nothing the rule forbids, which the test asserts.
ZYGOTE = """
import json, os, sys
if sys.argv[1]:
    __import__(sys.argv[1])
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            exec(compile(json.loads(line), "<rule>", "exec"), {"__name__": "__rule__"})
            out = {"loaded": sorted(sys.modules)}
        except BaseException as exc:
            out = {"error": repr(exc)}
        sys.stdout.write(json.dumps(out) + "\\n")
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
"""


def forked(first: str, codes: list[str]) -> list[set[str]]:
    """sys.modules after each of ``codes``, each in a child forked from an interpreter that
    imported ``first`` ("" for nothing); the first entry is the interpreter before any."""
    lines = "".join(json.dumps(code) + "\n" for code in ["", *codes])
    done = subprocess.run(
        [sys.executable, "-c", ZYGOTE, first], input=lines, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    outs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == len(codes) + 1 and all("loaded" in out for out in outs), (outs, done.stderr)
    return [set(out["loaded"]) for out in outs]


@functools.cache
def rule_results() -> dict[str, tuple[set[str], set[str]]]:
    """module -> (what was loaded before its import, what was loaded after)."""
    results: dict[str, tuple[set[str], set[str]]] = {}
    for first, allowed in (("torch", True), ("", False)):
        group = sorted(m for m, forbidden in RULES.items() if ("torch" not in forbidden) == allowed)
        before, *after = forked(first, [_imports(m) for m in group])
        results.update((m, (before, loaded)) for m, loaded in zip(group, after, strict=True))
    return results


@pytest.mark.parametrize(("module", "forbidden"), sorted(RULES.items()))
def test_import_rules(module: str, forbidden: tuple[str, ...]) -> None:
    before, loaded = rule_results()[module]
    assert before.isdisjoint(forbidden), sorted(before & set(forbidden))  # the fork hides nothing
    assert module.rstrip(".*") in loaded
    assert loaded.isdisjoint(forbidden), sorted(loaded & set(forbidden))


def test_the_forked_check_sees_what_a_module_loads() -> None:
    """The check itself: a child reports what its import brought in, and only that."""
    before, rich, plain = forked("", ["import rich.text", "import json"])
    assert "rich" not in before and {"rich", "rich.text"} <= rich and "rich" not in plain


# What a command's --help or --version may load: nothing heavy (start-up, issue 8).
@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["show", "--help"], ["explore", "--help"], ["export", "--help"]]
)
def test_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    code = (
        f"import sys; sys.argv = ['attnviz', *{argv!r}]\n"
        "from attnviz.cli import app as main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('matplotlib', 'torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout
    if "--help" in argv:
        assert "Usage" in done.stdout
    assert loaded_after(code).isdisjoint(HEAVY)


def test_own_engine_never_imports_transformers() -> None:
    code = (
        "from attnviz.engines import load_engine\n"
        "from attnviz.pipeline import Selection, run\n"
        "e = load_engine('own', None, 'cpu')\n"
        "run(e.tokenize('The animal was tired'), e, Selection())\n"
    )
    loaded = loaded_after(code)
    assert "torch" in loaded
    assert "transformers" not in loaded


# --- the import graph -------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent / "attnviz"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the attnviz modules it imports anywhere in its text (inside functions and
    under ``if TYPE_CHECKING:`` included: a type-only import is a dependency too)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    modules = set(names.values())
    graph: dict[str, set[str]] = {}
    for path, name in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # "from pkg import mod" imports the module; "from mod import name", the module.
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in found:
                # The deepest attnviz module the name refers to ("from . import x": module x).
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    # Importing a module runs its packages' __init__ first: not an edge we count, since
    # a package face that re-exports its children is no circle of design.
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm),
    each sorted; a module importing itself is not counted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "attnviz"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("import attnviz.a\nfrom .. import b\n")
    graph = import_graph(pkg)
    assert graph["attnviz.a"] == {"attnviz.b"} and graph["attnviz.b"] == {"attnviz.sub.c"}
    assert graph["attnviz.sub.c"] == {"attnviz.a", "attnviz.b"}
    assert cycles(graph) == [["attnviz.a", "attnviz.b", "attnviz.sub.c"]]


# The one kind of exception to "no circle": a plain import inside the one method that needs
# it, where the module it reaches imports this one back. Each is named here, so the graph
# check sees it, and the test holds it to being lazy (inside a function, never at import).
LAZY_EDGES: dict[tuple[str, str], str] = {
    ("attnviz.result", "attnviz.render.notebook"): "Attention.show() and its notebook reprs",
}


def lazy_only(module: str, target: str, root: Path = ROOT) -> bool:
    """Whether ``module`` imports ``target`` only inside function bodies."""
    parts = module.split(".")[1:]
    path = root.joinpath(*parts).with_suffix(".py")
    if not path.exists():
        path = root.joinpath(*parts, "__init__.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lazy: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            lazy.update(id(node) for node in ast.walk(fn))
    graph_one = import_graph(root)[module]
    assert target in graph_one, f"{module} no longer imports {target}: drop it from LAZY_EDGES"
    package = module.rpartition(".")[0] if path.name != "__init__.py" else module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in lazy:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if target in (base, *(f"{base}.{a.name}" for a in node.names)):
                return False
        if isinstance(node, ast.Import) and id(node) not in lazy and any(a.name == target for a in node.names):
            return False
    return True


def test_no_import_cycle() -> None:
    graph = import_graph()
    for (module, target), why in LAZY_EDGES.items():
        assert lazy_only(module, target), f"{module} -> {target} ({why}) must stay inside a function"
        graph[module].discard(target)
    assert cycles(graph) == []
    # Without the named exceptions' removal the check does see their circle.
    assert cycles(import_graph()) != [] or not LAZY_EDGES


def test_no_string_import_outside_the_family_registry() -> None:
    """``importlib.import_module``/``__import__`` would hide an edge from the graph check;
    only the family registry (lazy loading by model type) uses one."""
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in ROOT.rglob("*.py")
        if path.relative_to(ROOT).as_posix() != "architectures/__init__.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bimport_module\(|\b__import__\(", line)
    ]
    assert offenders == []


# What each part of the package may import, read from the text (lazy imports included):
# the rules of DESIGN.md that the fresh-interpreter table above cannot see, since a lazy
# import only loads when its function runs.
DATA = (
    r"attnviz(\.(errors|version|shape|tokens|select|pipeline|result|transforms)"
    r"|\.(nn|measures|io|engines|architectures|corpus)(\..*)?)$"
)
LAYER_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    # (who, a regex of module names, the packages they never import)
    ("math and data modules", DATA, ("rich", "matplotlib", "typer", "textual", "IPython", "anywidget")),
    ("renderers", r"attnviz\.render(\..*)?$", ("torch", "transformers", "typer", "textual", "ray")),
    ("everything but tui/", r"attnviz(?!\.tui\b).*$", ("textual",)),
    ("everything but corpus/", r"attnviz(?!\.corpus\b).*$", ("ray",)),
    ("everything but the notebook renderer", r"attnviz(?!\.render\.notebook$).*$", ("anywidget", "IPython")),
]


def third_party_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the top-level names of everything outside attnviz it imports anywhere."""
    out: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.partition(".")[0])
        out[name] = found - {"attnviz"}
    return out


@pytest.mark.parametrize(("who", "pattern", "forbidden"), LAYER_RULES, ids=[r[0] for r in LAYER_RULES])
def test_layer_rules_hold_for_lazy_imports_too(who: str, pattern: str, forbidden: tuple[str, ...]) -> None:
    imports = third_party_imports()
    matched = {m: found for m, found in imports.items() if re.match(pattern, m)}
    assert matched, f"no module matches the rule for {who}"
    offenders = {m: sorted(found & set(forbidden)) for m, found in matched.items() if found & set(forbidden)}
    assert offenders == {}


def test_library_never_imports_the_cli_or_the_package_face() -> None:
    """Imports run down the layers: no library module imports ``attnviz.cli`` or names
    ``from . import`` / ``from attnviz import`` (the package face sits above them all)."""
    import re
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] == "cli" or rel.name in ("__init__.py", "__main__.py") and len(rel.parts) == 1:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"^\s*from \.+cli\b|^\s*import attnviz\.cli|^\s*from attnviz\.cli", text, re.M):
            offenders.append(f"{rel}: imports the CLI")
        # "from . import x" in a top-level module (or ".." one level down) reaches the face,
        # unless x is a module or subpackage.
        dots = len(rel.parts)
        for names in re.findall(rf"^\s*from \.{{{dots}}} import ([\w, ]+)", text, re.M):
            for name in (n.strip() for n in names.split(",")):
                if not ((root / f"{name}.py").exists() or (root / name).is_dir()):
                    offenders.append(f"{rel}: imports {name} from the package face")
        if re.search(r"^\s*from attnviz import ", text, re.M):
            offenders.append(f"{rel}: imports the package face")
    assert offenders == []


def test_no_library_module_names_a_command_line_flag() -> None:
    """Library error text carries facts; only the CLI speaks in flags."""
    import re
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    flag = re.compile(r"""["'][^"'\n]*--(engine|target|occurrence|vs|index|layer|token|sort|limit|model|device)\b""")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if "cli" not in path.relative_to(root).parts
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if flag.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


def test_the_explorer_takes_data_and_callables_never_an_engine() -> None:
    """tui/ draws an ``Attention`` and calls what it is handed (built by cli/exploring.py):
    no module of it imports an engine, the pipeline that runs one, or the mechanisms."""
    graph = import_graph()
    tui = {m: edges for m, edges in graph.items() if m == "attnviz.tui" or m.startswith("attnviz.tui.")}
    assert len(tui) >= 5
    reach = ("attnviz.engines", "attnviz.pipeline", "attnviz.nn", "attnviz.architectures", "attnviz.cli")
    offenders = {m: sorted(e for e in edges if e.startswith(reach)) for m, edges in tui.items()}
    assert {m: e for m, e in offenders.items() if e} == {}
    words = re.compile(r"\bengine\s*[:.]|\bEngine\b|\bplan\(|\bread\(\w+,\s*\w*engine")
    named = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "tui").glob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if words.search(line)
    ]
    assert named == []


# --- the layout ---------------------------------------------------------------------------

REPO = ROOT.parent


def test_the_example_sentence_is_defined_once() -> None:
    """attnviz/example.py holds it; code elsewhere imports ``EXAMPLE`` (a docstring's
    example may quote it)."""
    sentence = "The animal didn't cross the street because it was too tired"
    offenders = []
    for folder in ("attnviz", "tests", "bench", "docs"):
        for path in (REPO / folder).rglob("*.py"):
            if path == ROOT / "example.py" or path == Path(__file__):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if sentence in line and not line.lstrip().startswith((">>>", "#")):
                    offenders.append(f"{path.relative_to(REPO)}:{n}")
    assert offenders == []


def test_the_tiny_checkpoint_builders_live_in_tests_builders() -> None:
    assert (REPO / "tests" / "builders" / "__init__.py").is_file()
    assert sorted(p.name for p in (REPO / "tests").glob("tiny_*.py")) == []


def test_the_package_root_keeps_the_face_and_the_pipeline_data() -> None:
    """The mechanisms (nn/), the measures and analyses (measures/) and the file I/O (io/)
    live in their sub-packages; the root holds at most 14 modules."""
    root = sorted(p.stem for p in ROOT.glob("*.py"))
    assert len(root) <= 14, root
    assert {"attention", "norms", "checkpoint", "explain", "ablation"}.isdisjoint(root)
