"""The anyio shell around :class:`~client._connect.AsyncConnect`: sockets, tasks, timers.

Wire model (as in Aeron): the client *listens* for egress.  It binds a TCP listener on
``egress_host`` (ephemeral port) and sends ``"host:port"`` as the ``response_channel`` of
its ``SessionConnectRequest``; cluster members dial that address and write
length-prefixed egress frames.  Every accepted egress connection feeds the same handler.
Ingress is one TCP connection to the leader on which the client only writes.

Tasks, all in one task group owned by :func:`connect`::

    accept loop        accepts egress connections, one reader task each
    egress readers     decode frames, dispatch messages (bad frames close that connection)
    connectors         (while connecting) dial members until one answers
    ingress watcher    notices when the node closes the ingress connection
    writer             sends the pending ingress buffer, one ``send`` per wake-up
    ingress manager    reconnects to the leader after a break or a NewLeaderEvent
    keepalive          sends SessionKeepAlive when nothing was sent for a while
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import msgspec

from cluster.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    EGRESS,
    INGRESS,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    encode_frames_into,
)
from cluster.protocol.codec import encode_into
from cluster.protocol.egress import AdminResponse, NewLeaderEvent, SessionEvent
from cluster.protocol.enums import AdminRequestType, CloseReason, EventCode
from cluster.protocol.framing import HEADER_LENGTH, LENGTH
from cluster.protocol.ingress import (
    AdminRequest,
    SessionCloseRequest,
    SessionKeepAlive,
    SessionMessageHeader,
)

from ._connect import AsyncConnect, ConnectIngress, Done, Fail, SendMessage
from ._credentials import CredentialsSupplier, as_credentials_supplier
from ._endpoints import Endpoint, format_endpoints, parse_endpoints
from ._exception_groups import raise_unwrapped
from ._sync import Backend, Broadcast
from .errors import (
    ConnectTimeoutError,
    EgressBacklogExceededError,
    NotConnectedError,
    SessionClosedError,
)

__all__ = ["ClusterClient", "connect"]

MAX_PENDING_BYTES = 4 << 20
"""Offers wait (backpressure) while this much ingress is queued but not yet sent."""

_FLUSH_HINT_BYTES = 256 << 10  # past this, offers yield so the writer can start sending
_HEADER_ZERO = bytes(HEADER_LENGTH)
_CONNECT_ATTEMPT_TIMEOUT = 1.0  # one TCP connect attempt
_RETRY_DELAY_MIN = 0.05
_RETRY_DELAY_MAX = 0.5
_RECONNECT_ATTEMPTS = 5  # to the same leader, before waiting for a NewLeaderEvent
_CLOSE_FLUSH_TIMEOUT = 1.0  # close() waits this long for the SessionCloseRequest to go out
_RECEIVE_SIZE = 1 << 18

_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)
_EGRESS_ERRORS: tuple[type[BaseException], ...] = (ProtocolError, *_NETWORK_ERRORS)


def _retry_delay(attempt: int) -> float:
    return float(min(_RETRY_DELAY_MAX, _RETRY_DELAY_MIN * 2 ** max(0, attempt - 1)))


class _Ingress:
    """One ingress TCP connection to a member; its watcher task runs under ``scope``."""

    __slots__ = ("broken", "endpoint", "member_id", "scope", "send_nowait", "stream", "tail")

    def __init__(
        self, member_id: int, endpoint: Endpoint, stream: anyio.abc.SocketStream, *, direct: bool
    ) -> None:
        self.member_id = member_id
        self.endpoint = endpoint
        self.stream = stream
        self.scope = anyio.CancelScope()
        self.broken = False
        # Under Trio the socket is non-blocking and only ever written by whoever holds
        # the client's ``_writing`` turn, so a burst can go out from the caller's task.
        self.send_nowait: Callable[[bytearray], int] | None = None
        if direct:
            with suppress(anyio.TypedAttributeLookupError):
                self.send_nowait = stream.extra(anyio.abc.SocketAttribute.raw_socket).send
        # the rest of a frame whose start went out on this connection: it goes first
        self.tail = b""


@dataclass(slots=True)
class _AdminWaiter:
    event: anyio.Event
    response: AdminResponse | None = None


async def _aclose_quietly(resource: anyio.abc.AsyncResource) -> None:
    with anyio.CancelScope(shield=True):
        with suppress(*_NETWORK_ERRORS):
            await resource.aclose()


async def _try_connect(endpoint: Endpoint) -> anyio.abc.SocketStream | None:
    """One TCP connect attempt; ``None`` if refused, unreachable or too slow."""
    try:
        with anyio.fail_after(_CONNECT_ATTEMPT_TIMEOUT):
            return await anyio.connect_tcp(endpoint.host, endpoint.port)
    except (OSError, TimeoutError):
        return None


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
        egress_host: str,
        keepalive_interval: float,
        max_frame_size: int,
        max_egress_backlog: int,
    ) -> None:
        """Internal: use :func:`connect`."""
        self._endpoints: dict[int, Endpoint] = dict(endpoints)
        self._credentials = credentials
        self._egress_host = egress_host
        self._keepalive_interval = keepalive_interval
        self._max_frame_size = max_frame_size
        self._max_egress_backlog = max_egress_backlog
        self._next_correlation_id: Callable[[], int] = itertools.count(1).__next__
        self._backend = backend = Backend()

        self._scope = anyio.CancelScope()
        self._tg: anyio.abc.TaskGroup | None = None
        self._response_channel = ""

        # Session state (valid once _open).
        self._open = False
        self._closing = False
        self._close_reason: str | None = None
        self._cluster_session_id = -1
        self._leadership_term_id = -1
        self._leader_member_id = -1

        # Handshake plumbing.
        self._hs_events: deque[tuple[str, Any]] = deque()
        self._hs_changed = Broadcast(backend)
        self._connector_scope: anyio.CancelScope | None = None

        # Ingress.
        self._ingress: _Ingress | None = None
        self._ingresses: set[_Ingress] = set()  # every ingress stream not yet closed
        self._leader_endpoint: Endpoint | None = None
        self._target_version = 0
        self._reconnect_exhausted = False
        self._ingress_changed = Broadcast(backend)

        # Writer.
        self._pending = bytearray()
        self._writing = False
        self._last_sent = 0.0
        self._data_ready = Broadcast(backend)
        self._space_ready = Broadcast(backend)
        self._flushed = Broadcast(backend)

        # Egress.
        self._backlog: deque[SessionMessageHeader] = deque()
        self._backlog_exceeded = False
        self._egress_ready = Broadcast(backend)
        self._admin: dict[int, _AdminWaiter] = {}

    def __repr__(self) -> str:
        state = (
            f"closed={self._close_reason!r}"
            if self._close_reason is not None
            else ("open" if self._open else "connecting")
        )
        return (
            f"<ClusterClient session={self._cluster_session_id} "
            f"term={self._leadership_term_id} leader={self._leader_member_id} {state}>"
        )

    # ------------------------------------------------------------------ public properties

    @property
    def cluster_session_id(self) -> int:
        """Session id assigned by the cluster (``-1`` before the session is open)."""
        return self._cluster_session_id

    @property
    def leader_member_id(self) -> int:
        """Member id of the current leader."""
        return self._leader_member_id

    @property
    def leadership_term_id(self) -> int:
        """Current leadership term (ingress messages carry it)."""
        return self._leadership_term_id

    @property
    def ingress_endpoints(self) -> str:
        """Ingress endpoints as last learned, ``"0=host:port,1=host:port,..."``."""
        return format_endpoints(self._endpoints)

    @property
    def is_closed(self) -> bool:
        """True once the session is closed, by :meth:`close` or by the cluster."""
        return self._close_reason is not None

    @property
    def is_ingress_connected(self) -> bool:
        """True while an ingress connection to the leader is up.

        It is down for a moment after the leader's connection breaks or a new leader is
        announced; offers made meanwhile are queued and sent once it is back.
        """
        ingress = self._ingress
        return ingress is not None and not ingress.broken and self._close_reason is None

    @property
    def close_reason(self) -> str | None:
        """Why the session closed (``"TIMEOUT"``, ``"CLIENT_ACTION"``...), or ``None``."""
        return self._close_reason

    # ------------------------------------------------------------------ public API

    async def offer(self, payload: bytes) -> None:
        """Queue ``payload`` for the clustered service, as a ``SessionMessageHeader``.

        Offers are batched: they are appended to one buffer that a writer task sends
        with one ``send`` per wake-up.  This only blocks (and yields) when more than
        :data:`MAX_PENDING_BYTES` are queued, or when the queue grows big enough that the
        writer should run.  While the ingress is reconnecting (a broken connection, a
        new leader) offers are queued and sent after the reconnect.

        Raises :class:`SessionClosedError` once the session is closed, and
        :class:`ValueError` if the message would exceed ``max_frame_size``.
        """
        await self._backend.checkpoint_if_cancelled()
        self._check_usable()
        while len(self._pending) >= MAX_PENDING_BYTES:
            await self._space_ready.wait()
            self._check_usable()
        self._enqueue(
            SessionMessageHeader(self._leadership_term_id, self._cluster_session_id, 0, payload)
        )
        if len(self._pending) >= _FLUSH_HINT_BYTES:
            await self._backend.checkpoint()

    async def offer_many(self, payloads: Iterable[bytes]) -> int:
        """Queue several payloads in one call, in order; return how many were queued.

        The same as :meth:`offer` for each, with the per-call cost paid once, and the
        burst is sent at once from the caller's task when the socket takes it (under
        Trio), without waiting for the writer task: the way to send a burst.  If the
        session closes part-way, raises like :meth:`offer` (the payloads before that
        point were queued)."""
        await self._backend.checkpoint_if_cancelled()
        self._check_usable()
        count = 0
        max_frame_size = self._max_frame_size
        header = SessionMessageHeader
        pack_length = LENGTH.pack_into
        # The frames go straight into the pending buffer (what _enqueue does per offer),
        # and the writer is told once at the end.
        for payload in payloads:
            if len(self._pending) >= MAX_PENDING_BYTES:
                self._data_ready.notify()
                while len(self._pending) >= MAX_PENDING_BYTES:
                    await self._space_ready.wait()
                    self._check_usable()
            buf = self._pending
            start = len(buf)
            buf += _HEADER_ZERO
            encode_into(
                header(self._leadership_term_id, self._cluster_session_id, 0, payload),
                buf,
                start + HEADER_LENGTH,
            )
            size = len(buf) - start - HEADER_LENGTH
            if size > max_frame_size:
                del buf[start:]
                self._data_ready.notify()
                raise ValueError(f"message of {size} bytes exceeds max_frame_size {max_frame_size}")
            pack_length(buf, start, size)
            count += 1
        self._data_ready.notify()
        self._send_now()
        if len(self._pending) >= _FLUSH_HINT_BYTES:
            await self._backend.checkpoint()
        return count

    async def receive(self) -> bytes:
        """Wait for the next application message on the egress and return its payload.

        Messages that arrived before the session closed are still returned; after them
        this raises :class:`SessionClosedError`.  If more than ``max_egress_backlog``
        messages were waiting, raises :class:`EgressBacklogExceededError`.
        """
        return (await self.receive_message()).payload

    async def receive_message(self) -> SessionMessageHeader:
        """Like :meth:`receive`, but return the whole message (with its cluster timestamp)."""
        await self._backend.checkpoint_if_cancelled()
        while not self._backlog_ready():
            await self._egress_ready.wait()
        return self._backlog.popleft()

    async def receive_many(self, max_messages: int = 4096) -> list[bytes]:
        """Wait for the next application message, then return the payloads of all that
        are waiting (at most ``max_messages``), oldest first: the way to drain a burst.

        Raises like :meth:`receive`."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be positive, got {max_messages!r}")
        await self._backend.checkpoint_if_cancelled()
        while not self._backlog_ready():
            await self._egress_ready.wait()
        backlog = self._backlog
        if len(backlog) <= max_messages:
            payloads = [m.payload for m in backlog]
            backlog.clear()
            return payloads
        pop = backlog.popleft
        return [pop().payload for _ in range(max_messages)]

    def _backlog_ready(self) -> bool:
        """True if a received message waits; raises if none ever will."""
        if self._backlog_exceeded:
            raise EgressBacklogExceededError(self._max_egress_backlog)
        if self._backlog:
            return True
        if self._close_reason is not None:
            raise SessionClosedError(self._close_reason)
        if not self._open:
            raise NotConnectedError("the client has no session")
        return False

    async def request_snapshot(self, *, timeout: float = 5.0) -> AdminResponse:  # noqa: ASYNC109
        """Ask the cluster to take a snapshot; return the matching ``AdminResponse``.

        Check ``response.response_code`` for the outcome.  Raises :class:`TimeoutError`
        if no response arrives within ``timeout`` seconds, and
        :class:`SessionClosedError` if the session closes first.
        """
        await self._backend.checkpoint_if_cancelled()
        self._check_usable()
        correlation_id = self._next_correlation_id()
        waiter = _AdminWaiter(anyio.Event())
        self._admin[correlation_id] = waiter
        try:
            self._enqueue(
                AdminRequest(
                    self._leadership_term_id,
                    self._cluster_session_id,
                    correlation_id,
                    AdminRequestType.SNAPSHOT,
                )
            )
            with anyio.fail_after(timeout):
                await waiter.event.wait()
        finally:
            self._admin.pop(correlation_id, None)
        if waiter.response is None:
            raise SessionClosedError(self._close_reason or CloseReason.CLIENT_ACTION.name)
        return waiter.response

    async def send_keepalive(self) -> None:
        """Queue a ``SessionKeepAlive`` now (the client also sends them when idle)."""
        await self._backend.checkpoint_if_cancelled()
        self._check_usable()
        self._enqueue(SessionKeepAlive(self._leadership_term_id, self._cluster_session_id))

    async def close(self) -> None:
        """Close the session: send ``SessionCloseRequest``, then stop every task.

        Waits up to one second for the close request to be sent.  Idempotent; the
        ``async with connect(...)`` block calls it on exit.
        """
        if self._closing:
            await self._backend.checkpoint()
            return
        self._closing = True
        with anyio.CancelScope(shield=True):
            if self._open and self._close_reason is None:
                self._enqueue(
                    SessionCloseRequest(self._leadership_term_id, self._cluster_session_id)
                )
                with anyio.move_on_after(_CLOSE_FLUSH_TIMEOUT):
                    await self._flush_for_close()
            self._mark_closed(CloseReason.CLIENT_ACTION.name)
            self._scope.cancel()
            for ingress in list(self._ingresses):
                await self._close_ingress(ingress)

    async def _flush_for_close(self) -> None:
        """Send what is queued (the close request last) from this task.

        The writer task may already be cancelled (the ``async with`` block is being
        cancelled), so close() does the last send itself, after any send in progress.
        """
        while self._close_reason is None:
            ingress = self._ingress
            if self._writing or ingress is None or ingress.broken:
                if not self._writing and self._reconnect_exhausted:
                    return  # no leader to send to
                await self._flushed.wait()
                continue
            if not self._pending and not ingress.tail:
                return
            batch = self._pending
            tail, ingress.tail = ingress.tail, b""
            self._pending = bytearray()
            self._writing = True
            try:
                await ingress.stream.send(tail + batch)
            except _NETWORK_ERRORS:
                self._pending = batch + self._pending
                self._drop_ingress(ingress)
            finally:
                self._writing = False
                self._flushed.notify()

    # ------------------------------------------------------------------ internals: state

    def _check_usable(self) -> None:
        if self._close_reason is not None:
            raise SessionClosedError(self._close_reason)
        if self._closing:
            raise SessionClosedError(CloseReason.CLIENT_ACTION.name)
        if not self._open:
            raise NotConnectedError("the client has no session")

    def _mark_closed(self, reason: str) -> None:
        if self._close_reason is None:
            self._close_reason = reason
        for waiter in self._admin.values():
            waiter.event.set()
        for broadcast in (
            self._egress_ready,
            self._space_ready,
            self._data_ready,
            self._flushed,
            self._ingress_changed,
            self._hs_changed,
        ):
            broadcast.notify()

    def _enqueue(self, message: Any) -> None:
        """Append one ingress message to the pending buffer and wake the writer."""
        buf = self._pending
        start = len(buf)
        encode_frames_into(buf, (message,))
        size = len(buf) - start - 4
        if size > self._max_frame_size:
            del buf[start:]
            raise ValueError(
                f"message of {size} bytes exceeds max_frame_size {self._max_frame_size}"
            )
        self._data_ready.notify()

    def _send_now(self) -> None:
        """Send the queued frames from the caller's task if the socket takes them now."""
        ingress = self._ingress
        pending = self._pending
        if (
            not pending
            or self._writing
            or ingress is None
            or ingress.broken
            or ingress.tail
            or ingress.send_nowait is None
        ):
            return
        try:
            sent = ingress.send_nowait(pending)
        except OSError:  # including BlockingIOError; the writer task deals with it
            return
        if sent >= len(pending):
            self._pending = bytearray()
        elif sent > 0:
            # Whole frames stay queued (they can be re-sent elsewhere); the rest of the
            # frame that was cut must follow on this connection.
            end = 0
            while end < sent:
                (length,) = LENGTH.unpack_from(pending, end)
                end += HEADER_LENGTH + length
            ingress.tail = bytes(pending[sent:end])
            del pending[:end]
            self._data_ready.notify()
        self._space_ready.notify()
        self._last_sent = self._backend.current_time()

    def _retarget(self, buf: bytearray | bytes) -> bytearray:
        """Re-encode queued ingress frames with the current leadership term.

        A leader drops ingress messages whose term is not its own, so messages queued
        before a NewLeaderEvent are rewritten before they go to the new leader.
        """
        term = self._leadership_term_id
        decoder = FrameDecoder(max(self._max_frame_size, 1 << 16))
        messages = [
            msgspec.structs.replace(INGRESS.decode(body), leadership_term_id=term)
            for body in decoder.feed(buf)
        ]
        out = bytearray()
        encode_frames_into(out, messages)
        return out

    # ------------------------------------------------------------------ internals: tasks

    async def _run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the background task group; bind the egress listener, then report started."""
        with self._scope:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                listener = await anyio.create_tcp_listener(
                    local_host=self._egress_host, local_port=0
                )
                port = listener.extra(anyio.abc.SocketAttribute.local_port)
                self._response_channel = str(Endpoint(self._egress_host, port))
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
                    await anyio.sleep(_RETRY_DELAY_MIN)
                    continue
                self._spawn(self._egress_reader, stream)

    async def _egress_reader(self, stream: anyio.abc.SocketStream) -> None:
        """Decode one egress connection; a bad frame closes it (the others carry on)."""
        decoder = FrameDecoder(self._max_frame_size)
        async with stream:
            try:
                while True:
                    data = await stream.receive(_RECEIVE_SIZE)
                    messages: list[Any] = []
                    try:
                        decoder.decode_into(data, EGRESS.decode, messages)
                    finally:  # what came before a bad frame still counts
                        for message in messages:
                            self._on_egress(message)
            except _EGRESS_ERRORS:
                return

    def _on_egress(self, message: Any) -> None:
        if self._open:
            self._dispatch(message)
        elif self._close_reason is None and len(self._hs_events) < self._max_egress_backlog:
            self._hs_events.append(("egress", message))
            self._hs_changed.notify()

    def _dispatch(self, message: Any) -> None:
        """Handle one egress message once the session is open."""
        session_id = self._cluster_session_id
        if isinstance(message, SessionMessageHeader):
            if message.cluster_session_id != session_id or self._backlog_exceeded:
                return
            if len(self._backlog) >= self._max_egress_backlog:
                self._backlog_exceeded = True
                self._backlog.clear()
            else:
                self._backlog.append(message)
            self._egress_ready.notify()
        elif isinstance(message, SessionEvent):
            if message.cluster_session_id == session_id and message.code is EventCode.CLOSED:
                self._mark_closed(message.detail or EventCode.CLOSED.name)
        elif isinstance(message, NewLeaderEvent):
            if message.cluster_session_id == session_id:
                self._on_new_leader(message)
        elif isinstance(message, AdminResponse) and message.cluster_session_id == session_id:
            waiter = self._admin.get(message.correlation_id)
            if waiter is not None and waiter.response is None:
                waiter.response = message
                waiter.event.set()

    def _on_new_leader(self, event: NewLeaderEvent) -> None:
        if event.leadership_term_id < self._leadership_term_id or self._close_reason is not None:
            return  # stale
        if event.ingress_endpoints:
            with suppress(ValueError):  # keep the endpoints we know
                self._endpoints = parse_endpoints(event.ingress_endpoints)
        term_changed = event.leadership_term_id != self._leadership_term_id
        self._leadership_term_id = event.leadership_term_id
        self._leader_member_id = event.leader_member_id
        if term_changed and self._pending:
            self._pending = self._retarget(self._pending)
        endpoint = self._endpoints.get(event.leader_member_id)
        if endpoint is not None:
            self._leader_endpoint = endpoint
        self._target_version += 1
        ingress = self._ingress
        if ingress is not None and (
            ingress.endpoint != self._leader_endpoint or ingress.member_id != event.leader_member_id
        ):
            self._drop_ingress(ingress)
        self._ingress_changed.notify()
        self._data_ready.notify()

    def _new_ingress(
        self, member_id: int, endpoint: Endpoint, stream: anyio.abc.SocketStream
    ) -> _Ingress:
        ingress = _Ingress(member_id, endpoint, stream, direct=self._backend.is_trio)
        self._ingresses.add(ingress)
        return ingress

    async def _close_ingress(self, ingress: _Ingress) -> None:
        self._ingresses.discard(ingress)
        await _aclose_quietly(ingress.stream)

    def _install_ingress(self, ingress: _Ingress) -> None:
        self._spawn(self._watch_ingress, ingress)
        self._flushed.notify()

    async def _watch_ingress(self, ingress: _Ingress) -> None:
        """Notice when the node closes the ingress connection (it never writes on it).

        The stream is closed here when it broke or was dropped; when the whole client
        is being cancelled, :meth:`close` closes it after its last send instead.
        """
        with ingress.scope:
            try:
                while True:
                    await ingress.stream.receive(_RECEIVE_SIZE)
            except _NETWORK_ERRORS:
                pass
        self._drop_ingress(ingress)
        await self._close_ingress(ingress)

    def _drop_ingress(self, ingress: _Ingress) -> None:
        """Give up on an ingress connection (broken, or no longer the leader's)."""
        if ingress.broken:
            return
        ingress.broken = True
        ingress.scope.cancel()  # its watcher closes the stream
        if not self._open:
            self._hs_events.append(("lost", ingress))
            self._hs_changed.notify()
        elif self._ingress is ingress:
            self._ingress = None
            self._ingress_changed.notify()
            self._data_ready.notify()
            self._flushed.notify()

    async def _write_loop(self) -> None:
        """Send the pending buffer to the leader, all of it per wake-up."""
        while True:
            ingress = self._ingress
            while ingress is None or ingress.broken or not (self._pending or ingress.tail):
                await self._data_ready.wait()
                ingress = self._ingress
            batch, batch_term = self._pending, self._leadership_term_id
            tail, ingress.tail = ingress.tail, b""
            self._pending = bytearray()
            self._writing = True
            self._space_ready.notify()
            try:
                await ingress.stream.send(tail + batch)
            except _NETWORK_ERRORS:
                # Unsent (or partly sent) batch: queue it again, ahead of newer messages.
                if batch_term != self._leadership_term_id:
                    batch = self._retarget(batch)
                batch += self._pending
                self._pending = batch
                self._drop_ingress(ingress)
            else:
                self._last_sent = anyio.current_time()
            finally:
                self._writing = False
                self._flushed.notify()

    async def _maintain_ingress(self) -> None:
        """Keep an ingress connection to the leader while the session is open."""
        failures = 0
        version = self._target_version
        while self._close_reason is None:
            if self._ingress is not None:
                await self._ingress_changed.wait()
                continue
            if self._target_version != version:
                version = self._target_version
                failures = 0
                self._reconnect_exhausted = False
            endpoint = self._leader_endpoint
            if endpoint is None or failures >= _RECONNECT_ATTEMPTS:
                # Gave up on this leader: an election will bring a NewLeaderEvent.
                self._reconnect_exhausted = True
                self._flushed.notify()
                await self._ingress_changed.wait()
                continue
            member_id = self._leader_member_id
            stream = await _try_connect(endpoint)
            if stream is None:
                failures += 1
                with anyio.move_on_after(_retry_delay(failures)):
                    while self._target_version == version and self._close_reason is None:
                        await self._ingress_changed.wait()
                continue
            if (
                endpoint != self._leader_endpoint
                or self._close_reason is not None
                or self._ingress is not None
            ):
                await _aclose_quietly(stream)
                continue
            failures = 0
            ingress = self._new_ingress(member_id, endpoint, stream)
            self._ingress = ingress
            self._install_ingress(ingress)
            self._data_ready.notify()

    async def _keepalive_loop(self) -> None:
        """Send a SessionKeepAlive whenever nothing was sent for ``keepalive_interval``."""
        interval = self._keepalive_interval
        while True:
            idle = anyio.current_time() - self._last_sent
            if idle < interval:
                await anyio.sleep(interval - idle)
                continue
            if (
                self._close_reason is None
                and not self._closing
                and self._ingress is not None
                and not self._pending
                and not self._writing
            ):
                self._enqueue(SessionKeepAlive(self._leadership_term_id, self._cluster_session_id))
                self._last_sent = anyio.current_time()
            else:
                await anyio.sleep(interval)

    # ------------------------------------------------------------------ internals: connect

    def _start_connectors(self, members: Mapping[int, Endpoint]) -> None:
        self._stop_connectors()
        scope = anyio.CancelScope()
        self._connector_scope = scope
        self._spawn(self._connect_members, dict(members), scope)

    def _stop_connectors(self) -> None:
        if self._connector_scope is not None:
            self._connector_scope.cancel()
            self._connector_scope = None

    async def _connect_members(
        self, members: dict[int, Endpoint], scope: anyio.CancelScope
    ) -> None:
        """Dial every member at once; cancelled by ``scope`` once one is chosen."""
        with scope:
            async with anyio.create_task_group() as tg:
                for member_id, endpoint in members.items():
                    tg.start_soon(self._connector, member_id, endpoint, scope)

    async def _connector(
        self, member_id: int, endpoint: Endpoint, scope: anyio.CancelScope
    ) -> None:
        """Dial one member until it answers (members that refuse are retried)."""
        stream: anyio.abc.SocketStream | None = None
        attempt = 0
        while stream is None:
            stream = await _try_connect(endpoint)
            if stream is None:
                attempt += 1
                await anyio.sleep(_retry_delay(attempt))
        if scope.cancel_called or self._open or self._close_reason is not None:
            await _aclose_quietly(stream)
            return
        self._hs_events.append(("connected", self._new_ingress(member_id, endpoint, stream)))
        self._hs_changed.notify()

    async def _establish(self, connect_timeout: float) -> None:
        """Run the handshake; raise on refusal or ``ConnectTimeoutError``."""
        machine = AsyncConnect(self._endpoints, self._credentials, self._next_correlation_id)
        try:
            with anyio.fail_after(connect_timeout):
                await self._drive(machine)
        except TimeoutError:
            raise ConnectTimeoutError(
                f"no cluster session within {connect_timeout}s "
                f"(stuck in {machine.state.name}, members {format_endpoints(machine.targets)})"
            ) from None
        finally:
            self._stop_connectors()

    async def _drive(self, machine: AsyncConnect) -> None:
        actions = deque(machine.on_egress_bound(self._response_channel))
        chosen: _Ingress | None = None
        while True:
            while actions:
                action = actions.popleft()
                if isinstance(action, ConnectIngress):
                    if chosen is not None:
                        self._drop_ingress(chosen)
                        chosen = None
                    self._start_connectors(action.members)
                elif isinstance(action, SendMessage):
                    assert chosen is not None
                    assert chosen.member_id == action.member_id
                    try:
                        await chosen.stream.send(encode_frame(action.message))
                    except _NETWORK_ERRORS:
                        self._drop_ingress(chosen)  # queues a "lost" event
                    else:
                        actions.extend(machine.on_sent())
                elif isinstance(action, Done):
                    assert chosen is not None
                    self._conclude(machine, action, chosen)
                    return
                elif isinstance(action, Fail):
                    raise action.error
            while not self._hs_events:
                await self._hs_changed.wait()
            kind, item = self._hs_events.popleft()
            if kind == "egress":
                actions.extend(machine.on_egress_message(item))
            elif kind == "connected":
                new = machine.on_ingress_connected(item.member_id)
                if new:
                    chosen = item
                    self._stop_connectors()
                    self._install_ingress(item)
                    actions.extend(new)
                else:
                    await self._close_ingress(item)
            elif kind == "lost" and chosen is not None and item is chosen:
                actions.extend(machine.on_ingress_lost(chosen.member_id))
                chosen = None

    def _conclude(self, machine: AsyncConnect, done: Done, chosen: _Ingress) -> None:
        """Session granted: switch to the open state without losing queued egress."""
        result = done.result
        self._cluster_session_id = result.cluster_session_id
        self._leadership_term_id = result.leadership_term_id
        self._leader_member_id = result.leader_member_id
        self._endpoints = dict(result.endpoints)
        self._leader_endpoint = chosen.endpoint
        self._stop_connectors()
        self._ingress = None if chosen.broken else chosen
        self._last_sent = anyio.current_time()
        self._open = True
        leftovers = list(self._hs_events)
        self._hs_events.clear()
        for kind, item in leftovers:
            if kind == "egress":
                self._dispatch(item)
            elif kind == "connected":
                self._spawn(self._close_ingress, item)
        machine.on_concluded()
        self._spawn(self._write_loop)
        self._spawn(self._maintain_ingress)
        self._spawn(self._keepalive_loop)


# ---------------------------------------------------------------------- connect()


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


@asynccontextmanager
async def connect(
    ingress_endpoints: str,
    *,
    credentials: bytes | CredentialsSupplier | None = None,
    egress_host: str = "127.0.0.1",
    connect_timeout: float = 5.0,
    keepalive_interval: float = 1.0,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_egress_backlog: int = 100_000,
) -> AsyncIterator[ClusterClient]:
    """Open a session with the cluster; close it when the block ends.

    ``async with client.connect("0=127.0.0.1:9010,1=127.0.0.1:9011") as c:``

    - ``ingress_endpoints``: ``"member_id=host:port,..."``; every member is tried at once,
      and a follower redirects the client to the leader.
    - ``credentials``: bytes sent in the connect request, or a
      :class:`~client.CredentialsSupplier` (which also answers challenges).
    - ``egress_host``: address the client listens on for egress; cluster members must be
      able to dial it.
    - ``connect_timeout``: seconds to get a session before :class:`ConnectTimeoutError`.
    - ``keepalive_interval``: idle seconds before a ``SessionKeepAlive`` is sent.
    - ``max_frame_size``: largest frame accepted on egress or offered on ingress.
    - ``max_egress_backlog``: received application messages held before ``receive()``
      fails with :class:`~client.errors.EgressBacklogExceededError`.

    Raises :class:`SessionRejectedError`, :class:`AuthenticationRejectedError`,
    :class:`ConnectTimeoutError`, :class:`ValueError` (bad arguments).  Errors come out
    as themselves, never wrapped in an ``ExceptionGroup``.
    """
    endpoints = parse_endpoints(ingress_endpoints)
    supplier = as_credentials_supplier(credentials)
    _check_positive("connect_timeout", connect_timeout)
    _check_positive("keepalive_interval", keepalive_interval)
    _check_positive("max_frame_size", max_frame_size)
    _check_positive("max_egress_backlog", max_egress_backlog)
    user_error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            client = ClusterClient(
                endpoints,
                credentials=supplier,
                egress_host=egress_host,
                keepalive_interval=keepalive_interval,
                max_frame_size=max_frame_size,
                max_egress_backlog=max_egress_backlog,
            )
            try:
                await tg.start(client._run)
                await client._establish(connect_timeout)
                try:
                    yield client
                except BaseException as exc:
                    user_error = exc
                    raise
            finally:
                await client.close()
    except BaseExceptionGroup as group:
        raise_unwrapped(group, user_error)
