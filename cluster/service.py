"""The clustered service API: what an application implements and what it may call.

Subclass :class:`ClusteredService` and run it with
``python -m cluster.node --service my.module:MyService``.  Every member runs the same
service and feeds it the same committed log in the same order, so callbacks must be
synchronous and deterministic: use ``cluster.time`` (the log entry's timestamp) rather
than the wall clock, and no randomness that is not seeded from the log.

Replies go to clients with :meth:`ClientSession.offer`; on followers the offer is faked
(it reports success but sends nothing), so the same code runs on every member.

**State and snapshots.**  A member that restarts loads its latest snapshot and replays
only the log after it, so a service must write *all* of its state in
:meth:`ClusteredService.on_take_snapshot` and load it back in
:meth:`ClusteredService.on_start`.  Both are abstract, as Aeron makes ``onTakeSnapshot``
abstract: a service class that lacks either cannot be instantiated (the node refuses to
start, naming what is missing).  A service that keeps no state says so by deriving from
:class:`StatelessService`.  A snapshot whose service raises in ``on_take_snapshot``, or
returns something other than bytes, fails loudly: an ERROR in the node's log and an ERROR
``AdminResponse`` to the client that asked, never an empty snapshot.

**Exceptions.**  An :class:`Exception` raised by a callback applied from the log
(:meth:`~ClusteredService.on_session_message`, ``on_session_open``, ``on_session_close``,
``on_timer_event``, ``on_new_leadership_term_event``) or by ``on_role_change`` is caught
by the member.  Every member applies the same entry to the same state, so every member
raises on it alike, and their states stay equal: the entry counts as applied (the log
position moves past it; whatever the callback changed before it raised stays changed, on
every member) and the member goes on with the next one.  The error is logged at ERROR
(with its traceback the first time a distinct error is seen), listed by ``cluster-tool
errors`` and counted (``triarch_service_errors_total``); for a client's message the
leader tells the sender, whose ``receive()`` raises ``client.ServiceError`` in the place
of the reply, and the session stays open.  With ``--on-service-error stop`` the member
logs one ERROR line instead and exits with code 1 (every member stops at that entry, and
a restart replays it and stops again).  An exception from :meth:`~ClusteredService.on_start`
always stops the member (exit code 1), as does a ``MemoryError``; one from
:meth:`~ClusteredService.on_take_snapshot` fails that snapshot only.

See ``docs/service-guide.md`` for a tutorial.
"""

from __future__ import annotations

import abc
from typing import Any, Protocol, Self

from .protocol.enums import CloseReason, Role
from .protocol.log import NewLeadershipTermEvent

__all__ = [
    "ClientSession",
    "CloseReason",
    "Cluster",
    "ClusteredService",
    "Role",
    "ServiceStateError",
    "StatelessService",
    "take_service_snapshot",
]


class ClientSession(Protocol):
    """A client session as the service sees it."""

    @property
    def id(self) -> int:
        """The cluster session id."""
        ...

    @property
    def response_stream_id(self) -> int: ...

    @property
    def response_channel(self) -> str: ...

    @property
    def encoded_principal(self) -> bytes: ...

    @property
    def is_closing(self) -> bool: ...

    def offer(self, payload: bytes) -> bool:
        """Send ``payload`` to the client on its egress (faked on followers).

        Returns False when the session is closed or its egress backlog is full.
        """
        ...

    def close(self) -> bool:
        """Ask the consensus module to close this session (SERVICE_ACTION); idempotent."""
        ...


class Cluster(Protocol):
    """The handle the service gets in :meth:`ClusteredService.on_start`."""

    @property
    def member_id(self) -> int: ...

    @property
    def role(self) -> Role: ...

    @property
    def time(self) -> int:
        """Cluster time (epoch ms) of the log entry being processed."""
        ...

    @property
    def log_position(self) -> int:
        """Log position after the entry being processed."""
        ...

    @property
    def leadership_term_id(self) -> int: ...

    @property
    def client_sessions(self) -> list[ClientSession]: ...

    def get_client_session(self, cluster_session_id: int) -> ClientSession | None: ...

    def close_client_session(self, cluster_session_id: int) -> bool: ...

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        """Schedule (or reschedule) a timer firing at cluster time ``deadline`` (epoch ms)."""
        ...

    def cancel_timer(self, correlation_id: int) -> bool: ...

    def offer(self, payload: bytes) -> bool:
        """Put a service message into the log; every member's service gets it through
        ``on_session_message`` with ``session`` None, once, in log order."""
        ...


class ServiceStateError(Exception):
    """A service's state could not be saved or loaded: ``on_take_snapshot`` raised or
    returned something other than bytes, or a :class:`StatelessService` was handed a
    snapshot holding state.  The snapshot is not written (the log keeps everything)."""


