"""Make sure a Java runtime is there for Spark (a fresh machine has none).

:func:`ensure_java` finds ``java`` (``$JAVA_HOME/bin/java``, then ``PATH``) and checks its
version (Spark 4 needs Java 17 or newer).  When it is missing and this process runs as
root on a Debian-like system, it installs the distribution's ``default-jre-headless``
package (``apt-get update && apt-get install -y default-jre-headless``); otherwise it
raises :class:`JavaMissingError` saying what to install.

``python -m cluster.pipeline.java`` does the same from the command line (``scripts/dev.py
test`` runs it) and prints the runtime it found.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["MIN_JAVA_VERSION", "JavaMissingError", "ensure_java", "java_version"]

MIN_JAVA_VERSION = 17
"""Spark 4 runs on Java 17 or 21."""
APT_PACKAGE = "default-jre-headless"

_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


class JavaMissingError(RuntimeError):
    """No usable Java runtime, and it could not be installed here."""


def _find_java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java")
    return Path(found) if found else None


def java_version(java: str | os.PathLike[str]) -> int | None:
    """The major version of the ``java`` at this path (``1.8`` counts as 8), or None."""
    try:
        result = subprocess.run(
            [os.fspath(java), "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(result.stderr + result.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_402"
        major = int(match.group(2))
    return major


def _install_with_apt() -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(
        f"cluster-pipeline: no Java runtime found; installing {APT_PACKAGE} with apt-get",
        file=sys.stderr,
        flush=True,
    )
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", APT_PACKAGE],
    ):
        result = subprocess.run(command, env=env, check=False)
        if result.returncode != 0:
            raise JavaMissingError(
                f"installing Java failed: {' '.join(command)} exited with {result.returncode}"
            )


def ensure_java(*, install: bool = True) -> Path:
    """Return the path of a ``java`` of version :data:`MIN_JAVA_VERSION` or newer.

    Installs ``default-jre-headless`` with apt-get when there is none, ``install`` is
    true, the process runs as root and ``apt-get`` exists.

    Raises:
        JavaMissingError: no suitable Java and it could not be installed.
    """
    java = _find_java()
    if java is None and install:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        if is_root and shutil.which("apt-get"):
            _install_with_apt()
            java = _find_java()
    if java is None:
        raise JavaMissingError(
            "Spark needs a Java runtime (17 or newer) and none was found: install one "
            f"(Debian/Ubuntu: sudo apt-get install -y {APT_PACKAGE}) or set JAVA_HOME"
        )
    version = java_version(java)
    if version is None:
        raise JavaMissingError(f"{java} does not run (java -version failed)")
    if version < MIN_JAVA_VERSION:
        raise JavaMissingError(
            f"{java} is Java {version}; Spark needs Java {MIN_JAVA_VERSION} or newer "
            "(set JAVA_HOME to a newer runtime)"
        )
    return java


def main() -> int:
    try:
        java = ensure_java()
    except JavaMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"java: {java} (version {java_version(java)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
