"""A lease service: named leases that expire unless renewed (``docs/service-guide.md``).

A client session *acquires* a lease (``"printer"``, ``"db-primary"``) for a time to live;
while it holds it, no other session gets it; it ends when the holder releases it, when
its time is up, or when the holder's session closes.  The state, the timers and the
snapshot are the service's own; the client (:class:`LeaseClient`) is a few lines over
``client.ClusterClient``.

Run it on a three-member cluster::

    PYTHONPATH=docs/examples python -m cluster.local --nodes 3 \\
        --service leases:LeaseService --dir /tmp/leases --leader-heartbeat-timeout 1s
"""

from __future__ import annotations

import anyio
import msgspec

from client import ClusterClient
from cluster.service import ClientSession, CloseReason, Cluster, ClusteredService


# --8<-- [start:messages]
class Acquire(msgspec.Struct, tag="acquire", array_like=True):
    """Take the lease ``name`` for ``ttl_ms``; if this session holds it, extend it."""

    name: str
    ttl_ms: int


class Release(msgspec.Struct, tag="release", array_like=True):
    """Give the lease ``name`` back (only its holder can)."""

    name: str


class Reply(msgspec.Struct, array_like=True):
    """The answer to a request: each request gets one, in the order they were sent."""

    granted: bool
    holder: int = 0  # the session that holds the lease now (0: nobody)
    expires: int = 0  # when it ends, in cluster time (epoch ms)
    error: str = ""


request_decoder = msgspec.msgpack.Decoder(Acquire | Release)
reply_decoder = msgspec.msgpack.Decoder(Reply)
encode = msgspec.msgpack.Encoder().encode
# --8<-- [end:messages]


# --8<-- [start:state]
class Lease(msgspec.Struct, array_like=True):
    holder: int  # the cluster session id of the holder
    expires: int  # cluster time (epoch ms)
    timer_id: int  # the cluster timer that ends it


class State(msgspec.Struct, array_like=True):
    """Everything the service knows: what a snapshot holds."""

    leases: dict[str, Lease]
    next_timer_id: int


class LeaseService(ClusteredService):
    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.next_timer_id = 1
        self.by_timer: dict[int, str] = {}  # derived from leases: not in the snapshot
        self.cluster: Cluster | None = None

    # --8<-- [end:state]

    # --8<-- [start:snapshot]
    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster  # kept for timers
        if snapshot:
            state = msgspec.msgpack.decode(snapshot, type=State)
            self.leases = state.leases
            self.next_timer_id = state.next_timer_id
            self.by_timer = {lease.timer_id: name for name, lease in self.leases.items()}

    def on_take_snapshot(self) -> bytes:
        return encode(State(self.leases, self.next_timer_id))

    # --8<-- [end:snapshot]

    # --8<-- [start:requests]
    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if session is None:
            return  # no service messages here
        try:
            request = request_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            session.offer(encode(Reply(False, error=f"bad request: {exc}")))
            return
        lease = self.leases.get(request.name)
        if lease is not None and lease.holder != session.id:
            reply = Reply(False, lease.holder, lease.expires)
        elif isinstance(request, Acquire):
            lease = self._grant(request.name, session.id, timestamp + request.ttl_ms)
            reply = Reply(True, session.id, lease.expires)
        else:  # a Release by the holder, or of a lease nobody holds
            if lease is not None:
                self._end(request.name)
            reply = Reply(lease is not None)
        session.offer(encode(reply))

    # --8<-- [end:requests]

    # --8<-- [start:queries]
    def on_query(self, payload: bytes) -> bytes:
        """Who holds the lease ``payload`` names: read the state, change nothing."""
        lease = self.leases.get(payload.decode())
        if lease is None:
            return encode(Reply(False))
        return encode(Reply(True, lease.holder, lease.expires))

    # --8<-- [end:queries]

    # --8<-- [start:timers]
    def _grant(self, name: str, holder: int, expires: int) -> Lease:
        assert self.cluster is not None
        if name in self.leases:
            self._end(name)  # a renewal: the old deadline's timer goes
        lease = Lease(holder, expires, self.next_timer_id)
        self.next_timer_id += 1
        self.leases[name] = lease
        self.by_timer[lease.timer_id] = name
        self.cluster.schedule_timer(lease.timer_id, expires)
        return lease

    def _end(self, name: str) -> None:
        assert self.cluster is not None
        lease = self.leases.pop(name)
        del self.by_timer[lease.timer_id]
        self.cluster.cancel_timer(lease.timer_id)

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        name = self.by_timer.get(correlation_id)
        if name is not None:  # not a timer of a lease renewed or released meanwhile
            self._end(name)

    def on_session_close(
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        for name in [n for n, lease in self.leases.items() if lease.holder == session.id]:
            self._end(name)

    # --8<-- [end:timers]


# --8<-- [start:client]
class LeaseClient:
    """A :class:`LeaseService`'s requests over one session, one at a time.

    Each request is sent once, and its reply is the next one the session receives: the
    cluster applies a session's messages exactly once, in the order sent, and hands
    the service's replies over once, in order, whatever leader changes happen
    meanwhile.  No request id, no timer to resend on, nothing to deduplicate.
    """

    def __init__(self, cluster_client: ClusterClient) -> None:
        self.client = cluster_client
        self._one_at_a_time = anyio.Lock()  # two callers must not take each other's reply

    async def acquire(self, name: str, ttl: float) -> Reply:
        """Take (or extend) the lease ``name`` for ``ttl`` seconds."""
        return await self._call(Acquire(name, int(ttl * 1000)))

    async def release(self, name: str) -> Reply:
        return await self._call(Release(name))

    async def holder(self, name: str) -> Reply:
        """Who holds ``name`` now (``granted``: somebody does): a query, no log entry."""
        return reply_decoder.decode(await self.client.query(name.encode()))

    async def _call(self, request: Acquire | Release) -> Reply:
        async with self._one_at_a_time:
            await self.client.offer(encode(request))
            reply = reply_decoder.decode(await self.client.receive())
        if reply.error:  # the service could not read what we sent
            raise ValueError(reply.error)
        return reply


# --8<-- [end:client]
