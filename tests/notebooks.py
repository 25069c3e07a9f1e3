"""Real notebooks for the notebook tests: written by the test, executed by nbclient in a
real ipykernel (the venv's, with this checkout on PYTHONPATH and the Hub offline), then
converted to HTML by nbconvert or opened in JupyterLab."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def missing() -> str | None:
    """Why a notebook cannot be executed here, or None."""
    for name in ("nbformat", "nbclient", "ipykernel", "nbconvert"):
        try:
            __import__(name)
        except ImportError:
            return f"{name} is not installed (pip install 'attnviz[notebook,test]')"
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        return "no python3 Jupyter kernel is installed (pip install ipykernel)"
    return None


def run_notebook(path: Path, cells: list[str], timeout: int = 600) -> Any:
    """Write ``cells`` (code) as a notebook at ``path``, execute it in a fresh kernel
    started in ``path``'s folder, save the outputs into it, return the notebook node."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute(env=env)
    nbformat.write(nb, str(path))
    return nb


def to_html(nb: Any, path: Path) -> Path:
    """The notebook as nbconvert's standalone HTML (the lab template) at ``path``."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    path.write_text(body, encoding="utf-8")
    return path


def outputs(nb: Any, cell: int) -> list[Any]:
    return list(nb.cells[cell].get("outputs", []))
