"""Ingress agent: accepts client connections and decodes their frames.

Each connection gets a reader task that decodes every frame that arrived in one receive
and adds them to the connection's queue in the inbox (:mod:`cluster.agents.inbox`),
whose duty cycle runs right in a reader's task (no task switch), once per scheduler
batch (:meth:`IngressInbox.notify_soon`), and takes every connection's messages in turn.
A reader whose queue is full stops reading until it has room (back-pressure).  Bad
bytes close that connection and are counted; the node lives on.

Each connection is an :class:`~cluster.core.base.IngressSource` to the consensus module,
put in the inbox ahead of the messages read from it, and has a writer: the answers to
its connect requests, and the egress of the sessions it holds, go back on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..core.base import IngressSource
from ..protocol.admin import IngressStatus
from ..protocol.codec import INGRESS
from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder
from ..protocol.ingress import IngressMessage
from ..security import client_cert
from ..transport.base import Network
from ..transport.framed import FrameWriter, Receiver
from ..transport.gate import ConnectionGate, gated
from .inbox import IngressInbox, SourceQueue

log = logging.getLogger("cluster.ingress")


PRE_AUTH_FRAME_SIZE = 64 * 1024
PRE_AUTH_RECEIVE_SIZE = 4 * 1024
"""A connection reads this much at a time until a session opens on it (a stranger's
connection holds no more), then :data:`RECEIVE_SIZE`."""
RECEIVE_SIZE = 64 * 1024
"""Largest frame from a connection that holds no session yet."""
PARTIAL_BUDGET = 16 << 20
"""Bytes of incomplete frames that all connections holding no session may keep, in all
(issue 33: 1,000 connections each holding 65,535 bytes of a 64 KiB frame took 126 MB).
A stranger's connection whose partial frame would not fit is closed and counted
(``IngressStats.partial_refused``)."""


@dataclass
class IngressStats:
    connections: int = 0
    open_connections: int = 0
    idle_closed: int = 0  # held no session for --handshake-timeout
    partial_refused: int = 0  # a stranger's half-sent frame beyond PARTIAL_BUDGET
    frames: int = 0
    protocol_errors: int = 0
    last_error: str = ""


class IngressAgent:
    def __init__(
        self,
        network: Network,
        host: str,
        port: int,
        inbox: IngressInbox,
        *,
        max_frame_size: int,
        max_backlog: int = 8 << 20,
        on_closed: Callable[[IngressSource], None] | None = None,
        max_connections: int = 1024,
        handshake_timeout: float = 5.0,
        holds_session: Callable[[IngressSource], bool] = lambda source: True,
        max_per_address: int = 0,
    ) -> None:
        """``max_connections`` and ``max_per_address`` (0: a quarter, see
        :func:`~cluster.transport.gate.default_share`) are counted at accept, before a
        TLS handshake (:class:`~cluster.transport.gate.ConnectionGate`).  A connection
        is proven once past its TLS handshake with a client certificate, or, without
        TLS, once a session opens on it: a flood of strangers cannot push it out."""
        self.max_connections = max_connections
        self.gate = ConnectionGate("ingress", max_connections, max_per_address)
        self.handshake_timeout = handshake_timeout
        self._holds_session = holds_session
        self.network = network
        self.host = host
        self.port = port
        self.inbox = inbox
        self.max_frame_size = max_frame_size
        self.max_backlog = max_backlog
        self.stats = IngressStats()
        self.partial_bytes = 0
        """Bytes of incomplete frames held for connections without a session
        (at most :data:`PARTIAL_BUDGET`)."""
        self.partial_budget = PARTIAL_BUDGET
        self._partial_logged_at = -1e9
        """Connections refused at accept: ``self.gate.refused``."""
        self._on_closed = on_closed
        self._next_conn_id = 0
        self.sources: set[IngressSource] = set()
        self._all_closed = trio.Event()

    def statistics(self) -> IngressStatus:
        stats = self.stats
        return IngressStatus(
            connections=stats.connections,
            open_connections=stats.open_connections,
            frames=stats.frames,
            protocol_errors=stats.protocol_errors,
            last_error=stats.last_error,
            refused_at_accept=self.gate.refused,
            partial_refused=stats.partial_refused,
        )

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await self.network.serve(
            self.host, self.port, gated(self._handle, self.gate), task_status=task_status
        )

    async def drain(self) -> None:
        """Flush and close every client connection (a graceful shutdown); the caller
        bounds the wait."""
        for source in list(self.sources):
            writer = source.link
            if isinstance(writer, FrameWriter):
                writer.close()
        while self.sources:
            self._all_closed = trio.Event()
            await self._all_closed.wait()

    async def _handle(self, stream: trio.abc.Stream) -> None:
        # counted at accept by self.gate (over the cap: closed before any handshake)
        allowed, cert = client_cert(stream)
        if not allowed:  # a member's certificate is no client's
            self.stats.protocol_errors += 1
            log.warning("closing ingress connection: %s is not a client certificate", cert)
            await trio.aclose_forcefully(stream)
            return
        if cert is not None:  # past the TLS handshake with a client certificate of our CA
            self.gate.prove(stream)
        self._next_conn_id += 1
        writer = FrameWriter(self.max_backlog, flushed_by_owner=True)
        source = IngressSource(
            self._next_conn_id,
            peer_host(stream),
            None if cert is None else cert.name,
            link=writer,
        )
        self.sources.add(source)
        queue = SourceQueue(source)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, writer, stream, nursery.cancel_scope)
                nursery.start_soon(self._watch, source, nursery.cancel_scope)
                await self._read(stream, queue)
                nursery.cancel_scope.cancel()
        finally:
            self.sources.discard(source)
            if not self.sources:
                self._all_closed.set()
            writer.close()
            if self._on_closed is not None:
                self.inbox.close(queue, self._on_closed)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    @staticmethod
    async def _write(writer: FrameWriter, stream: trio.abc.Stream, done: trio.CancelScope) -> None:
        try:
            await writer.run(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        done.cancel()  # closed by the node, or broken: stop reading too

    async def _watch(self, source: IngressSource, done: trio.CancelScope) -> None:
        """Close the connection once it has held no session for a handshake timeout:
        a stranger may not keep it (or half a frame) open without a session."""
        while True:
            await trio.sleep(self.handshake_timeout)
            if not self._holds_session(source):
                self.stats.idle_closed += 1
                log.debug("closing ingress connection %d: no session", source.conn_id)
                done.cancel()
                return

    async def _read(self, stream: trio.abc.Stream, queue: SourceQueue) -> None:
        source = queue.source
        stats = self.stats
        stats.connections += 1
        stats.open_connections += 1
        # until a session opens on it, a connection's frames are small (a connect
        # request, a challenge response): strangers' half-sent frames stay cheap
        decoder = FrameDecoder(min(self.max_frame_size, PRE_AUTH_FRAME_SIZE))
        receiver = Receiver(stream, PRE_AUTH_RECEIVE_SIZE)
        full_size = self.max_frame_size
        inbox = self.inbox
        stranger = True
        held = 0  # a stranger's partial frame, counted in self.partial_bytes
        try:
            while True:
                data = await receiver.receive()
                if not data:
                    return
                if stranger and source.trusted:  # a session opened (or resumed) on it
                    stranger = False
                    self.gate.prove(stream)
                    decoder.max_frame_size = full_size
                    receiver.grow(RECEIVE_SIZE)
                    self.partial_bytes -= held
                    held = 0
                messages: list[IngressMessage] = []
                try:
                    frames = decoder.decode_into(data, INGRESS, messages)
                except ProtocolError as exc:
                    if messages:  # frames decoded before the bad one still count
                        inbox.add(queue, messages, len(data))
                        inbox.notify()
                    stats.protocol_errors += 1
                    stats.last_error = str(exc)
                    log.warning("closing ingress connection after bad frame: %s", exc)
                    return
                if stranger and decoder.buffered != held:
                    grown = decoder.buffered - held
                    if self.partial_bytes + grown > self.partial_budget:
                        self._partial_refused()
                        return
                    self.partial_bytes += grown
                    held += grown
                if not frames:
                    continue
                stats.frames += frames
                inbox.add(queue, messages, len(data))
                await inbox.notify_soon(queue)
                if inbox.full(queue):
                    await inbox.wait_for_room(queue)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            stats.open_connections -= 1
            self.partial_bytes -= held

    def _partial_refused(self) -> None:
        self.stats.partial_refused += 1
        now = trio.current_time()
        if now - self._partial_logged_at >= 10.0:
            self._partial_logged_at = now
            log.warning(
                "ingress: connections without a session hold %d bytes of unfinished "
                "frames (the budget, %d): closing the ones that send more (%d so far)",
                self.partial_bytes,
                self.partial_budget,
                self.stats.partial_refused,
            )


def peer_host(stream: trio.abc.Stream) -> str:
    """The address of the peer of ``stream`` (``""`` when it has none)."""
    inner = getattr(stream, "transport_stream", stream)
    remote = getattr(inner, "remote_host", None)  # the simulated network
    if isinstance(remote, str):
        return remote
    sock = getattr(inner, "socket", None)
    try:
        peer = sock.getpeername() if sock is not None else getattr(inner, "peer", "")
    except OSError:
        return ""
    if isinstance(peer, tuple):
        return str(peer[0])
    return str(peer or "")
