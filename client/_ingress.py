"""The ingress half of the anyio shell: connections to the leader, and the writer.

Ingress is one TCP connection to the leader.  The cluster answers the connect
handshake on it (and, without a response channel, sends the session's egress on it):
its watcher decodes what arrives and hands it to ``on_message``.  A new connection of
an open session starts with the session's proof (a SessionResumeRequest).  The
:class:`~client._session.Session` queues encoded frames in ``session.pending``; the
:class:`IngressWriter` sends them:

- its write loop takes the whole buffer per wake-up and sends it with one ``send``;
- under Trio, :meth:`IngressWriter.send_now` sends a burst from the caller's task when
  the socket takes it at once;
- its maintain loop reconnects to the leader after a break or a NewLeaderEvent, with
  an exponential, jittered back-off (:func:`backoff_delay`) between failed tries; a
  connection counts as a failure unless it proved useful (see :meth:`maintain_loop`);
- its keepalive loop queues a SessionKeepAlive when nothing was sent for a while.

Whoever sends holds the ``writing`` turn, so frames go out whole and in order.  A batch
whose send failed is queued again ahead of newer frames, to go to the next connection.
"""

from __future__ import annotations

import math
import random
import ssl
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import anyio
import anyio.abc

from cluster.protocol import EGRESS, FrameDecoder, ProtocolError
from cluster.protocol.egress import NewLeaderEvent, QueryResponse, SessionEvent
from cluster.protocol.enums import EventCode, QueryStatus
from cluster.protocol.framing import HEADER_LENGTH, LENGTH
from cluster.transport.tls import speaks_tls

from ._dial import (
    CLOSED_WORDS,
    NETWORK_ERRORS,
    TLS_REQUIRED_WORDS,
    aclose_quietly,
    describe_failures,
    try_connect,
)
from ._endpoints import Endpoint
from ._session import Reconnect, Redial, Session
from ._sync import Backend, Broadcast
from .events import ClientEvent, Connected, Disconnected

__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "CONNECTION_PROVEN_AFTER",
    "RECEIVE_SIZE",
    "RETRY_DELAY_MIN",
    "Ingress",
    "IngressWriter",
    "Uniform",
    "backoff_delay",
]

RETRY_DELAY_MIN = 0.05
RECONNECT_ATTEMPTS = 5  # to the same leader, before waiting for a NewLeaderEvent
LEADER_SILENCE = 3.0
"""Seconds without a byte from the leader on a connection that carries the session's
egress before the client gives the connection up (the leader sends every second)."""
BACKOFF_BASE = 0.05  # the back-off before the first redial after a failure (upper bound)
BACKOFF_CAP = 2.0  # the longest back-off before one redial
# A connection that stayed up this long (or carried a message from the node) proved
# useful: losing it starts the back-off over, so the next redial happens at once.
CONNECTION_PROVEN_AFTER = 2.0
RECEIVE_SIZE = 1 << 18


_READ_ERRORS: tuple[type[BaseException], ...] = (ProtocolError, *NETWORK_ERRORS)


def _leads_nowhere(message: Any) -> bool:
    """A message that only says its member does not lead and sends nowhere: a query
    answered NOT_LEADER, a REDIRECT naming no leader.  It does not count as hearing from
    the leader (:meth:`IngressWriter.liveness_loop`): a deposed leader cut off from the
    other members but not from its clients answers every query it is asked again
    NOT_LEADER, and every resume REDIRECT with no leader, for as long as the partition
    lasts, while the others elected a leader long ago (found by ``scripts/nemesis.py``,
    seed 44: sessions stuck for a whole 8 s split)."""
    kind = type(message)
    if kind is QueryResponse:
        return bool(message.status is QueryStatus.NOT_LEADER)
    if kind is SessionEvent:
        return bool(message.code is EventCode.REDIRECT and message.leader_member_id < 0)
    return False


class Uniform(Protocol):
    """What :func:`backoff_delay` needs of a random source (the ``random`` module, or a
    :class:`random.Random`)."""

    def uniform(self, a: float, b: float, /) -> float: ...


def backoff_delay(
    attempt: int,
    rng: Uniform = random,
    *,
    base: float = BACKOFF_BASE,
    cap: float = BACKOFF_CAP,
) -> float:
    """Seconds to wait before redial number ``attempt`` after consecutive failures.

    ``0`` for ``attempt <= 0`` (the first dial goes at once); otherwise a uniform random
    value in the upper half of ``min(cap, base * 2 ** (attempt - 1))``, so that the
    waits grow exponentially and clients that failed together do not redial together.
    """
    if attempt <= 0:
        return 0.0
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 64))
    return float(rng.uniform(ceiling / 2, ceiling))


