"""Timers, service messages, snapshots and recovery (issue #4), on real nodes in-process.

Each test runs one or three :class:`cluster.node.Node` objects in the test's Trio run,
on loopback TCP with their data in ``tmp_path``, and drives them with the real client.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import client
from client import AuthenticationRejectedError
from cluster.archive.reader import list_segments
from cluster.archive.record import RECORD_HEADER_LENGTH, iter_records
from cluster.config import NodeConfig
from cluster.core.auth import Authenticator
from cluster.examples.auth import SharedSecretAuthenticator, SharedSecretCredentials
from cluster.examples.kv import KeyValueClient, KeyValueService
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol.enums import AdminResponseCode, CloseReason, Role
from cluster.service import ClientSession, Cluster

FAST = {
    "leader_heartbeat_timeout": 1_000_000_000,
    "startup_canvass_timeout": 3_000_000_000,
    "election_timeout": 300_000_000,
}


def members_string(n: int) -> str:
    ports = free_ports(3 * n)
    return ",".join(
        f"{i}=127.0.0.1:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(n)
    )


class Cluster3:
    """N in-process nodes; each runs in its own cancel scope so a test can crash one."""

    def __init__(
        self,
        nursery: trio.Nursery,
        tmp_path: Path,
        n: int,
        service: Callable[[], Any],
        **config: Any,
    ) -> None:
        self.nursery = nursery
        self.tmp_path = tmp_path
        self.members = members_string(n)
        self.n = n
        self.service = service
        self.config = {**FAST, **config}
        self.nodes: dict[int, Node] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.stopped: dict[int, Node] = {}
        self.authenticator: Callable[[], Authenticator | None] = lambda: None

    @property
    def endpoints(self) -> str:
        parts = []
        for member in self.members.split(","):
            ident, _, rest = member.partition("=")
            host, ingress, _c, _a = rest.rsplit(":", 3)
            parts.append(f"{ident}={host}:{ingress}")
        return ",".join(parts)

    async def start(self, i: int) -> Node:
        previous = self.stopped.pop(i, None)
        if previous is not None:  # a crashed or stopped node lets go of its directory
            await previous.closed.wait()
        config = NodeConfig(
            member_id=i, members=self.members, dir=str(self.tmp_path / f"node-{i}"), **self.config
        )
        node = Node(config, self.service(), authenticator=self.authenticator())
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await node.run(handle_signals=False, task_status=task_status)

        await self.nursery.start(run)
        self.nodes[i] = node
        self.scopes[i] = scope
        return node

    async def start_all(self) -> None:
        for i in range(self.n):
            await self.start(i)
        await self.wait_for_leader()

    def crash(self, i: int) -> None:
        self.scopes.pop(i).cancel()
        self.stopped[i] = self.nodes.pop(i)

    async def stop(self, i: int) -> None:
        node = self.stopped[i] = self.nodes.pop(i)
        await node.shutdown()
        self.scopes.pop(i)

    async def stop_all(self) -> None:
        for i in list(self.nodes):
            await self.stop(i)

    def leader(self) -> Node | None:
        ready = [n for n in self.nodes.values() if n.cm.is_ready_leader]
        return max(ready, key=lambda n: n.cm.leadership_term_id, default=None)

    async def wait_for_leader(self) -> Node:
        await wait_for(lambda: self.leader() is not None, 15)
        leader = self.leader()
        assert leader is not None
        return leader


async def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 (polling node state from a test)
            await trio.sleep(0.01)


@asynccontextmanager
async def cluster(
    tmp_path: Path, n: int = 3, service: Callable[[], Any] = KeyValueService, **config: Any
) -> AsyncIterator[Cluster3]:
    async with trio.open_nursery() as nursery:
        c = Cluster3(nursery, tmp_path, n, service, **config)
        try:
            yield c
        finally:
            await c.stop_all()
            nursery.cancel_scope.cancel()


def store(node: Node) -> dict[str, bytes]:
    service = node.service
    assert isinstance(service, KeyValueService)
    return service.store


async def test_ttl_keys_expire_on_every_member(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with cluster(tmp_path) as c:
            await c.start_all()
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                await kv.put("keep", b"1")
                await kv.put("brief", b"2", ttl=0.3)
                assert await kv.get("brief") == b"2"
                await kv.put("renewed", b"3", ttl=0.3)
                await kv.put("renewed", b"4")  # a plain put cancels the expiry
                await trio.sleep(0.8)
                assert await kv.get("brief") is None
                assert await kv.get("renewed") == b"4"
                end = c.leader().cm.commit_position  # type: ignore[union-attr]
            await wait_for(
                lambda: all(n.log_agent.applied_position >= end for n in c.nodes.values())
            )
            for node in c.nodes.values():
                assert "brief" not in store(node)
                assert store(node)["renewed"] == b"4"
                assert store(node)["keep"] == b"1"


class OfferingService(KeyValueService):
    """Offers a service message for every client message starting with b"offer:"."""

    def __init__(self) -> None:
        super().__init__()
        self.service_messages: list[bytes] = []

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        super().on_start(cluster, snapshot)
        self.cluster_handle = cluster

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if session is None:
            self.service_messages.append(payload)
            return
        if payload.startswith(b"offer:"):
            self.cluster_handle.offer(b"svc-" + payload[6:])
            session.offer(b"ok")
            return
        super().on_session_message(session, timestamp, payload)


async def test_service_messages_enter_the_log_once_across_failover(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with cluster(tmp_path, service=OfferingService) as c:
            await c.start_all()
            async with client.connect(c.endpoints) as cc:
                for i in range(20):
                    await cc.offer(f"offer:{i}".encode())
                    assert await cc.receive() == b"ok"
                old = c.leader()
                assert old is not None
                c.crash(old.config.member_id)  # pending service messages may be in flight
                await wait_for(lambda: c.leader() is not None, 15)
                for i in range(20, 30):
                    with trio.fail_after(10):
                        await cc.offer(f"offer:{i}".encode())
                        assert await cc.receive() == b"ok"
            leader = c.leader()
            assert leader is not None
            expected = [f"svc-{i}".encode() for i in range(30)]
            await wait_for(
                lambda: all(
                    n.service.service_messages == expected  # type: ignore[attr-defined]
                    for n in c.nodes.values()
                ),
                15,
            )
            assert leader.cm.service_messages.log_service_session_id == 30
            assert len(leader.cm.service_messages) == 0


async def test_snapshot_then_full_restart_restores_state_and_timers(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with cluster(tmp_path) as c:
            await c.start_all()
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                async with trio.open_nursery() as n:
                    for i in range(300):
                        n.start_soon(kv.put, f"k{i}", f"v{i}".encode())
                await kv.put("expires", b"soon", ttl=4)
                put_at = trio.current_time()
                response = await cc.request_snapshot()
                assert response.response_code is AdminResponseCode.OK, response.message
                await wait_for(lambda: all(n.snapshots_taken == 1 for n in c.nodes.values()))
                for i in range(300, 350):
                    await kv.put(f"k{i}", f"v{i}".encode())
            for i in range(3):
                assert len(list((tmp_path / f"node-{i}" / "snapshots").glob("*.snap"))) == 1
            snapshot_position = c.nodes[0].recording_log.get_latest_snapshot(-1).log_position  # type: ignore[union-attr]
            await c.stop_all()
            for i in range(3):
                await c.start(i)
            leader = await c.wait_for_leader()
            for node in c.nodes.values():
                # recovery started from the snapshot, not from the start of the log
                assert node.recovered_position >= snapshot_position
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                for i in range(350):
                    assert await kv.get(f"k{i}") == f"v{i}".encode()
                if trio.current_time() - put_at < 3.5:
                    assert await kv.get("expires") == b"soon"
                    timers = [t for n in c.nodes.values() for t in n.cm.timers.snapshot()]
                    assert len(timers) == 3  # restored from the snapshot on every member
                with trio.fail_after(8):  # the timer restored from the snapshot fires
                    while await kv.get("expires") is not None:  # noqa: ASYNC110
                        await trio.sleep(0.2)
            assert leader.cm.role is Role.LEADER


class SessionWatcher(KeyValueService):
    def __init__(self) -> None:
        super().__init__()
        self.closed: list[tuple[int, CloseReason]] = []

    def on_session_close(self, session: ClientSession, timestamp: int, close_reason: Any) -> None:
        super().on_session_close(session, timestamp, close_reason)
        self.closed.append((session.id, close_reason))


async def test_every_session_survives_a_full_restart_alike(tmp_path: Path) -> None:
    """One policy for sessions across a full restart (issue #20): a session in the
    snapshot and one opened after it (in the log) are both live after the restart; a
    client that comes back within the session timeout resumes its session, and one
    that does not is closed (TIMEOUT).  (Aeron closes the snapshot's sessions at the
    first election and keeps the log's: two policies, and a client left hanging.)"""
    timeout = 3_000_000_000
    with trio.fail_after(60):
        async with cluster(tmp_path, n=1, service=SessionWatcher, session_timeout=timeout) as c:
            await c.start_all()
            endpoints = c.endpoints
            async with (
                client.connect(endpoints, connect_timeout=10) as in_snapshot,
                KeyValueClient(in_snapshot, timeout=20) as kv_snapshot,
            ):
                release, finished = trio.Event(), trio.Event()

                async def hold(task_status: trio.TaskStatus[int]) -> None:
                    async with client.connect(endpoints) as gone:
                        task_status.started(gone.cluster_session_id)
                        await release.wait()
                    finished.set()

                gone_id = await c.nursery.start(hold)
                response = await in_snapshot.request_snapshot()
                assert response.response_code is AdminResponseCode.OK
                await wait_for(lambda: c.nodes[0].snapshots_taken == 1)
                async with (
                    client.connect(endpoints, connect_timeout=10) as in_log,
                    KeyValueClient(in_log, timeout=20) as kv_log,
                ):
                    await kv_log.put("log", b"1")
                    c.crash(0)
                    release.set()  # that client goes away while the node is down
                    await finished.wait()
                    await c.start(0)
                    await c.wait_for_leader()
                    node = c.nodes[0]
                    assert {gone_id, in_snapshot.cluster_session_id} <= set(node.cm.sessions)
                    assert in_log.cluster_session_id in node.cm.sessions
                    await kv_snapshot.put("snapshot", b"2")  # both resume and go on
                    await kv_log.put("log", b"3")
                    await wait_for(lambda: gone_id not in node.cm.sessions, 10)
                    closed = node.service.closed  # type: ignore[attr-defined]
                    assert closed == [(gone_id, CloseReason.TIMEOUT)]
                    assert await kv_snapshot.get("log") == b"3"


@pytest.mark.parametrize("entries", [2_000, 20_000])
async def test_startup_replays_only_the_log_after_the_snapshot(
    tmp_path: Path, entries: int
) -> None:
    """Start-up time stays flat as the log before the snapshot grows."""
    with trio.fail_after(120):
        async with cluster(tmp_path, n=1) as c:
            await c.start_all()
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                limiter = trio.CapacityLimiter(500)

                async def put(i: int) -> None:
                    async with limiter:
                        await kv.put(f"k{i % 1000}", b"x" * 32)

                async with trio.open_nursery() as n:
                    for i in range(entries):
                        n.start_soon(put, i)
                assert (await cc.request_snapshot()).response_code is AdminResponseCode.OK
                await wait_for(lambda: c.nodes[0].snapshots_taken == 1)
                for i in range(100):
                    await kv.put(f"after{i}", b"y")
            log_size = c.nodes[0].archive.position
            await c.stop_all()
            started = time.perf_counter()
            node = await c.start(0)
            elapsed = time.perf_counter() - started
            snapshot = node.recording_log.get_latest_snapshot(-1)
            assert snapshot is not None
            replayed = node.recovered_position - snapshot.log_position
            assert node.recovered_position == node.archive.position
            assert node.container.applied_messages == 100  # only the puts after it
            print(
                f"\n{entries} entries before the snapshot: log {log_size} bytes, "
                f"start-up {elapsed * 1000:.1f} ms, {replayed} bytes replayed"
            )
            assert replayed < 10_000  # the 100 puts after the snapshot, not the history
            assert elapsed < 2.0


async def test_admin_requests_need_an_admin_principal_when_authenticated(
    tmp_path: Path,
) -> None:
    secret = b"s3cret"
    with trio.fail_after(40):
        async with cluster(tmp_path, n=1, admin_principals="root") as c:
            c.authenticator = lambda: SharedSecretAuthenticator(
                {b"alice": secret, b"root": b"r00t"}
            )
            await c.start_all()
            alice = SharedSecretCredentials(b"alice", secret)
            async with client.connect(c.endpoints, credentials=alice) as cc:
                response = await cc.request_snapshot()
                assert response.response_code is AdminResponseCode.UNAUTHORISED_ACCESS
            # alice's secret does not make her root
            with pytest.raises(AuthenticationRejectedError):
                async with client.connect(
                    c.endpoints, credentials=SharedSecretCredentials(b"root", secret)
                ):
                    pass
            root = SharedSecretCredentials(b"root", b"r00t")
            async with client.connect(c.endpoints, credentials=root) as cc:
                response = await cc.request_snapshot()
                assert response.response_code is AdminResponseCode.OK
            await wait_for(lambda: c.nodes[0].snapshots_taken == 1)


async def test_a_follower_more_than_a_replication_chunk_behind_catches_up(
    tmp_path: Path,
) -> None:
    """Catch-up ships the log in chunks of at most MAX_CHUNK bytes; each must end at a
    record boundary (a chunk cut inside a record stopped the follower)."""
    from cluster.agents.replication import MAX_CHUNK

    with trio.fail_after(60):
        async with cluster(tmp_path, fsync="none") as c:
            await c.start_all()
            leader = await c.wait_for_leader()
            behind = next(i for i, n in c.nodes.items() if n is not leader)
            c.crash(behind)
            value = bytes(range(256)) * 4  # 1 KiB, so records cross chunk boundaries
            async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                for start in range(0, 3000, 100):
                    async with trio.open_nursery() as puts:
                        for i in range(start, start + 100):
                            puts.start_soon(kv.put, f"k{i}", value)
            assert leader.cm.commit_position > 2 * MAX_CHUNK
            node = await c.start(behind)
            await wait_for(lambda: node.log_agent.applied_position >= leader.cm.commit_position, 30)
            assert store(node) == store(leader)
            assert len(store(node)) == 3000


def flip_a_byte_in_record(data_dir: Path, index: int) -> int:
    """Flip one bit in the body of the ``index``-th record of the first segment; return
    the record's log position."""
    (segment,) = list_segments(data_dir / "archive")[:1]
    raw = bytearray(Path(segment.path).read_bytes())
    position, body = list(iter_records(raw))[index]
    raw[position + RECORD_HEADER_LENGTH + len(body) // 2] ^= 0x10
    Path(segment.path).write_bytes(bytes(raw))
    return position


async def test_corruption_below_the_snapshot_is_found_and_never_shipped(tmp_path: Path) -> None:
    """The sixth attack: a flipped bit in a segment below the latest snapshot is not
    checked at start-up (start-up checks from the snapshot on).  It is found by the
    background check, reported by the member that holds it (an ERROR record and a
    counter), and never shipped to a member rebuilt from an empty directory, which
    stays up instead of crashing on the bad bytes; the leader sends that member its
    snapshot instead, above the bad record, and it catches up (issue 33)."""
    caplog_records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                caplog_records.append(record.getMessage())

    handler = Collect()
    logging.getLogger("cluster").addHandler(handler)
    try:
        with trio.fail_after(90):
            async with cluster(tmp_path) as c:
                await c.start_all()
                async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                    for i in range(50):
                        await kv.put(f"k{i}", f"v{i}".encode())
                    response = await cc.request_snapshot()
                    assert response.response_code is AdminResponseCode.OK, response.message
                    await wait_for(lambda: all(n.snapshots_taken == 1 for n in c.nodes.values()))
                await c.stop_all()
                bad = {i: flip_a_byte_in_record(tmp_path / f"node-{i}", 5) for i in range(3)}
                shutil.rmtree(tmp_path / "node-2")  # member 2 is rebuilt from nothing
                for i in range(3):
                    await c.start(i)
                leader = await c.wait_for_leader()
                assert leader.config.member_id != 2
                holders = [c.nodes[0], c.nodes[1]]
                await wait_for(lambda: all(n.archive_errors >= 1 for n in holders), 20)
                assert any(f"position {bad[0]}" in m for m in caplog_records), caplog_records
                async with client.connect(c.endpoints) as cc, KeyValueClient(cc) as kv:
                    await kv.put("after", b"yes")  # the two holders are still a quorum
                    assert await kv.get("k7") == b"v7"
                rebuilt = c.nodes[2]
                # it never received the corrupt record: the leader sent it its snapshot,
                # above the record, and the log after it (issue 33)
                await wait_for(lambda: rebuilt.catchup.installs == 1, 20)
                assert rebuilt.archive.start_position > bad[0]
                await wait_for(
                    lambda: rebuilt.cm.log.commit_position >= leader.cm.log.commit_position, 10
                )
                assert leader.status().archive_errors >= 1
                assert leader.cm.counters.snapshot_fallbacks == 1
    finally:
        logging.getLogger("cluster").removeHandler(handler)
