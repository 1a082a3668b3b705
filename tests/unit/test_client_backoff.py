"""The client's redials back off (issue #18): exponential, jittered waits between tries
at a port that accepts and closes at once, in the handshake and once the session is
open; a connection that proved useful starts the back-off over.

The servers are real loopback TCP listeners written here with anyio, and the network
tests with them run under asyncio and under Trio; the last test runs a real node (under
Trio) and puts such a listener on its ingress port once it has stopped.
"""

from __future__ import annotations

import functools
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

import client
from client import _ingress
from client._client import ClusterClient
from client._ingress import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    RECONNECT_ATTEMPTS,
    backoff_delay,
)
from cluster.config import NodeConfig
from cluster.examples.echo import EchoService
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol import INGRESS, PROTOCOL_VERSION, EventCode, FrameDecoder, encode_frame
from cluster.protocol.egress import SessionEvent
from cluster.protocol.ingress import (
    SessionConnectRequest,
    SessionMessageHeader,
    SessionResumeRequest,
)

connect_dial_back = functools.partial(client.connect, egress_host="127.0.0.1")
"""The client as these tests drive it: it listens for egress and the (fake) cluster
dials it (the seeds' response channel), instead of egress on the ingress connection."""

SESSION_ID = 7
TERM = 3
SECRET = b"s" * 16


# ---------------------------------------------------------------------- the delay


class _Edge:
    """A random source that always picks one end of the range."""

    def __init__(self, upper: bool) -> None:
        self.upper = upper

    def uniform(self, a: float, b: float) -> float:
        return b if self.upper else a


def test_backoff_delay_bounds() -> None:
    assert backoff_delay(0) == 0.0  # the first dial goes at once
    assert backoff_delay(-3) == 0.0
    for attempt in range(1, 40):
        ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
        assert backoff_delay(attempt, _Edge(upper=True)) == pytest.approx(ceiling)
        assert backoff_delay(attempt, _Edge(upper=False)) == pytest.approx(ceiling / 2)
    assert backoff_delay(1, _Edge(upper=True)) == pytest.approx(0.05)
    assert backoff_delay(1, _Edge(upper=False)) == pytest.approx(0.025)
    assert backoff_delay(6, _Edge(upper=True)) == pytest.approx(1.6)
    assert backoff_delay(7, _Edge(upper=True)) == BACKOFF_CAP == 2.0
    assert backoff_delay(10_000, _Edge(upper=False)) == BACKOFF_CAP / 2  # no overflow
    assert backoff_delay(3, _Edge(upper=True), base=1.0, cap=3.0) == 3.0


def test_backoff_delay_is_jittered_and_grows() -> None:
    rng = random.Random(18)
    for attempt in range(1, 12):
        ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
        samples = [backoff_delay(attempt, rng) for _ in range(200)]
        assert all(ceiling / 2 <= s <= ceiling for s in samples)
        assert len(set(samples)) > 150  # jitter: clients that failed together spread out
        # spread over the whole upper half, not bunched at one end
        assert min(samples) < ceiling * 0.6
        assert max(samples) > ceiling * 0.9
    # the module's own generator by default
    assert 0.025 <= backoff_delay(1) <= 0.05


# ---------------------------------------------------------------------- a fake leader


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class FakeLeader:
    """A loopback listener that treats each accepted connection as ``plan`` says.

    Plans, taken one per accepted connection (``default`` once ``plan`` is empty):
    ``"close"`` closes it at once; ``"serve"`` grants the connect request (OK on the same
    connection) and otherwise stays silent; ``"answer"`` also answers a resume with an
    application message.  ``accepts`` holds the time of every accept.
    """

    def __init__(self, *plan: str, default: str = "serve") -> None:
        self.plan = list(plan)
        self.default = default
        self.accepts: list[float] = []
        self.open: list[anyio.abc.SocketStream] = []
        self.port = 0
        self.changed = anyio.Event()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changed.wait()

    async def drop_open(self) -> None:
        """Close the connections being served (as a crashing node does)."""
        streams, self.open = self.open, []
        for stream in streams:
            await stream.aclose()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        self.accepts.append(anyio.current_time())
        plan = self.plan.pop(0) if self.plan else self.default
        self._notify()
        async with stream:
            if plan == "close":
                return
            self.open.append(stream)
            decoder = FrameDecoder()
            try:
                async for chunk in stream:
                    for body in decoder.feed(chunk):
                        await self._on_message(stream, plan, INGRESS.decode(body))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    async def _on_message(self, stream: anyio.abc.SocketStream, plan: str, message: object) -> None:
        if isinstance(message, SessionConnectRequest):
            ok = SessionEvent(
                cluster_session_id=SESSION_ID,
                correlation_id=message.correlation_id,
                leadership_term_id=TERM,
                leader_member_id=0,
                code=EventCode.OK,
                version=PROTOCOL_VERSION,
                session_secret=SECRET,
            )
            await stream.send(encode_frame(ok))
        elif isinstance(message, SessionResumeRequest) and plan == "answer":
            reply = SessionMessageHeader(TERM, SESSION_ID, 0, b"resumed")
            await stream.send(encode_frame(reply))


