#!/usr/bin/env python3
"""Compile the consensus core with mypyc, or go back to the interpreted one.

    python3 scripts/dev.py native            # compile cluster/core in place
    python3 scripts/dev.py native --clean    # remove what that made
    python3 scripts/dev.py native --status   # which core modules run compiled

An opt-in: the project runs and is tested interpreted, and nothing here is needed.
Compiled, the sans-IO core (``cluster/core``, but for ``__init__`` and ``auth``) runs as
C extensions beside its sources (about a minute on two cores; a C compiler and the
``dev`` extra's mypy are needed).  ``cluster/core/native.json`` records each source's
SHA-256: importing ``cluster`` refuses compiled modules whose source has changed since
(:mod:`cluster.native`), so compile again after editing the core.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "cluster" / "core"
MANIFEST = CORE / "native.json"
GROUP = "cluster.core._native"  # the same as cluster.native.GROUP (not imported: may be stale)


INTERPRETED = {"__init__.py", "auth.py"}
"""Left as Python: the package's ``__init__``, and ``auth`` (``Authenticator`` is a base
class for applications' own, and interpreted classes cannot inherit from compiled ones)."""


def sources() -> list[Path]:
    return sorted(p for p in CORE.glob("*.py") if p.name not in INTERPRETED)


def extensions() -> list[Path]:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return sorted(CORE.glob(f"*{suffix}"))


def clean() -> int:
    removed = extensions() + ([MANIFEST] if MANIFEST.exists() else [])
    for path in removed:
        path.unlink()
    print(f"removed {len(removed)} file(s): the core runs interpreted")
    return 0


def status() -> int:
    # cluster/native.py loaded as a file: importing the package refuses a stale core
    spec = importlib.util.spec_from_file_location("triarch_native", ROOT / "cluster" / "native.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(json.dumps(module.status(), indent=2))
    return 0


def build() -> int:
    compiler = sysconfig.get_config_var("CC") or "cc"
    if not shutil.which(compiler.split()[0]):
        print(f"no C compiler ({compiler!r}): the core stays interpreted", file=sys.stderr)
        return 1
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution
    except ImportError as exc:
        print(f"needs mypy (the dev extra) and setuptools: {exc}", file=sys.stderr)
        return 1
    clean()  # nothing stale may be imported while mypy reads the sources
    paths = [str(p.relative_to(ROOT)) for p in sources()]
    with tempfile.TemporaryDirectory(prefix="triarch-native-") as build_dir:
        os.chdir(ROOT)  # mypy finds the project's settings (pyproject.toml) here
        modules = mypycify(paths, opt_level="3", group_name=GROUP, target_dir=build_dir)
        # setuptools reads no project configuration here: only these extensions
        dist = Distribution({"name": "triarch-native-core", "ext_modules": modules})
        dist.script_name = "native.py"
        dist.script_args = ["build_ext", "--inplace", "--build-temp", build_dir]
        dist.parse_command_line()
        dist.run_commands()
    recorded = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in sources()}
    MANIFEST.write_text(json.dumps({"sources": recorded}, indent=1, sort_keys=True) + "\n")
    print(f"compiled {len(recorded)} core modules into {len(extensions())} extension(s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--clean", action="store_true", help="go back to the interpreted core")
    group.add_argument("--status", action="store_true", help="print which modules run compiled")
    args = parser.parse_args()
    if args.clean:
        return clean()
    if args.status:
        return status()
    return build()


if __name__ == "__main__":
    sys.exit(main())
