"""Follower reads from the client: ``query(payload, consistency="follower")`` spread over
every member (``docs/queries.md``; the members' side is
:mod:`cluster.core.follower_reads`).

Each query goes to the next member in turn (round-robin over all members, the leader
included), over a *query connection* to that member: opened on first use with the
session's dial code (:func:`~client._dial.try_connect`: the same TLS and certificates)
and bound to the session by a query-only :class:`~cluster.protocol.ingress.
SessionResumeRequest` carrying its secret.  The member answers when it has applied at
least ``min_position`` (the highest log position any answer this client got reflected:
:attr:`Queries.seen_position <client._query.Queries.seen_position>`, shared with
linearizable queries) and the session's messages up to ``min_sequence`` (the highest
the cluster confirmed applied: ``Outbox.confirmed``), so a client's follower reads
never go back in time and see its own acknowledged writes.

No answer within :data:`~client._query.RESEND_AFTER`, a broken connection, a bind
refused, BUSY: the query goes to the next member; a member that failed is passed over
for a back-off (:data:`DOWN_MIN` doubling to :data:`DOWN_MAX`) unless every member is,
so a dead or paused member costs one retry, not an error nor a stall per query.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from cluster.protocol import EGRESS, FrameDecoder, ProtocolError, encode_frame
from cluster.protocol.egress import QueryResponse, SessionEvent
from cluster.protocol.enums import EventCode
from cluster.protocol.ingress import QUERY_FOLLOWER, QueryRequest, SessionResumeRequest
from cluster.protocol.version import PROTOCOL_VERSION

from ._dial import NETWORK_ERRORS, aclose_quietly, try_connect
from ._query import RESEND_AFTER, RETRY_MAX, RETRY_MIN, outcome
from ._session import Session

__all__ = ["DOWN_MAX", "DOWN_MIN", "FollowerReads"]

DOWN_MIN = 0.25
DOWN_MAX = 5.0
"""A member whose query connection failed (or whose answer did not come) is passed over
for this long, doubling with each failure in a row (seconds)."""

_RECEIVE_SIZE = 64 * 1024
_ERRORS: tuple[type[BaseException], ...] = (ProtocolError, *NETWORK_ERRORS)


class QueryLink:
    """One query connection to one member."""

    __slots__ = (
        "bind_id",
        "bound",
        "broken",
        "data",
        "member_id",
        "pending",
        "ready",
        "stream",
        "waiting",
    )

    def __init__(self, member_id: int, bind_id: int) -> None:
        self.member_id = member_id
        self.bind_id = bind_id
        self.stream: anyio.abc.ByteStream | None = None
        self.ready = anyio.Event()
        """Set once the member answered the bind (or the link failed first)."""
        self.bound = False
        self.broken = False
        self.pending = bytearray()
        """Query frames queued for its writer (all sent with one ``send``)."""
        self.data = anyio.Event()
        """Set when frames are queued (or it broke): its writer wakes."""
        self.waiting: dict[int, Callable[[], None]] = {}
        """The queries in flight on it: woken when it breaks."""

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for the writer."""
        self.pending += frame
        self.data.set()

    def fail(self) -> None:
        self.broken = True
        self.ready.set()
        self.data.set()
        for wake in list(self.waiting.values()):
            wake()


