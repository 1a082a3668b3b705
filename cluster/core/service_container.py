"""Feeds committed log records to the clustered service, in order (sans-IO).

The container is Aeron's ClusteredServiceAgent in miniature: it decodes each committed
record, keeps the service's view of client sessions, stamps egress replies with the
timestamp of the log entry being processed (seed 002), numbers each session's replies
and keeps them on every member until the client confirms them (where Aeron's followers
fake the egress: exactly once out, :mod:`cluster.core.replies`), answers the leader's
confirmed queries (:mod:`cluster.core.reads`), and routes the service's requests (close a
session, timers) to the consensus module.

An exception a service callback raises is caught around the call, on every member
alike: the entry counts as applied (the log position moves past it as if the callback
had returned) and the container's :class:`~cluster.core.service_errors.ServiceErrorPolicy`
says what else happens (log it and go on, or stop the member with
:class:`~cluster.core.service_errors.ServiceFailure`); it is counted
(``Counters.service_errors``) and, on the leader, a client whose message it was gets a
``ServiceErrorEvent``.  The ``try`` costs nothing on the hot path until something raises.

Any ``BaseException`` counts: a ``SystemExit``, ``KeyboardInterrupt`` or
``GeneratorExit`` that a callback raises comes from the service's code and is in the log
for good (every member applies the entry, every restart replays it), so letting it
through would stop every member at every start.  A signal to the process never arrives
as one inside a callback: the node's SIGINT and SIGTERM go to its signal receiver, and
the log agent applies with Trio's KeyboardInterrupt protection on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from ..archive.record import RECORD_HEADER, RECORD_HEADER_LENGTH, iter_records
from ..protocol.codec import DECODE_ERRORS, EGRESS, LOG
from ..protocol.egress import SERVICE_ERROR_REQUEST_BYTES, QueryResponse, ServiceErrorEvent
from ..protocol.enums import CloseReason, QueryStatus, Role
from ..protocol.ingress import SessionMessageHeader
from ..protocol.log import (
    ClusterActionRequest,
    LogMessage,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)
from ..protocol.snapshot import ClientSession as ClientSessionRecord
from ..service import ClientSession, ClusteredService
from .base import EgressPort
from .consensus import ConsensusModule
from .pending import is_service_message
from .replies import DEFAULT_KEPT_REPLIES, KeptReplies, Reply
from .service_errors import ServiceErrorPolicy, error_text, error_type

log = logging.getLogger("cluster.service")

_LEADER = Role.LEADER  # a module global is found faster than an enum's member
_unpack_record = RECORD_HEADER.unpack_from


class _ClientSession:
    """The service's view of a client session.  ``applied_sequence`` is the highest
    sequence of its messages applied (on every member: a new leader knows from it what
    its log holds; snapshots keep it); ``told_sequence``, on the leader, the highest its
    client has been told of (a reply carries it, else the session manager's
    :class:`~cluster.protocol.egress.SessionAck`); ``replies``, the replies given to it
    that its client has not confirmed (every member keeps them: exactly once out,
    :mod:`cluster.core.replies`)."""

    __slots__ = (
        "_container",
        "applied_sequence",
        "encoded_principal",
        "id",
        "is_closing",
        "replies",
        "response_channel",
        "response_stream_id",
        "secret_hash",
        "told_sequence",
    )

    def __init__(
        self, container: ServiceContainer, event: SessionOpenEvent | ClientSessionRecord
    ) -> None:
        self._container = container
        self.id = event.cluster_session_id
        self.response_stream_id = event.response_stream_id
        self.response_channel = event.response_channel
        self.encoded_principal = event.encoded_principal
        self.secret_hash = event.secret_hash
        self.is_closing = False
        self.told_sequence = 0
        if isinstance(event, ClientSessionRecord):
            self.applied_sequence = event.last_sequence
            self.replies = KeptReplies(
                container.max_kept_replies, event.last_reply, event.confirmed_reply
            )
        else:
            self.applied_sequence = 0
            self.replies = KeptReplies(container.max_kept_replies)

    def offer(self, payload: bytes) -> bool:
        """A reply to the session: numbered and kept on every member, sent by the
        leader in order (a follower keeps it in case it leads next); one given outside
        the log is only sent, by the leader (:mod:`cluster.core.replies`)."""
        c = self._container
        if self.is_closing or self.id not in c.sessions:
            return False
        if type(payload) is not bytes:
            payload = bytes(payload)  # kept: the caller may change its buffer
        if c.outside_log:
            return c.role is _LEADER and c.egress.send(
                self.id, SessionMessageHeader(c.leadership_term_id, self.id, c.time, payload)
            )
        applied = self.applied_sequence  # the client forgets what it kept up to here
        replies = self.replies
        number = replies.last + 1
        reply = SessionMessageHeader(
            c.leadership_term_id, self.id, c.time, payload, applied, number
        )
        dropped = replies.keep(reply)  # ServiceContainer.give, inline: the hot path
        if dropped and c.role is _LEADER:
            c.cm.counters.replies_dropped += dropped  # never sent: its client lacks them
        if c.role is _LEADER and replies.sent == number - 1 and c.egress.send(self.id, reply):
            replies.sent = number
            self.told_sequence = applied
        return True

    def close(self) -> bool:
        if self.is_closing or self.id not in self._container.sessions:
            return False
        self.is_closing = True
        return self._container.close_client_session(self.id)

    def __repr__(self) -> str:
        return f"ClientSession(id={self.id}, channel={self.response_channel!r})"


class ServiceContainer:
    """Drives one :class:`ClusteredService` from the committed log."""

    def __init__(
        self,
        service: ClusteredService,
        consensus_module: ConsensusModule,
        egress: EgressPort,
        *,
        member_id: int,
        clock_ns: Callable[[], int],
        on_error: ServiceErrorPolicy | None = None,
        max_kept_replies: int = DEFAULT_KEPT_REPLIES,
    ) -> None:
        """``on_error``: what to do when a service callback raises (by default: log
        it and go on, :class:`ServiceErrorPolicy`); ``max_kept_replies``: the bytes of
        each session's unconfirmed replies kept (:mod:`cluster.core.replies`)."""
        self.service = service
        self.cm = consensus_module
        self.egress = egress
        self.member_id = member_id
        self._clock_ns = clock_ns
        self.role = Role.FOLLOWER
        self.time = 0
        self.log_position = 0
        self.leadership_term_id = -1
        self.sessions: dict[int, _ClientSession] = {}
        self.applied_messages = 0
        self.max_session_id = 0
        self.on_cluster_action: Callable[[int, ClusterActionRequest], None] | None = None
        self.on_error = on_error or ServiceErrorPolicy(clock_ns=clock_ns)
        self.max_kept_replies = max_kept_replies
        #: a callback runs that no log entry drives (``on_start``, ``on_role_change``,
        #: ``on_terminate``): its replies are not numbered, kept nor sent by followers
        self.outside_log = False
        consensus_module.session_manager.sequencing.progress = self.progress

    def progress(self, cluster_session_id: int) -> _ClientSession | None:
        """What this member applied of a session's sequenced messages (None: no such
        session); the session manager reads it (a new leader's log, acknowledgements)."""
        return self.sessions.get(cluster_session_id)

    def restore_sessions(self, records: list[ClientSessionRecord]) -> None:
        for record in records:
            session = _ClientSession(self, record)
            session.replies.restore([_decode_reply(body) for body in record.replies])
            self.sessions[session.id] = session
            self.max_session_id = max(self.max_session_id, session.id)

    # ---- the Cluster handle -------------------------------------------------------

    def session_records(self) -> Iterator[tuple[int, int, str, bytes, bytes]]:
        """The committed sessions, as the session manager rebuilds its table from."""
        for s in self.sessions.values():
            yield s.id, s.response_stream_id, s.response_channel, s.encoded_principal, s.secret_hash

    @property
    def client_sessions(self) -> list[ClientSession]:
        return list(self.sessions.values())

    def get_client_session(self, cluster_session_id: int) -> ClientSession | None:
        return self.sessions.get(cluster_session_id)

    def close_client_session(self, cluster_session_id: int) -> bool:
        if cluster_session_id not in self.sessions:
            return False
        return self.cm.session_manager.on_service_close(cluster_session_id, self._clock_ns())

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        self.cm.timers.schedule(correlation_id, deadline)
        return True

    def cancel_timer(self, correlation_id: int) -> bool:
        return self.cm.timers.cancel(correlation_id)

    def give(self, session: _ClientSession, reply: Reply) -> None:
        """A numbered reply to ``session``: kept (every member), and sent at once by a
        leader that has sent every one before it on the client's connection (else the
        session manager's slow tick sends them in order when there is room)."""
        replies = session.replies
        dropped = replies.keep(reply)
        if dropped and self.role is _LEADER:
            self.cm.counters.replies_dropped += dropped  # never sent: its client lacks them
        if (
            self.role is _LEADER
            and replies.sent == reply.reply - 1
            and self.egress.send(session.id, reply)
        ):
            replies.sent = reply.reply
            if type(reply) is SessionMessageHeader:
                session.told_sequence = reply.sequence

    def offer(self, payload: bytes) -> bool:
        """A service message into the log (sequenced by the leader, exactly once)."""
        self.cm.service_messages.enqueue(bytes(payload))
        return True

    # ---- lifecycle ----------------------------------------------------------------

    def start(self, snapshot: bytes | None = None) -> None:
        """``on_start``; if it raises, the member cannot start:
        :class:`~cluster.core.service_errors.ServiceFailure` (logged), whatever the policy."""
        self.outside_log = True
        try:
            self.service.on_start(self, snapshot)
        except BaseException as exc:
            raise self.on_error.failed_to_start(exc, self.log_position) from exc
        finally:
            self.outside_log = False

    def set_role(self, role: Role) -> None:
        if role is not self.role:
            self.role = role
            self.outside_log = True
            try:
                self.service.on_role_change(role)
            except BaseException as exc:
                self._service_error("on_role_change", exc)
            finally:
                self.outside_log = False

    def terminate(self) -> None:
        """``on_terminate`` (the node is stopping): an exception is logged, not raised."""
        self.outside_log = True
        try:
            self.service.on_terminate(self)
        except BaseException as exc:
            self.cm.counters.service_errors += 1
            log.error("the service's on_terminate raised %r", exc, exc_info=exc)
        finally:
            self.outside_log = False

    # ---- the log ------------------------------------------------------------------

    def apply(
        self,
        data: bytes | bytearray | memoryview,
        base_position: int,
        *,
        mirror_into_consensus: bool = False,
        checked: bool = False,
    ) -> int:
        """Apply every complete record in ``data`` (which starts at ``base_position``).

        Returns the number of bytes consumed (whole records only).  With
        ``mirror_into_consensus`` (followers, recovery) the consensus module also sees
        each entry so it can rebuild its sessions and timers.  ``checked``: the records'
        CRCs were checked already (the log in memory: a follower checks what it receives
        before appending it), so they are not checked again; unchecked ones are checked
        first (a :class:`~cluster.archive.record.RecordError` at a bad length or CRC,
        and nothing applied).  One pass then applies them, a client's message straight
        to the service (the follower's hot path).
        """
        if not checked:
            for _ in iter_records(data):  # RecordError at a bad length or CRC
                pass
        rlog = self.cm.log
        mirror = self.cm.on_replay_log_message if mirror_into_consensus else None
        now_ns = self._clock_ns() if mirror_into_consensus else 0
        sessions, service, unpack = self.sessions, self.service, _unpack_record
        header, offset, decode = RECORD_HEADER_LENGTH, 0, LOG.raw_decode
        with memoryview(data) as view:
            end = len(view)
            while end - offset >= header:
                length, _ = unpack(view, offset)
                body_end = offset + header + length
                if body_end > end:
                    break
                try:
                    message = decode(view[offset + header : body_end])
                except DECODE_ERRORS as exc:
                    raise LOG.error(exc) from None  # what LOG.decode raises
                offset = body_end
                position = base_position + offset
                self.log_position = position
                self.time = timestamp = message.timestamp
                if type(message) is SessionMessageHeader:
                    if mirror is not None and timestamp > rlog.timestamp:
                        rlog.timestamp = timestamp  # on_replay_log_message's, inline
                    session = sessions.get(message.cluster_session_id)
                    if session is not None:
                        self.applied_messages += 1
                        session.applied_sequence = message.sequence
                        if message.reply > session.replies.confirmed:
                            session.replies.confirm(message.reply)
                        try:
                            service.on_session_message(session, timestamp, message.payload)
                        except BaseException as exc:
                            self._message_failed(exc, session, message)
                        continue
                elif mirror is not None:
                    mirror(message, position, now_ns)
                self._apply_message(message, position)
        return offset

    def apply_records(self, records: list[tuple[int, int, LogMessage]], base_position: int) -> int:
        """Apply ``(start, end, message)`` records that this member's consensus module
        encoded itself (a leader's own entries of its term: no decoding, no mirroring);
        ``records`` are contiguous from ``base_position``.  Returns the bytes consumed."""
        apply_message, sessions, service = self._apply_message, self.sessions, self.service
        for _, end, message in records:
            if type(message) is SessionMessageHeader:  # the hot path, inline
                session = sessions.get(message.cluster_session_id)
                if session is not None:
                    self.log_position = end
                    self.time = message.timestamp
                    self.applied_messages += 1
                    session.applied_sequence = message.sequence
                    if message.reply > session.replies.confirmed:
                        session.replies.confirm(message.reply)
                    try:
                        service.on_session_message(session, message.timestamp, message.payload)
                    except BaseException as exc:
                        self._message_failed(exc, session, message)
                    continue
            apply_message(message, end)
        return records[-1][1] - base_position if records else 0

    def _apply_message(self, message: LogMessage, position: int) -> None:
        """One log entry, which ends at ``position``."""
        self.log_position = position
        self.time = message.timestamp
        service = self.service
        if type(message) is SessionMessageHeader:
            session_id = message.cluster_session_id
            session = self.sessions.get(session_id)
            if session is not None:
                self.applied_messages += 1
                session.applied_sequence = message.sequence
                if message.reply > session.replies.confirmed:
                    session.replies.confirm(message.reply)
                try:
                    service.on_session_message(session, message.timestamp, message.payload)
                except BaseException as exc:
                    self._message_failed(exc, session, message)
            elif is_service_message(session_id):
                self.cm.service_messages.sweep(-session_id)
                self.applied_messages += 1
                try:
                    service.on_session_message(None, message.timestamp, message.payload)
                except BaseException as exc:
                    self._service_error("on_session_message", exc, "a service message")
        elif isinstance(message, SessionOpenEvent):
            session = _ClientSession(self, message)
            self.sessions[session.id] = session
            if session.id > self.max_session_id:
                self.max_session_id = session.id
            try:
                service.on_session_open(session, message.timestamp)
            except BaseException as exc:
                self._service_error("on_session_open", exc, f"session {session.id}")
        elif isinstance(message, SessionCloseEvent):
            closed = self.sessions.pop(message.cluster_session_id, None)
            if closed is not None:
                closed.is_closing = True
                try:
                    service.on_session_close(
                        closed, message.timestamp, CloseReason(message.close_reason)
                    )
                except BaseException as exc:
                    self._service_error("on_session_close", exc, f"session {closed.id}")
        elif isinstance(message, TimerEvent):
            self.cm.timers.cancel(message.correlation_id)  # on every member, leader too
            try:
                service.on_timer_event(message.correlation_id, message.timestamp)
            except BaseException as exc:
                self._service_error("on_timer_event", exc, f"timer {message.correlation_id}")
        elif isinstance(message, NewLeadershipTermEvent):
            self.leadership_term_id = message.leadership_term_id
            try:
                service.on_new_leadership_term_event(message)
            except BaseException as exc:
                self._service_error("on_new_leadership_term_event", exc)
        elif isinstance(message, ClusterActionRequest) and self.on_cluster_action:
            self.on_cluster_action(position, message)

    # ---- queries (cluster.core.reads) ---------------------------------------------

    def answer_queries(self, applied: int) -> int:
        """Answer, from the service's ``on_query``, each confirmed query whose read
        index the log applied up to ``applied`` reaches (the leader's: no log, no disk),
        and each follower query this member has applied far enough for
        (:mod:`cluster.core.follower_reads`); returns how many.  What ``on_query``
        raises goes back to its client as SERVICE_ERROR (counted in ``query_errors``,
        logged at DEBUG): the member goes on, and the service's log callbacks' policy
        does not apply (nothing changed)."""
        reads = self.cm.reads
        queries = reads.take_answerable(applied)
        follower = reads.follower
        held = follower.take_answerable(applied)
        if not queries and not held:
            return 0
        send = self.egress.send
        for query in queries:
            send(
                query.session_id,
                self._answer(query.session_id, query.correlation_id, query.payload, applied),
            )
        self.cm.counters.follower_queries += len(held)
        for fq in held:
            follower.send(fq, self._answer(fq.session_id, fq.correlation_id, fq.payload, applied))
        return len(queries) + len(held)

    def _answer(
        self, session_id: int, correlation_id: int, payload: bytes, position: int
    ) -> QueryResponse:
        """The service's answer to one query, from its state at ``position``."""
        counters, term = self.cm.counters, self.cm.leadership_term_id
        try:
            answer = self.service.on_query(payload)
            if type(answer) is not bytes:
                if not isinstance(answer, bytearray | memoryview):
                    raise TypeError(f"on_query() returned {type(answer).__name__}, not bytes")
                answer = bytes(answer)
        except BaseException as exc:  # as the log callbacks': see the module
            counters.query_errors += 1
            log.debug("on_query raised %r", exc)
            return QueryResponse(
                session_id,
                correlation_id,
                term,
                QueryStatus.SERVICE_ERROR,
                position,
                error_type=error_type(exc),
                message=error_text(exc),
            )
        counters.queries += 1
        return QueryResponse(session_id, correlation_id, term, QueryStatus.OK, position, answer)

    # ---- service errors (never on the hot path) -----------------------------------

    def _service_error(self, callback: str, exc: BaseException, where: str = "") -> None:
        """A callback raised: counted, then the policy's (which may raise
        :class:`~cluster.core.service_errors.ServiceFailure` to stop the member)."""
        self.cm.counters.service_errors += 1
        self.on_error.on_error(callback, exc, self.log_position, where)

    def _message_failed(
        self, exc: BaseException, session: _ClientSession, message: SessionMessageHeader
    ) -> None:
        """``on_session_message`` raised on a client's message: the policy's, then the
        client hears of it, in its place among the replies (numbered and kept on every
        member, :meth:`give`)."""
        self._service_error("on_session_message", exc, f"session {session.id}")
        if session.is_closing or session.id not in self.sessions:
            return
        self.give(
            session,
            ServiceErrorEvent(
                session.id,
                self.leadership_term_id,
                self.log_position,
                message.timestamp,
                error_type(exc),
                error_text(exc),
                bytes(message.payload[:SERVICE_ERROR_REQUEST_BYTES]),
                session.replies.last + 1,
            ),
        )


def _decode_reply(body: bytes) -> Reply:
    """A reply a snapshot kept (its egress encoding)."""
    reply = EGRESS.decode(body)
    if not isinstance(reply, (SessionMessageHeader, ServiceErrorEvent)):
        raise EGRESS.error(ValueError(f"a snapshot kept {type(reply).__name__} as a reply"))
    return reply
