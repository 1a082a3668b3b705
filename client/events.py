"""What happens to a session, as events an application can watch (Aeron's
``EgressListener``: ``onSessionEvent``, ``onNewLeader``, ``onAdminResponse``; plus the
client's own connections).

::

    async with client.connect(endpoints) as c:
        async for event in c.events():
            match event:
                case client.NewLeader(member_id=leader):
                    print("leader is now", leader)
                case client.Disconnected(member_id=m, reason=why):
                    print("lost the connection to", m, why)
                case client.SessionClosed(reason=why):
                    print("session over:", why)  # the last event

Each ``events()`` iterator sees every event from the moment it starts, in order, and
ends after :class:`SessionClosed`.  One that falls more than ``limit`` events behind
loses the oldest ones and then sees :class:`EventsMissed` with how many.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from cluster.protocol.egress import AdminResponse

from ._sync import Backend, Broadcast

__all__ = [
    "AdminResponseReceived",
    "ClientEvent",
    "Connected",
    "Disconnected",
    "EventsMissed",
    "NewLeader",
    "RepliesDropped",
    "SessionClosed",
    "SessionEventReceived",
]


@dataclass(frozen=True, slots=True)
class SessionEventReceived:
    """A ``SessionEvent`` about this session (``code``: ``"REDIRECT"``, ``"ERROR"``...)."""

    code: str
    detail: str
    leader_member_id: int
    leadership_term_id: int


@dataclass(frozen=True, slots=True)
class NewLeader:
    """The session's leader changed (a NewLeaderEvent, or a REDIRECT to it)."""

    member_id: int
    leadership_term_id: int
    ingress_endpoints: str


@dataclass(frozen=True, slots=True)
class AdminResponseReceived:
    """An ``AdminResponse`` for this session, asked for here or not."""

    response: AdminResponse


@dataclass(frozen=True, slots=True)
class Connected:
    """An ingress connection of the open session works: the leader took it."""

    member_id: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The ingress connection to ``member_id`` was lost or given up; the client
    reconnects by itself (a :class:`Connected` follows, or :class:`SessionClosed`)."""

    member_id: int
    endpoint: str
    reason: str


@dataclass(frozen=True, slots=True)
class RepliesDropped:
    """``count`` replies to this session never reached it: the service gave them, but
    more than ``--max-kept-replies`` were given while the client was away (a lost
    connection, a pause), so the members no longer held the oldest when it came back
    (a gap in the replies' numbers).  ``total``: how many so far
    (:attr:`ClusterClient.replies_dropped`)."""

    count: int
    total: int


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The session is closed (by the cluster, by this client, or lost): the last event."""

    reason: str
    lost: bool


@dataclass(frozen=True, slots=True)
class EventsMissed:
    """This iterator fell behind and ``count`` older events were dropped."""

    count: int


ClientEvent = (
    SessionEventReceived
    | NewLeader
    | AdminResponseReceived
    | Connected
    | Disconnected
    | RepliesDropped
    | SessionClosed
    | EventsMissed
)


class _Subscriber:
    __slots__ = ("changed", "limit", "missed", "queue")

    def __init__(self, backend: Backend, limit: int) -> None:
        self.queue: deque[ClientEvent] = deque()
        self.changed = Broadcast(backend)
        self.limit = limit
        self.missed = 0


class EventHub:
    """Hands each event to every iterator watching (nothing to do when none is)."""

    __slots__ = ("_backend", "_closed", "_subscribers", "watched")

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._subscribers: list[_Subscriber] = []
        self._closed: SessionClosed | None = None
        self.watched = False  # some iterator is watching

    def emit(self, event: ClientEvent) -> None:
        if isinstance(event, SessionClosed):
            if self._closed is not None:
                return
            self._closed = event
        for subscriber in self._subscribers:
            queue = subscriber.queue
            if len(queue) >= subscriber.limit:
                queue.popleft()
                subscriber.missed += 1
            queue.append(event)
            subscriber.changed.notify()

    async def iterate(self, limit: int) -> AsyncIterator[ClientEvent]:
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit!r}")
        subscriber = _Subscriber(self._backend, limit)
        if self._closed is not None:
            yield self._closed
            return
        self._subscribers.append(subscriber)
        self.watched = True
        try:
            while True:
                while not subscriber.queue:
                    await subscriber.changed.wait()
                if subscriber.missed:
                    missed, subscriber.missed = subscriber.missed, 0
                    yield EventsMissed(missed)
                event = subscriber.queue.popleft()
                yield event
                if isinstance(event, SessionClosed):
                    return
        finally:
            self._subscribers.remove(subscriber)
            self.watched = bool(self._subscribers)
