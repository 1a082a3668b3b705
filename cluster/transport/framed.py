"""Batched frame writing and frame reading over any ``trio.abc.Stream``.

:class:`FrameWriter` gathers frames from many producers into one buffer, and sends it in
one syscall either from the producer's own task (:meth:`~FrameWriter.flush`, at the end
of a duty cycle: no task switch) or from its :meth:`~FrameWriter.run` task, which sends
whatever has accumulated with one ``send_all`` per wake-up (when the socket is full, or
nobody flushed).  The buffer is bounded: ``write`` returns False instead of growing past
``max_backlog`` (the caller decides what back pressure means).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import trio

from ..protocol.codec import encode_into
from ..protocol.framing import LENGTH
from .base import SendNowait, nowait_sender

HEADER_ZERO = b"\0\0\0\0"
OTHER_READ_SIZE = 32 * 1024
"""The most a :class:`Receiver` asks of a stream that is no plain socket (TLS) at once."""


class FrameWriter:
    __slots__ = (
        "_buf",
        "_closing",
        "_owed",
        "_send_nowait",
        "_sending",
        "_wake",
        "flushed_by_owner",
        "max_backlog",
    )

    def __init__(self, max_backlog: int = 8 << 20, *, flushed_by_owner: bool = False) -> None:
        """``flushed_by_owner``: the owner promises to call :meth:`flush` after writing,
        so a write does not wake the writer task when the stream can be written
        directly (no task switch that finds nothing to do)."""
        self.max_backlog = max_backlog
        self.flushed_by_owner = flushed_by_owner
        self._buf = bytearray()
        self._wake = trio.Event()
        self._closing = False
        self._send_nowait: SendNowait | None = None
        self._owed: Callable[[], bool] | None = None
        self._sending = False

    @property
    def backlog(self) -> int:
        return len(self._buf)

    def write_message(self, message: Any) -> bool:
        """Queue one message as a frame; False if the backlog is full or closing."""
        buf = self._buf
        if self._closing or len(buf) >= self.max_backlog:
            return False
        start = len(buf)
        buf += HEADER_ZERO
        encode_into(message, buf, start + 4)
        LENGTH.pack_into(buf, start, len(buf) - start - 4)
        if not (self.flushed_by_owner and self._send_nowait is not None and not self._sending):
            self._wake.set()
        return True

    def write_raw(self, data: bytes) -> bool:
        """Queue already framed bytes."""
        if self._closing or len(self._buf) >= self.max_backlog:
            return False
        self._buf += data
        self._wake.set()
        return True

    def flush(self) -> None:
        """Send what is queued now, from the caller's task, if the stream can take it
        without waiting; whatever is left (a full socket buffer, an error) stays queued
        for the writer task."""
        send = self._send_nowait
        buf = self._buf
        if not buf:
            return
        if send is None or self._sending:
            self._wake.set()
            return
        try:
            sent = send(buf)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            self._wake.set()  # the writer task's send_all meets the error and reports it
            return
        if sent >= len(buf):
            self._buf = bytearray()
            owed = self._owed
            if owed is not None and owed():
                self._wake.set()  # taken, not all on the wire: the writer task drains it
            return
        if sent:
            del buf[:sent]
        self._wake.set()  # the socket is full: the writer task waits for room

    def close(self) -> None:
        """Flush what is queued, then close the stream (from :meth:`run`)."""
        self._closing = True
        self._wake.set()

    @property
    def closing(self) -> bool:
        return self._closing

    async def run(self, stream: trio.abc.Stream) -> None:
        """Send queued frames to ``stream`` until closed; closes the stream when done.

        Frames may be queued before the stream exists; they go out first.
        """
        send = self._send_nowait = nowait_sender(stream)
        drain = getattr(send, "drain", None)
        owed = self._owed = getattr(send, "owed", None)
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                if drain is not None and owed is not None and owed():
                    self._sending = True
                    try:
                        await drain()
                    finally:
                        self._sending = False
                if self._buf:
                    data, self._buf = self._buf, bytearray()
                    self._sending = True
                    try:
                        await stream.send_all(data)
                    finally:
                        self._sending = False
                if self._closing and not self._buf:
                    return
        finally:
            self._send_nowait = self._owed = None
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


class Receiver:
    """Reads a stream into one buffer of its own, reused for every read.

    ``stream.receive_some(n)`` makes a new bytes object of ``n`` bytes for each read
    and shrinks it to what arrived.  At the 256 KiB a busy connection wants that is a
    large allocation per read, which glibc takes from the heap once its mmap threshold
    has risen (it does, the first time a large block is freed), and the small objects
    allocated between two reads keep the heap from shrinking again: resident memory
    grew with every byte of log replicated, and was never given back (issue 36).  A
    plain TCP socket reads into this buffer instead (``recv_into``); what
    :meth:`receive` returns is a view of it, valid until the next read: decode it (the
    frame decoder copies what it keeps) before reading again.  Other streams (TLS, whose
    records are at most 16 KiB; the simulator's) read with ``receive_some`` of at most
    :data:`OTHER_READ_SIZE`.

    The buffer starts at ``size`` and :meth:`grow` enlarges it (a connection that has
    proved itself): a stranger's connection costs ``size``, not a busy link's buffer.
    """

    __slots__ = ("_buffer", "_recv_into", "_stream", "_view")

    def __init__(self, stream: trio.abc.Stream, size: int = 16 * 1024) -> None:
        self._stream = stream
        socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._recv_into = None if socket is None else socket.recv_into
        self._buffer = bytearray(size)
        self._view = memoryview(self._buffer)

    @property
    def size(self) -> int:
        return len(self._buffer)

    def grow(self, size: int) -> None:
        """Read up to ``size`` bytes at a time from now on (never shrinks)."""
        if size > len(self._buffer):
            self._view.release()
            self._buffer = bytearray(size)
            self._view = memoryview(self._buffer)

    async def receive(self) -> memoryview | bytes | bytearray:
        """The next bytes that arrived (empty at the end of the stream).  Raises
        ``trio.BrokenResourceError`` (a reset) and ``trio.ClosedResourceError`` as
        ``receive_some`` does."""
        recv_into = self._recv_into
        if recv_into is None:
            return await self._stream.receive_some(min(len(self._buffer), OTHER_READ_SIZE))
        try:
            count = await recv_into(self._buffer)
        except trio.ClosedResourceError:
            raise
        except OSError as exc:
            if exc.errno == errno.EBADF:  # closed here, as receive_some says it
                raise trio.ClosedResourceError("this stream was closed") from exc
            raise trio.BrokenResourceError(str(exc)) from exc
        return self._view[:count]
