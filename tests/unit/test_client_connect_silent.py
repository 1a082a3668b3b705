"""The client's connect handshake with a member that accepts connections but never
answers, as a frozen (SIGSTOPped) process does (issue 36): loopback fakes of members,
written here with anyio, under asyncio and under Trio.

- a connect request unanswered for ``ANSWER_TIMEOUT`` also goes to the other members,
  and the session opens at the leader;
- every other connection is closed once the session is granted, the silent member's too;
- a late OK from the silent member grants nothing, unless it comes first;
- a cluster that answers at once gets no extra request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress

import anyio
import anyio.abc
import pytest

import client
from client._connect import ANSWER_TIMEOUT
from cluster.protocol import INGRESS, PROTOCOL_VERSION, EventCode, FrameDecoder, encode_frame
from cluster.protocol.egress import SessionEvent
from cluster.protocol.ingress import SessionConnectRequest

TERM = 4


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Member:
    """A fake member on a loopback port.

    ``role``: ``"leader"`` grants each connect request (OK, session id ``session``);
    ``"follower"`` answers REDIRECT to ``leader``, with every member's endpoint;
    ``"silent"`` accepts and reads nothing until :meth:`thaw` (what the kernel does for
    a frozen process), and then grants what it reads, as a leader, however late.
    """

    def __init__(self, role: str, *, leader: int = -1, session: int = 0) -> None:
        self.role = role
        self.leader = leader
        self.session = session
        self.detail = ""
        self.port = 0
        self.accepts = 0
        self.requests = 0  # connect requests read
        self.ended = 0  # connections the client closed (EOF, or reset)
        self.late_answers = 0  # answers a silent member sent once thawed
        self.thawed = anyio.Event()

    def thaw(self) -> None:
        self.thawed.set()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        self.accepts += 1
        async with stream:
            if self.role == "silent":
                await self.thawed.wait()
            decoder = FrameDecoder()
            try:
                async for chunk in stream:
                    for body in decoder.feed(chunk):
                        message = INGRESS.decode(body)
                        if isinstance(message, SessionConnectRequest):
                            self.requests += 1
                            with suppress(anyio.BrokenResourceError):
                                await self._answer(stream, message)
            except anyio.BrokenResourceError:
                pass
            self.ended += 1

    async def _answer(self, stream: anyio.abc.SocketStream, request: SessionConnectRequest) -> None:
        grant = self.role != "follower"
        answer = SessionEvent(
            cluster_session_id=self.session if grant else -1,
            correlation_id=request.correlation_id,
            leadership_term_id=TERM,
            leader_member_id=self.leader,
            code=EventCode.OK if grant else EventCode.REDIRECT,
            version=PROTOCOL_VERSION,
            detail="" if grant else self.detail,
            session_secret=b"s" * 16 if grant else b"",
        )
        if self.role == "silent":
            self.late_answers += 1
        await stream.send(encode_frame(answer))


@asynccontextmanager
async def members(*fakes: Member) -> AsyncIterator[str]:
    """Serve ``fakes`` as members 0, 1, ...; yield their ingress endpoints string.  Each
    follower's REDIRECT carries every member's endpoint."""
    async with AsyncExitStack() as stack:
        listeners = []
        for fake in fakes:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
            listeners.append(await stack.enter_async_context(listener))
            fake.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        # (the task group ends before the listeners close)
        tg = await stack.enter_async_context(anyio.create_task_group())
        for fake, listener in zip(fakes, listeners, strict=True):
            tg.start_soon(listener.serve, fake.handle, tg)
        endpoints = ",".join(f"{i}=127.0.0.1:{f.port}" for i, f in enumerate(fakes))
        for fake in fakes:
            fake.detail = endpoints
        try:
            yield endpoints
        finally:
            for fake in fakes:
                fake.thaw()
            tg.cancel_scope.cancel()


async def settle() -> None:
    """Give the fakes' tasks time to see what the client did."""
    await anyio.sleep(0.1)


@pytest.mark.anyio
async def test_a_silent_member_gets_the_request_sent_to_the_others() -> None:
    # The client knows a follower and the silent member, which the follower names as the
    # leader; only the follower's REDIRECT tells of the real leader, member 2.  Whichever
    # the client dials first, the silent member gets a request (at once, or after the
    # REDIRECT), and the connect must go on without it.
    silent = Member("silent", leader=1, session=99)
    leader = Member("leader", leader=2, session=7)
    with anyio.fail_after(10):
        async with members(Member("follower", leader=1), silent, leader) as endpoints:
            known = ",".join(endpoints.split(",")[:2])  # members 0 and 1 only
            start = anyio.current_time()
            async with client.connect(known, connect_timeout=5) as c:
                elapsed = anyio.current_time() - start
                assert c.cluster_session_id == 7
                assert c.leader_member_id == 2
                assert ANSWER_TIMEOUT <= elapsed < ANSWER_TIMEOUT + 1.5
                await settle()
                # one connection with a request (and maybe one lost in the first race)
                assert 1 <= silent.accepts <= 2
                assert leader.requests == 1  # one request, one session
                # The silent member wakes up: it finds the request, and the connection
                # closed; its late OK grants nothing.
                silent.thaw()
                await settle()
                assert silent.requests == 1
                assert silent.ended == silent.accepts
                assert c.cluster_session_id == 7
                assert not c.is_closed
                await c.send_keepalive()


@pytest.mark.anyio
async def test_a_silent_leader_that_wakes_up_grants_the_session() -> None:
    # Member 0 leads and is paused; member 1 keeps naming it.  The client waits for it
    # (asking member 1 again now and then) and takes its OK when it wakes up.
    silent = Member("silent", leader=0, session=3)
    follower = Member("follower", leader=0)
    async with members(silent, follower) as endpoints, anyio.create_task_group() as tg:

        async def wake() -> None:
            await anyio.sleep(ANSWER_TIMEOUT + 0.3)
            silent.thaw()

        tg.start_soon(wake)
        start = anyio.current_time()
        with anyio.fail_after(10):
            async with client.connect(endpoints, connect_timeout=5) as c:
                elapsed = anyio.current_time() - start
                assert c.cluster_session_id == 3
                assert ANSWER_TIMEOUT + 0.3 <= elapsed < ANSWER_TIMEOUT + 1.5
                # one request, never a second: it was in flight all along
                assert silent.requests == 1
                assert silent.accepts <= 2  # (one more lost the first race, maybe)
                assert silent.late_answers == 1
                assert 1 <= follower.requests <= 2  # at the start, and/or on the deadline


@pytest.mark.anyio
async def test_a_prompt_cluster_gets_no_extra_request() -> None:
    fakes = [
        Member("follower", leader=2),
        Member("follower", leader=2),
        Member("leader", leader=2, session=5),
    ]
    with anyio.fail_after(10):
        async with members(*fakes) as endpoints:
            start = anyio.current_time()
            async with client.connect(endpoints, connect_timeout=5) as c:
                assert c.cluster_session_id == 5
                assert anyio.current_time() - start < ANSWER_TIMEOUT
                await anyio.sleep(ANSWER_TIMEOUT + 0.2)  # past the deadline: nothing more
                requests = [f.requests for f in fakes]
                # the first connection gets the request: the leader's, or a follower's
                # that sends it to the leader; the two other connections are closed
                assert requests in ([0, 0, 1], [1, 0, 1], [0, 1, 1]), requests
                assert sum(f.accepts for f in fakes) <= 4
