"""The anyio client against scripted cluster members written here with anyio sockets.

Each fake member listens for ingress, decodes what the client writes, dials the
client's response channel (the egress) and answers as its ``role`` says.  Every test
runs under asyncio and under Trio.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

import client
from client._endpoints import parse_host_port
from cluster.protocol import (
    INGRESS,
    AdminResponseCode,
    EventCode,
    FrameDecoder,
    encode_frames_into,
)
from cluster.protocol.egress import (
    AdminResponse,
    Challenge,
    NewLeaderEvent,
    SessionAck,
    SessionEvent,
)
from cluster.protocol.ingress import (
    AdminRequest,
    ChallengeResponse,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionMessageHeader,
    SessionResumeRequest,
)
from cluster.protocol.version import PROTOCOL_VERSION

connect_dial_back = functools.partial(client.connect, egress_host="127.0.0.1")
"""The client as these tests drive it: it listens for egress and the (fake) cluster
dials it (the seeds' response channel), instead of egress on the ingress connection."""

pytestmark = pytest.mark.anyio

TIMESTAMP = 42


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def dead_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Poll client-side state (the client has no hook for tests to wait on)."""
    while not predicate():  # noqa: ASYNC110 - no event to wait on from outside the client
        await anyio.sleep(0.005)


async def receive_until_error(c: client.ClusterClient, error: type[Exception]) -> int:
    """Receive until ``error`` is raised; return how many messages came first."""
    count = 0
    while True:
        try:
            await c.receive()
        except error:
            return count
        count += 1


class Changed:
    """Wake waiters whenever a fake member records something."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._event.wait()


class FakeMember:
    """One scripted member.  Roles: leader, follower, reject, auth_reject, challenge, silent."""

    def __init__(self, cluster: FakeCluster, member_id: int, role: str) -> None:
        self.cluster = cluster
        self.member_id = member_id
        self.role = role
        self.received: list[Any] = []
        self.ingress_chunks = 0
        self.ingress_connections = 0
        self.ingress_open = 0
        self.ingress_streams: list[anyio.abc.SocketStream] = []
        self.egress: anyio.abc.SocketStream | None = None
        self.answer_admin = True
        self.echo = True
        self.gate: anyio.Event | None = None  # while set and not yet fired, stop reading
        self.port = 0
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
        self._scope = anyio.CancelScope()

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [m for m in self.received if isinstance(m, kind)]

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        self._listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = self._listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(self._serve, tg)

    async def _serve(self, tg: anyio.abc.TaskGroup) -> None:
        assert self._listener is not None
        with self._scope:
            async with self._listener:
                await self._listener.serve(self._handle_ingress, tg)

    async def stop(self) -> None:
        """Crash: stop listening and drop every connection."""
        self._scope.cancel()
        for stream in self.ingress_streams:
            await stream.aclose()
        if self.egress is not None:
            await self.egress.aclose()

    async def drop_ingress(self) -> None:
        """Close the ingress connections (as a node does on a bad frame)."""
        for stream in self.ingress_streams:
            await stream.aclose()

    async def _handle_ingress(self, stream: anyio.abc.SocketStream) -> None:
        self.ingress_connections += 1
        self.ingress_open += 1
        self.ingress_streams.append(stream)
        self.cluster.changed.notify()
        decoder = FrameDecoder()
        async with stream:
            try:
                async for chunk in stream:
                    if self.gate is not None:
                        await self.gate.wait()
                    self.ingress_chunks += 1
                    replies: list[Any] = []
                    for body in decoder.feed(chunk):
                        message = INGRESS.decode(body)
                        self.received.append(message)
                        await self._on_message(message, replies)
                    if replies:
                        await self.send(*replies)
                    self.cluster.changed.notify()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        self.ingress_open -= 1
        self.cluster.changed.notify()

    async def dial_egress(self) -> None:
        if self.egress is None:
            assert self.cluster.response_channel is not None
            host, port = parse_host_port(self.cluster.response_channel)
            self.egress = await anyio.connect_tcp(host, port)

    async def send(self, *messages: Any) -> None:
        buf = bytearray()
        encode_frames_into(buf, messages)
        await self.send_raw(bytes(buf))

    async def send_raw(self, data: bytes) -> None:
        """Egress bytes: on the client's ingress connection when it named no response
        channel (the real client's default), else on a connection dialled to it."""
        if self.cluster.response_channel == "":
            await self.ingress_streams[-1].send(data)
            return
        await self.dial_egress()
        assert self.egress is not None
        await self.egress.send(data)

    def event(self, correlation_id: int, code: EventCode, detail: str = "") -> SessionEvent:
        c = self.cluster
        return SessionEvent(
            cluster_session_id=c.session_id,
            correlation_id=correlation_id,
            leadership_term_id=c.term,
            leader_member_id=c.leader_id,
            code=code,
            version=PROTOCOL_VERSION,
            detail=detail,
        )

    async def _on_message(self, message: Any, replies: list[Any]) -> None:
        c = self.cluster
        if isinstance(message, SessionConnectRequest):
            c.response_channel = message.response_channel
            corr = message.correlation_id
            if self.role == "leader":
                replies.append(self.event(corr, EventCode.OK))
            elif self.role == "follower":
                replies.append(self.event(corr, EventCode.REDIRECT, c.endpoints))
            elif self.role == "reject":
                replies.append(self.event(corr, EventCode.ERROR, "concurrent session limit"))
            elif self.role == "auth_reject":
                replies.append(self.event(corr, EventCode.AUTHENTICATION_REJECTED, "bad creds"))
            elif self.role == "challenge":
                replies.append(Challenge(corr, c.session_id, b"nonce"))
        elif isinstance(message, SessionResumeRequest) and self.role == "leader":
            replies.append(NewLeaderEvent(c.term, c.session_id, c.leader_id, c.endpoints))
        elif isinstance(message, ChallengeResponse):
            ok = message.encoded_credentials == b"answer:nonce"
            code = EventCode.OK if ok else EventCode.AUTHENTICATION_REJECTED
            replies.append(self.event(message.correlation_id, code))
        elif isinstance(message, SessionMessageHeader):
            if self.echo:
                replies.append(
                    SessionMessageHeader(c.term, c.session_id, TIMESTAMP, message.payload)
                )
            if message.sequence:  # applied at once: confirmed, as a leader's ack says
                seq = message.sequence
                replies.append(SessionAck(c.session_id, c.term, applied=seq, logged=seq))
        elif isinstance(message, AdminRequest) and self.answer_admin:
            replies.append(
                AdminResponse(
                    c.session_id,
                    message.correlation_id,
                    message.request_type,
                    AdminResponseCode.OK,
                    "snapshot taken",
                )
            )


class FakeCluster:
    def __init__(self, roles: list[str]) -> None:
        self.members = [FakeMember(self, i, role) for i, role in enumerate(roles)]
        self.changed = Changed()
        self.session_id = 7
        self.term = 3
        self.leader_id = next((i for i, r in enumerate(roles) if r != "follower"), 0)
        self.response_channel: str | None = None

    @property
    def endpoints(self) -> str:
        return ",".join(f"{m.member_id}=127.0.0.1:{m.port}" for m in self.members)

    def endpoint(self, member_id: int) -> str:
        return f"{member_id}=127.0.0.1:{self.members[member_id].port}"


@asynccontextmanager
async def fake_cluster(*roles: str) -> AsyncIterator[FakeCluster]:
    cluster = FakeCluster(list(roles))
    async with anyio.create_task_group() as tg:
        for member in cluster.members:
            await member.start(tg)
        try:
            yield cluster
        finally:
            with anyio.CancelScope(shield=True):
                for member in cluster.members:
                    await member.stop()
            tg.cancel_scope.cancel()


# ---------------------------------------------------------------------------- tests


async def test_connect_offer_receive_and_close() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints) as c:
                assert c.cluster_session_id == 7
                assert c.leadership_term_id == 3
                assert c.leader_member_id == 0
                assert c.ingress_endpoints == cluster.endpoints
                assert not c.is_closed
                await c.offer(b"hello")
                assert await c.receive() == b"hello"
                await c.offer(b"again")
                message = await c.receive_message()
                assert message.payload == b"again"
                assert message.timestamp == TIMESTAMP
                # Messages for another session are ignored.
                await leader.send(SessionMessageHeader(3, 99, 0, b"not mine"))
                await leader.send(SessionMessageHeader(3, 7, 0, b"mine"))
                assert await c.receive() == b"mine"
            assert c.is_closed
            await c.close()  # idempotent
            await cluster.changed.wait_until(lambda: bool(leader.of_type(SessionCloseRequest)))
            (request,) = leader.of_type(SessionConnectRequest)
            assert request.version == PROTOCOL_VERSION
            assert request.response_stream_id == 0
            assert request.response_channel.startswith("127.0.0.1:")
            assert leader.of_type(SessionCloseRequest) == [SessionCloseRequest(3, 7)]
            with pytest.raises(client.SessionClosedError) as info:
                await c.offer(b"late")
            assert info.value.reason == "CLIENT_ACTION"


