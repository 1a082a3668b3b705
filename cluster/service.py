"""The clustered service API: what an application implements and what it may call.

Subclass :class:`ClusteredService` and run it with
``python -m cluster.node --service my.module:MyService``.  Every member runs the same
service and feeds it the same committed log in the same order, so callbacks must be
synchronous and deterministic: use ``cluster.time`` (the log entry's timestamp) rather
than the wall clock, and no randomness that is not seeded from the log.

Replies go to clients with :meth:`ClientSession.offer`; on followers the offer is faked
(it reports success but sends nothing), so the same code runs on every member.
"""

from __future__ import annotations

from typing import Protocol

from .protocol.enums import CloseReason, Role
from .protocol.log import NewLeadershipTermEvent

__all__ = [
    "ClientSession",
    "CloseReason",
    "Cluster",
    "ClusteredService",
    "Role",
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


class ClusteredService:
    """Base class for replicated application logic; override what you need."""

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        """Called once before any log entry, with the latest snapshot if there is one."""

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        """A client session opened (SessionOpenEvent on the log)."""

    def on_session_close(
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        """A client session closed (SessionCloseEvent on the log)."""

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        """An application message in log order: from a client session, or (``session``
        None) a service message offered with :meth:`Cluster.offer`."""

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        """A timer scheduled with :meth:`Cluster.schedule_timer` fired."""

    def on_take_snapshot(self) -> bytes:
        """Return the service's state as bytes for a snapshot."""
        return b""

    def on_role_change(self, new_role: Role) -> None:
        """This member's role changed."""

    def on_terminate(self, cluster: Cluster) -> None:
        """The node is shutting down."""

    def on_new_leadership_term_event(self, event: NewLeadershipTermEvent) -> None:
        """A new leadership term began (NewLeadershipTermEvent on the log)."""
