"""Framed TCP on Trio: the real network."""

from __future__ import annotations

import logging
import socket

import trio

from .base import StreamHandler

log = logging.getLogger("cluster.transport")


KEEPALIVE_IDLE = 5
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3
"""A connection whose peer's host is gone (no FIN, no RST: a power cut, a partition) is
found dead after about ``5 + 2 * 3`` seconds of silence, instead of the kernel's two hours:
a member link is only given to a reconnecting member once its old one is closed."""


def _tune(stream: trio.SocketStream) -> None:
    try:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, True)
        for option, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            if hasattr(socket, option):
                stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:  # pragma: no cover - not every socket supports it
        pass


class TcpNetwork:
    """:class:`~cluster.transport.base.Network` over real TCP sockets."""

    def __init__(self, connect_timeout: float = 2.0) -> None:
        self.connect_timeout = connect_timeout

    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        with trio.fail_after(self.connect_timeout):
            try:
                stream = await trio.open_tcp_stream(host, port)
            except trio.TooSlowError:
                raise OSError(f"timed out connecting to {host}:{port}") from None
        _tune(stream)
        return stream

    async def serve(
        self,
        host: str,
        port: int,
        handler: StreamHandler,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]

        async def handle(stream: trio.SocketStream) -> None:
            _tune(stream)
            await handler(stream)

        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handle, listeners)
            task_status.started(bound)
