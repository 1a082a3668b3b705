"""Log record framing, shared by the consensus core, the archive and every reader.

A log record is ``u32 length | u32 crc32(body) | body`` (little-endian), where the body is
one encoded log message (:data:`cluster.protocol.LOG`).  The log position is the byte
offset of a record in this stream, the same on every member: replication ships byte
ranges of records unchanged.

This module is pure (no I/O) so the sans-IO core may use it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

RECORD_HEADER = struct.Struct("<II")
RECORD_HEADER_LENGTH = RECORD_HEADER.size
MAX_RECORD_LENGTH = 64 << 20
"""Upper bound on a record body; a larger length field is treated as corruption."""

_crc32 = zlib.crc32
_unpack_from = RECORD_HEADER.unpack_from


class RecordError(Exception):
    """A record that fails its length or CRC check; ``offset`` is where it starts."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"bad record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def append_record(buf: bytearray, body: bytes | bytearray | memoryview) -> int:
    """Append ``body`` as a record to ``buf``; return the record's total length."""
    buf += RECORD_HEADER.pack(len(body), _crc32(body))
    buf += body
    return RECORD_HEADER_LENGTH + len(body)


def encode_record(body: bytes | bytearray | memoryview) -> bytes:
    """Return ``body`` framed as one record."""
    return RECORD_HEADER.pack(len(body), _crc32(body)) + bytes(body)


def iter_records(
    data: bytes | bytearray | memoryview,
    offset: int = 0,
    end: int | None = None,
    *,
    check_crc: bool = True,
) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(offset, body)`` for each complete, CRC-valid record in ``data[offset:end]``.

    Stops quietly at an incomplete record at the end (the caller checks the offset it
    reached); raises :class:`RecordError` at a record whose length or CRC is wrong.
    ``check_crc=False`` skips the CRC, for bytes already checked (a member's log in
    memory: checked when it arrived, or when the archive was opened).
    """
    view = memoryview(data)
    stop = len(view) if end is None else end
    while stop - offset >= RECORD_HEADER_LENGTH:
        length, crc = _unpack_from(view, offset)
        if length > MAX_RECORD_LENGTH:
            raise RecordError(offset, f"length {length} exceeds {MAX_RECORD_LENGTH}")
        body_start = offset + RECORD_HEADER_LENGTH
        body_end = body_start + length
        if body_end > stop:
            return
        body = view[body_start:body_end]
        if check_crc and _crc32(body) != crc:
            raise RecordError(offset, "crc mismatch")
        yield offset, body
        offset = body_end


def complete_length(data: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """Number of bytes from ``offset`` that form whole records (CRC not checked)."""
    view = memoryview(data)
    stop = len(view)
    pos = offset
    while stop - pos >= RECORD_HEADER_LENGTH:
        length, _ = _unpack_from(view, pos)
        if pos + RECORD_HEADER_LENGTH + length > stop:
            break
        pos += RECORD_HEADER_LENGTH + length
    return pos - offset