class FollowerReads:
    """The client's query connections and its follower queries (see the module)."""

    def __init__(
        self,
        session: Session,
        tls: ssl.SSLContext | None,
        spawn: Callable[..., None],
        next_correlation_id: Callable[[], int],
    ) -> None:
        self._session = session
        self._tls = tls
        self._spawn = spawn
        self._next_correlation_id = next_correlation_id
        self._links: dict[int, QueryLink] = {}
        self._down_until: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._turn = 0
        self.closed = False

    # ------------------------------------------------------------------ queries

    async def ask(self, payload: bytes, correlation_id: int) -> bytes:
        """Ask members in turn until one answers (see the module)."""
        session = self._session
        queries = session.queries
        misses, retry = 0, RETRY_MIN
        while True:
            session.check_usable()  # a closed session: SessionClosedError
            member_id = self._pick()
            link = self._links.get(member_id)
            if link is None or not link.bound or link.broken:
                link = await self._link(member_id)
            if link is not None:
                event = anyio.Event()
                waiter = queries.add(correlation_id, event.set)
                link.waiting[correlation_id] = event.set
                request = QueryRequest(
                    session.leadership_term_id,
                    session.cluster_session_id,
                    correlation_id,
                    payload,
                    QUERY_FOLLOWER,
                    queries.seen_position,
                    session.outbox.confirmed,
                )
                try:
                    link.send(encode_frame(request))
                    with anyio.move_on_after(RESEND_AFTER):
                        await event.wait()
                finally:
                    queries.remove(correlation_id)
                    link.waiting.pop(correlation_id, None)
                response = waiter.response
                if response is not None:
                    answer = outcome(response, payload)  # raises ServiceError, refusals
                    if answer is not None:
                        self._failures.pop(member_id, None)
                        return answer
                else:  # no answer in time (paused, cut off, far behind), or broken
                    self._down(member_id)
            misses += 1
            if misses % max(1, len(session.endpoints)) == 0:  # every member failed once
                await anyio.sleep(retry)
                retry = min(2 * retry, RETRY_MAX)

    def _pick(self) -> int:
        """The next member in turn that is not passed over (or, if every one is, the
        one passed over the shortest)."""
        members = sorted(self._session.endpoints)
        now = anyio.current_time()
        count = len(members)
        for step in range(count):
            member_id = members[(self._turn + step) % count]
            if self._down_until.get(member_id, 0.0) <= now:
                self._turn = (self._turn + step + 1) % count
                return member_id
        self._turn = (self._turn + 1) % count
        return min(members, key=lambda m: self._down_until.get(m, 0.0))

    def _down(self, member_id: int) -> None:
        """``member_id`` failed: its connection goes, and it is passed over a while."""
        failures = self._failures.get(member_id, 0) + 1
        self._failures[member_id] = failures
        delay = min(DOWN_MIN * 2 ** (failures - 1), DOWN_MAX)
        self._down_until[member_id] = anyio.current_time() + delay
        link = self._links.pop(member_id, None)
        if link is not None:
            link.fail()
            if link.stream is not None:
                self._spawn(aclose_quietly, link.stream)

    # ------------------------------------------------------------------ connections

    async def _link(self, member_id: int) -> QueryLink | None:
        """The bound query connection to ``member_id``, opened if need be (None: it
        could not be; the member is passed over a while)."""
        link = self._links.get(member_id)
        if link is None or link.broken:
            link = QueryLink(member_id, self._next_correlation_id())
            self._links[member_id] = link
            self._spawn(self._run, link)
        with anyio.move_on_after(RESEND_AFTER + 1.0):  # a dial, then the bind's answer
            await link.ready.wait()
        if link.bound and not link.broken:
            return link
        if self._links.get(member_id) is link:  # (not already given up by another query)
            self._down(member_id)
        return None

    async def _run(self, link: QueryLink) -> None:
        """Dial the member, bind the connection, then read its answers until it breaks
        or the client closes."""
        session = self._session
        endpoint = session.endpoints.get(link.member_id)
        if endpoint is None or self.closed:
            link.fail()
            return
        stream = await try_connect(endpoint, self._tls)
        if isinstance(stream, str) or self.closed:
            if not isinstance(stream, str):
                await aclose_quietly(stream)
            link.fail()
            return
        link.stream = stream
        try:
            await stream.send(
                encode_frame(
                    SessionResumeRequest(
                        correlation_id=link.bind_id,
                        cluster_session_id=session.cluster_session_id,
                        version=PROTOCOL_VERSION,
                        session_secret=session.session_secret,
                        query_only=True,
                    )
                )
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write, link, stream)
                await self._read(link, stream)
                tg.cancel_scope.cancel()
        except _ERRORS:
            pass
        finally:
            link.fail()
            await aclose_quietly(stream)

    async def _read(self, link: QueryLink, stream: anyio.abc.ByteStream) -> None:
        """Decode what the member sends on the link until it breaks."""
        decoder = FrameDecoder(self._session.max_frame_size)
        try:
            while not link.broken:
                data = await stream.receive(_RECEIVE_SIZE)
                messages: list[Any] = []
                try:
                    decoder.decode_into(data, EGRESS, messages)
                finally:  # what came before a bad frame still counts
                    for message in messages:
                        self._on_message(link, message)
        except _ERRORS:
            link.fail()

    @staticmethod
    async def _write(link: QueryLink, stream: anyio.abc.ByteStream) -> None:
        """Send the link's queued frames, everything queued with one ``send``."""
        try:
            while not link.broken:
                if not link.pending:
                    link.data = anyio.Event()
                    await link.data.wait()
                    continue
                frames, link.pending = link.pending, bytearray()
                await stream.send(bytes(frames))
        except _ERRORS:
            link.fail()

    def _on_message(self, link: QueryLink, message: Any) -> None:
        session = self._session
        if getattr(message, "cluster_session_id", None) != session.cluster_session_id:
            return
        if isinstance(message, QueryResponse):
            session.queries.on_response(message)
        elif isinstance(message, SessionEvent):
            if message.code is EventCode.OK and message.correlation_id == link.bind_id:
                link.bound = True
                link.ready.set()
            elif message.code in (EventCode.CLOSED, EventCode.ERROR, EventCode.REDIRECT):
                # refused (not open there yet, a wrong secret), or unbound since (the
                # session closed there, a newer connection took its place)
                link.fail()

    async def aclose(self) -> None:
        """Close every query connection (the client closes)."""
        self.closed = True
        links, self._links = list(self._links.values()), {}
        for link in links:
            link.fail()
            if link.stream is not None:
                await aclose_quietly(link.stream)
