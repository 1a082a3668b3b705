"""The network interface the agents see, so a simulated network can replace TCP.

A :class:`Network` opens outbound byte streams and serves inbound ones; streams are
``trio.abc.Stream`` objects.  :class:`~cluster.transport.tcp.TcpNetwork` is the real
thing; tests substitute an in-memory network with seeded faults.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

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
    (:class:`TlsNowait`).  Errors are raised as ``OSError``/``trio.BrokenResourceError``;
    callers leave the data queued and let the writer task's ``send_all`` meet and report
    them.  A sender that took bytes it could not all put on the wire yet has ``owed()``
    true; the writer task then calls ``await drain()`` before anything else.
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


class TlsNowait:
    """Sends from the caller's task on a ``trio.SSLStream`` whose handshake is done:
    encrypts with its ``SSLObject`` and writes the records to the socket at once.

    ``trio.SSLStream`` has no such send (each ``send_all`` wakes the writer task and
    takes its locks: at one message in flight, TLS doubled the latency and the CPU per
    message), so this works with its internals, under the same rules it keeps: nothing
    is sent while its send lock is held (another task's records are on their way) or
    records it holds back wait (``_delayed_outgoing``), and records that did not fit in
    the socket go to ``_delayed_outgoing``, which every later send of the stream puts
    first, and which :meth:`drain` (the writer task) sends.  Encrypting and writing
    happen without a checkpoint in between, so nothing can come between them.
    :meth:`over` returns None where this Trio's ``SSLStream`` lacks what it relies on
    (then the writer task sends everything, as before).
    """

    __slots__ = ("_broken", "_fd", "_inner", "_ok", "_stream", "partial_writes")

    def __init__(self, stream: trio.SSLStream[trio.SocketStream], ok: object, broken: object):
        self._stream: Any = stream
        self._inner = stream.transport_stream
        self._fd = self._inner.socket.fileno()
        self._ok = ok
        self._broken = broken
        self.partial_writes = 0
        """Sends whose records did not all fit in the socket (left to :meth:`drain`)."""

    @classmethod
    def over(cls, stream: trio.SSLStream[Any]) -> TlsNowait | None:
        state = getattr(stream, "_state", None)
        needed = ("_ssl_object", "_outgoing", "_inner_send_lock", "_delayed_outgoing",
                  "_handshook")  # fmt: skip
        if (
            state is None
            or not all(hasattr(stream, name) for name in needed)
            or not hasattr(type(state), "OK")
            or not hasattr(type(state), "BROKEN")
            or not isinstance(stream.transport_stream, trio.SocketStream)
        ):
            return None
        return cls(stream, type(state).OK, type(state).BROKEN)

    def __call__(self, data: bytearray) -> int:
        stream = self._stream
        if (
            stream._state is not self._ok
            or stream._delayed_outgoing is not None
            or stream._inner_send_lock.locked()
            or stream._outgoing.pending
            or not stream._handshook.done
        ):
            return 0  # the writer task sends it, through the stream
        try:
            stream._ssl_object.write(data)
        except ssl.SSLWantReadError:  # a renegotiation (TLS 1.2) wants the peer first
            return 0
        except ssl.SSLError as exc:
            stream._state = self._broken
            raise trio.BrokenResourceError(f"TLS: {exc}") from exc
        records = stream._outgoing.read()
        try:
            sent = os.write(self._fd, records)
        except BlockingIOError:
            sent = 0
        except OSError:
            stream._state = self._broken  # some records may have gone: the stream is done
            raise
        if sent < len(records):
            stream._delayed_outgoing = records[sent:]
            self.partial_writes += 1
        return len(data)

    def owed(self) -> bool:
        return self._stream._delayed_outgoing is not None

    async def drain(self) -> None:
        """Send the records :meth:`__call__` could not (in order: under the send lock)."""
        stream = self._stream
        async with stream._inner_send_lock:
            records, stream._delayed_outgoing = stream._delayed_outgoing, None
            if records:
                try:
                    await self._inner.send_all(records)
                except BaseException:
                    stream._state = self._broken
                    raise


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

        Reports the bound port through ``task_status`` once listening.
        """
        ...