async def test_connect_timeout_when_no_member_listens() -> None:
    with anyio.fail_after(10):
        endpoints = f"0=127.0.0.1:{dead_port()},1=127.0.0.1:{dead_port()}"
        start = anyio.current_time()
        with pytest.raises(client.ConnectTimeoutError) as info:
            async with connect_dial_back(endpoints, connect_timeout=0.3):
                pytest.fail("connected to nothing")
        assert isinstance(info.value, TimeoutError)
        assert anyio.current_time() - start < 3


async def test_unreachable_member_is_skipped() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            endpoints = f"0=127.0.0.1:{dead_port()},1=127.0.0.1:{cluster.members[0].port}"
            async with connect_dial_back(endpoints) as c:
                await c.offer(b"x")
                assert await c.receive() == b"x"


async def test_redirect_to_leader() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("follower", "leader") as cluster:
            follower, leader = cluster.members
            # The client only knows the follower; the REDIRECT tells it the rest.
            async with connect_dial_back(cluster.endpoint(0)) as c:
                assert c.leader_member_id == 1
                assert c.ingress_endpoints == cluster.endpoints
                await c.offer(b"to the leader")
                assert await c.receive() == b"to the leader"
            (first,) = follower.of_type(SessionConnectRequest)
            (second,) = leader.of_type(SessionConnectRequest)
            assert first.correlation_id != second.correlation_id
            assert not follower.of_type(SessionMessageHeader)


