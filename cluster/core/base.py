"""What the consensus module's parts share: its configuration, its counters, the ports
its output leaves through, and the events it hands to the shell.

The ports only enqueue: a call never re-enters the consensus module and never blocks.
What the shell must *do* (persist the log, apply it, react to a role change) is handed
out instead (``take_log_batch``, ``commit_position``, ``take_events``) and the shell
reports back what it did (``on_archive_position``, ``on_truncated``, ``on_applied``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..protocol import version as protocol_version
from ..protocol.consensus import ConsensusMessage
from ..protocol.egress import EgressMessage
from ..protocol.enums import Role


@dataclass(slots=True)
class ConsensusConfig:
    member_id: int = 0
    member_ids: tuple[int, ...] = (0,)
    session_timeout_ns: int = 10_000_000_000
    max_concurrent_sessions: int = 10
    max_pending_sessions: int = 16
    """Sessions connecting at once (not yet open), counted apart from open ones."""
    max_pending_per_address: int = 4
    """Sessions connecting at once from one client address (an IPv6 address counts by
    its /64: :func:`~cluster.core.session.address_key`).  When every pending slot is
    taken, a new request takes the place of the longest-waiting one of the address that
    holds the most, if that is more than the newcomer's address holds (fair shares:
    :meth:`~cluster.core.admission.SessionAdmission.on_connect`)."""
    resume_grace_ns: int = 250_000_000
    """How long an open session whose connection dropped here keeps its slot for a
    resume once the slots are full and another session needs one; then it is closed
    (TIMEOUT) and gives its slot up.  While slots are free it waits the whole
    ``session_timeout_ns``."""
    ingress_endpoints: str = ""
    app_version: int = protocol_version.compose(0, 0, 1)
    leader_heartbeat_interval_ns: int = 200_000_000
    leader_heartbeat_timeout_ns: int = 10_000_000_000
    election_timeout_ns: int = 1_000_000_000
    election_status_interval_ns: int = 100_000_000
    startup_canvass_timeout_ns: int = 500_000_000
    slow_disk_threshold_ns: int = 1_000_000_000
    """A leader whose every append, for ``slow_disk_period_ns``, took longer than this
    from encoded to durable on its own disk hands leadership over (0: never)."""
    slow_disk_period_ns: int = 10_000_000_000
    max_session_queries: int = 256
    """Queries of one session a member holds at once (waiting for their read round or
    for the service to apply); one past it is answered BUSY (:mod:`cluster.core.reads`,
    :mod:`cluster.core.follower_reads`)."""
    max_queries: int = 8192
    """Queries a member holds at once, all sessions together; one past it is BUSY."""

    @property
    def member_count(self) -> int:
        return len(self.member_ids)

    @property
    def others(self) -> list[int]:
        """Every member but this one."""
        return [m for m in self.member_ids if m != self.member_id]


@dataclass(slots=True)
class Counters:
    """Things counted rather than raised (operators see them in describe/TUI)."""

    unknown_session_messages: int = 0
    wrong_term_messages: int = 0
    held_messages_dropped: int = 0
    """Messages refused because the SUSPENDED module's hold queue was full."""
    duplicate_messages: int = 0
    """Session messages a leader dropped because its log already holds their sequence
    (a client's resend after a leader change, a resume or a gap: exactly once in)."""
    sequence_gaps: int = 0
    """Session messages a leader dropped because they were not the session's next
    (one before them was lost on the way); the client is told to resend at once."""
    rejected_sessions: int = 0
    redirected_sessions: int = 0
    timed_out_sessions: int = 0
    egress_failures: int = 0
    elections: int = 0
    truncations: int = 0
    truncated_bytes: int = 0
    invalid_messages: int = 0
    """Member messages refused by the consensus module: a report of more log than this
    leader has, an append that would not start at a record boundary."""
    foreign_session_messages: int = 0
    """Client messages naming a session that their connection does not hold."""
    rejected_resumes: int = 0
    """Resume requests with a wrong secret."""
    dropped_connect_requests: int = 0
    """Connect requests dropped unanswered: more waiting for an answer than the limit."""
    evicted_pending_sessions: int = 0
    """Sessions still connecting (not yet answered) that gave their place to a request
    from an address holding fewer of the pending slots (told ERROR; also counted in
    ``rejected_sessions``)."""
    sessions_given_back: int = 0
    """Open sessions whose connection had dropped, closed (TIMEOUT) after
    ``resume_grace_ns`` rather than a whole session timeout, because every slot was
    taken and another session needed one."""
    leader_stalls: int = 0
    """Times this leader found it had not run for a second or more (a pause, a VM
    steal) while it held sessions: the gap was not counted against their timeouts."""
    replies_dropped: int = 0
    """The service's replies this leader could not deliver (their session had no
    connection, or no room on it); counted when the session is told, or closes."""
    service_errors: int = 0
    """Exceptions the clustered service raised from a callback (caught, on every member
    alike: ``--on-service-error``); ``triarch_service_errors_total``."""
    snapshot_failures: int = 0
    """Snapshots this member could not take or write (the service's snapshot callback
    raised, a full disk); the member goes on, the log keeps everything;
    ``triarch_snapshot_failures_total``."""
    snapshot_fallbacks: int = 0
    """Followers sent a snapshot because the record they needed next is corrupt in this
    leader's archive (issue 33); ``triarch_snapshot_fallbacks_total``."""
    later_terms_ignored: int = 0
    """Messages of a later term ignored because this member has a live leader and they
    came from a member it had not been hearing from (a forged or stray message:
    :mod:`cluster.core.lease`)."""
    queries: int = 0
    """Queries this member answered from the service (:mod:`cluster.core.reads`)."""
    read_rounds: int = 0
    """Read rounds this leader began (the queries of a duty cycle share one)."""
    query_errors: int = 0
    """Queries whose ``on_query`` raised (or a service that answers none)."""
    queries_refused: int = 0
    """Queries answered BUSY (past a bound) or NOT_LEADER (not the ready leader, or it
    stepped down holding them): their clients ask again."""
    follower_queries: int = 0
    """Follower-consistency queries this member answered from its applied state (also
    counted in ``queries`` or ``query_errors``: :mod:`cluster.core.follower_reads`)."""
    queries_dropped: int = 0
    """Follower queries dropped unanswered: their session closed, or their connection,
    while they waited for this member to apply far enough."""


