"""The one version source: the installed package's metadata. Stdlib only.

Its own module so that the library (engines, result) can record the version without
importing the package face (``attnviz/__init__.py``), which sits above every layer.

The metadata is read from the ``attnviz-*.dist-info/METADATA`` file next to the package
on ``sys.path``; ``importlib.metadata`` is the fallback. (It parses with the ``email``
package: ~12 ms idle and ~140 ms on a busy 2-core machine, a third of ``attnviz --help``.)
"""

from __future__ import annotations

import sys
from pathlib import Path


def _read_version() -> str:
    for entry in sys.path:
        try:
            candidates = sorted(Path(entry or ".").glob("attnviz-*.dist-info/METADATA"))
        except OSError:
            continue
        for metadata in candidates:
            try:
                with open(metadata, encoding="utf-8") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break  # the headers end at the first blank line
            except OSError:
                continue
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnviz")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


__version__ = _read_version()