async def test_challenge_response() -> None:
    class Supplier(client.CredentialsSupplier):
        def encoded_credentials(self) -> bytes:
            return b"user:secret"

        def on_challenge(self, encoded_challenge: bytes) -> bytes:
            return b"answer:" + encoded_challenge

    with anyio.fail_after(10):
        async with fake_cluster("challenge") as cluster:
            member = cluster.members[0]
            async with connect_dial_back(cluster.endpoints, credentials=Supplier()) as c:
                assert c.cluster_session_id == 7
            (request,) = member.of_type(SessionConnectRequest)
            (response,) = member.of_type(ChallengeResponse)
            assert request.encoded_credentials == b"user:secret"
            assert response.encoded_credentials == b"answer:nonce"
            assert response.correlation_id == request.correlation_id
            assert response.cluster_session_id == 7


async def test_wrong_challenge_answer_is_rejected() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("challenge") as cluster:
            with pytest.raises(client.AuthenticationRejectedError):
                async with connect_dial_back(cluster.endpoints, credentials=b"plain bytes"):
                    pytest.fail("connected")


@pytest.mark.parametrize(
    ("role", "error", "detail"),
    [
        ("reject", client.SessionRejectedError, "concurrent session limit"),
        ("auth_reject", client.AuthenticationRejectedError, "bad creds"),
    ],
)
async def test_rejection_errors(role: str, error: type[Exception], detail: str) -> None:
    with anyio.fail_after(10):
        async with fake_cluster(role) as cluster:
            with pytest.raises(error) as info:  # the error itself, not an ExceptionGroup
                async with connect_dial_back(cluster.endpoints):
                    pytest.fail("connected")
            assert type(info.value) is error
            assert getattr(info.value, "detail", None) == detail


async def test_session_closed_by_cluster() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints) as c:
                await leader.send(SessionMessageHeader(3, 7, 0, b"last words"))
                await leader.send(leader.event(1, EventCode.CLOSED, "TIMEOUT"))
                assert await c.receive() == b"last words"  # sent before CLOSED
                with pytest.raises(client.SessionClosedError) as info:
                    await c.receive()
                assert info.value.reason == "TIMEOUT"
                assert c.is_closed
                with pytest.raises(client.SessionClosedError):
                    await c.offer(b"too late")
            assert not leader.of_type(SessionCloseRequest)  # nothing to close any more


async def test_pending_receive_raises_when_closed() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints) as c:
                async with anyio.create_task_group() as tg:

                    async def close_soon() -> None:
                        await anyio.sleep(0.05)
                        await leader.send(leader.event(1, EventCode.CLOSED, "SERVICE_ACTION"))

                    tg.start_soon(close_soon)
                    with pytest.raises(client.SessionClosedError) as info:
                        await c.receive()
                    assert info.value.reason == "SERVICE_ACTION"


