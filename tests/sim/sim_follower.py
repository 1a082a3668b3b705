"""Follower reads in the simulator (issue 43): a sim client's follower-consistency
queries go, in turn, to every member (the leader included) over *query connections*,
as the real client sends them (``client._follower``; the members' side is
:mod:`cluster.core.follower_reads`).

A query connection to a member is dialled on first use and bound to the session by a
query-only :class:`~cluster.protocol.ingress.SessionResumeRequest` carrying its secret;
the member answers the bind OK (the link is usable), or CLOSED / ERROR / REDIRECT (it is
not, or no longer).  Each query is sent with ``min_position`` = the highest log position
of any answer the client got (:attr:`ClientQueries.seen_position
<tests.sim.queries.ClientQueries.seen_position>`) and ``min_sequence`` = the highest of
the session's messages the cluster confirmed applied (``Outbox.confirmed``).  No answer
within :data:`~client._query.RESEND_AFTER`, a link that breaks or a bind refused: the
query goes to the next member, and that member is passed over a while
(:data:`~client._follower.DOWN_MIN` doubling to :data:`~client._follower.DOWN_MAX`);
BUSY: the next member.  After every member failed once, a back-off (``RETRY_MIN``
doubling to ``RETRY_MAX``), as the real client.

Answers go to the client's ``_on_query_response``, so invariant (9) checks them as it
checks the leader's; :attr:`History.answered_by <tests.sim.sim_client.History>` counts
OK follower answers by the member that gave them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from client._follower import DOWN_MAX, DOWN_MIN
from client._query import RESEND_AFTER, RETRY_MAX, RETRY_MIN
from cluster.protocol import EGRESS, FrameDecoder, ProtocolError, encode_frame
from cluster.protocol.egress import QueryResponse, SessionEvent
from cluster.protocol.enums import EventCode, QueryStatus
from cluster.protocol.ingress import QUERY_FOLLOWER, QueryRequest, SessionResumeRequest
from cluster.protocol.version import PROTOCOL_VERSION

if TYPE_CHECKING:
    from .queries import QueryOp
    from .sim_client import SimClient

_NETWORK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_NO_SESSION_WAIT = 0.05
"""How long a query waits for its client to open a session again (virtual seconds)."""


class Link:
    """One query connection to one member, bound to one session."""

    def __init__(self, member: int, session_id: int, bind_id: int) -> None:
        self.member = member
        self.session_id = session_id
        self.bind_id = bind_id
        self.stream: trio.abc.Stream | None = None
        self.ready = trio.Event()
        """Set once the member answered the bind (or the link failed first)."""
        self.bound = False
        self.broken = False
        self.send_lock = trio.Lock()
        self.waiting: dict[int, trio.Event] = {}
        """The queries in flight on it: woken by an answer or a refusal, or when it breaks."""

    def fail(self) -> None:
        self.broken = True
        self.ready.set()
        for event in list(self.waiting.values()):
            event.set()


class SimFollowerReads:
    """One sim client's query connections and its follower queries (see the module)."""

    def __init__(self, client: SimClient) -> None:
        self.client = client
        self._links: dict[int, Link] = {}
        self._down_until: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._turn = 0
        self._nursery: trio.Nursery | None = None
        self.sent_to: dict[int, int] = {}
        """member -> the follower queries sent to it (each send counted)."""

    def start(self, nursery: trio.Nursery, query: QueryOp) -> None:
        """Ask ``query`` (a follower one) until it is answered, in a task of its own."""
        self._nursery = nursery
        query.on_links = True
        nursery.start_soon(self._ask, query)

    # ------------------------------------------------------------------ queries

    async def _ask(self, query: QueryOp) -> None:
        client = self.client
        queries = client.queries
        cid = query.correlation_id
        misses, retry = 0, RETRY_MIN
        while cid in queries.waiting:
            session_id = client.session_id
            if session_id < 0 or not client.endpoints:
                await trio.sleep(_NO_SESSION_WAIT)  # the client is opening a new session
                continue
            member = self._pick()
            link = await self._link(member, session_id)
            if cid not in queries.waiting:
                return  # answered (a late answer to an earlier send)
            if link is not None:
                event = trio.Event()
                link.waiting[cid] = event
                seen = queries.seen_position
                commit = client._committed() if client._committed is not None else 0
                request = QueryRequest(
                    client.term,
                    session_id,
                    cid,
                    query.key.encode(),
                    QUERY_FOLLOWER,
                    seen,
                    client.outbox.confirmed,
                )
                try:
                    if await self._send(link, request):
                        queries.sent(query, trio.current_time(), commit, seen, member)
                        self.sent_to[member] = self.sent_to.get(member, 0) + 1
                        client.trace("query", cid, query.level, query.key, query.sends, member)
                        with trio.move_on_after(RESEND_AFTER):
                            await event.wait()
                finally:
                    link.waiting.pop(cid, None)
                if cid not in queries.waiting:
                    self._failures.pop(member, None)
                    return
                if not event.is_set() or link.broken:
                    self._down(member)  # no answer in time (paused, cut off, far behind)
                # else refused (BUSY): the next member, at once
            misses += 1
            if misses % max(1, len(client.endpoints)) == 0:  # every member failed once
                await trio.sleep(retry)
                retry = min(2 * retry, RETRY_MAX)

    def _pick(self) -> int:
        """The next member in turn that is not passed over (or, if every one is, the
        one passed over the shortest)."""
        members = sorted(self.client.endpoints)
        now = trio.current_time()
        count = len(members)
        for step in range(count):
            member = members[(self._turn + step) % count]
            if self._down_until.get(member, 0.0) <= now:
                self._turn = (self._turn + step + 1) % count
                return member
        self._turn = (self._turn + 1) % count
        return min(members, key=lambda m: self._down_until.get(m, 0.0))

    def _down(self, member: int) -> None:
        """``member`` failed: its link goes, and it is passed over a while."""
        failures = self._failures.get(member, 0) + 1
        self._failures[member] = failures
        self._down_until[member] = trio.current_time() + min(
            DOWN_MIN * 2 ** (failures - 1), DOWN_MAX
        )
        link = self._links.pop(member, None)
        if link is not None:
            link.fail()
            if link.stream is not None and self._nursery is not None:
                self._nursery.start_soon(trio.aclose_forcefully, link.stream)

    # ------------------------------------------------------------------ connections

    async def _link(self, member: int, session_id: int) -> Link | None:
        """The bound query connection of ``session_id`` to ``member``, opened if need be
        (None: it could not be; the member is passed over a while)."""
        link = self._links.get(member)
        if link is not None and link.session_id != session_id:  # of a lost session
            self._links.pop(member)
            link.fail()
            if link.stream is not None:
                await trio.aclose_forcefully(link.stream)
            link = None
        if link is None or link.broken:
            link = Link(member, session_id, next(self.client._correlation_ids))
            self._links[member] = link
            assert self._nursery is not None
            self._nursery.start_soon(self._run, link)
        with trio.move_on_after(RESEND_AFTER + 1.0):  # a dial, then the bind's answer
            await link.ready.wait()
        if link.bound and not link.broken:
            return link
        if self._links.get(member) is link:  # (not already given up by another query)
            self._down(member)
        return None

    async def _run(self, link: Link) -> None:
        """Dial the member, bind the link, then read its answers until it breaks."""
        client = self.client
        stream = await client._dial(link.member)
        if stream is None or link.broken:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            link.fail()
            return
        link.stream = stream
        bind = SessionResumeRequest(
            correlation_id=link.bind_id,
            cluster_session_id=link.session_id,
            version=PROTOCOL_VERSION,
            session_secret=client.session_secret,
            query_only=True,
        )
        decoder = FrameDecoder()
        try:
            if await self._send(link, bind):
                while not link.broken and (data := await stream.receive_some()):
                    for body in decoder.feed(data):
                        self._on_message(link, EGRESS.decode(body))
        except (*_NETWORK_ERRORS, ProtocolError):
            pass
        finally:
            link.fail()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _send(self, link: Link, message: Any) -> bool:
        stream = link.stream
        if stream is None or link.broken:
            return False
        try:
            async with link.send_lock:
                await stream.send_all(encode_frame(message))
        except _NETWORK_ERRORS:
            link.fail()
            return False
        return True

    def _on_message(self, link: Link, message: Any) -> None:
        if getattr(message, "cluster_session_id", None) != link.session_id:
            return
        if isinstance(message, QueryResponse):
            cid = message.correlation_id
            if message.status is QueryStatus.OK and cid in self.client.queries.waiting:
                answered_by = self.client.history.answered_by
                answered_by[link.member] = answered_by.get(link.member, 0) + 1
            self.client._on_query_response(message)
            event = link.waiting.get(cid)
            if event is not None:
                event.set()
        elif isinstance(message, SessionEvent):
            if message.code is EventCode.OK and message.correlation_id == link.bind_id:
                link.bound = True
                link.ready.set()
            elif message.code in (EventCode.CLOSED, EventCode.ERROR, EventCode.REDIRECT):
                # refused (not open there yet), or unbound since (the session closed
                # there, a newer query connection took its place)
                self.client.trace("query-link-refused", link.member, message.code.name)
                link.fail()
