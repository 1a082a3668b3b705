"""The anyio shell: :class:`ClusterClient`, its tasks and sockets (:func:`connect`, in
:mod:`client._open`, makes one for an ``async with`` block).

Wire model: ingress is one TCP connection to the leader, and by default the cluster
sends the session's egress back on it (an empty ``response_channel``; Aeron's response
channels do the same for clients behind NAT): the ingress watcher decodes it.  With
``egress_host`` the client *listens* for egress as in the seeds: it binds a TCP listener
there (ephemeral port) and sends ``"host:port"`` as the ``response_channel``; the leader
dials it once the session is authenticated.  Every egress message, from either, feeds
the same handler.

The decisions are sans-IO: :class:`~client._connect.AsyncConnect` for the handshake,
:class:`~client._session.Session` for the open session (its state, the queued ingress
frames, the received messages, what an egress message means).  This module owns the
public API and wires the tasks; :mod:`client._handshake` and :mod:`client._ingress` hold
the rest of the shell.

Tasks, all in one task group owned by :func:`~client._open.connect`::

    accept loop        (dial-back only) accepts egress connections, one reader each
    egress readers     decode frames, dispatch messages (bad frames close that connection)
    connectors         (while connecting) dial members until one answers
    ingress watcher    notices when the node closes the ingress connection
    writer             sends the pending ingress buffer, one ``send`` per wake-up
    ingress manager    reconnects to the leader after a break or a NewLeaderEvent
    keepalive          sends SessionKeepAlive when nothing was sent for a while

The first two are here, the connectors in :mod:`client._handshake`, the rest in
:mod:`client._ingress`.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from cluster.protocol import EGRESS, FrameDecoder, ProtocolError
from cluster.protocol.codec import encode_into
from cluster.protocol.egress import AdminResponse, SessionEvent
from cluster.protocol.enums import AdminRequestType, CloseReason
from cluster.protocol.framing import HEADER_LENGTH, LENGTH
from cluster.protocol.ingress import (
    QUERY_FOLLOWER,
    AdminRequest,
    SessionCloseRequest,
    SessionMessageHeader,
)
from cluster.transport.tls import TlsIdentity

from ._connect import AsyncConnect, Done
from ._credentials import CredentialsSupplier
from ._dial import NETWORK_ERRORS, aclose_quietly, describe_failures, peer_role
from ._endpoints import Endpoint, format_endpoints
from ._follower import FollowerReads
from ._handshake import Handshake
from ._ingress import RECEIVE_SIZE, RETRY_DELAY_MIN, Ingress, IngressWriter
from ._outbox import ENTRY_OVERHEAD
from ._query import ask, query_level
from ._session import Action, Dropped, Reconnect, Redial, Session
from ._sync import Backend, Broadcast
from .errors import ConnectTimeoutError, TlsRequiredError
from .events import (
    AdminResponseReceived,
    ClientEvent,
    EventHub,
    NewLeader,
    RepliesDropped,
    SessionClosed,
    SessionEventReceived,
)

__all__ = ["ClusterClient"]

MAX_PENDING_BYTES = 4 << 20
"""Offers wait (backpressure) while this much of the session's messages is not yet
confirmed applied (queued, sent, or kept to be sent again: :mod:`client._outbox`)."""

_FLUSH_HINT_BYTES = 256 << 10  # past this, offers yield so the writer can start sending
_HEADER_ZERO = bytes(HEADER_LENGTH)
_CLOSE_FLUSH_TIMEOUT = 1.0  # close() waits this long for the SessionCloseRequest to go out

_EGRESS_ERRORS: tuple[type[BaseException], ...] = (ProtocolError, *NETWORK_ERRORS)
_TLS_HANDSHAKE_TIMEOUT = 5.0
_TLS_FAILURES: tuple[type[BaseException], ...] = (TimeoutError, ssl.SSLError, *_EGRESS_ERRORS)


class ClusterClient:
    """A session with the cluster (Aeron's ``AeronCluster``).

    Obtain one from :func:`connect`; it is usable until the ``async with`` block ends,
    :meth:`close` is called, or the cluster closes the session.  All methods must be
    called from the event loop that opened it.
    """

    def __init__(
        self,
        endpoints: Mapping[int, Endpoint],
        *,
        credentials: CredentialsSupplier,
        egress_host: str | None,
        keepalive_interval: float,
        max_frame_size: int,
        max_egress_backlog: int,
        identity: TlsIdentity | None = None,
    ) -> None:
        """Internal: use :func:`connect`."""
        self._identity = identity
        self._credentials = credentials
        self._egress_host = egress_host
        self._keepalive_interval = keepalive_interval
        self._next_correlation_id: Callable[[], int] = itertools.count(1).__next__
        self._backend = backend = Backend()

        self._scope = anyio.CancelScope()
        self._tg: anyio.abc.TaskGroup | None = None
        self._response_channel = ""

        self._egress_ready = Broadcast(backend)
        data_ready = Broadcast(backend)
        self._session = session = Session(
            endpoints,
            max_frame_size=max_frame_size,
            max_egress_backlog=max_egress_backlog,
            wake_writer=data_ready.notify,
            wake_receivers=self._egress_ready.notify,
        )
        self._writer = writer = IngressWriter(
            session,
            backend,
            self._spawn,
            data_ready=data_ready,
            lost_before_open=self._lost_before_open,
            on_message=self._on_egress,
            next_correlation_id=self._next_correlation_id,
            tls=None if identity is None else identity.client_context,
        )
        session.wake_space = writer.space_ready.notify  # confirmations make room
        self._handshake = Handshake(
            session, writer, backend, self._spawn, max_events=max_egress_backlog
        )
        self._events = EventHub(backend)
        writer.on_event = self._events.emit
        self._followers = FollowerReads(session, writer.tls, self._spawn, self._next_correlation_id)
        # Bound once: receive() uses it per message.
        self._backlog_ready = session.backlog_ready

    def __repr__(self) -> str:
        session = self._session
        state = (
            f"closed={session.close_reason!r}"
            if session.close_reason is not None
            else ("open" if session.open else "connecting")
        )
        return (
            f"<ClusterClient session={session.cluster_session_id} "
            f"term={session.leadership_term_id} leader={session.leader_member_id} {state}>"
        )

    # ------------------------------------------------------------------ public properties

    @property
    def cluster_session_id(self) -> int:
        """Session id assigned by the cluster (``-1`` before the session is open)."""
        return self._session.cluster_session_id

    @property
    def leader_member_id(self) -> int:
        """Member id of the current leader."""
        return self._session.leader_member_id

    @property
    def leadership_term_id(self) -> int:
        """Current leadership term (ingress messages carry it)."""
        return self._session.leadership_term_id

    @property
    def ingress_endpoints(self) -> str:
        """Ingress endpoints as last learned, ``"0=host:port,1=host:port,..."``."""
        return format_endpoints(self._session.endpoints)

    @property
    def is_closed(self) -> bool:
        """True once the session is closed, by :meth:`close` or by the cluster."""
        return self._session.close_reason is not None

    @property
    def is_ingress_connected(self) -> bool:
        """True while an ingress connection to the leader is up.

        It is down for a moment after the leader's connection breaks or a new leader is
        announced; offers made meanwhile are queued and sent once it is back.
        """
        ingress = self._writer.ingress
        return ingress is not None and not ingress.broken and self._session.close_reason is None

    @property
    def close_reason(self) -> str | None:
        """Why the session closed (``"TIMEOUT"``, ``"CLIENT_ACTION"``...), or ``None``."""
        return self._session.close_reason

    @property
    def last_sequence(self) -> int:
        """The sequence number of the last message this session accepted (they are
        numbered 1, 2, 3... in the order ``offer``, ``try_offer`` and ``offer_many`` took
        them); each is applied exactly once, in that order, while the session is open."""
        return self._session.outbox.sequence

    @property
    def confirmed_sequence(self) -> int:
        """The highest sequence the cluster has confirmed the service applied (the
        messages up to it are no longer kept to be sent again)."""
        return self._session.outbox.confirmed

    @property
    def replies_dropped(self) -> int:
        """Replies to this session that never reached it: the members keep a session's
        replies until it confirms them, and a new leader sends what it lacks, so this
        stays 0 unless more than ``--max-kept-replies`` of them were given while it was
        away (a gap in their numbers; each time, a :class:`RepliesDropped` event)."""
        return self._session.replies_dropped

    # ------------------------------------------------------------------ public API

    async def offer(self, payload: bytes) -> None:
        """Queue ``payload`` for the clustered service, as a ``SessionMessageHeader``.

        The service applies it exactly once, in the order offered, whatever leader
        changes, reconnects and resumes happen while the session is open: each message
        gets the session's next sequence number (:attr:`last_sequence`) and is kept
        until the cluster confirms the service applied it; a leader that takes the
        session, or sees one missing, asks for the rest again and drops what it already
        has.  Offers are batched: they are appended to one buffer that a writer task
        sends with one ``send`` per wake-up.  This only blocks (and yields) when
        :data:`MAX_PENDING_BYTES` of messages are not yet confirmed, or when the queue
        grows big enough that the writer should run.  While the ingress is reconnecting
        (a broken connection, a new leader) offers are queued and sent after the
        reconnect.

        Raises :class:`TypeError` for anything but bytes, bytearray or memoryview,
        :class:`SessionClosedError` once the session is closed (its subclass
        :class:`SessionLostError` when no member answered for ``connect_timeout``), and
        :class:`ValueError` if the message would exceed ``max_frame_size``.
        """
        if type(payload) is not bytes:
            _check_payload(payload)
        await self._backend.checkpoint_if_cancelled()
        session = self._session
        session.check_usable()
        outbox = session.outbox
        while outbox.full(MAX_PENDING_BYTES):
            await self._writer.space_ready.wait()
            session.check_usable()
        queued = session.offer_message(payload)
        if queued >= _FLUSH_HINT_BYTES:
            await self._backend.checkpoint()

    def try_offer(self, payload: bytes) -> bool:
        """Queue ``payload`` without waiting: ``True`` if queued, ``False`` if the
        client is back-pressured (:data:`MAX_PENDING_BYTES` of messages are not yet
        confirmed: try again later), like Aeron's ``offer`` returning ``BACK_PRESSURED``.
        Applied exactly once, in order, as :meth:`offer`'s.

        Raises like :meth:`offer` (``TypeError``, ``SessionClosedError``, ``ValueError``)."""
        if type(payload) is not bytes:
            _check_payload(payload)
        session = self._session
        session.check_usable()
        if session.outbox.full(MAX_PENDING_BYTES):
            return False
        session.offer_message(payload)
        return True

    async def offer_many(self, payloads: Iterable[bytes]) -> int:
        """Queue several payloads in one call, in order; return how many were queued.

        The same as :meth:`offer` for each, with the per-call cost paid once, and the
        burst is sent at once from the caller's task when the socket takes it (under
        Trio), without waiting for the writer task: the way to send a burst.  If the
        session closes part-way, raises like :meth:`offer` (the payloads before that
        point were queued)."""
        await self._backend.checkpoint_if_cancelled()
        session = self._session
        writer = self._writer
        session.check_usable()
        count = 0
        max_frame_size = session.max_frame_size
        header = SessionMessageHeader
        pack_length = LENGTH.pack_into
        # The frames go straight into the pending buffer (what Session.enqueue does per
        # offer), and the writer is told once at the end.  Nothing else runs between
        # two payloads but where this waits for room: only there can the buffer or the
        # session's term change.
        buf = session.pending
        outbox = session.outbox
        kept = outbox.kept
        term, session_id = session.leadership_term_id, session.cluster_session_id
        for payload in payloads:
            if type(payload) is not bytes:
                try:
                    _check_payload(payload)
                except TypeError:
                    writer.data_ready.notify()  # the ones before it were queued
                    raise
                payload = bytes(payload)  # kept until applied: never changed later
            if outbox.kept_bytes >= MAX_PENDING_BYTES and outbox.full(MAX_PENDING_BYTES):
                writer.data_ready.notify()
                while outbox.full(MAX_PENDING_BYTES):
                    await writer.space_ready.wait()
                    session.check_usable()
                buf = session.pending
                term, session_id = session.leadership_term_id, session.cluster_session_id
            start = len(buf)
            buf += _HEADER_ZERO
            sequence = outbox.sequence + 1
            encode_into(header(term, session_id, 0, payload, sequence), buf, start + HEADER_LENGTH)
            size = len(buf) - start - HEADER_LENGTH
            if size > max_frame_size:
                del buf[start:]
                writer.data_ready.notify()
                raise ValueError(f"message of {size} bytes exceeds max_frame_size {max_frame_size}")
            pack_length(buf, start, size)
            outbox.sequence = sequence  # Outbox.add, inline
            kept.append(payload)
            outbox.kept_bytes += len(payload) + ENTRY_OVERHEAD
            count += 1
        writer.send_now()
        if session.pending:  # not all sent from here: the writer task sends the rest
            writer.data_ready.notify()
        if len(session.pending) >= _FLUSH_HINT_BYTES:
            await self._backend.checkpoint()
        return count

    async def receive(self) -> bytes:
        """Wait for the next application message on the egress and return its payload.

        Messages that arrived before the session closed are still returned; after them
        this raises :class:`SessionClosedError`.  Where the service raised on one of
        this session's messages, this raises :class:`ServiceError` in the place of its
        reply, once; the session stays open.  If more than ``max_egress_backlog``
        messages were waiting, raises :class:`EgressBacklogExceededError`.
        """
        return (await self.receive_message()).payload

    async def receive_message(self) -> SessionMessageHeader:
        """Like :meth:`receive`, but return the whole message (with its cluster timestamp)."""
        await self._backend.checkpoint_if_cancelled()
        while not self._backlog_ready():
            await self._egress_ready.wait()
        return self._session.take()

    async def receive_many(self, max_messages: int = 4096) -> list[bytes]:
        """Wait for the next application message, then return the payloads of all that
        are waiting (at most ``max_messages``), oldest first: the way to drain a burst.

        Raises like :meth:`receive`; a :class:`ServiceError` ends the list before it
        and is raised by the next call."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be positive, got {max_messages!r}")
        await self._backend.checkpoint_if_cancelled()
        while not self._backlog_ready():
            await self._egress_ready.wait()
        return self._session.take_payloads(max_messages)

    async def query(self, payload: bytes, *, consistency: str = "linearizable") -> bytes:
        """Ask the service a read-only question; return its ``on_query`` answer.

        No log entry, no disk write: the leader answers from the service's state once
        it has confirmed it still leads (a heartbeat round to a quorum, begun after the
        query arrived) and applied every write acknowledged before the query was sent
        (``consistency="linearizable"``, the default: ReadIndex).  ``"follower"``: any
        member answers from the state it has applied, never older than what this client
        has seen (any answer, and its own writes the cluster confirmed); the client asks
        the members in turn, each over a query connection it opens on first use
        (:mod:`client._follower`).  See ``docs/queries.md``.  A query changes nothing,
        so it is asked again by itself across leader changes, lost connections and
        members that do not answer.

        Raises :class:`ServiceError` when ``on_query`` raises or the service answers no
        queries, :class:`QueryRefusedError` when the cluster cannot answer it as asked,
        :class:`ValueError` for an unknown ``consistency`` or a payload over
        ``max_frame_size``, :class:`SessionClosedError` once the session is closed."""
        if type(payload) is not bytes:
            _check_payload(payload)
            payload = bytes(payload)
        level = query_level(consistency)
        await self._backend.checkpoint_if_cancelled()
        if level == QUERY_FOLLOWER:
            return await self._followers.ask(payload, self._next_correlation_id())
        return await ask(self._session, payload, level, self._next_correlation_id())

    async def request_snapshot(self, *, timeout: float = 5.0) -> AdminResponse:  # noqa: ASYNC109
        """Ask the cluster to take a snapshot; return the matching ``AdminResponse``.

        Check ``response.response_code`` for the outcome.  Raises :class:`TimeoutError`
        if no response arrives within ``timeout`` seconds, and
        :class:`SessionClosedError` if the session closes first.
        """
        await self._backend.checkpoint_if_cancelled()
        session = self._session
        session.check_usable()
        correlation_id = self._next_correlation_id()
        event = anyio.Event()
        waiter = session.add_admin_waiter(correlation_id, event.set)
        try:
            session.enqueue(
                AdminRequest(
                    session.leadership_term_id,
                    session.cluster_session_id,
                    correlation_id,
                    AdminRequestType.SNAPSHOT,
                )
            )
            with anyio.fail_after(timeout):
                await event.wait()
        except TimeoutError:
            raise TimeoutError(f"no answer to the snapshot request within {timeout:g} s") from None
        finally:
            session.remove_admin_waiter(correlation_id)
        if waiter.response is None:
            raise session.closed_error()
        return waiter.response

    def events(self, *, limit: int = 1024) -> AsyncIterator[ClientEvent]:
        """The session's events from now on, in order, as an async iterator: session
        events, new leaders, admin responses (asked for here or not), ingress
        connections lost and made again, and last :class:`~client.events.SessionClosed`
        (see :mod:`client.events`).  Several iterators may run at once; one that falls
        ``limit`` events behind loses the oldest (and is told how many)."""
        return self._events.iterate(limit)

    async def send_keepalive(self) -> None:
        """Queue a ``SessionKeepAlive`` now (the client also sends them when idle)."""
        await self._backend.checkpoint_if_cancelled()
        session = self._session
        session.check_usable()
        session.enqueue(session.keepalive())

    async def close(self) -> None:
        """Close the session: send ``SessionCloseRequest``, then stop every task.

        Waits up to one second for the close request to be sent.  Idempotent; the
        ``async with connect(...)`` block calls it on exit.
        """
        session = self._session
        if session.closing:
            await self._backend.checkpoint()
            return
        session.closing = True
        with anyio.CancelScope(shield=True):
            if session.open and session.close_reason is None:
                session.enqueue(
                    SessionCloseRequest(session.leadership_term_id, session.cluster_session_id)
                )
                with anyio.move_on_after(_CLOSE_FLUSH_TIMEOUT):
                    await self._writer.flush_for_close()
            self._mark_closed(CloseReason.CLIENT_ACTION.name)
            await self._followers.aclose()
            self._scope.cancel()
            for ingress in list(self._writer.ingresses):
                await self._writer.close_ingress(ingress)

    # ------------------------------------------------------------------ internals

    def _mark_closed(self, reason: str, *, lost: bool = False) -> None:
        """The session is closed (by close() or by the cluster): wake every waiting task."""
        self._session.mark_closed(reason, lost=lost)
        self._events.emit(SessionClosed(self._session.close_reason or reason, self._session.lost))
        writer = self._writer
        for broadcast in (
            self._egress_ready,
            writer.space_ready,
            writer.data_ready,
            writer.flushed,
            writer.ingress_changed,
            self._handshake.changed,
        ):
            broadcast.notify()

    def _lost_before_open(self, ingress: Ingress) -> None:
        """The writer dropped a connection during the handshake (which is built after it)."""
        self._handshake.on_lost(ingress)

    async def _run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the background task group; bind the egress listener, then report started."""
        with self._scope:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                host = self._egress_host
                if host is None:  # egress comes back on the ingress connection
                    self._writer.own_egress = True
                    task_status.started()
                    await anyio.sleep_forever()  # the task group lives for the session
                    return
                listener = await anyio.create_tcp_listener(local_host=host, local_port=0)
                port = listener.extra(anyio.abc.SocketAttribute.local_port)
                self._response_channel = str(Endpoint(host, port))
                for sub in listener.listeners:
                    assert isinstance(sub, anyio.abc.SocketListener)
                    tg.start_soon(self._accept_loop, sub)
                task_status.started()

    def _spawn(self, func: Callable[..., Any], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(func, *args)

    async def _accept_loop(self, listener: anyio.abc.SocketListener) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                except OSError:  # e.g. out of file descriptors: back off, keep serving
                    await anyio.sleep(RETRY_DELAY_MIN)
                    continue
                self._spawn(self._egress_reader, stream)

    async def _egress_reader(self, raw: anyio.abc.SocketStream) -> None:
        """Decode one egress connection; a bad frame closes it (the others carry on).
        With certificates, only a member of the cluster may send egress."""
        decoder = FrameDecoder(self._session.max_frame_size)
        on_egress = self._on_egress
        stream: anyio.abc.ByteStream = raw
        if self._identity is not None:
            try:
                with anyio.fail_after(_TLS_HANDSHAKE_TIMEOUT):
                    stream = await TLSStream.wrap(
                        raw,
                        server_side=True,
                        ssl_context=self._identity.server_context,
                        standard_compatible=False,
                    )
            except _TLS_FAILURES:
                await aclose_quietly(raw)
                return
            if peer_role(stream) != "member":
                await aclose_quietly(stream)
                return
        async with stream:
            try:
                while True:
                    data = await stream.receive(RECEIVE_SIZE)
                    self._writer.trouble_since = None  # a member answered
                    messages: list[Any] = []
                    try:
                        decoder.decode_into(data, EGRESS, messages)
                    finally:  # what came before a bad frame still counts
                        for message in messages:
                            on_egress(message)
            except _EGRESS_ERRORS:
                return

    def _on_egress(self, message: Any) -> None:
        session = self._session
        if session.open:
            if self._events.watched:
                self._report(message)
                return
            action = session.on_egress(message)
            if action is not None:
                self._carry_out(action)
        else:
            self._handshake.on_egress(message)

    def _report(self, message: Any) -> None:
        """Handle ``message`` and tell the events() iterators what it meant."""
        session = self._session
        leader = (session.leader_member_id, session.leadership_term_id)
        action = session.on_egress(message)
        if getattr(message, "cluster_session_id", None) == session.cluster_session_id:
            emit = self._events.emit
            if isinstance(message, SessionEvent):
                emit(
                    SessionEventReceived(
                        message.code.name,
                        message.detail,
                        message.leader_member_id,
                        message.leadership_term_id,
                    )
                )
            elif isinstance(message, AdminResponse):
                emit(AdminResponseReceived(message))
            if (session.leader_member_id, session.leadership_term_id) != leader:
                emit(
                    NewLeader(
                        session.leader_member_id,
                        session.leadership_term_id,
                        format_endpoints(session.endpoints),
                    )
                )
        if action is not None:
            self._carry_out(action)

    def _carry_out(self, action: Action) -> None:
        """Do what the session decided an egress message means."""
        if isinstance(action, Reconnect):
            self._writer.on_reconnect(action)
        elif isinstance(action, Redial):
            self._writer.on_redial(action)
        elif isinstance(action, Dropped):
            self._events.emit(RepliesDropped(action.count, self._session.replies_dropped))
        else:
            self._mark_closed(action.reason)

    async def _establish(self, connect_timeout: float) -> None:
        """Run the handshake; raise on refusal or ``ConnectTimeoutError``."""
        self._connect_timeout = connect_timeout
        machine = AsyncConnect(
            self._session.endpoints,
            self._credentials,
            self._next_correlation_id,
            clock=self._backend.current_time,  # a silent member: ask the others too
        )
        try:
            with anyio.fail_after(connect_timeout):
                done, chosen = await self._handshake.drive(machine, self._response_channel)
                self._conclude(machine, done, chosen)
        except TlsRequiredError:  # a ConnectTimeoutError of its own, before the timeout
            raise
        except TimeoutError:
            failures = self._writer.failures
            if failures and not self._handshake.reached_any:
                raise ConnectTimeoutError(
                    f"no member accepted a connection within {connect_timeout:g} s: "
                    f"{describe_failures(failures, machine.targets)}"
                ) from None
            dials = describe_failures(failures, machine.targets) if failures else ""
            raise ConnectTimeoutError(
                f"no cluster session within {connect_timeout:g} s "
                f"(stuck in {machine.state.name}, members {format_endpoints(machine.targets)}"
                f"{'; last dials: ' + dials if dials else ''})"
            ) from None
        finally:
            self._handshake.stop_connectors()

    def _conclude(self, machine: AsyncConnect, done: Done, chosen: Ingress) -> None:
        """Session granted: switch to the open state without losing queued egress."""
        writer = self._writer
        handshake = self._handshake
        self._session.on_granted(done.result, chosen.endpoint)
        handshake.stop_connectors()
        writer.ingress = None if chosen.broken else chosen
        writer.last_sent = anyio.current_time()
        writer.trouble_since = None
        writer.failures.clear()
        # dial-back: only the leader answers, and an election may take a while
        writer.lost_after = self._connect_timeout * (1 if writer.own_egress else 4)
        writer.on_lost = lambda reason: self._mark_closed(reason, lost=True)
        for kind, item in handshake.take_leftovers():
            if kind == "egress":
                self._on_egress(item)
            elif kind == "connected":
                self._spawn(writer.close_ingress, item)
        machine.on_concluded()
        self._spawn(writer.write_loop)
        self._spawn(writer.maintain_loop)
        self._spawn(writer.keepalive_loop, self._keepalive_interval)
        if writer.own_egress:
            self._spawn(writer.liveness_loop)


# ---------------------------------------------------------------------- connect()


def _check_payload(payload: object) -> None:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(
            f"a message must be bytes, bytearray or memoryview, not {type(payload).__name__}"
            + (" (encode the text first, e.g. text.encode())" if isinstance(payload, str) else "")
        )
