"""The guard of the optional compiled core (cluster/native.py, scripts/native.py): a
compiled module must never run in place of an edited source."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import native

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = ".cpython-311-x86_64-linux-gnu.so"


def core_dir(tmp_path: Path, *, compiled: bool, recorded: str | None) -> Path:
    """A stand-in for cluster/core: one source, maybe an extension beside it, maybe a
    manifest recording ``recorded`` as the source's digest."""
    core = tmp_path / "core"
    core.mkdir()
    source = core / "consensus.py"
    source.write_text("X = 1\n")
    if compiled:
        (core / f"consensus{SUFFIX}").write_bytes(b"\x7fELF")
        (core / f"_native__mypyc{SUFFIX}").write_bytes(b"\x7fELF")
    if recorded is not None:
        (core / "native.json").write_text(json.dumps({"sources": {"consensus": recorded}}))
    return core


def test_the_interpreted_core_is_not_checked_further(tmp_path: Path) -> None:
    core = core_dir(tmp_path, compiled=False, recorded=None)
    assert native.status(core) == {"compiled": False, "modules": [], "stale": []}
    native.check(core)


def test_a_compiled_module_built_from_this_source_passes(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"X = 1\n").hexdigest()
    core = core_dir(tmp_path, compiled=True, recorded=digest)
    assert native.status(core) == {"compiled": True, "modules": ["consensus"], "stale": []}
    native.check(core)


@pytest.mark.parametrize("recorded", ["0" * 64, None], ids=["edited-since", "no-manifest"])
def test_a_compiled_module_of_another_source_refuses_to_load(
    tmp_path: Path, recorded: str | None
) -> None:
    core = core_dir(tmp_path, compiled=True, recorded=recorded)
    assert native.status(core)["stale"] == ["consensus"]
    with pytest.raises(ImportError, match=r"built from other sources: consensus .*native"):
        native.check(core)


def test_this_checkout_runs_a_core_that_matches_its_sources() -> None:
    """Importing cluster checks the real core: interpreted (the usual case), or compiled
    from exactly these sources."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "native.py"), "--status"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert json.loads(out.stdout)["stale"] == []
