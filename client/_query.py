"""Queries: ``ClusterClient.query``, read-only requests the cluster answers without its
log (``docs/queries.md``; the leader's side is :mod:`cluster.core.reads`).

A query travels on the session's ingress connection as a ``QueryRequest`` with a
correlation id of its own and comes back as the ``QueryResponse`` of that id.  It
changes nothing, so it is asked again freely: when no answer came within
:data:`RESEND_AFTER` (it was lost with a connection, or held by a leader that lost its
leadership unheard), and after a NOT_LEADER (the session is moving to the new leader:
the request then goes there) or BUSY answer, after a short back-off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from cluster.protocol.egress import QueryResponse
from cluster.protocol.enums import QueryStatus
from cluster.protocol.ingress import QUERY_FOLLOWER, QUERY_LINEARIZABLE, QueryRequest

from .errors import QueryRefusedError, ServiceError

RESEND_AFTER = 1.0
"""Seconds without an answer after which a query is asked again."""

RETRY_MIN = 0.01
RETRY_MAX = 0.5
"""The back-off after a NOT_LEADER or BUSY answer: from the first, doubling to the
second (seconds)."""

LEVELS = {"linearizable": QUERY_LINEARIZABLE, "follower": QUERY_FOLLOWER}
"""The consistency levels ``query()`` takes, and their wire values."""


def query_level(consistency: str) -> int:
    """The wire value of ``consistency``; :class:`ValueError` for an unknown level."""
    level = LEVELS.get(consistency)
    if level is None:
        raise ValueError(
            f"consistency must be one of {', '.join(map(repr, LEVELS))}, not {consistency!r}"
        )
    return level


@dataclass(slots=True)
class QueryWaiter:
    """A query waiting for the ``QueryResponse`` to its correlation id; ``wake`` is
    called once it is set, or when the session closes first (``response`` None)."""

    wake: Callable[[], None]
    response: QueryResponse | None = None


class Queries:
    """The session's queries in flight, by correlation id (sans-IO)."""

    __slots__ = ("_waiting", "seen_position")

    def __init__(self) -> None:
        self._waiting: dict[int, QueryWaiter] = {}
        self.seen_position = 0
        """The highest log position an answer reflected: a follower read asks to be
        at least as fresh (``min_position``)."""

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, correlation_id: int, wake: Callable[[], None]) -> QueryWaiter:
        waiter = QueryWaiter(wake)
        self._waiting[correlation_id] = waiter
        return waiter

    def remove(self, correlation_id: int) -> None:
        self._waiting.pop(correlation_id, None)

    def on_response(self, response: QueryResponse) -> None:
        """A ``QueryResponse`` of this session: its waiter, if still waiting, is woken."""
        if response.status is QueryStatus.OK and response.log_position > self.seen_position:
            self.seen_position = response.log_position
        waiter = self._waiting.get(response.correlation_id)
        if waiter is not None and waiter.response is None:
            waiter.response = response
            waiter.wake()

    def wake_all(self) -> None:
        """The session closed, or moves to a new leader: every waiter wakes without an
        answer (its query is asked again there, or raises)."""
        for waiter in self._waiting.values():
            waiter.wake()


def outcome(response: QueryResponse, payload: bytes) -> bytes | None:
    """The answer in ``response`` (to the query of ``payload``), or None: ask again
    (NOT_LEADER, BUSY); raises :class:`ServiceError` where ``on_query`` raised and
    :class:`QueryRefusedError` where the query cannot be answered as asked."""
    status = response.status
    if status is QueryStatus.OK:
        return response.payload
    if status is QueryStatus.SERVICE_ERROR:
        raise ServiceError(
            response.error_type,
            response.message,
            response.log_position,
            0,
            payload[:4096],
            query=True,
        )
    if status is QueryStatus.REFUSED:
        raise QueryRefusedError(response.message)
    return None


class QuerySession(Protocol):
    """What :func:`ask` needs of the client's session (:class:`client._session.Session`)."""

    queries: Queries
    leadership_term_id: int
    cluster_session_id: int

    def check_usable(self) -> None: ...

    def enqueue(self, message: Any) -> int: ...


async def ask(session: QuerySession, payload: bytes, level: int, correlation_id: int) -> bytes:
    """Send the query and wait for its answer, asking again as the module says."""
    queries = session.queries
    retry = RETRY_MIN
    while True:
        session.check_usable()  # a closed session: SessionClosedError
        event = anyio.Event()
        waiter = queries.add(correlation_id, event.set)
        try:
            session.enqueue(
                QueryRequest(
                    session.leadership_term_id,
                    session.cluster_session_id,
                    correlation_id,
                    payload,
                    level,
                    queries.seen_position,
                )
            )
            with anyio.move_on_after(RESEND_AFTER):
                await event.wait()
        finally:
            queries.remove(correlation_id)
        response = waiter.response
        if response is None:
            continue  # no answer (lost, or the session closed): ask again, or raise
        answer = outcome(response, payload)
        if answer is not None:
            return answer
        await anyio.sleep(retry)
        retry = min(2 * retry, RETRY_MAX)