@asynccontextmanager
async def fake_leader(leader: FakeLeader, port: int = 0) -> AsyncIterator[FakeLeader]:
    """Serve ``leader`` on ``port`` (any free one by default; a given one once it is free)."""
    while True:
        try:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        except OSError:
            if not port:
                raise
            await anyio.sleep(0.005)  # its last owner is still letting go of it
        else:
            break
    leader.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, leader.handle, tg)
        try:
            yield leader
        finally:
            tg.cancel_scope.cancel()


def exhausted(c: ClusterClient) -> bool:
    """The maintain loop gave up on the leader (it waits for a NewLeaderEvent)."""
    return c._writer._reconnect_exhausted


async def wait_for(predicate: Callable[[], bool], seconds: float) -> None:
    """Poll client-side state for up to ``seconds`` (the client has no hook to wait on)."""
    with anyio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 - no event to wait on from outside the client
            await anyio.sleep(0.005)


# ---------------------------------------------------------------------- the handshake


@pytest.mark.anyio
async def test_handshake_backs_off_from_a_port_that_accepts_and_closes() -> None:
    # Before issue #18 every lost handshake connection restarted the connectors from
    # attempt 0: hundreds to thousands of accepts in these 3 seconds.
    with anyio.fail_after(15):
        async with fake_leader(FakeLeader(default="close")) as leader:
            start = anyio.current_time()
            with pytest.raises(client.ConnectTimeoutError):
                async with connect_dial_back(f"0=127.0.0.1:{leader.port}", connect_timeout=3):
                    pytest.fail("a session from a port that only closes")
            elapsed = anyio.current_time() - start
            count = len(leader.accepts)
            assert 2.9 < elapsed < 5
            # waits of 25-50 ms, 50-100 ms, ... 0.8-1.6 s, 1-2 s: at most 8 dials in 3 s
            assert 3 <= count <= 15, count
            assert leader.accepts[0] - start < 0.5  # the first dial goes at once
            gaps = [b - a for a, b in zip(leader.accepts, leader.accepts[1:], strict=False)]
            assert gaps[-1] >= 0.2  # the waits grew


@pytest.mark.anyio
async def test_happy_path_connects_at_once() -> None:
    with anyio.fail_after(10):
        async with fake_leader(FakeLeader()) as leader:
            start = anyio.current_time()
            async with connect_dial_back(f"0=127.0.0.1:{leader.port}") as c:
                assert c.cluster_session_id == SESSION_ID
                assert anyio.current_time() - start < 1
            assert len(leader.accepts) == 1


# ---------------------------------------------------------------------- open session


@pytest.mark.anyio
async def test_open_session_backs_off_from_a_leader_that_accepts_and_closes() -> None:
    # Before issue #18 a successful TCP connect reset the failure count, so the session's
    # ingress redialled a port that accepts and closes without pause, forever.
    with anyio.fail_after(15):
        async with fake_leader(FakeLeader("serve", default="close")) as leader:
            async with connect_dial_back(f"0=127.0.0.1:{leader.port}") as c:
                assert c.is_ingress_connected
                await leader.drop_open()  # the handshake's connection, which proved useful
                dropped = anyio.current_time()
                await wait_for(lambda: exhausted(c) or len(leader.accepts) > 50, 3)
                redials = leader.accepts[1:]
                assert exhausted(c), len(redials)
                # every connection that broke at once was a failure: RECONNECT_ATTEMPTS
                # dials, then the loop waits for a new leader
                assert len(redials) == RECONNECT_ATTEMPTS
                assert redials[0] - dropped < 0.5  # the first redial goes at once
                # back-offs of at least 25 + 50 + 100 + 200 ms between them
                assert redials[-1] - redials[0] >= 0.37
                assert not c.is_ingress_connected
            # close() does not wait for a leader it gave up on
            assert c.is_closed


