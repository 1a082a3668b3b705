"""Batched frame writing and frame reading over any ``trio.abc.Stream``.

:class:`FrameWriter` gathers frames from many producers into one buffer; its
:meth:`~FrameWriter.run` task sends whatever has accumulated with one ``send_all`` per
wake-up, so a burst of messages costs one syscall.  The buffer is bounded: ``write``
returns False instead of growing past ``max_backlog`` (the caller decides what back
pressure means).
"""

from __future__ import annotations

from typing import Any

import trio

from ..protocol.codec import encode_into
from ..protocol.framing import LENGTH, FrameDecoder

HEADER_ZERO = b"\0\0\0\0"
RECEIVE_SIZE = 256 * 1024


class FrameWriter:
    __slots__ = ("_buf", "_closing", "_wake", "max_backlog")

    def __init__(self, max_backlog: int = 8 << 20) -> None:
        self.max_backlog = max_backlog
        self._buf = bytearray()
        self._wake = trio.Event()
        self._closing = False

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
        self._wake.set()
        return True

    def write_raw(self, data: bytes) -> bool:
        """Queue already framed bytes."""
        if self._closing or len(self._buf) >= self.max_backlog:
            return False
        self._buf += data
        self._wake.set()
        return True

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
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                if self._buf:
                    data, self._buf = self._buf, bytearray()
                    await stream.send_all(data)
                if self._closing and not self._buf:
                    return
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


async def read_frames(
    stream: trio.abc.Stream, decoder: FrameDecoder, receive_size: int = RECEIVE_SIZE
) -> list[bytes] | None:
    """Receive once and return the complete frames (possibly none); None at EOF.

    Raises :class:`~cluster.protocol.errors.ProtocolError` on a bad length prefix.
    """
    data = await stream.receive_some(receive_size)
    if not data:
        return None
    return decoder.feed(data)
