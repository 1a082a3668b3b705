"""`python -m cluster.local`: SIGTERM stops its members as Ctrl-C does (issue #21); it
supervises them (issue 35): a member that exits is named with its exit code and the
cluster stops with exit code 1, or with `--restart` the member is started again."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cluster.local import wait_for_port


class Local:
    """A ``python -m cluster.local --nodes 1`` process, its output read line by line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        members = self.wait_for("members:")
        host, _, rest = members.split("=", 1)[1].strip().partition(":")
        self.host, self.ingress = host, int(rest.split(":")[0])

    def wait_for(self, prefix: str, timeout: float = 30.0) -> str:
        """The next line of its output that starts with ``prefix``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {prefix!r} in {self.lines}"
            if select.select([self.proc.stdout], [], [], left)[0]:
                line = self.proc.stdout.readline()
                assert line, f"output ended without {prefix!r}: {self.lines}"
                self.lines.append(line)
                if line.startswith(prefix):
                    return line

    def member_pid(self) -> int:
        """Its one member's pid (its only child)."""
        pid = self.proc.pid
        (child,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(child)


@contextmanager
def local(tmp_path: Path, *flags: str) -> Iterator[Local]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.local", "--nodes", "1", "--dir", str(tmp_path), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield Local(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_sigterm_stops_the_local_cluster_and_its_members(tmp_path: Path) -> None:
    with local(tmp_path) as c:
        assert wait_for_port(c.host, c.ingress, 10)
        c.proc.send_signal(signal.SIGTERM)
        assert c.proc.wait(timeout=30) == 0
        assert not wait_for_port(c.host, c.ingress, 1)  # its member stopped too


def test_a_member_that_exits_is_named_and_the_cluster_stops_with_1(tmp_path: Path) -> None:
    with local(tmp_path) as c:
        assert wait_for_port(c.host, c.ingress, 10)
        os.kill(c.member_pid(), signal.SIGKILL)
        line = c.wait_for("member 0 exited")
        assert "with code -9 (SIGKILL)" in line
        assert "node-0.log" in line
        assert c.proc.wait(timeout=30) == 1


def test_with_restart_a_failed_member_is_started_again(tmp_path: Path) -> None:
    with local(tmp_path, "--restart") as c:
        assert wait_for_port(c.host, c.ingress, 10)
        first = c.member_pid()
        os.kill(first, signal.SIGKILL)
        assert "restarting it in 0.5 s" in c.wait_for("member 0 exited with code -9")
        again = c.wait_for("member 0 started again")
        second = c.member_pid()
        assert second != first
        assert f"pid {second}" in again
        assert wait_for_port(c.host, c.ingress, 20)  # serving again, same port and data
        assert c.proc.poll() is None
        # a member stopped on purpose (SIGTERM: exit code 0) is not restarted; it was the
        # only one, so every member stopped with 0: the supervisor ends with 0 too
        os.kill(second, signal.SIGTERM)
        assert "not restarted" in c.wait_for("member 0 exited with code 0")
        c.wait_for("every member stopped with exit code 0")
        assert c.proc.wait(timeout=30) == 0