class IngressSource:
    """One client connection to this member's ingress, as the core knows it.

    The shell makes one per connection and puts it in the inbox ahead of the messages
    read from it, so the core knows which connection every client message came on: a
    session's messages are accepted only from the connection that holds it.
    ``address`` is the peer's host, ``principal`` the name on its client certificate
    (None without TLS), ``link`` the shell's handle for replying on it.
    """

    __slots__ = ("address", "closed", "conn_id", "link", "principal", "trusted")

    def __init__(
        self, conn_id: int, address: str, principal: str | None = None, link: object = None
    ) -> None:
        self.conn_id = conn_id
        self.address = address
        self.principal = principal
        self.link = link
        self.closed = False
        self.trusted = False  # a session opened or resumed on it (it may send large frames)

    def __repr__(self) -> str:
        return f"IngressSource({self.conn_id}, {self.address!r}, {self.principal!r})"


class EgressPort(Protocol):
    """Where the consensus module's egress goes; every method only enqueues."""

    def connect(self, egress_id: int, channel: str) -> None:
        """Start connecting to a client's egress channel ``host:port``."""

    def attach(self, egress_id: int, source: IngressSource) -> None:
        """The egress goes back on the client's own ingress connection."""

    def reply(self, source: IngressSource, message: EgressMessage) -> bool:
        """Queue a message on a client's ingress connection (handshake answers);
        False if it is closed or its backlog is full."""

    def send(self, egress_id: int, message: EgressMessage) -> bool:
        """Queue a message; False if the egress is unknown or its backlog is full."""

    def close(self, egress_id: int) -> None:
        """Flush what is queued, then close the egress connection."""


class ConsensusPort(Protocol):
    """Member-to-member messages; sending only enqueues and may silently drop."""

    def send(self, member_id: int, message: ConsensusMessage) -> bool: ...


class StorageError(Exception):
    """A durable write of the :class:`StoragePort` failed (a full disk): nothing of it
    may be acted upon."""


class StoragePort(Protocol):
    """The few durable writes the consensus module makes itself (rare, synchronous)."""

    def save_candidate_term(self, candidate_term_id: int) -> None:
        """Persist the highest term voted in or seen, before it is acted upon; raise
        :class:`StorageError` if it is not durable (the module then does not act on it)."""

    def save_voting(self) -> None:
        """Record that this catch-up member votes again (it has been caught up), before
        it acts on it; raise :class:`StorageError` if it is not durable."""

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        """Persist the start of a term in the recording log.  Never fails: a write that
        cannot be made now is kept, and no log byte at or after ``base_position`` becomes
        durable before it is made."""

    def remove_terms_from(self, position: int) -> None:
        """Forget terms starting at or after a truncation point (written, like
        :meth:`record_term`, before the truncation of the log)."""


class NoConsensus:
    """A ConsensusPort for a cluster of one: nobody to send to."""

    def send(self, member_id: int, message: ConsensusMessage) -> bool:
        return False


class NoStorage:
    """A StoragePort that keeps nothing (tests of the core alone)."""

    def save_candidate_term(self, candidate_term_id: int) -> None:
        pass

    def save_voting(self) -> None:
        pass

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        pass

    def remove_terms_from(self, position: int) -> None:
        pass


class TermView(Protocol):
    """The consensus module's term and leader, as its parts read them."""

    @property
    def leadership_term_id(self) -> int: ...

    @property
    def leader_member_id(self) -> int: ...

    @property
    def is_ready_leader(self) -> bool:
        """Leader with its election complete: it takes client work."""
        ...

    @property
    def in_election(self) -> bool: ...


# ---------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """This member's role changed (a leader stepping down, a follower winning)."""

    role: Role


@dataclass(frozen=True, slots=True)
class LeaderReady:
    """This leader's election is complete: its term's first entry is committed and
    applied, so every earlier entry is too; the service may now send real egress."""

    leadership_term_id: int
    log_position: int


@dataclass(frozen=True, slots=True)
class MemberRefused:
    """A member's message contradicted what this member knows (log bytes that are not
    whole records, a report of more log than this leader has, a second leader for a
    term, a term far ahead): refused and counted; the shell closes that member's link,
    as it does for a message that fails the link's own checks."""

    member_id: int
    reason: str


Event = RoleChanged | LeaderReady | MemberRefused
