"""A real node in this process (real sockets, real files) driven by the real client.

Each test starts :class:`cluster.node.Node` on free loopback ports inside the test's
Trio nursery, with its data in ``tmp_path``.
"""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import client
from client import AuthenticationRejectedError, SessionClosedError, SessionRejectedError
from cluster.config import NodeConfig
from cluster.core.auth import Authenticator
from cluster.examples.auth import SharedSecretAuthenticator, SharedSecretCredentials
from cluster.examples.echo import EchoService
from cluster.examples.kv import KeyValueClient, KeyValueService
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol import EGRESS, PROTOCOL_VERSION, EventCode, FrameDecoder, encode_frame
from cluster.protocol.egress import SessionEvent
from cluster.protocol.enums import CloseReason, Role
from cluster.protocol.ingress import SessionConnectRequest
from cluster.protocol.version import compose
from cluster.service import ClientSession, ClusteredService, StatelessService


def make_config(directory: Path, **overrides: Any) -> NodeConfig:
    ports = free_ports(3)
    return NodeConfig(
        member_id=0,
        members=f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}",
        dir=str(directory),
        **overrides,
    )


@asynccontextmanager
async def running_node(
    config: NodeConfig,
    service: ClusteredService,
    authenticator: Authenticator | None = None,
) -> AsyncIterator[Node]:
    node = Node(config, service, authenticator=authenticator)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        await wait_for(lambda: node.cm.is_ready_leader)
        try:
            yield node
        finally:
            await node.shutdown()


def endpoints(node: Node) -> str:
    return f"0=127.0.0.1:{node.ingress_port}"


