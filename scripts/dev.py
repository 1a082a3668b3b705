#!/usr/bin/env python3
"""Set up the project and run its jobs; needs nothing but Python 3.11+.

    python3 scripts/dev.py demo     # local cluster + example service + load (the main job)
    python3 scripts/dev.py test     # lint, type check and the whole test suite (CI runs this)
    python3 scripts/dev.py bench    # scripts/bench.py with its arguments
    python3 scripts/dev.py floor    # scripts/floor_bench.py: the machine's latency floor

The first run creates ``.venv`` and installs the project: ``demo`` and ``floor`` need
nothing more, ``test`` adds the ``dev`` and ``spark`` extras (pytest, pdoc, PySpark...), ``bench``
the ``dev`` one; later runs install again only when ``pyproject.toml`` changes or a
command needs an extra not yet there.  ``test`` also makes
sure a Java runtime is there for the Spark pipeline tests (``python -m
cluster.pipeline.java``: installs ``default-jre-headless`` with apt-get when run as root).
``test`` lints, type-checks and builds the API reference (``docs/api/``, with pdoc)
before the tests.  With no arguments, ``test`` runs the suite on three pytest-xdist workers
(``tests/conftest.py`` says which test runs where); extra arguments after ``test`` go to
pytest instead (e.g. ``-m "not slow"`` to skip the real-process tests).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def ensure_env(*extras: str) -> Path:
    """The virtualenv with the project and ``extras`` installed (``demo`` needs none:
    PySpark, 500 MB, comes only with ``test``'s ``spark`` extra).  The stamp file keeps
    the extras installed for this ``pyproject.toml``: asking for fewer installs nothing,
    asking for more installs them on top."""
    if sys.version_info < (3, 11):  # noqa: UP036 (run by any python3)
        sys.exit(f"Python 3.11 or newer is needed, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating virtualenv {VENV}", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    project = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamp = VENV / ".triarch-installed"
    have: set[str] = set()
    if stamp.exists():
        stamped, _, names = stamp.read_text().partition(" ")
        if stamped == project:
            have = set(filter(None, names.split(",")))
            if set(extras) <= have:
                return PY
    want = sorted(have | set(extras))
    target = f".[{','.join(want)}]" if want else "."
    print(f"installing triarch{target[1:]} into {VENV}", flush=True)
    subprocess.check_call([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    subprocess.check_call([str(PY), "-m", "pip", "install", "--quiet", "-e", target], cwd=ROOT)
    stamp.write_text(f"{project} {','.join(want)}")
    return PY


def run(*cmd: str) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def ensure_prometheus() -> None:
    """Best effort: Prometheus from the system's packages (as root, with apt-get), for the
    test that scrapes a cluster with it (tests/integration/test_prometheus.py, skipped
    without it)."""
    if shutil.which("prometheus") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    print("installing prometheus with apt-get (for tests/integration/test_prometheus.py)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

    def apt(*args: str) -> int:
        return subprocess.call(["apt-get", *args], stdout=subprocess.DEVNULL, env=env)

    install = ("install", "-y", "-q", "--no-install-recommends", "prometheus")
    if apt(*install) != 0 and (apt("update", "-q") != 0 or apt(*install) != 0):
        print("could not install prometheus: its test will be skipped", flush=True)


def cmd_test(args: list[str]) -> int:
    py = str(ensure_env("dev", "spark"))
    failed = []
    if run(py, "-m", "cluster.pipeline.java") != 0:
        failed.append("java (needed by the Spark pipeline tests)")
    ensure_prometheus()
    for name, cmd in (
        ("ruff check", (py, "-m", "ruff", "check", ".")),
        ("ruff format", (py, "-m", "ruff", "format", "--check", ".")),
        ("mypy", (py, "-m", "mypy")),
        # the API reference (docs/service-guide.md): docs/api/ with pdoc (the dev extra), seconds
        ("API reference", (py, str(ROOT / "scripts" / "apidoc.py"))),
    ):
        if run(*cmd) != 0:
            failed.append(name)
    # The full suite on three workers (tests/conftest.py says which test runs where:
    # the real-time tests mostly wait, so three share two cores); with arguments,
    # pytest as asked.
    code = run(py, "-m", "pytest", *(args or ["-n", "3", "--dist", "loadgroup"]))
    if failed:
        print(f"FAILED checks: {', '.join(failed)}", flush=True)
        return 1
    return code


def cmd_demo(args: list[str]) -> int:
    py = str(ensure_env())
    return run(py, str(ROOT / "scripts" / "demo.py"), *args)


def cmd_bench(args: list[str]) -> int:
    py = str(ensure_env("dev"))  # --vs-pysyncobj
    return run(py, str(ROOT / "scripts" / "bench.py"), *args)


def cmd_floor(args: list[str]) -> int:
    py = str(ensure_env())
    return run(py, str(ROOT / "scripts" / "floor_bench.py"), *args)


def main() -> int:
    commands = {"test": cmd_test, "demo": cmd_demo, "bench": cmd_bench, "floor": cmd_floor}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    try:
        return commands[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
