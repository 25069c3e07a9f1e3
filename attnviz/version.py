"""The one version source: the installed package's metadata. Stdlib only.

Its own module so that the library (engines, result) can record the version without
importing the package face (``attnviz/__init__.py``), which sits above every layer.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnviz")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
