"""The open session as a sans-IO object: its state, its two queues, egress dispatch.

No sockets, no tasks, no awaits: like :class:`~client._connect.AsyncConnect`, a
:class:`Session` decides and the anyio shell (:mod:`client._client`,
:mod:`client._ingress`) does.  It holds what the session *is* (its id, the leadership
term, the leader and the endpoints, open or closed) and the queues that cross the
network: the ingress frames not yet sent (``pending``), the messages offered and not yet
confirmed applied (``outbox``, :class:`~client._outbox.Outbox`: sent again when a leader
asks) and the application messages received but not yet taken (``backlog``).

Egress messages of an open session go in through :meth:`Session.on_egress`::

    SessionMessageHeader  appended to the backlog; what it says the
                          service applied is forgotten            -> None
                          (a reply numbered as one already
                          received is dropped; after a gap in
                          the numbers, counted as dropped         -> Dropped)
    SessionAck            the same forgotten; with resend, what
                          follows the leader's log queued again    -> None
    ServiceErrorEvent     appended to the backlog (receive raises);
                          numbered as replies are                  -> None
    RepliesDropped        counted                                 -> Dropped
    AdminResponse         handed to the request_snapshot() waiting -> None
    NewLeaderEvent        term, leader and endpoints updated; the
                          queued frames re-encoded for the new term -> Reconnect
    SessionEvent CLOSED                                             -> Closed
    anything else, or for another session, or stale                 -> None

What the shell must do to its connections and tasks comes back as an action.  Wake-ups
are called directly instead, because two of them happen once per message: the
``wake_writer`` and ``wake_receivers`` callables the shell passes in, and an admin
waiter's ``wake``.  They only notify waiting tasks; they never block or do I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from cluster.protocol import INGRESS, FrameDecoder, encode_frame, encode_frames_into
from cluster.protocol.egress import (
    AdminResponse,
    NewLeaderEvent,
    QueryResponse,
    RepliesDropped,
    ServiceErrorEvent,
    SessionAck,
    SessionEvent,
)
from cluster.protocol.enums import CloseReason, EventCode
from cluster.protocol.ingress import (
    SessionKeepAlive,
    SessionMessageHeader,
    SessionResumeRequest,
)
from cluster.protocol.version import PROTOCOL_VERSION

from ._connect import ConnectResult
from ._endpoints import Endpoint, merge_endpoints, parse_endpoints
from ._outbox import Outbox
from ._query import Queries
from .errors import (
    EgressBacklogExceededError,
    NotConnectedError,
    ServiceError,
    SessionClosedError,
    SessionLostError,
)

__all__ = ["Action", "AdminWaiter", "Closed", "Dropped", "Reconnect", "Redial", "Session"]


@dataclass(frozen=True, slots=True)
class Reconnect:
    """A new leader: keep the ingress only if it goes to ``endpoint`` of ``member_id``,
    else drop it, and reconnect (to the session's ``leader_endpoint``)."""

    member_id: int
    endpoint: Endpoint | None


@dataclass(frozen=True, slots=True)
class Redial:
    """A member that does not lead named the leader this session already has (one it
    could not reach, or that went silent: paused, or cut off from this client only):
    leave that member and dial the leader again, the back-off going on growing."""

    member_id: int
    endpoint: Endpoint


@dataclass(frozen=True, slots=True)
class Closed:
    """The cluster closed the session: mark it closed with ``reason``, wake every task."""

    reason: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """``count`` replies to this session were dropped while it was away: tell the
    application (an event; :attr:`Session.replies_dropped` counts them all)."""

    count: int


Action = Reconnect | Redial | Closed | Dropped


@dataclass(slots=True)
class AdminWaiter:
    """A ``request_snapshot()`` waiting for the ``AdminResponse`` to its correlation id.

    ``wake`` is called once the response is set, or when the session closes first
    (``response`` is then still ``None``)."""

    wake: Callable[[], None]
    response: AdminResponse | None = None


class Session:
    """One client session's state, from connecting to closed.

    ``endpoints`` are the ingress endpoints the client was given (``given``, kept); the
    handshake, REDIRECTs and NewLeaderEvents add the members it was not given, from
    what the members advertise (:func:`~client._endpoints.merge_endpoints`: a given
    endpoint, a proxy's say, always wins).  ``wake_writer`` is called whenever a frame is
    queued in ``pending``, ``wake_receivers`` whenever the backlog changes.

    The shell reads and sets the plain attributes directly (``open``, ``closing`` and
    ``pending`` included: the writer swaps ``pending`` for an empty buffer when it
    takes a batch).  ``backlog`` is never replaced, so the shell may hold on to it.
    """

    __slots__ = (
        "_admin",
        "_wake_receivers",
        "_wake_writer",
        "backlog",
        "backlog_exceeded",
        "close_reason",
        "closing",
        "cluster_session_id",
        "endpoints",
        "errors_waiting",
        "given",
        "last_applied",
        "leader_endpoint",
        "leader_member_id",
        "leadership_term_id",
        "lost",
        "max_egress_backlog",
        "max_frame_size",
        "open",
        "outbox",
        "pending",
        "queries",
        "received_reply",
        "replies_dropped",
        "session_secret",
        "wake_space",
    )

    def __init__(
        self,
        endpoints: Mapping[int, Endpoint],
        *,
        max_frame_size: int,
        max_egress_backlog: int,
        wake_writer: Callable[[], None],
        wake_receivers: Callable[[], None],
    ) -> None:
        self.given: dict[int, Endpoint] = dict(endpoints)
        self.endpoints: dict[int, Endpoint] = dict(endpoints)
        self.max_frame_size = max_frame_size
        self.max_egress_backlog = max_egress_backlog
        self._wake_writer = wake_writer
        self._wake_receivers = wake_receivers

        # Lifecycle and identity (valid once open).
        self.open = False
        self.closing = False
        self.close_reason: str | None = None
        self.lost = False  # closed because no member answered (SessionLostError)
        self.cluster_session_id = -1
        self.leadership_term_id = -1
        self.leader_member_id = -1
        self.leader_endpoint: Endpoint | None = None
        self.session_secret = b""

        # Ingress frames queued but not yet sent; the messages offered, until applied.
        self.pending = bytearray()
        self.outbox = Outbox()
        #: called when confirmations make room in the outbox (offers may go on)
        self.wake_space: Callable[[], None] = lambda: None
        #: the highest sequence the service applied, as the cluster said when it closed
        #: the session (else the highest it confirmed)
        self.last_applied = 0

        # Egress: received application messages, admin requests awaiting a response.
        # Received messages, and the service's errors in their place (ServiceErrorEvent,
        # ``errors_waiting`` of them: while none waits, the backlog is plain messages).
        self.backlog: deque[SessionMessageHeader | ServiceErrorEvent] = deque()
        self.errors_waiting = 0
        self.replies_dropped = 0
        #: the highest of the service's numbered replies received in order: each message
        #: this client sends says so, and every member forgets what it kept up to it
        #: (exactly once out); a reply numbered at most this is a duplicate
        self.received_reply = 0
        self.backlog_exceeded = False
        self._admin: dict[int, AdminWaiter] = {}
        self.queries = Queries()
        """The queries in flight (``query()``), by correlation id."""

    # ------------------------------------------------------------------ lifecycle

    def on_granted(self, result: ConnectResult, leader_endpoint: Endpoint) -> None:
        """The handshake succeeded: the session is open, its leader at ``leader_endpoint``."""
        self.cluster_session_id = result.cluster_session_id
        self.leadership_term_id = result.leadership_term_id
        self.leader_member_id = result.leader_member_id
        self.endpoints = merge_endpoints(self.given, result.endpoints)
        self.leader_endpoint = leader_endpoint
        self.session_secret = result.session_secret
        self.open = True

    def resume_frame(self, correlation_id: int) -> bytes:
        """The first frame on a new ingress connection of an open session: the proof
        that it holds the session (the cluster takes nothing else from it before)."""
        return encode_frame(
            SessionResumeRequest(
                correlation_id=correlation_id,
                cluster_session_id=self.cluster_session_id,
                version=PROTOCOL_VERSION,
                session_secret=self.session_secret,
                reply=self.received_reply,
            )
        )

    def check_usable(self) -> None:
        """Raise unless messages may be queued (open, and neither closing nor closed)."""
        if self.close_reason is not None:
            raise self.closed_error()
        if self.closing:
            raise SessionClosedError(CloseReason.CLIENT_ACTION.name)
        if not self.open:
            raise NotConnectedError("the client has no session")

    def closed_error(self) -> SessionClosedError:
        """The error for using the closed session."""
        reason = self.close_reason or CloseReason.CLIENT_ACTION.name
        applied = max(self.last_applied, self.outbox.confirmed)
        if self.lost:
            return SessionLostError(reason, last_applied=applied)
        return SessionClosedError(reason, last_applied=applied)

    def mark_closed(self, reason: str, *, lost: bool = False) -> None:
        """Record why the session closed (the first reason wins); wake admin waiters.

        The shell wakes its own tasks after this."""
        if self.close_reason is None:
            self.close_reason = reason
            self.lost = lost
        for waiter in self._admin.values():
            waiter.wake()
        self.queries.wake_all()

    # ------------------------------------------------------------------ ingress queue

    def enqueue(self, message: Any) -> int:
        """Append one ingress message to ``pending`` and wake the writer.

        Returns how many bytes are now queued; raises :class:`ValueError` (queueing
        nothing) if the message exceeds ``max_frame_size``."""
        buf = self.pending
        start = len(buf)
        encode_frames_into(buf, (message,))
        end = len(buf)
        size = end - start - 4
        if size > self.max_frame_size:
            del buf[start:]
            raise ValueError(
                f"message of {size} bytes exceeds max_frame_size {self.max_frame_size}"
            )
        self._wake_writer()
        return end

    def offer_message(self, payload: bytes | bytearray | memoryview) -> int:
        """Number one application message, keep it until it is applied, queue it
        (:meth:`enqueue`); returns how many bytes are now queued."""
        kept = payload if type(payload) is bytes else bytes(payload)  # never changed later
        outbox = self.outbox
        sequence = outbox.add(kept)
        try:
            return self.enqueue(
                SessionMessageHeader(
                    self.leadership_term_id,
                    self.cluster_session_id,
                    0,
                    kept,
                    sequence,
                    self.received_reply,
                )
            )
        except ValueError:  # too big: never offered
            outbox.unadd()
            raise

    def keepalive(self) -> SessionKeepAlive:
        """A keepalive, saying how far this client's messages go (a leader whose log
        holds less asks for the rest again)."""
        return SessionKeepAlive(
            self.leadership_term_id, self.cluster_session_id, self.outbox.sequence
        )

    def confirm(self, applied: int) -> None:
        """The cluster says the service applied the messages up to ``applied``."""
        if self.outbox.confirm(applied):
            self.wake_space()

    def resend(self, logged: int) -> None:
        """The leader asked again for the messages after ``logged`` (the last of its
        log): queue every kept one after it, re-encoded for the current term, ahead of
        the other frames queued (keepalives, requests, a close).  The messages queued
        are all kept, so none is queued twice."""
        term, session_id, received = (
            self.leadership_term_id,
            self.cluster_session_id,
            self.received_reply,
        )
        decoder = FrameDecoder(max(self.max_frame_size, 1 << 16))
        others = [
            msgspec.structs.replace(message, leadership_term_id=term)
            for message in (INGRESS.decode(body) for body in decoder.feed(self.pending))
            if type(message) is not SessionMessageHeader
        ]
        out = bytearray()
        encode_frames_into(
            out,
            [
                SessionMessageHeader(term, session_id, 0, payload, sequence, received)
                for sequence, payload in self.outbox.after(logged)
            ],
        )
        encode_frames_into(out, others)
        self.pending = out
        self._wake_writer()

    def retarget(self, buf: bytearray | bytes) -> bytearray:
        """Re-encode queued ingress frames with the current leadership term.

        A leader drops ingress messages whose term is not its own, so messages queued
        before a NewLeaderEvent are rewritten before they go to the new leader.
        """
        term = self.leadership_term_id
        decoder = FrameDecoder(max(self.max_frame_size, 1 << 16))
        messages = [
            msgspec.structs.replace(INGRESS.decode(body), leadership_term_id=term)
            for body in decoder.feed(buf)
        ]
        out = bytearray()
        encode_frames_into(out, messages)
        return out

    # ------------------------------------------------------------------ egress

    def backlog_ready(self) -> bool:
        """True if a received message waits; raises if none ever will."""
        if self.backlog_exceeded:
            raise EgressBacklogExceededError(self.max_egress_backlog)
        if self.backlog:
            return True
        if self.close_reason is not None:
            raise self.closed_error()
        if not self.open:
            raise NotConnectedError("the client has no session")
        return False

    def take(self) -> SessionMessageHeader:
        """The oldest received message (one waits: :meth:`backlog_ready`); raises
        :class:`ServiceError` if the service raised on the message in its place."""
        message = self.backlog.popleft()
        if type(message) is ServiceErrorEvent:
            self.errors_waiting -= 1
            raise _service_error(message)
        return message  # type: ignore[return-value]

    def take_payloads(self, max_messages: int) -> list[bytes]:
        """The payloads of the received messages, oldest first, at most
        ``max_messages`` (one waits), up to the first of the service's errors; that
        error is raised when it comes first (:meth:`take`)."""
        backlog = self.backlog
        if not self.errors_waiting:  # only messages: the fast path
            messages = cast("deque[SessionMessageHeader]", backlog)
            if len(messages) <= max_messages:
                payloads = [m.payload for m in messages]
                messages.clear()
                return payloads
            pop = messages.popleft
            return [pop().payload for _ in range(max_messages)]
        if type(backlog[0]) is ServiceErrorEvent:
            self.take()  # raises
        taken: list[bytes] = []
        while len(taken) < max_messages and backlog:
            message = backlog[0]
            if type(message) is ServiceErrorEvent:
                break
            taken.append(cast(SessionMessageHeader, backlog.popleft()).payload)
        return taken

    def add_admin_waiter(self, correlation_id: int, wake: Callable[[], None]) -> AdminWaiter:
        """Expect the ``AdminResponse`` to ``correlation_id``; ``wake`` is called once."""
        waiter = AdminWaiter(wake)
        self._admin[correlation_id] = waiter
        return waiter

    def remove_admin_waiter(self, correlation_id: int) -> None:
        """Stop expecting that response (it came, or the caller gave up)."""
        self._admin.pop(correlation_id, None)

    def on_egress(self, message: Any) -> Action | None:
        """Handle one egress message once the session is open (see the module's table)."""
        session_id = self.cluster_session_id
        if isinstance(message, SessionMessageHeader):
            if message.cluster_session_id != session_id:
                return None
            applied, outbox = message.sequence, self.outbox
            if applied > outbox.confirmed:  # Outbox.confirm, inline: the hot path
                outbox.confirmed = applied if applied < outbox.sequence else outbox.sequence
                self.wake_space()
            number, gap = message.reply, None
            if number:  # numbered (exactly once out): the next, else a duplicate or a gap
                if number <= self.received_reply:
                    return None  # a new leader sent it again: the application has it
                if number != self.received_reply + 1:
                    gap = self._gap(number)
                self.received_reply = number
            if self.backlog_exceeded:
                return gap
            backlog = self.backlog
            if len(backlog) < self.max_egress_backlog:  # the hot path, inline
                backlog.append(message)
                self._wake_receivers()
            else:
                self._to_backlog(message)
            return gap
        elif isinstance(message, SessionEvent):
            if message.cluster_session_id != session_id:
                return None
            code = message.code
            if code is EventCode.CLOSED or code is EventCode.ERROR:
                # ERROR: the cluster refused this client's proof of the session
                self.last_applied = max(self.last_applied, message.last_applied)
                return Closed(message.detail or code.name)
            if code is EventCode.REDIRECT:
                return self._on_redirect(message)
        elif isinstance(message, SessionAck):
            if message.cluster_session_id == session_id:
                self.confirm(message.applied)
                if message.resend and message.leadership_term_id >= self.leadership_term_id:
                    self.resend(message.logged)
        elif isinstance(message, NewLeaderEvent):
            if message.cluster_session_id == session_id:
                return self._on_new_leader(message)
        elif isinstance(message, QueryResponse):
            if message.cluster_session_id == session_id:
                self.queries.on_response(message)
        elif isinstance(message, AdminResponse) and message.cluster_session_id == session_id:
            waiter = self._admin.get(message.correlation_id)
            if waiter is not None and waiter.response is None:
                waiter.response = message
                waiter.wake()
        elif isinstance(message, ServiceErrorEvent):
            if message.cluster_session_id != session_id:
                return None
            number, gap = message.reply, None
            if number:
                if number <= self.received_reply:
                    return None
                if number != self.received_reply + 1:
                    gap = self._gap(number)
                self.received_reply = number
            if not self.backlog_exceeded:
                self.errors_waiting += 1
                self._to_backlog(message)
            return gap
        elif (
            isinstance(message, RepliesDropped)
            and message.cluster_session_id == session_id
            and message.count > 0
        ):
            self.replies_dropped += message.count
            return Dropped(message.count)
        return None

    def _gap(self, number: int) -> Dropped:
        """Reply ``number`` came after a gap: the ones between are gone for good (the
        members keep a session's replies only up to ``--max-kept-replies``)."""
        count = number - self.received_reply - 1
        self.replies_dropped += count
        return Dropped(count)

    def _to_backlog(self, message: SessionMessageHeader | ServiceErrorEvent) -> None:
        if len(self.backlog) >= self.max_egress_backlog:
            self.backlog_exceeded = True
            self.backlog.clear()
            self.errors_waiting = 0
        else:
            self.backlog.append(message)
        self._wake_receivers()

    def _on_redirect(self, event: SessionEvent) -> Reconnect | Redial | None:
        """A member this client resumed on does not lead: go to the one that does.
        A REDIRECT naming no leader (an election is on) means: wait here, this member
        will say when the leader changes.  One naming the leader and term this client
        has (a leader it could not reach: paused, or cut off from this client only)
        means: dial that leader again (:class:`Redial`), for it still leads, as far as
        the cluster knows: waiting here would let the session time out on a leader
        that merely paused.  The same member leading a newer term is a new leader."""
        if event.leadership_term_id < self.leadership_term_id or event.leader_member_id < 0:
            return None
        if (
            event.leader_member_id == self.leader_member_id
            and event.leadership_term_id == self.leadership_term_id
        ):
            if self.leader_endpoint is None:
                return None
            return Redial(self.leader_member_id, self.leader_endpoint)
        if event.detail:
            with suppress(ValueError):
                self.endpoints = merge_endpoints(self.given, parse_endpoints(event.detail))
        endpoint = self.endpoints.get(event.leader_member_id)
        if endpoint is None:
            return None
        term_changed = event.leadership_term_id != self.leadership_term_id
        self.leadership_term_id = event.leadership_term_id
        self.leader_member_id = event.leader_member_id
        self.leader_endpoint = endpoint
        if term_changed and self.pending:  # queued messages name the new term
            self.pending = self.retarget(self.pending)
        self.queries.wake_all()  # asked again, to go to the leader
        return Reconnect(event.leader_member_id, endpoint)

    def _on_new_leader(self, event: NewLeaderEvent) -> Reconnect | None:
        if event.leadership_term_id < self.leadership_term_id or self.close_reason is not None:
            return None  # stale
        if event.ingress_endpoints:
            with suppress(ValueError):  # keep the endpoints we know
                advertised = parse_endpoints(event.ingress_endpoints)
                self.endpoints = merge_endpoints(self.given, advertised)
        term_changed = event.leadership_term_id != self.leadership_term_id
        endpoint = self.endpoints.get(event.leader_member_id) or self.leader_endpoint
        if (
            not term_changed
            and event.leader_member_id == self.leader_member_id
            and endpoint == self.leader_endpoint
        ):
            return None  # the leader we have (a resume's answer, or its heartbeat)
        self.leadership_term_id = event.leadership_term_id
        self.leader_member_id = event.leader_member_id
        if term_changed and self.pending:
            self.pending = self.retarget(self.pending)
        self.leader_endpoint = endpoint
        self.queries.wake_all()  # asked again, to go to the new leader
        return Reconnect(event.leader_member_id, self.leader_endpoint)


def _service_error(event: ServiceErrorEvent) -> ServiceError:
    return ServiceError(
        event.error_type, event.message, event.log_position, event.timestamp, bytes(event.request)
    )
