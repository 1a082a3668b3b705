"""The optional compiled consensus core (``python3 scripts/dev.py native``).

mypyc can compile the sans-IO core (``cluster/core``: strictly typed, no I/O) into C
extension modules that sit beside its sources, and Python then imports those instead of
the ``.py`` files.  Nothing else changes: the wire, the log, the API are the same, and
``python3 scripts/dev.py native --clean`` goes back to the interpreted core.

A compiled module runs the code it was built from.  So that an edited source never runs
as its older compiled self, the build records each source's SHA-256 in
``cluster/core/native.json``, and importing :mod:`cluster` checks every compiled module
against it (:func:`check`): a mismatch is an :class:`ImportError` that says what to do.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
from pathlib import Path
from typing import Any

CORE = Path(__file__).resolve().parent / "core"
MANIFEST = CORE / "native.json"
GROUP = "cluster.core._native"
"""mypyc's shared library for the group (``cluster/core/_native__mypyc*.so``)."""

_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


class StaleNativeError(ImportError):
    """A compiled core module was built from another version of its source."""


def compiled_files(directory: Path = CORE) -> list[Path]:
    """The extension modules in ``directory`` (the compiled core, if built)."""
    try:
        names = sorted(p for p in directory.iterdir() if p.name.endswith(_SUFFIXES))
    except OSError:
        return []
    return names


def module_name(path: Path) -> str:
    """``consensus`` for ``consensus.cpython-311-x86_64-linux-gnu.so``."""
    return path.name.split(".", 1)[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def status(directory: Path = CORE) -> dict[str, Any]:
    """Which core modules run compiled, and whether each matches its source."""
    files = compiled_files(directory)
    try:
        recorded: dict[str, str] = json.loads((directory / MANIFEST.name).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    stale = []
    modules = []
    for path in files:
        name = module_name(path)
        if name.endswith("__mypyc"):
            continue  # the group's shared library: no source of its own
        modules.append(name)
        source = directory / f"{name}.py"
        if not source.exists() or recorded.get(name) != digest(source):
            stale.append(name)
    return {"compiled": bool(modules), "modules": modules, "stale": stale}


def check(directory: Path = CORE) -> None:
    """Refuse to run compiled core modules built from other sources than these."""
    if not compiled_files(directory):
        return  # the interpreted core: the usual case, one directory listing
    stale = status(directory)["stale"]
    if stale:
        raise StaleNativeError(
            f"compiled core modules built from other sources: {', '.join(stale)} "
            f"(in {directory}): run `python3 scripts/dev.py native` to compile them "
            "again, or `python3 scripts/dev.py native --clean` to run the sources"
        )
