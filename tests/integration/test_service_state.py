"""A clustered service cannot silently lose its state (issue #20).

``on_start`` and ``on_take_snapshot`` are abstract (as Aeron's ``onTakeSnapshot``): a
service without them is refused at instantiation and the node does not start; a stateless
service says so with ``StatelessService``; a snapshot whose service raises or returns no
bytes fails with an ERROR (log and AdminResponse) instead of writing an empty snapshot.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
from test_node import endpoints, make_config, running_node

import client
from cluster.archive.recording_log import ENTRY_TYPE_SNAPSHOT
from cluster.node import Node
from cluster.protocol.enums import AdminResponseCode
from cluster.service import (
    ClientSession,
    Cluster,
    ClusteredService,
    ServiceStateError,
    StatelessService,
    take_service_snapshot,
)


class Forgetful(ClusteredService):  # the mistake under test: no snapshot pair
    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        pass


class LoadsOnly(ClusteredService):
    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        pass


class Count(ClusteredService):
    """Counts messages; ``broken`` decides how its snapshot goes wrong."""

    def __init__(self, broken: str = "") -> None:
        self.count = 0
        self.broken = broken

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.count = int(snapshot) if snapshot else 0

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        self.count += 1
        if session is not None:
            session.offer(str(self.count).encode())

    def on_take_snapshot(self) -> bytes:
        if self.broken == "raises":
            raise RuntimeError("state not serialisable")
        if self.broken == "none":
            return None  # type: ignore[return-value]  # forgot the return
        return str(self.count).encode()


def test_a_service_without_the_snapshot_pair_cannot_be_made() -> None:
    with pytest.raises(TypeError) as info:
        Forgetful()
    text = str(info.value)
    assert "Forgetful cannot be a clustered service" in text
    assert "on_start() and on_take_snapshot()" in text
    assert "StatelessService" in text
    with pytest.raises(TypeError, match=r"does not implement on_take_snapshot\(\)\."):
        LoadsOnly()


def test_a_stateless_service_says_so_and_refuses_a_snapshot_with_state() -> None:
    class Echo(StatelessService):
        pass

    echo = Echo()
    assert take_service_snapshot(echo) == b""
    echo.on_start(None, None)  # type: ignore[arg-type]
    echo.on_start(None, b"")  # type: ignore[arg-type]
    with pytest.raises(ServiceStateError, match="holds 3 bytes of service state"):
        echo.on_start(None, b"abc")  # type: ignore[arg-type]


def test_take_service_snapshot_checks_what_the_service_gives() -> None:
    assert take_service_snapshot(Count()) == b"0"
    with pytest.raises(ServiceStateError, match=r"returned NoneType, not bytes"):
        take_service_snapshot(Count("none"))
    with pytest.raises(ServiceStateError, match="raised RuntimeError") as info:
        take_service_snapshot(Count("raises"))
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("broken", "reason"),
    [("none", "returned NoneType, not bytes"), ("raises", "state not serialisable")],
)
async def test_a_snapshot_the_service_cannot_give_fails_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str, reason: str
) -> None:
    config = make_config(tmp_path)
    with trio.fail_after(30):
        async with running_node(config, Count(broken)) as node:
            async with client.connect(endpoints(node)) as c:
                for _ in range(5):
                    await c.offer(b"+1")
                    await c.receive_message()
                with caplog.at_level(logging.ERROR, logger="cluster.node"):
                    response = await c.request_snapshot(timeout=10)
                assert response.response_code is AdminResponseCode.ERROR, response
                assert reason in response.message, response.message
                errors = [r for r in caplog.records if r.levelno == logging.ERROR]
                assert any(reason in r.getMessage() for r in errors), caplog.text
                # the node goes on serving
                await c.offer(b"+1")
                assert (await c.receive_message()).payload == b"6"
            assert _snapshots_recorded(node) == 0
            assert list((tmp_path / "snapshots").glob("*")) == []
        # nothing was lost: the restart replays the whole log
        restored = Count()
        async with running_node(config, restored):
            assert restored.count == 6


async def test_a_good_snapshot_is_loaded_by_on_start(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with trio.fail_after(30):
        async with running_node(config, Count()) as node:
            async with client.connect(endpoints(node)) as c:
                for _ in range(3):
                    await c.offer(b"+1")
                    await c.receive_message()
                response = await c.request_snapshot(timeout=10)
                assert response.response_code is AdminResponseCode.OK, response
            assert _snapshots_recorded(node) == 1
        seen: list[bytes | None] = []

        class Spy(Count):
            def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
                seen.append(snapshot)
                super().on_start(cluster, snapshot)

        restored = Spy()
        async with running_node(config, restored):
            assert seen == [b"3"]
            assert restored.count == 3


def _snapshots_recorded(node: Node) -> int:
    entries = node.recording_log.entries  # two per snapshot: the service's, the module's
    return len({e.log_position for e in entries if e.is_valid and e.type == ENTRY_TYPE_SNAPSHOT})


def test_the_node_refuses_to_start_a_service_without_the_snapshot_pair(tmp_path: Path) -> None:
    (tmp_path / "forgetful.py").write_text(
        textwrap.dedent(
            """
            from cluster.service import ClusteredService

            class Forgetful(ClusteredService):
                def on_session_message(self, session, timestamp, payload):
                    session.offer(payload)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "cluster.node", "--dir", str(tmp_path / "data")),
            *("--service", "forgetful:Forgetful", "--members", "0=127.0.0.1:1:2:3"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2, result
    assert "error: service 'forgetful:Forgetful': Forgetful cannot be a clustered service" in (
        result.stderr
    )
    assert "on_start() and on_take_snapshot()" in result.stderr
    assert "Traceback" not in result.stderr
