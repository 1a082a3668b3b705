"""Build the API reference from the docstrings with pdoc.

    .venv/bin/python scripts/apidoc.py            # writes docs/api/ (open docs/api/index.html)
    .venv/bin/python scripts/apidoc.py -o DIR     # somewhere else

Covers the client library (``client``), the service API (``cluster.service``) and the
key-value example (``cluster.examples.kv``).  ``tests/integration/test_docs.py`` builds it
on every test run, so a docstring pdoc cannot render fails the suite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("client", "cluster.service", "cluster.examples.kv")


def build(out: Path) -> int:
    """Run pdoc into ``out``; its exit code (non-zero when a module cannot be rendered)."""
    pdoc = (sys.executable, "-m", "pdoc", "--docformat", "restructuredtext")
    return subprocess.call([*pdoc, "--output-directory", str(out), *MODULES], cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "api")
    args = parser.parse_args()
    code = build(args.output)
    if code == 0:
        print(f"API reference: {args.output / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
