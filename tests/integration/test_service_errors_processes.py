"""A service that raises on one payload does not stop the cluster (issue 32), with real
``python -m cluster.node`` processes.

The service (written to a module of the test's own, on ``PYTHONPATH``) counts messages
and raises ``ValueError`` on ``b"boom"``.  With ``--on-service-error continue`` (the
default) every member stays up, the sender's ``receive()`` raises ``client.ServiceError``
in the place of that reply and the next message is answered; a restart of the whole
cluster replays the entry cleanly.  With ``--on-service-error stop`` every member ends
with exit code 1 and one ERROR line naming the error, and no traceback of the node's
own; a restart replays the entry and stops again.  A service whose ``on_start`` raises
ends the same way.

Slow-marked: skip locally with ``-m "not slow"``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import trio
from test_failover import NODE_ARGS, node_log, wait_for

import client
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

SERVICE = "fragile:Fragile"
SOURCE = '''
from cluster.service import ClusteredService


class Fragile(ClusteredService):
    """Counts good messages, answers each with the count; raises on b"boom"."""

    def on_start(self, cluster, snapshot):
        if snapshot == b"unloadable":
            raise RuntimeError("cannot load this snapshot")
        self.count = int(snapshot) if snapshot else 0

    def on_session_message(self, session, timestamp, payload):
        if payload == b"boom":
            raise ValueError(f"cannot count {payload!r}")
        if payload == b"exit":
            raise SystemExit(3)
        if payload == b"interrupt":
            raise KeyboardInterrupt
        self.count += 1
        if session is not None:
            session.offer(str(self.count).encode())

    def on_take_snapshot(self):
        return str(self.count).encode()


class Unstartable(Fragile):
    def on_start(self, cluster, snapshot):
        raise RuntimeError("cannot load this snapshot")
'''
ERROR_LINE = "ERROR cluster.service: the service's on_session_message raised ValueError: "
CONNECT_TIMEOUT = 24.0


@pytest.fixture
def service_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The service's module, importable by the node processes."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "fragile.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.setenv("PYTHONPATH", str(modules))
    return modules


@asynccontextmanager
async def session(endpoints: str, attempts: int = 3) -> AsyncIterator[client.ClusterClient]:
    """A session, retrying the first connect after start-up (see test_failover's notes)."""
    async with AsyncExitStack() as stack:
        for attempt in itertools.count(1):
            try:
                c = await stack.enter_async_context(
                    client.connect(endpoints, connect_timeout=CONNECT_TIMEOUT / attempts)
                )
                break
            except client.ConnectTimeoutError:
                if attempt >= attempts:
                    raise
        yield c


async def ask(c: client.ClusterClient, payload: bytes) -> bytes:
    await c.offer(payload)
    return await c.receive()


def alive(cluster: LocalCluster) -> list[int]:
    return [m for m, p in cluster.processes.items() if p.poll() is None]


def test_every_member_survives_the_sender_hears_and_a_restart_replays_cleanly(
    tmp_path: Path, service_path: Path
) -> None:
    cluster = LocalCluster(3, SERVICE, tmp_path / "data", extra_args=NODE_ARGS)

    async def main() -> None:
        with trio.fail_after(90):
            async with session(cluster.ingress_endpoints) as c:
                assert [await ask(c, b"+") for _ in range(3)] == [b"1", b"2", b"3"]
                await c.offer(b"boom")
                with pytest.raises(client.ServiceError) as info:
                    await c.receive()
                error = info.value
                assert isinstance(error, client.ClusterClientError)
                assert error.error_type == "ValueError"
                assert error.message == "cannot count b'boom'"
                assert error.request == b"boom"
                assert error.log_position > 0
                # the session stays open: the next message is answered, in order
                for payload in (b"+", b"boom", b"+"):
                    await c.offer(payload)
                assert await c.receive() == b"4"
                with pytest.raises(client.ServiceError) as again:
                    await c.receive()
                assert again.value.log_position > error.log_position
                assert await c.receive() == b"5"
                # SystemExit and KeyboardInterrupt raised by the service's code are its
                # errors too: in the log for good, they must not stop every member at
                # every start (issue 41)
                for payload, kind in ((b"exit", "SystemExit"), (b"interrupt", "KeyboardInterrupt")):
                    await c.offer(payload)
                    with pytest.raises(client.ServiceError) as base:
                        await c.receive()
                    assert base.value.error_type == kind
                assert await ask(c, b"+") == b"6"
        assert sorted(alive(cluster)) == [0, 1, 2]
        # every member raised on every entry, alike: a follower applies the last ones a
        # little after the leader answered, so wait for its last error, not its first
        await wait_for(
            lambda: all(
                ERROR_LINE in node_log(cluster, m)
                and "raised KeyboardInterrupt" in node_log(cluster, m)
                for m in range(3)
            ),
            10,
            "every member's ERROR lines",
        )

    try:
        cluster.start_all(timeout=20)
        trio.run(main)
        for member_id in range(3):
            text = node_log(cluster, member_id)
            assert text.count(ERROR_LINE) == 1, text  # the same error again: not repeated
            # one traceback for each distinct error: ValueError, SystemExit, KeyboardInterrupt
            assert text.count("Traceback (most recent call last)") == 3, text
            assert "raised SystemExit: 3 at log position" in text, text
            assert "ExceptionGroup" not in text
        # a restart of the whole cluster replays both entries and goes on
        assert [cluster.stop(m) for m in range(3)] == [0, 0, 0]
        cluster.start_all(timeout=20)

        async def after_restart() -> None:
            with trio.fail_after(60):
                async with session(cluster.ingress_endpoints) as c:
                    assert await ask(c, b"+") == b"7"

        trio.run(after_restart)
        assert sorted(alive(cluster)) == [0, 1, 2]
    finally:
        cluster.stop_all()


def test_stop_ends_every_member_with_an_error_line_and_exit_code_1(
    tmp_path: Path, service_path: Path
) -> None:
    cluster = LocalCluster(
        3, SERVICE, tmp_path / "data", extra_args=[*NODE_ARGS, "--on-service-error", "stop"]
    )

    async def main() -> None:
        with trio.fail_after(90):
            async with session(cluster.ingress_endpoints) as c:
                assert await ask(c, b"+") == b"1"
                # every member holds the log first: a member that started late and was not
                # caught up when the others stopped never meets the entry (it waits, as a
                # member must, for a leader)
                await wait_for(lambda: all_caught_up(cluster), 30, "every member to catch up")
                await c.offer(b"boom")
                await wait_for(lambda: not alive(cluster), 30, "every member to stop")

    try:
        cluster.start_all(timeout=20)
        trio.run(main)
        codes = {m: p.wait() for m, p in cluster.processes.items()}
        assert codes == {0: 1, 1: 1, 2: 1}
        for member_id in range(3):
            check_stopped(node_log(cluster, member_id))

        # The way past a poison entry (the operations guide's runbook): the same command
        # line with --on-service-error continue, on every member; each replays the
        # entry, logs it as an error, and the cluster serves again.  `cluster-tool
        # errors` names the entry's log position.
        cluster.processes.clear()
        cluster.extra_args = [*NODE_ARGS, "--on-service-error", "continue"]
        cluster.start_all(timeout=20)

        async def past_it() -> None:
            with trio.fail_after(60):
                async with session(cluster.ingress_endpoints) as c:
                    assert await ask(c, b"+") == b"2"  # the poison entry counted nothing

        trio.run(past_it)
        assert sorted(alive(cluster)) == [0, 1, 2]
        errors = subprocess.run(
            [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "errors"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "on_session_message raised ValueError: cannot count b'boom' at log position" in (
            errors.stdout
        ), errors
    finally:
        cluster.stop_all()


def all_caught_up(cluster: LocalCluster) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "describe", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    try:
        members = json.loads(done.stdout)["members"]
        applied = [m["applied_position"] for m in members]
    except (ValueError, KeyError, TypeError):
        return False
    return len(applied) == 3 and min(applied) > 0 and len(set(applied)) == 1


def check_stopped(text: str, line: str = ERROR_LINE) -> None:
    """One ERROR line naming the error, with the service's traceback and no other."""
    assert text.count(line) == 1, text
    before, _, after = text.partition(line)
    assert "Traceback (most recent call last)" not in before, text
    assert "ExceptionGroup" not in text, text
    assert after.count("Traceback (most recent call last)") == 1, text
    assert "node stopped by an unexpected error" not in text, text


def test_stop_stops_again_when_a_restart_replays_the_entry(
    tmp_path: Path, service_path: Path
) -> None:
    """In a cluster of one everything durable is committed: the restart's replay meets
    the entry at once."""
    cluster = LocalCluster(1, SERVICE, tmp_path / "data", extra_args=["--on-service-error", "stop"])

    async def main() -> None:
        with trio.fail_after(60):
            async with session(cluster.ingress_endpoints, attempts=1) as c:
                assert await ask(c, b"+") == b"1"
                await c.offer(b"boom")
                await wait_for(lambda: not alive(cluster), 30, "the member to stop")

    try:
        cluster.start_all(timeout=20)
        trio.run(main)
        assert cluster.processes[0].wait() == 1
        check_stopped(node_log(cluster, 0))
        proc = cluster.start(0)
        assert proc.wait(timeout=30) == 1
        text = node_log(cluster, 0)
        assert text.count(ERROR_LINE) == 2, text
        assert "ExceptionGroup" not in text, text
    finally:
        cluster.stop_all()


def test_on_start_raising_exits_1_with_an_error_line(tmp_path: Path, service_path: Path) -> None:
    result = subprocess.run(
        LocalCluster(1, "fragile:Unstartable", tmp_path).command(0),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1, result
    check_stopped(
        result.stderr,
        "ERROR cluster.service: the service's on_start raised RuntimeError: cannot load "
        "this snapshot at log position 0",
    )