async def test_new_leader_event_switches_ingress() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader", "leader") as cluster:
            old, new = cluster.members
            async with connect_dial_back(cluster.endpoint(0)) as c:
                await c.offer(b"before")
                assert await c.receive() == b"before"
                await old.stop()  # the leader dies; its ingress goes away
                await wait_for(lambda: not c.is_ingress_connected)
                # Offers made meanwhile are queued...
                for i in range(3):
                    await c.offer(b"meanwhile %d" % i)
                # ...until the election's winner announces itself on the egress.
                cluster.term = 4
                cluster.leader_id = 1
                await new.send(NewLeaderEvent(4, 7, 1, cluster.endpoints))
                for i in range(3):
                    assert await c.receive() == b"meanwhile %d" % i
                assert c.leader_member_id == 1
                assert c.leadership_term_id == 4
                assert c.ingress_endpoints == cluster.endpoints
                await c.offer(b"after")
                assert await c.receive() == b"after"
            payloads = [m.payload for m in new.of_type(SessionMessageHeader)]
            assert payloads == [b"meanwhile 0", b"meanwhile 1", b"meanwhile 2", b"after"]
            # Queued messages were re-stamped with the new term, or the leader would drop them.
            assert {m.leadership_term_id for m in new.of_type(SessionMessageHeader)} == {4}
            assert new.of_type(SessionCloseRequest) == [SessionCloseRequest(4, 7)]


async def test_new_leader_event_while_the_old_leader_lives() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader", "leader") as cluster:
            old, new = cluster.members
            async with connect_dial_back(cluster.endpoint(0)) as c:
                await c.offer(b"before")
                assert await c.receive() == b"before"
                cluster.term = 4
                cluster.leader_id = 1
                await new.send(NewLeaderEvent(4, 7, 1, cluster.endpoints))
                await wait_for(lambda: c.leader_member_id == 1)
                await c.offer(b"after")
                assert await c.receive() == b"after"
                # The client hung up on the old leader.
                await cluster.changed.wait_until(lambda: not old.ingress_open)
            assert [m.payload for m in old.of_type(SessionMessageHeader)] == [b"before"]
            assert [m.payload for m in new.of_type(SessionMessageHeader)] == [b"after"]


async def test_stale_or_foreign_new_leader_events_are_ignored() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader", "leader") as cluster:
            new = cluster.members[1]
            async with connect_dial_back(cluster.endpoint(0)) as c:
                await new.send(NewLeaderEvent(9, 1234, 1, cluster.endpoints))  # other session
                await new.send(NewLeaderEvent(2, 7, 1, cluster.endpoints))  # older term
                await new.send(SessionMessageHeader(3, 7, 0, b"marker"))
                assert await c.receive() == b"marker"
                assert c.leader_member_id == 0
                assert c.leadership_term_id == 3
                await c.offer(b"still old")
                assert await c.receive() == b"still old"
            assert new.ingress_connections == 0


async def test_ingress_reconnects_to_same_leader() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints) as c:
                await leader.drop_ingress()
                await cluster.changed.wait_until(lambda: leader.ingress_connections == 2)
                await c.offer(b"reconnected")
                assert await c.receive() == b"reconnected"
                assert c.cluster_session_id == 7


async def test_many_offers_are_batched_and_echoed_in_order() -> None:
    count = 10_000
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints) as c:
                for i in range(count):
                    await c.offer(i.to_bytes(4, "little"))
                for i in range(count):
                    assert await c.receive() == i.to_bytes(4, "little")
            assert len(leader.of_type(SessionMessageHeader)) == count
            # Thousands of offers went out in a handful of writes.
            assert leader.ingress_chunks < count // 20


async def test_offers_apply_backpressure() -> None:
    payload = b"x" * 65536
    total = 400  # 25 MiB: more than the kernel's socket buffers plus the client's 4 MiB
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            leader.echo = False
            async with connect_dial_back(cluster.endpoints) as c:
                leader.gate = anyio.Event()  # the leader stops reading its ingress
                done = 0
                with anyio.move_on_after(0.5):
                    for _ in range(total):
                        await c.offer(payload)
                        done += 1
                assert done < total
                leader.gate.set()
                for _ in range(done, total):
                    await c.offer(payload)
                await cluster.changed.wait_until(
                    lambda: len(leader.of_type(SessionMessageHeader)) == total
                )