class Ingress:
    """One ingress TCP connection to a member; its watcher task runs under ``scope``."""

    __slots__ = (
        "broken",
        "confirmed",
        "endpoint",
        "last_heard",
        "member_id",
        "received",
        "redirected",
        "scope",
        "send_nowait",
        "silent",
        "stream",
        "tail",
    )

    def __init__(
        self, member_id: int, endpoint: Endpoint, stream: anyio.abc.SocketStream, *, direct: bool
    ) -> None:
        self.member_id = member_id
        self.endpoint = endpoint
        self.stream = stream
        self.scope = anyio.CancelScope()
        self.broken = False
        self.received = False  # a message from the node arrived on it
        self.last_heard = anyio.current_time()  # when something last arrived (or it opened)
        self.silent = False  # given up because the node said nothing for too long
        self.redirected = False  # given up because its member named the leader we have
        # the session's messages may go on it: the leader's (the handshake's connection,
        # or the leader accepted the resume: its NewLeaderEvent came on it)
        self.confirmed = True
        # Under Trio the socket is non-blocking and only ever written by whoever holds
        # the writer's ``writing`` turn, so a burst can go out from the caller's task.
        self.send_nowait: Callable[[bytearray], int] | None = None
        if direct:
            with suppress(anyio.TypedAttributeLookupError):
                self.send_nowait = stream.extra(anyio.abc.SocketAttribute.raw_socket).send
        # the rest of a frame whose start went out on this connection: it goes first
        self.tail = b""