@pytest.mark.anyio
@pytest.mark.parametrize("proof", ["message", "time"])
async def test_a_connection_that_proved_useful_starts_the_back_off_over(
    proof: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two quick failures, then a connection that proves useful (a message from the
    node, or staying up long enough): losing it costs nothing, and the next run of
    failures gets all RECONNECT_ATTEMPTS tries again."""
    # only the proof under test can prove it: a message comes long before 5 s
    monkeypatch.setattr(_ingress, "CONNECTION_PROVEN_AFTER", 5.0 if proof == "message" else 0.3)
    useful = "answer" if proof == "message" else "serve"
    plan = ("serve", "close", "close", useful)
    with anyio.fail_after(15):
        async with fake_leader(FakeLeader(*plan, default="close")) as leader:
            async with connect_dial_back(f"0=127.0.0.1:{leader.port}") as c:
                await leader.drop_open()
                await leader.wait_until(lambda: len(leader.accepts) == 4)
                if proof == "message":
                    assert await c.receive() == b"resumed"
                else:
                    await anyio.sleep(0.5)
                assert c.is_ingress_connected
                assert not exhausted(c)
                await leader.drop_open()
                dropped = anyio.current_time()
                await wait_for(lambda: exhausted(c) or len(leader.accepts) > 50, 5)
                assert exhausted(c)
                after = leader.accepts[4:]
                assert len(after) == RECONNECT_ATTEMPTS
                assert after[0] - dropped < 0.5


@pytest.mark.anyio
async def test_a_short_lived_silent_connection_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that is closed before it proved useful counts as a failure, even
    though the TCP connect succeeded."""
    monkeypatch.setattr(_ingress, "CONNECTION_PROVEN_AFTER", 5.0)
    plan = ("serve", "close", "close", "serve")
    with anyio.fail_after(15):
        async with fake_leader(FakeLeader(*plan, default="close")) as leader:
            async with connect_dial_back(f"0=127.0.0.1:{leader.port}") as c:
                await leader.drop_open()
                await leader.wait_until(lambda: len(leader.accepts) == 4)
                await anyio.sleep(0.1)
                await leader.drop_open()  # silent and short-lived: failure number 3
                await wait_for(lambda: exhausted(c) or len(leader.accepts) > 50, 5)
                assert exhausted(c)
                assert len(leader.accepts[1:]) == RECONNECT_ATTEMPTS


async def test_a_real_node_replaced_by_a_port_that_accepts_and_closes(tmp_path: Path) -> None:
    """A session with a real node (run here under Trio); the node stops and a listener
    that accepts and closes takes its ingress port: the client tries a few times, backing
    off, then waits for a new leader (before issue #18: thousands of redials)."""
    ports = free_ports(3)
    config = NodeConfig(
        member_id=0,
        members=f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}",
        dir=str(tmp_path),
    )
    node = Node(config, EchoService())
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(
                lambda task_status: node.run(handle_signals=False, task_status=task_status)
            )
            await wait_for(lambda: node.cm.is_ready_leader, 10)
            port = node.ingress_port
            async with connect_dial_back(f"0=127.0.0.1:{port}") as c:
                await c.offer(b"hello")
                assert await c.receive() == b"hello"
                await node.shutdown()
                async with fake_leader(FakeLeader(default="close"), port) as leader:
                    await wait_for(lambda: exhausted(c) or len(leader.accepts) > 50, 3)
                    # refusals while the port was free count as failures too
                    assert 1 <= len(leader.accepts) <= RECONNECT_ATTEMPTS, len(leader.accepts)
                    assert exhausted(c)
