"""`python -m cluster.local` (issue #21): SIGTERM stops its members as Ctrl-C does."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster.local import wait_for_port


def test_sigterm_stops_the_local_cluster_and_its_members(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.local", "--nodes", "1", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        members = ""
        deadline = time.monotonic() + 30
        while not members.startswith("members:"):
            assert time.monotonic() < deadline
            members = proc.stdout.readline()
        host, _, rest = members.split("=", 1)[1].strip().partition(":")
        ingress = int(rest.split(":")[0])
        assert wait_for_port(host, ingress, 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not wait_for_port(host, ingress, 1)  # its member stopped too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