class IngressWriter:
    """Sends ``session.pending`` to the leader and keeps a connection to it.

    ``spawn`` starts a task in the client's task group (each connection's watcher).
    ``data_ready`` is the broadcast the session's ``wake_writer`` notifies.
    ``lost_before_open`` is told of a connection that broke (or was dropped) before the
    session opened: the handshake decides what that means.

    ``ingress`` is the connection to the leader in use, ``None`` while there is none;
    ``ingresses`` every connection opened and not yet closed (handshake ones included);
    ``writing`` is true while a send is in progress (the turn :meth:`send_now`, the
    write loop and :meth:`flush_for_close` take, so frames never interleave);
    ``last_sent`` is when something last went out (the keepalive loop's clock).
    """

    def __init__(
        self,
        session: Session,
        backend: Backend,
        spawn: Callable[..., None],
        *,
        data_ready: Broadcast,
        lost_before_open: Callable[[Ingress], None],
        on_message: Callable[[Any], None] = lambda message: None,
        next_correlation_id: Callable[[], int] = lambda: 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tls = tls
        self._session = session
        self._on_message = on_message
        self._next_correlation_id = next_correlation_id
        self._backend = backend
        self._spawn = spawn
        self._lost_before_open = lost_before_open

        self.ingress: Ingress | None = None
        self.ingresses: set[Ingress] = set()
        #: what each member did on the last dial that failed (for the errors' words)
        self.failures: dict[Endpoint, str] = {}
        #: since when no connection has worked and no member answered (None: fine)
        self.trouble_since: float | None = None
        #: seconds of trouble after which the session counts as lost (:attr:`on_lost`)
        self.lost_after = math.inf
        self.on_lost: Callable[[str], None] = lambda reason: None
        #: the application's view of the connections (:meth:`ClusterClient.events`)
        self.on_event: Callable[[ClientEvent], None] = lambda event: None
        self.writing = False
        self.last_sent = 0.0
        self._reconnect_exhausted = False
        self._target_version = 0
        self._rotation = 0  # members skipped after a silent connection (own_egress)
        self._redial_leader = False  # the next dial goes to the leader (a Redial)
        #: the cluster sends egress on the ingress connection (no egress listener): the
        #: maintain loop then looks for the leader among all members itself
        self.own_egress = False

        self.data_ready = data_ready
        self.space_ready = Broadcast(backend)
        self.flushed = Broadcast(backend)
        self.ingress_changed = Broadcast(backend)

    # ------------------------------------------------------------------ connections

    def new_ingress(
        self, member_id: int, endpoint: Endpoint, stream: anyio.abc.SocketStream
    ) -> Ingress:
        """Track a freshly connected stream (:meth:`close_ingress` forgets it)."""
        # under TLS every byte goes through the TLS stream: never the raw socket
        ingress = Ingress(
            member_id, endpoint, stream, direct=self._backend.is_trio and self.tls is None
        )
        self.ingresses.add(ingress)
        return ingress

    async def close_ingress(self, ingress: Ingress) -> None:
        self.ingresses.discard(ingress)
        await aclose_quietly(ingress.stream)

    def install(self, ingress: Ingress) -> None:
        """Start watching a connection that is in use."""
        self._spawn(self._watch, ingress)
        self.flushed.notify()

    async def _watch(self, ingress: Ingress) -> None:
        """Read what the node sends on the ingress connection, and notice when it closes.

        The stream is closed here when it broke or was dropped; when the whole client
        is being cancelled, ``close()`` closes it after its last send instead.  A bad
        frame drops the connection.
        """
        decoder = FrameDecoder(self._session.max_frame_size)
        on_message = self._on_message
        current_time = self._backend.current_time  # anyio's finds the backend each call
        with ingress.scope:
            try:
                while True:
                    data = await ingress.stream.receive(RECEIVE_SIZE)
                    heard = current_time()
                    self.trouble_since = None  # a member answered
                    messages: list[Any] = []
                    try:
                        decoder.decode_into(data, EGRESS, messages)
                    finally:  # what came before a bad frame still counts
                        if messages:
                            ingress.received = True
                        if not messages or not all(map(_leads_nowhere, messages)):
                            ingress.last_heard = heard
                        for message in messages:
                            if ingress.broken:
                                break
                            if not ingress.confirmed and type(message) is NewLeaderEvent:
                                ingress.confirmed = True  # the leader took the resume
                                self.data_ready.notify()
                                self.flushed.notify()
                                self.on_event(Connected(ingress.member_id, str(ingress.endpoint)))
                            on_message(message)
            except _READ_ERRORS:
                pass
        self.drop(ingress, "the connection closed")
        await self.close_ingress(ingress)

    def drop(self, ingress: Ingress, reason: str = "given up") -> None:
        """Give up on an ingress connection (broken, or no longer the leader's)."""
        if ingress.broken:
            return
        ingress.broken = True
        ingress.scope.cancel()  # its watcher closes the stream
        if not self._session.open:
            self._lost_before_open(ingress)
        elif self.ingress is ingress:
            if self._session.close_reason is None:
                self.on_event(Disconnected(ingress.member_id, str(ingress.endpoint), reason))
            self.ingress = None
            self.ingress_changed.notify()
            self.data_ready.notify()
            self.flushed.notify()

    def on_reconnect(self, action: Reconnect) -> None:
        """A new leader: drop a connection to anyone else, wake the maintain loop."""
        self._target_version += 1
        self._rotation = 0
        ingress = self.ingress
        if ingress is not None and (
            ingress.endpoint != action.endpoint or ingress.member_id != action.member_id
        ):
            self.drop(ingress, f"member {action.member_id} leads now")
        self.ingress_changed.notify()
        self.data_ready.notify()

    def on_redial(self, action: Redial) -> None:
        """A member that does not lead named the leader this session has: leave it and
        dial the leader next.  Unlike a new leader this is no fresh start: the failures
        so far keep counting, so a leader that stays away is dialled less and less often
        (the back-off grows), yet a leader that was only paused is back on the line
        within a back-off of its return."""
        self._redial_leader = True
        ingress = self.ingress
        if ingress is not None and ingress.member_id != action.member_id:
            ingress.redirected = True
            self.drop(
                ingress,
                f"member {ingress.member_id} does not lead: member {action.member_id} does",
            )

    # ------------------------------------------------------------------ sending

    def send_now(self) -> None:
        """Send the queued frames from the caller's task if the socket takes them now."""
        ingress = self.ingress
        session = self._session
        pending = session.pending
        if (
            not pending
            or self.writing
            or ingress is None
            or ingress.broken
            or ingress.tail
            or not ingress.confirmed
            or ingress.send_nowait is None
        ):
            return
        try:
            sent = ingress.send_nowait(pending)
        except OSError:  # including BlockingIOError; the writer task deals with it
            return
        if sent >= len(pending):
            session.pending = bytearray()
        elif sent > 0:
            # Whole frames stay queued (they can be re-sent elsewhere); the rest of the
            # frame that was cut must follow on this connection.
            end = 0
            while end < sent:
                (length,) = LENGTH.unpack_from(pending, end)
                end += HEADER_LENGTH + length
            ingress.tail = bytes(pending[sent:end])
            del pending[:end]
            self.data_ready.notify()
        self.space_ready.notify()
        self.last_sent = self._backend.current_time()

    async def write_loop(self) -> None:
        """Send the pending buffer to the leader, all of it per wake-up."""
        session = self._session
        data_ready = self.data_ready
        while True:
            ingress = self.ingress
            while (
                ingress is None
                or ingress.broken
                or not (ingress.tail or (session.pending and ingress.confirmed))
            ):
                await data_ready.wait()
                ingress = self.ingress
            batch, batch_term = session.pending, session.leadership_term_id
            if not ingress.confirmed:  # only the resume, until the leader takes it
                batch = bytearray()
            tail, ingress.tail = ingress.tail, b""
            session.pending = session.pending if not ingress.confirmed else bytearray()
            self.writing = True
            self.space_ready.notify()
            try:
                await ingress.stream.send(tail + batch)
            except NETWORK_ERRORS:
                # Unsent (or partly sent) batch: queue it again, ahead of newer messages.
                if batch_term != session.leadership_term_id:
                    batch = session.retarget(batch)
                batch += session.pending
                session.pending = batch
                self.drop(ingress, "the connection broke while sending")
            else:
                self.last_sent = self._backend.current_time()
            finally:
                self.writing = False
                self.flushed.notify()

    async def flush_for_close(self) -> None:
        """Send what is queued (the close request last) from this task.

        The writer task may already be cancelled (the ``async with`` block is being
        cancelled), so close() does the last send itself, after any send in progress.
        """
        session = self._session
        while session.close_reason is None:
            ingress = self.ingress
            if self.writing or ingress is None or ingress.broken:
                if not self.writing and self._reconnect_exhausted:
                    return  # no leader to send to
                await self.flushed.wait()
                continue
            if not ingress.confirmed:
                await self.flushed.wait()  # the leader has not taken the resume yet
                continue
            if not session.pending and not ingress.tail:
                return
            batch = session.pending
            tail, ingress.tail = ingress.tail, b""
            session.pending = bytearray()
            self.writing = True
            try:
                await ingress.stream.send(tail + batch)
            except NETWORK_ERRORS:
                session.pending = batch + session.pending
                self.drop(ingress, "the connection broke while sending")
            finally:
                self.writing = False
                self.flushed.notify()

    # ------------------------------------------------------------------ other tasks

    async def maintain_loop(self) -> None:
        """Keep an ingress connection to the leader while the session is open.

        Each failure to reach the leader is followed by a back-off
        (:func:`backoff_delay`) before the next dial: a refused or timed-out connect, and
        a connection this loop opened that broke before it proved useful (before
        :data:`CONNECTION_PROVEN_AFTER` seconds, with nothing received from the node),
        as when a port accepts and closes at once.  Losing a connection that proved
        useful (the handshake's included) starts the count over: the next dial goes at
        once.  After :data:`RECONNECT_ATTEMPTS` failures in a row the loop waits for a
        new leader; a new target (:meth:`on_reconnect`) starts the count over too.

        With egress on the ingress connection (``own_egress``) no new leader would dial
        the client, so the loop never waits: failure after failure it tries the next
        member (:meth:`_target`), each new connection starting with the session's resume
        and carrying nothing else until the leader has taken it (``confirmed``).  A
        connection given up for silence (:meth:`liveness_loop`) counts as a failure.
        """
        session = self._session
        failures = 0
        version = self._target_version
        opened: Ingress | None = None  # the last connection this loop opened
        opened_at = 0.0
        while session.close_reason is None:
            if self.ingress is not None:
                await self.ingress_changed.wait()
                continue
            if opened is not None:
                lost, opened = opened, None
                proven = not lost.silent and (
                    lost.received or anyio.current_time() - opened_at >= CONNECTION_PROVEN_AFTER
                )
                if lost.redirected:
                    pass  # it named the leader: dial it now, the failures still counting
                elif proven:
                    failures = 0
                elif self._target_version == version:
                    failures += 1
                    self._failed(lost.endpoint, CLOSED_WORDS)
                    if await self._lost():
                        return
                    await self._back_off(failures, version)
                    continue
            if self._target_version != version:
                version = self._target_version
                failures = 0
                self._reconnect_exhausted = False
            member_id, endpoint = self._target(failures)
            if endpoint is None or (failures >= RECONNECT_ATTEMPTS and not self.own_egress):
                # Gave up on this leader: an election will bring a NewLeaderEvent.
                self._reconnect_exhausted = True
                self.flushed.notify()
                with anyio.move_on_after(self._lost_in()):
                    await self.ingress_changed.wait()
                if await self._lost():
                    return
                continue
            stream = await try_connect(endpoint, self.tls)
            if isinstance(stream, str):
                failures += 1
                self._failed(endpoint, stream)
                if await self._lost():
                    return
                await self._back_off(failures, version)
                continue
            if (
                (endpoint != session.leader_endpoint and not self.own_egress)
                or self._target_version != version
                or session.close_reason is not None
                or self.ingress is not None
            ):
                await aclose_quietly(stream)
                continue
            ingress = self.new_ingress(member_id, endpoint, stream)
            ingress.tail = session.resume_frame(self._next_correlation_id())
            # with egress on it, it may be a member that does not lead: the session's
            # messages wait until the leader answers the resume (a NewLeaderEvent)
            ingress.confirmed = not self.own_egress
            self.ingress = opened = ingress
            opened_at = anyio.current_time()
            self.install(ingress)
            self.data_ready.notify()
            if ingress.confirmed:
                self.on_event(Connected(member_id, str(endpoint)))

    def _failed(self, endpoint: Endpoint, what: str) -> None:
        self.failures[endpoint] = what
        if self.trouble_since is None:
            self.trouble_since = anyio.current_time()

    def _lost_in(self) -> float:
        """Seconds until the trouble so far would make the session lost."""
        if self.trouble_since is None:
            return self.lost_after
        return max(0.0, self.trouble_since + self.lost_after - anyio.current_time())

    async def _lost(self) -> bool:
        """After ``lost_after`` seconds in which no connection worked and no member
        answered, the session is lost: say so (:attr:`on_lost`) and stop trying.
        Without certificates, each member that last closed our connection without a
        word is first asked whether it speaks TLS (one hello each, at once): if it does,
        that is what the reason says (it restarted with ``--certs-dir``)."""
        since = self.trouble_since
        if since is None or anyio.current_time() - since < self.lost_after:
            return False
        if self.tls is None:
            closed = [e for e, what in self.failures.items() if what == CLOSED_WORDS]

            async def probe(endpoint: Endpoint) -> None:
                if await speaks_tls(endpoint.host, endpoint.port):
                    self.failures[endpoint] = TLS_REQUIRED_WORDS

            async with anyio.create_task_group() as tg:
                for endpoint in closed:
                    tg.start_soon(probe, endpoint)
        self.on_lost(
            "no member answered for "
            f"{self.lost_after:g} s: {describe_failures(self.failures, self._session.endpoints)}"
        )
        return True

    def _target(self, failures: int) -> tuple[int, Endpoint | None]:
        """The member to dial next: the leader; with egress on the ingress connection,
        the leader first and then, failure after failure, every other member in turn
        (one that does not lead answers with a REDIRECT: to a new leader, or back to
        this one, :meth:`on_redial`)."""
        session = self._session
        if not self.own_egress or self._redial_leader:
            self._redial_leader = False
            return session.leader_member_id, session.leader_endpoint
        order = [session.leader_member_id] if session.leader_endpoint is not None else []
        order += sorted(m for m in session.endpoints if m != session.leader_member_id)
        if not order:
            return -1, None
        member_id = order[(failures + self._rotation) % len(order)]
        if member_id == session.leader_member_id and session.leader_endpoint is not None:
            return member_id, session.leader_endpoint
        return member_id, session.endpoints[member_id]

    async def liveness_loop(self) -> None:
        """With egress on the ingress connection the leader sends something at least
        every second (a NewLeaderEvent when there is nothing else): a connection silent
        for :data:`LEADER_SILENCE` seconds is given up (its member is paused, cut off or
        no longer leads) and the maintain loop tries the next member.  A member that
        says only that it does not lead and knows no leader (:func:`_leads_nowhere`)
        counts as silent."""
        while True:
            await anyio.sleep(LEADER_SILENCE / 4)
            ingress = self.ingress
            if ingress is None or ingress.broken:
                continue
            if anyio.current_time() - ingress.last_heard > LEADER_SILENCE:
                ingress.silent = True
                self._rotation += 1  # not that member again first
                self.drop(ingress, f"nothing heard for {LEADER_SILENCE:g} s")

    async def _back_off(self, failures: int, version: int) -> None:
        """Wait the back-off after ``failures`` failures in a row, or until a new target
        (or the session's end) cuts it short."""
        session = self._session
        with anyio.move_on_after(backoff_delay(failures)):
            while self._target_version == version and session.close_reason is None:
                await self.ingress_changed.wait()

    async def keepalive_loop(self, interval: float) -> None:
        """Send a SessionKeepAlive whenever nothing was sent for ``interval`` seconds."""
        session = self._session
        while True:
            idle = anyio.current_time() - self.last_sent
            if idle < interval:
                await anyio.sleep(interval - idle)
                continue
            if (
                session.close_reason is None
                and not session.closing
                and self.ingress is not None
                and not session.pending
                and not self.writing
            ):
                session.enqueue(session.keepalive())
                self.last_sent = anyio.current_time()
            else:
                await anyio.sleep(interval)