async def test_offers_larger_than_the_frame_limit_are_refused() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            async with connect_dial_back(cluster.endpoints, max_frame_size=1024) as c:
                with pytest.raises(ValueError, match="max_frame_size"):
                    await c.offer(b"x" * 2000)
                await c.offer(b"small")
                assert await c.receive() == b"small"


async def test_keepalives_sent_when_idle() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints, keepalive_interval=0.05) as c:
                await cluster.changed.wait_until(lambda: len(leader.of_type(SessionKeepAlive)) >= 3)
                keepalives = leader.of_type(SessionKeepAlive)
                assert all(k == SessionKeepAlive(3, 7) for k in keepalives)
                await c.send_keepalive()


async def test_request_snapshot() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints) as c:
                response = await c.request_snapshot()
                assert response.response_code is AdminResponseCode.OK
                (request,) = leader.of_type(AdminRequest)
                assert response.correlation_id == request.correlation_id
                leader.answer_admin = False
                with pytest.raises(TimeoutError):
                    await c.request_snapshot(timeout=0.1)


async def test_bad_egress_frames_close_only_that_connection() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            async with connect_dial_back(cluster.endpoints) as c:
                assert cluster.response_channel is not None
                host, port = parse_host_port(cluster.response_channel)
                async with await anyio.connect_tcp(host, port) as rogue:
                    await rogue.send(b"\0\0\0\0garbage")  # a zero-length frame
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                        await rogue.receive()
                await c.offer(b"still fine")
                assert await c.receive() == b"still fine"


async def test_egress_backlog_is_bounded() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with connect_dial_back(cluster.endpoints, max_egress_backlog=5) as c:
                await leader.send(*[SessionMessageHeader(3, 7, 0, b"m") for _ in range(20)])
                received = await receive_until_error(c, client.EgressBacklogExceededError)
                assert received <= 5
                with pytest.raises(client.EgressBacklogExceededError):
                    await c.receive()


async def test_user_exception_is_not_wrapped_in_a_group() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            with pytest.raises(KeyError) as info:
                async with connect_dial_back(cluster.endpoints):
                    raise KeyError("mine")
            assert type(info.value) is KeyError


async def test_outer_cancellation_is_clean() -> None:
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            with anyio.CancelScope() as scope:
                async with connect_dial_back(cluster.endpoints) as c:
                    # the deadline from here: a connect slower than 0.1 s on a busy
                    # machine is not what this tests
                    scope.deadline = anyio.current_time() + 0.1
                    await c.receive()  # nothing comes; cancelled here
            assert scope.cancelled_caught
            assert c.is_closed
            await cluster.changed.wait_until(lambda: bool(leader.of_type(SessionCloseRequest)))
            # ...and while still connecting.
            with anyio.move_on_after(0.1) as scope:
                async with connect_dial_back(f"0=127.0.0.1:{dead_port()}"):
                    pytest.fail("connected to nothing")
            assert scope.cancelled_caught


async def test_bad_arguments() -> None:
    with anyio.fail_after(10):
        with pytest.raises(ValueError, match="member id"):
            async with connect_dial_back("x=127.0.0.1:1"):
                pass
        with pytest.raises(ValueError, match="connect_timeout"):
            async with connect_dial_back("0=127.0.0.1:1", connect_timeout=0):
                pass
        with pytest.raises(TypeError, match="credentials"):
            async with connect_dial_back("0=127.0.0.1:1", credentials=42):  # type: ignore[arg-type]
                pass


async def test_bad_bytes_on_the_ingress_connection_drop_it_and_the_session_resumes() -> None:
    """Egress on the ingress connection (no response channel): a member's bad frame
    drops that connection; the client dials again, proves its session and goes on."""
    with anyio.fail_after(10):
        async with fake_cluster("leader") as cluster:
            leader = cluster.members[0]
            async with client.connect(cluster.endpoints) as c:
                assert cluster.response_channel == ""
                await c.offer(b"before")
                assert await c.receive() == b"before"
                await leader.send_raw(b"\0\0\0\0garbage")  # a zero-length frame
                await cluster.changed.wait_until(lambda: bool(leader.of_type(SessionResumeRequest)))
                (resume,) = leader.of_type(SessionResumeRequest)
                assert resume.cluster_session_id == cluster.session_id
                assert leader.ingress_connections == 2
                await c.offer(b"after")
                assert await c.receive() == b"after"