async def test_kv_round_trip_and_restart_replays_log(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with trio.fail_after(30):
        async with running_node(config, KeyValueService()) as node:
            async with client.connect(endpoints(node)) as c, KeyValueClient(c) as kv:
                async with trio.open_nursery() as n:
                    for i in range(500):
                        n.start_soon(kv.put, f"k{i}", f"v{i}".encode())
                assert await kv.get("k7") == b"v7"
                assert await kv.compare_and_set("k7", b"v7", b"new")
                assert not await kv.compare_and_set("k7", b"v7", b"newer")
                assert await kv.delete("k8")
                assert await kv.get("k8") is None
        restored = KeyValueService()
        async with running_node(config, restored) as node:
            assert restored.store["k7"] == b"new"
            assert "k8" not in restored.store
            assert len(restored.store) == 499
            async with client.connect(endpoints(node)) as c, KeyValueClient(c) as kv:
                assert await kv.get("k499") == b"v499"
            # a new term after the restart
            assert node.cm.leadership_term_id == 1


async def test_echo_reply_carries_log_timestamp(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            async with client.connect(endpoints(node)) as c:
                before = trio.current_time()
                await c.offer(b"hello")
                reply = await c.receive_message()
                assert reply.payload == b"hello"
                assert reply.cluster_session_id == c.cluster_session_id
                assert reply.leadership_term_id == c.leadership_term_id == 0
                # the timestamp is the cluster time (epoch ms) stamped on the log entry
                import time

                assert abs(reply.timestamp - time.time() * 1000) < 5_000
                assert reply.timestamp <= node.cm.log.timestamp
                del before


async def test_offer_many_and_receive_many_keep_order(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            async with client.connect(endpoints(node)) as c:
                sent = [b"m%d" % i for i in range(3000)]
                assert await c.offer_many(sent[:1000]) == 1000
                assert await c.offer_many(iter(sent[1000:])) == 2000
                got: list[bytes] = []
                while len(got) < len(sent):
                    batch = await c.receive_many(max_messages=700)
                    assert 1 <= len(batch) <= 700
                    got += batch
                assert got == sent
                with pytest.raises(ValueError, match="max_messages"):
                    await c.receive_many(0)
            with pytest.raises(SessionClosedError):
                await c.offer_many([b"late"])


async def test_bad_frames_do_not_stop_the_node(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            for garbage in (
                b"\xff\xff\xff\x7f" + b"x" * 10,
                b"\x05\x00\x00\x00hello",
                b"\x00\x00\x00\x00",
            ):
                stream = await trio.open_tcp_stream("127.0.0.1", node.ingress_port)
                await stream.send_all(garbage)
                # the node closes the connection
                with trio.fail_after(5):
                    while await stream.receive_some(100):
                        pass
                await stream.aclose()
            assert node.ingress.stats.protocol_errors == 3
            async with client.connect(endpoints(node)) as c:
                await c.offer(b"still alive")
                assert await c.receive() == b"still alive"


async def test_concurrent_session_limit(tmp_path: Path) -> None:
    config = make_config(tmp_path, max_concurrent_sessions=1)
    with trio.fail_after(20):
        async with running_node(config, EchoService()) as node:
            async with client.connect(endpoints(node)):
                with pytest.raises(SessionRejectedError, match="concurrent session limit"):
                    async with client.connect(endpoints(node)):
                        pass


async def test_version_mismatch_gets_error(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            stream = await trio.open_tcp_stream("127.0.0.1", node.ingress_port)
            await stream.send_all(
                encode_frame(SessionConnectRequest(1, 0, compose(9, 0, 0), "127.0.0.1:1"))
            )
            # the answer comes back on the connection: nothing is dialled for it
            decoder = FrameDecoder()
            frames: list[bytes] = []
            while not frames:
                frames = decoder.feed(await stream.receive_some(4096))
            event = EGRESS.decode(frames[0])
            assert isinstance(event, SessionEvent)
            assert event.code is EventCode.ERROR
            assert "invalid client version 9.0.0" in event.detail
            assert event.version == PROTOCOL_VERSION
            await stream.aclose()


async def test_challenge_authentication(tmp_path: Path) -> None:
    secret = b"s3cret"
    auth = SharedSecretAuthenticator({b"alice": secret, b"bob": b"b0b"})
    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService(), auth) as node:
            creds = SharedSecretCredentials(b"alice", secret)
            async with client.connect(endpoints(node), credentials=creds) as c:
                await c.offer(b"authenticated")
                assert await c.receive() == b"authenticated"
                # the principal named in the credentials reached the service via the log
                session = node.container.sessions[c.cluster_session_id]
                assert session.encoded_principal == b"alice"
            for wrong in (
                SharedSecretCredentials(b"mallory", b"wrong"),  # unknown principal
                SharedSecretCredentials(b"bob", secret),  # alice's secret, bob's name
                SharedSecretCredentials(b"x" * 2048, secret),  # over-long credentials
            ):
                with pytest.raises(AuthenticationRejectedError):
                    async with client.connect(endpoints(node), credentials=wrong):
                        pass
            assert auth.pending_state == 0  # nothing kept past a pending session


class RecordingService(StatelessService):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.close_on: bytes | None = b"close me"

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        self.events.append(("open", session.id))

    def on_session_message(self, session: ClientSession, timestamp: int, payload: bytes) -> None:
        self.events.append(("message", payload))
        if payload == self.close_on:
            session.close()
        else:
            session.offer(payload)

    def on_session_close(
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        self.events.append(("close", close_reason))


async def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 (polling node state from a test)
            await trio.sleep(0.01)


async def test_session_closes_by_client_service_and_timeout(tmp_path: Path) -> None:
    service = RecordingService()
    config = make_config(tmp_path, session_timeout=500_000_000)
    with trio.fail_after(30):
        async with running_node(config, service) as node:
            # CLIENT_ACTION
            async with client.connect(endpoints(node)) as c:
                await c.offer(b"one")
                assert await c.receive() == b"one"
            await wait_for(lambda: ("close", CloseReason.CLIENT_ACTION) in service.events)

            # SERVICE_ACTION
            async with client.connect(endpoints(node)) as c:
                await c.offer(b"close me")
                with pytest.raises(SessionClosedError) as info:
                    await c.receive()
                assert "SERVICE_ACTION" in str(info.value.reason)
            await wait_for(lambda: ("close", CloseReason.SERVICE_ACTION) in service.events)

            # TIMEOUT: no keepalives, idle past the 500 ms session timeout
            async with client.connect(endpoints(node), keepalive_interval=60) as c:
                with pytest.raises(SessionClosedError) as info:
                    await c.receive()
                assert "TIMEOUT" in str(info.value.reason)
            await wait_for(lambda: ("close", CloseReason.TIMEOUT) in service.events)
            assert node.cm.counters.timed_out_sessions == 1

            # keepalives keep an idle session open past the timeout
            async with client.connect(endpoints(node), keepalive_interval=0.1) as c:
                await trio.sleep(1.2)
                await c.offer(b"alive")
                assert await c.receive() == b"alive"
    opens = [e for e in service.events if e[0] == "open"]
    closes = [e for e in service.events if e[0] == "close"]
    assert len(opens) == 4
    assert len(closes) == 4  # the last closed by the client on exit


async def test_unknown_session_and_wrong_term_are_ignored_and_counted(tmp_path: Path) -> None:
    from cluster.protocol.ingress import SessionMessageHeader

    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            async with client.connect(endpoints(node)) as c:
                stream = await trio.open_tcp_stream("127.0.0.1", node.ingress_port)
                await stream.send_all(
                    encode_frame(SessionMessageHeader(0, 999, 0, b"who am i"))
                    + encode_frame(SessionMessageHeader(7, c.cluster_session_id, 0, b"old term"))
                )
                await wait_for(
                    lambda: (
                        node.cm.counters.unknown_session_messages == 1
                        and node.cm.counters.wrong_term_messages == 1
                    )
                )
                await stream.aclose()
                await c.offer(b"real")
                assert await c.receive() == b"real"


async def test_many_in_flight_echo(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            async with client.connect(endpoints(node)) as c:
                n = 5000
                for i in range(n):
                    await c.offer(i.to_bytes(4, "little"))
                for i in range(n):
                    assert await c.receive() == i.to_bytes(4, "little")


@pytest.mark.parametrize("archive_io", ["thread", "inline", "auto"])
async def test_failed_log_write_is_retried_and_nothing_is_lost(
    tmp_path: Path, archive_io: str
) -> None:
    """A log write that fails (ENOSPC: the archive rolls itself back) is held and
    retried; nothing is acknowledged meanwhile, the archive lock is free during the
    wait, and once the write succeeds the message commits and its reply arrives."""
    import errno

    from cluster.archive.errors import ArchiveWriteError

    config = make_config(tmp_path, archive_io=archive_io)
    with trio.fail_after(30):
        async with running_node(config, EchoService()) as node:
            agent = node.archive_agent
            agent.retry_interval = 0.3
            real_append = node.archive.append
            failures = [1]

            def append(data: bytes | bytearray | memoryview, *, checked: bool = False) -> int:
                if failures:
                    failures.pop()
                    raise ArchiveWriteError(errno.ENOSPC, "injected: no space left on device")
                return real_append(data, checked=checked)

            node.archive.append = append  # type: ignore[method-assign]
            async with client.connect(endpoints(node)) as c:
                committed = node.cm.commit_position
                await c.offer(b"held")
                await wait_for(lambda: agent.write_errors == 1)
                assert "no space left" in agent.last_error
                assert node.cm.commit_position == committed  # not acknowledged
                assert not node.archive_lock.locked()  # free while it waits to retry
                reply = await c.receive_message()
                assert reply.payload == b"held"
                assert node.cm.commit_position > committed
                assert agent.write_errors == 1


async def test_auto_leader_writes_a_lone_message_inline_and_a_burst_through_its_thread(
    tmp_path: Path,
) -> None:
    """``--archive-io auto``: a leader writes a batch in its event loop when the log is
    quiet (everything committed, the batch small and long after the one before), where
    the writer thread's hand-off costs more than the sync blocks; a burst goes to the
    thread, so the leader keeps sequencing while it syncs."""
    with trio.fail_after(30):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            agent = node.archive_agent
            writer = node._log_writer
            assert writer is not None
            assert agent.inline_when_idle
            assert not agent.inline
            async with client.connect(endpoints(node)) as c:
                await trio.sleep(0.01)
                inline, threaded = agent.inline_writes, writer.calls
                for i in range(5):
                    await trio.sleep(0.005)
                    await c.offer(b"lone %d" % i)
                    assert (await c.receive_message()).payload == b"lone %d" % i
                assert agent.inline_writes == inline + 5
                assert writer.calls == threaded
                await c.offer_many([b"burst"] * 3000)
                for _ in range(3000):
                    assert (await c.receive_message()).payload == b"burst"
                assert writer.calls > threaded


async def test_failed_node_state_save_is_logged_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Saving the applied position to node-state.json fails (ENOSPC): the node logs it
    once, keeps serving, and saves it at a later try."""
    import errno
    import logging

    import cluster.agents.upkeep

    monkeypatch.setattr(cluster.agents.upkeep, "STATE_SAVE_INTERVAL", 0.05)
    caplog.set_level(logging.INFO, logger="cluster")
    with trio.fail_after(20):
        async with running_node(make_config(tmp_path), EchoService()) as node:
            real_save = node.node_state.save
            failures = [1, 1]

            def save(**fields: Any) -> None:
                if failures:
                    failures.pop()
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")
                real_save(**fields)

            node.node_state.save = save  # type: ignore[method-assign]
            async with client.connect(endpoints(node)) as c:
                await c.offer(b"one")
                assert (await c.receive_message()).payload == b"one"
                await wait_for(lambda: node.node_state.commit_position > 0 and not failures)
                assert node.node_state.commit_position == node.log_agent.applied_position
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1  # one when the disk filled, not one per retry
    assert errors[0].startswith("disk full: node state (commit position ")
    assert "failed (No space left on device); writes are retried" in errors[0]
    assert "disk has space again: writes resumed after" in caplog.text


class AckOrderEcho(EchoService):
    """Echo that notes, each time a follower applies, whether that follower still holds
    unsent bytes for the leader (an acknowledgement queued but not yet sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.node: Node | None = None
        self.unsent_at_apply: list[int] = []

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        node = self.node
        if node is not None and node.cm.role is Role.FOLLOWER:
            link = node.links.links.get(node.cm.leader_member_id)
            self.unsent_at_apply.append(link.backlog if link is not None else -1)
        super().on_session_message(session, timestamp, payload)


async def test_follower_acknowledges_an_append_before_applying_committed_entries(
    tmp_path: Path,
) -> None:
    """With one message in flight, the AppendRequest that brings message k+1 also
    carries the commit position of message k.  The follower writes k+1, queues its
    AppendPosition and applies k: the acknowledgement (which the leader's commit of k+1
    waits for) must be on its way before the apply (which nothing waits for), not
    after it."""
    ports = free_ports(9)
    members = ",".join(
        f"{i}=127.0.0.1:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(3)
    )
    services = [AckOrderEcho() for _ in range(3)]
    nodes = [
        Node(NodeConfig(member_id=i, members=members, dir=str(tmp_path / f"n{i}")), services[i])
        for i in range(3)
    ]
    for service, node in zip(services, nodes, strict=True):
        service.node = node
    ingress = ",".join(f"{i}=127.0.0.1:{ports[3 * i]}" for i in range(3))
    n = 50
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for node in nodes:
                await nursery.start(
                    lambda task_status, node=node: node.run(
                        handle_signals=False, task_status=task_status
                    )
                )
            await wait_for(lambda: any(node.cm.is_ready_leader for node in nodes), 30)
            async with client.connect(ingress, connect_timeout=10) as c:
                for i in range(n):
                    await c.offer(i.to_bytes(4, "little"))
                    assert await c.receive() == i.to_bytes(4, "little")
            followers = [
                s for s, node in zip(services, nodes, strict=True) if not node.cm.is_ready_leader
            ]
            await wait_for(lambda: all(len(s.unsent_at_apply) >= n - 1 for s in followers))
            for node in nodes:
                await node.shutdown()
    assert len(followers) == 2
    for service in followers:
        # every apply found the link to the leader drained: no acknowledgement waited
        assert service.unsent_at_apply.count(0) == len(service.unsent_at_apply), (
            service.unsent_at_apply
        )


async def test_a_shutdown_shows_in_the_module_state_until_the_node_stops(tmp_path: Path) -> None:
    """SHUTDOWN applied: QUITTING, then TERMINATING while the node drains (what
    `describe`, the console and /health read: a clean stop, not a crash)."""
    from cluster.protocol.enums import ClusterAction

    node = Node(make_config(tmp_path), StatelessService())
    seen: list[str] = []
    real_shutdown = node.shutdown

    async def shutdown(drain_timeout: float = 5.0) -> None:
        seen.append(node.status().module_state)  # the action applied, not yet draining
        await real_shutdown(drain_timeout)
        seen.append(node.status().module_state)

    node.shutdown = shutdown  # type: ignore[method-assign]  # before run() hands it out
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: node.run(handle_signals=False, task_status=task_status)
        )
        await wait_for(lambda: node.cm.is_ready_leader)
        assert node.status().module_state == "ACTIVE"
        ok, message = await node.request_action(ClusterAction.SNAPSHOT, terminate=True)
        assert ok, message
    assert seen == ["QUITTING", "TERMINATING"]
    # and the next start knows everything was committed, the SHUTDOWN action included
    saved = json.loads((tmp_path / "node-state.json").read_text())["commit_position"]
    assert saved == node.cm.commit_position == node.log_agent.applied_position


async def test_a_node_that_owns_its_process_puts_start_up_objects_out_of_the_collectors_reach(
    tmp_path: Path,
) -> None:
    """``freeze_gc`` (what ``python -m cluster.node`` runs with): once started, what was
    made so far is frozen, so a full collection no longer walks the modules (12-27 ms of
    stopped loop here); by default (nodes sharing a process, as here) nothing is."""
    assert gc.get_freeze_count() == 0
    node = Node(make_config(tmp_path), StatelessService())
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: node.run(
                        handle_signals=False, freeze_gc=True, task_status=task_status
                    )
                )
                assert gc.get_freeze_count() > 10_000  # the modules at least
                await node.shutdown()
    finally:
        gc.unfreeze()
