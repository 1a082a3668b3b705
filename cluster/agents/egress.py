"""Egress agent: each client session's egress, shared by the consensus module and the
service (Aeron's shared egress publication, seed 000).

A session's egress goes back on the client's own ingress connection
(:meth:`EgressPublisher.attach`: the ingress agent's writer for that connection), or,
for a client that named a response channel, on a connection the leader dials
(:meth:`EgressPublisher.connect`, ``host:port``): frames sent before it is up are queued
(bounded) and go out first.  Each connection has one writer task that sends everything
queued with one ``send_all`` per wake-up.  Dial results are reported back to the
consensus module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from ..core.base import IngressSource
from ..transport.base import Network
from ..transport.framed import FrameWriter

log = logging.getLogger("cluster.egress")


class _Egress:
    __slots__ = ("attached", "channel", "connected", "scope", "writer")

    def __init__(self, channel: str, writer: FrameWriter, *, attached: bool) -> None:
        self.channel = channel
        self.writer = writer
        self.attached = attached  # the writer of a client's ingress connection (not ours)
        self.connected = attached
        self.scope = trio.CancelScope()


def split_channel(channel: str) -> tuple[str, int]:
    host, sep, port = channel.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad response channel {channel!r}: expected host:port")
    return host.strip("[]"), int(port)


class EgressPublisher:
    """Implements :class:`cluster.core.consensus.EgressPort` over a :class:`Network`."""

    def __init__(
        self,
        network: Network,
        *,
        max_backlog: int,
        on_connected: Callable[[int], None],
        on_failed: Callable[[int], None],
        connect_timeout: float = 2.0,
    ) -> None:
        self.network = network
        self.max_backlog = max_backlog
        self.connect_timeout = connect_timeout
        self._on_connected = on_connected
        self._on_failed = on_failed
        self._egress: dict[int, _Egress] = {}
        self._nursery: trio.Nursery | None = None
        self._queued_starts: list[tuple[int, _Egress]] = []
        self.dropped_messages = 0
        self._active = 0
        self._idle = trio.Event()
        self._dirty: list[FrameWriter] = []

    # ---- EgressPort -----------------------------------------------------------------

    def connect(self, egress_id: int, channel: str) -> None:
        self._forget(egress_id)
        writer = FrameWriter(self.max_backlog, flushed_by_owner=True)
        egress = _Egress(channel, writer, attached=False)
        self._egress[egress_id] = egress
        if self._nursery is None:
            self._queued_starts.append((egress_id, egress))
        else:
            self._nursery.start_soon(self._run, egress_id, egress)

    def attach(self, egress_id: int, source: IngressSource) -> None:
        self._forget(egress_id)
        writer = source.link
        if isinstance(writer, FrameWriter) and not writer.closing:
            self._egress[egress_id] = _Egress("", writer, attached=True)

    def reply(self, source: IngressSource, message: Any) -> bool:
        writer = source.link
        return isinstance(writer, FrameWriter) and self._queue(writer, message)

    def _forget(self, egress_id: int) -> None:
        old = self._egress.pop(egress_id, None)
        if old is not None and not old.attached:
            old.scope.cancel()

    def send(self, egress_id: int, message: Any) -> bool:
        egress = self._egress.get(egress_id)
        if egress is not None and self._queue(egress.writer, message):
            return True
        if egress is None:
            self.dropped_messages += 1
        return False

    def _queue(self, writer: FrameWriter, message: Any) -> bool:
        """Queue a frame for the next flush; False (counted) if the writer is full."""
        if not writer.backlog:
            self._dirty.append(writer)
        if not writer.write_message(message):
            self.dropped_messages += 1
            return False
        return True

    def flush(self) -> None:
        """Send what was queued since the last flush, from the caller's task."""
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for writer in dirty:
                writer.flush()

    def close(self, egress_id: int) -> None:
        egress = self._egress.pop(egress_id, None)
        if egress is not None and not egress.attached:
            egress.writer.close()
            if not egress.connected:
                egress.scope.cancel()

    def backlog(self, egress_id: int) -> int:
        egress = self._egress.get(egress_id)
        return egress.writer.backlog if egress is not None else 0

    def close_all(self) -> None:
        for egress_id in list(self._egress):
            self.close(egress_id)

    # ---- the agent ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for egress_id, egress in self._queued_starts:
                nursery.start_soon(self._run, egress_id, egress)
            self._queued_starts.clear()
            task_status.started()
            await trio.sleep_forever()

    async def drain(self) -> None:
        """Close every connection after flushing it, and wait for the writers to finish.

        Callers bound the wait with their own cancel scope.
        """
        self.close_all()
        while self._active:
            await self._idle.wait()

    async def _run(self, egress_id: int, egress: _Egress) -> None:
        self._active += 1
        try:
            await self._connect_and_write(egress_id, egress)
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
                self._idle = trio.Event()

    async def _connect_and_write(self, egress_id: int, egress: _Egress) -> None:
        with egress.scope:
            try:
                host, port = split_channel(egress.channel)
                with trio.fail_after(self.connect_timeout):
                    stream = await self.network.open_stream(host, port)
            except (OSError, ValueError, trio.TooSlowError) as exc:
                log.info("egress %d to %s failed: %s", egress_id, egress.channel, exc)
                if self._egress.get(egress_id) is egress:
                    del self._egress[egress_id]
                self._on_failed(egress_id)
                return
            egress.connected = True
            self._on_connected(egress_id)
            try:
                await egress.writer.run(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("egress %d to %s broke: %s", egress_id, egress.channel, exc)
                if self._egress.get(egress_id) is egress:
                    del self._egress[egress_id]
                    self._on_failed(egress_id)