class ClusteredService(abc.ABC):
    """Base class for replicated application logic.

    :meth:`on_start` and :meth:`on_take_snapshot` are abstract and must be implemented
    together: whatever ``on_take_snapshot`` returns is what ``on_start`` gets back after a
    restart (or ``None`` when there is no snapshot yet).  Every other callback does
    nothing by default (``on_query`` answers that the service answers no queries);
    override what you need.  A service without state derives from
    :class:`StatelessService` instead.

    A callback that raises does not stop the member (unless ``--on-service-error stop``):
    see *Exceptions* in the module documentation.  Check a request before changing any
    state: what a callback changed before it raised stays changed.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            names = " and ".join(f"{name}()" for name in missing)
            raise TypeError(
                f"{cls.__qualname__} cannot be a clustered service: it does not implement "
                f"{names}. A restarted member loads its latest snapshot and replays only "
                "the log after it, so a service writes its whole state in "
                "on_take_snapshot() and loads it back in on_start(cluster, snapshot); a "
                "service that keeps no state derives from cluster.service.StatelessService"
            )
        return super().__new__(cls)

    @abc.abstractmethod
    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        """Called when the member starts, before any log entry, with the service's bytes
        from the latest snapshot (what :meth:`on_take_snapshot` returned), or ``None``
        when there is no snapshot yet; and again on a running follower that installs its
        leader's snapshot (it needs log the leader has purged), with that snapshot.  Load
        the state from it, replacing whatever the service held; keep ``cluster`` to
        schedule timers, offer service messages or look up sessions later.  If it raises,
        the member cannot start: it logs an ERROR naming the exception and exits with
        code 1."""

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:  # noqa: B027
        """A client session opened (SessionOpenEvent on the log)."""

    def on_session_close(  # noqa: B027
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        """A client session closed (SessionCloseEvent on the log)."""

    def on_session_message(  # noqa: B027
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        """An application message in log order: from a client session, or (``session``
        None) a service message offered with :meth:`Cluster.offer`.

        If it raises an :class:`Exception`, every member raises alike and goes on with
        the next entry (``--on-service-error continue``); the client that sent the
        message gets ``client.ServiceError`` from ``receive()`` in the place of a reply,
        with the exception's type and text, and its session stays open."""

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:  # noqa: B027
        """A timer scheduled with :meth:`Cluster.schedule_timer` fired."""

    @abc.abstractmethod
    def on_take_snapshot(self) -> bytes:
        """Return the service's whole state as bytes, for a snapshot.

        Called on every member at the same log position; the bytes come back through
        :meth:`on_start` when the member restarts.  Timers and open sessions are in the
        consensus module's part of the snapshot already, but the service's own record of
        them (which key a timer expires, what a session was doing) is not.  Raising, or
        returning anything but bytes, fails the snapshot with an error."""

    def on_query(self, payload: bytes) -> bytes:
        """Answer a client's query (``await client.query(payload)``) from the state,
        without the log: no entry is appended, nothing is written to disk.

        **Read-only**: it must not change the state, schedule timers, offer messages or
        reply to sessions.  A query is answered on one member only (the leader, once it
        has confirmed it still leads and has applied every write acknowledged before
        the query was sent; or, for ``consistency="follower"``, any member, follower
        included, once it has applied as far as the client has seen:
        ``docs/queries.md``), so a change made here would exist on that member alone.
        Its ``cluster.time`` and ``cluster.log_position`` are those of the last entry
        applied.

        Return the answer as bytes.  An exception raised here reaches the client as
        ``client.ServiceError`` (its type and text); the member goes on.  By default a
        service answers no queries: this raises, and the client is told so."""
        raise NotImplementedError(
            f"{type(self).__qualname__} answers no queries: it does not implement on_query()"
        )

    def on_role_change(self, new_role: Role) -> None:  # noqa: B027
        """This member's role changed."""

    def on_terminate(self, cluster: Cluster) -> None:  # noqa: B027
        """The node is shutting down."""

    def on_new_leadership_term_event(self, event: NewLeadershipTermEvent) -> None:  # noqa: B027
        """A new leadership term began (NewLeadershipTermEvent on the log)."""


class StatelessService(ClusteredService):
    """A service that keeps no state between log entries (an echo, a router).

    Its snapshot part is empty, and it refuses to start from a snapshot that holds
    service state (``ServiceStateError``): that snapshot was written by a service that
    kept state, and starting would silently drop it.  The :class:`Cluster` handle is kept
    in ``self.cluster``; a subclass that overrides :meth:`on_start` calls
    ``super().on_start(cluster, snapshot)``.
    """

    cluster: Cluster

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster
        if snapshot:
            raise ServiceStateError(
                f"{type(self).__qualname__} is a StatelessService, but the latest snapshot "
                f"holds {len(snapshot)} bytes of service state (written by a service that "
                "kept state): refusing to start and drop it"
            )

    def on_take_snapshot(self) -> bytes:
        return b""


def take_service_snapshot(service: ClusteredService) -> bytes:
    """``service.on_take_snapshot()``, checked: its bytes, or :class:`ServiceStateError`
    when it raises or returns anything else (so no snapshot is ever silently empty)."""
    name = type(service).__qualname__
    try:
        state = service.on_take_snapshot()
    except BaseException as exc:
        raise ServiceStateError(f"{name}.on_take_snapshot() raised {exc!r}") from exc
    if isinstance(state, bytes):
        return state
    if isinstance(state, bytearray | memoryview):
        return bytes(state)
    raise ServiceStateError(
        f"{name}.on_take_snapshot() returned {type(state).__name__}, not bytes: "
        "it must return the service's whole state"
    )
