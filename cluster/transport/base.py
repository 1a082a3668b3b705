"""The network interface the agents see, so a simulated network can replace TCP.

A :class:`Network` opens outbound byte streams and serves inbound ones; streams are
``trio.abc.Stream`` objects.  :class:`~cluster.transport.tcp.TcpNetwork` is the real
thing; tests substitute an in-memory network with seeded faults.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from .tls import TlsNowait

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class SendNowait(Protocol):
    def __call__(self, data: bytearray) -> int: ...


def nowait_sender(stream: trio.abc.Stream) -> SendNowait | None:
    """A function that sends what it can of a buffer *now*, without waiting, and returns
    how many bytes it took (0 when the stream's buffer is full); ``None`` if ``stream``
    cannot do that.

    It lets a writer send from the task that produced the data instead of waking its own
    task (a task switch costs more than the send).  A stream supports it with a
    ``send_nowait`` method (the simulated network), by being a ``trio.SocketStream`` (a
    non-blocking socket, written with ``os.write``), or a ``trio.SSLStream`` over one
    (:class:`~cluster.transport.tls.TlsNowait`).  Errors are raised as ``OSError`` or
    ``trio.BrokenResourceError``; callers leave the data queued and let the writer task's
    ``send_all`` meet and report them.  A sender that took bytes it could not all put on
    the wire yet has ``owed()`` true; the writer task then calls ``await drain()`` before
    anything else.
    """
    send: SendNowait | None = getattr(stream, "send_nowait", None)
    if send is not None:
        return send
    if isinstance(stream, trio.SocketStream):
        return _socket_sender(stream)
    if isinstance(stream, trio.SSLStream):
        return TlsNowait.over(stream)
    return None


def _socket_sender(stream: trio.SocketStream) -> SendNowait:
    fd = stream.socket.fileno()
    write = os.write

    def send_socket(data: bytearray) -> int:
        try:
            return write(fd, data)
        except BlockingIOError:
            return 0

    return send_socket


class ListenError(OSError):
    """A port that cannot be listened on; its message says which and why:
    ``cannot listen on 127.0.0.1:9010 (address already in use)`` (:func:`listen_error`).
    ``errno`` is the socket's; ``host`` and ``port`` are what was asked for."""

    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        return str(self.strerror)


_LISTEN_REASONS = {
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "no such address on this machine",
    errno.EACCES: "permission denied",
}


def listen_error(host: str, port: int, exc: OSError) -> ListenError:
    """``exc``, raised when listening on ``host:port``, as a :class:`ListenError`."""
    if isinstance(exc, socket.gaierror):
        reason = f"cannot resolve {host!r}: {exc.strerror or exc}"
    else:
        reason = _LISTEN_REASONS.get(exc.errno or 0) or str(exc.strerror or exc).lower()
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    error = ListenError(exc.errno, f"cannot listen on {where} ({reason})")
    error.host, error.port = host, port
    return error


def listen_error_in(exc: BaseException) -> ListenError | None:
    """The :class:`ListenError` that is ``exc`` or is inside it (an ``ExceptionGroup`` of
    a nursery, at any depth), or ``None``."""
    if isinstance(exc, ListenError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = listen_error_in(inner)
            if found is not None:
                return found
    return None


class Network(Protocol):
    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        """Connect to ``host:port``; raise ``OSError`` if it cannot."""
        ...

    async def serve(
        self,
        host: str,
        port: int,
        handler: StreamHandler,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections forever, running ``handler`` for each in its own task.

        Reports the bound port through ``task_status`` once listening; raises
        :class:`ListenError` if it cannot listen (the port is taken, the address is not
        this machine's).
        """
        ...
