"""The ``cluster-node`` console script as an operator starts it (issue 41, section 3).

- ``--service mod:Class`` finds ``mod.py`` in the current folder, as ``python -m
  cluster.node`` does (a console script's ``sys.path`` starts with its own folder);
- an import that fails names the module, the folders searched and ``PYTHONPATH``, or,
  when the module was found, what it could not import;
- a ``CLUSTER_CERTS_DIR`` exported for the tools (a client folder) is named as the
  variable it is, not as a ``--certs-dir`` nobody passed.

Each run ends before the node opens a port or a data directory: real processes, no
cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster.certs import make_certs

NODE = Path(sys.executable).with_name("cluster-node")
MEMBERS = "0=127.0.0.1:1:2:3"  # never bound: every run here stops before listening


def cluster_node(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``cluster-node`` as installed, run in ``cwd``: the worktree's code (PYTHONPATH
    as the tests have it) and nothing of ``cwd`` on its path unless it adds it."""
    if not NODE.exists():
        found = shutil.which("cluster-node")
        if found is None:
            pytest.skip("the cluster-node console script is not installed")
        command = found
    else:
        command = str(NODE)
    return subprocess.run(
        [command, "--dir", str(cwd / "data"), "--members", MEMBERS, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, **env},
    )


def test_the_console_script_imports_a_service_from_the_current_folder(tmp_path: Path) -> None:
    """The module is found (so the error is the class's: it lacks the snapshot pair),
    not "cannot import"."""
    (tmp_path / "myservice.py").write_text(
        textwrap.dedent(
            """
            from cluster.service import ClusteredService

            class Forgetful(ClusteredService):
                def on_session_message(self, session, timestamp, payload):
                    session.offer(payload)
            """
        )
    )
    result = cluster_node(tmp_path, "--service", "myservice:Forgetful")
    assert result.returncode == 2, result
    assert "cannot import" not in result.stderr, result.stderr
    assert "error: service 'myservice:Forgetful': Forgetful cannot be a clustered service" in (
        result.stderr
    )


def test_a_module_nowhere_names_the_folders_searched_and_pythonpath(tmp_path: Path) -> None:
    result = cluster_node(tmp_path, "--service", "nosuchservice:Svc")
    assert result.returncode == 2, result
    err = result.stderr
    assert "Traceback" not in err, err
    assert "error: cannot import service module 'nosuchservice'" in err, err
    assert f"Searched the folders {tmp_path}, " in err, err  # the current folder first
    assert "PYTHONPATH" in err, err
    assert "Put the folder that holds nosuchservice.py" in err, err


def test_a_module_that_imports_what_is_missing_says_so(tmp_path: Path) -> None:
    (tmp_path / "needy.py").write_text("import no_such_dependency_xyz\n")
    result = cluster_node(tmp_path, "--service", "needy:Svc")
    assert result.returncode == 2, result
    err = result.stderr
    assert "service module 'needy' was found but does not import: " in err, err
    assert "no_such_dependency_xyz" in err, err
    assert "Searched the folders" not in err, err  # the module is not what is missing


def test_a_certs_dir_exported_for_the_tools_is_named_as_the_variable(tmp_path: Path) -> None:
    """``CLUSTER_CERTS_DIR`` pointing at a client folder (exported for ``cluster-tool``
    before it read ``CLUSTER_CLIENT_CERTS_DIR``): the node names the variable and the
    tools' own one; ``CLUSTER_CLIENT_CERTS_DIR`` itself is no unknown setting."""
    make_certs(tmp_path / "certs", [(0, "127.0.0.1")])
    client = tmp_path / "certs" / "client-admin"
    result = cluster_node(tmp_path, CLUSTER_CERTS_DIR=str(client))
    assert result.returncode == 2, result
    err = result.stderr
    assert f"error: $CLUSTER_CERTS_DIR {client} holds the certificate of 'admin' (client)" in (err)
    assert "CLUSTER_CERTS_DIR is the member's setting" in err, err
    assert "CLUSTER_CLIENT_CERTS_DIR" in err, err

    result = cluster_node(tmp_path, "--certs-dir", str(client))  # the flag: named as such
    assert result.returncode == 2, result
    assert f"error: --certs-dir {client} holds the certificate of 'admin'" in result.stderr
    assert "member's setting" not in result.stderr

    member = tmp_path / "certs" / "member-0"  # the tools' variable does not bother the node
    result = cluster_node(
        tmp_path, "--certs-dir", str(member), "--service", "nosuchservice:Svc",
        CLUSTER_CLIENT_CERTS_DIR=str(client),
    )  # fmt: skip
    assert "CLUSTER_CLIENT_CERTS_DIR is not a setting" not in result.stderr, result.stderr
