"""Length-prefixed framing: ``u32 little-endian body length`` then the body.

The decoder is sans-IO: feed it whatever bytes arrived and it returns the complete
frame bodies.  A length of zero or above ``max_frame_size`` is a :class:`ProtocolError`,
raised before any allocation for the body, so a hostile peer cannot make the node
allocate more than one frame's worth of memory.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .codec import DECODE_ERRORS, Codec, encode_into
from .errors import ProtocolError

LENGTH = struct.Struct("<I")
_unpack_length = LENGTH.unpack_from
T = TypeVar("T")
HEADER_LENGTH = LENGTH.size
DEFAULT_MAX_FRAME_SIZE = 1 << 20  # 1 MiB


def frame(body: bytes) -> bytes:
    """Prefix an already encoded body with its length."""
    return LENGTH.pack(len(body)) + body


def encode_frame(message: Any) -> bytes:
    """Encode one message as a complete frame."""
    buf = bytearray(HEADER_LENGTH)
    encode_into(message, buf, HEADER_LENGTH)
    LENGTH.pack_into(buf, 0, len(buf) - HEADER_LENGTH)
    return bytes(buf)


def encode_frames_into(buf: bytearray, messages: Iterable[Any]) -> None:
    """Append each message to ``buf`` as a frame (one buffer for a whole batch)."""
    for message in messages:
        start = len(buf)
        buf.extend(b"\0\0\0\0")
        encode_into(message, buf, start + HEADER_LENGTH)
        LENGTH.pack_into(buf, start, len(buf) - start - HEADER_LENGTH)


class FrameDecoder:
    """Incremental frame splitter with a maximum frame size."""

    __slots__ = ("_buf", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 1:
            raise ValueError("max_frame_size must be positive")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add received bytes; return every complete frame body now available."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        offset = 0
        end = len(buf)
        max_size = self.max_frame_size
        while end - offset >= HEADER_LENGTH:
            (length,) = LENGTH.unpack_from(buf, offset)
            if length == 0 or length > max_size:
                self._buf = bytearray()
                raise ProtocolError(f"frame length {length} outside 1..{max_size} (max frame size)")
            stop = offset + HEADER_LENGTH + length
            if stop > end:
                break
            frames.append(bytes(buf[offset + HEADER_LENGTH : stop]))
            offset = stop
        if offset:
            del buf[:offset]
        return frames

    def decode_into(
        self,
        data: bytes | bytearray | memoryview,
        decode: Codec[T] | Callable[[memoryview], T],
        out: list[T],
    ) -> int:
        """Add received bytes; append every complete frame, decoded straight from the
        receive buffer (no copy of the body), to ``out``; return how many.

        ``decode`` is a :class:`Codec` or a callable (which must not keep the view it
        is given).  On a bad length or a frame that does not decode (a
        :class:`ProtocolError`), the frames before it are in ``out``.
        """
        codec: Codec[T] | None = None
        if isinstance(decode, Codec):
            codec = decode
            decode_one: Callable[[memoryview], T] = decode.raw_decode
        else:
            decode_one = decode
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray | memoryview = buf
        else:
            src = data
        end = len(src)
        offset = count = 0
        max_size = self.max_frame_size
        unpack = _unpack_length
        append = out.append
        try:
            with memoryview(src) as view:
                while end - offset >= HEADER_LENGTH:
                    (length,) = unpack(view, offset)
                    if length == 0 or length > max_size:
                        raise ProtocolError(
                            f"frame length {length} outside 1..{max_size} (max frame size)"
                        )
                    stop = offset + HEADER_LENGTH + length
                    if stop > end:
                        break
                    append(decode_one(view[offset + HEADER_LENGTH : stop]))
                    offset = stop
                    count += 1
                rest = bytearray(view[offset:]) if src is not buf and offset < end else None
        except ProtocolError:
            self._buf = bytearray()
            raise
        except DECODE_ERRORS as exc:
            if codec is None:
                raise
            self._buf = bytearray()
            raise codec.error(exc) from None
        if src is buf:
            if offset:
                del buf[:offset]
        elif rest is not None:
            self._buf = rest
        return count
