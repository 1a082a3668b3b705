"""Reading the log's segment files: listing, scanning, torn tail or corruption.

The format is described in :mod:`cluster.archive.segments`, whose
:class:`~cluster.archive.segments.Archive` writes and recovers the files. This module
reads them, for the archive and for read-only users (:func:`read_log`, the pipeline's
executors in :mod:`cluster.pipeline.source`):

* :func:`list_segments` finds a directory's segment files and checks they are contiguous;
* :func:`scan_records` yields the CRC-checked records of a byte range of one file, read
  :data:`READ_CHUNK` bytes at a time, and returns the first bad one as a
  :class:`BadRecord` instead of raising;
* :func:`check_torn_tail` decides whether a bad record is a torn tail or corruption.

Torn tail or corruption
-----------------------
Opening the archive checks every record's CRC:

* the first bad record of the *last* segment, at or past the member's synced position
  (:mod:`cluster.archive.synced`, which gives the argument), is a **torn tail** if no
  CRC-valid record can be found after its start, or if it overlaps a 512-byte sector that
  reads as zeros from its start (or the record's) to its end (or the file's): a sector of
  the last, unsynced write that the power cut did not keep, after which every valid
  record is the same unacknowledged write.  The segment is then truncated at that record
  (logged as a warning) and fsynced. Recovery looks for valid records (1) along the chain
  of length fields past it, which an incomplete record at the end of the file or a length
  running past it cannot offer; (2) as a complete record whose length field alone is
  damaged (a prefix of the bytes after its header matches its CRC); (3) at every byte
  offset within :data:`RESYNC_WINDOW`, for the records after damage to several headers;
* any other bad record (in an earlier segment, below the synced position, or followed by
  valid records with no lost sector to explain it) is **corruption** and raises
  :class:`ArchiveCorruptionError` naming the file, position and remedy.  A member must
  not silently drop entries it may have acknowledged: it stops, and the operator
  replaces it (it catches up from the leader).  In doubt it stops: a torn record whose
  partial body happens to embed a valid framed record, with no zero sector, is reported
  as corruption, and so is a bad complete record when the scan (3) exhausts
  :data:`RESYNC_CRC_BUDGET`.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import NamedTuple

from ..fileio import RefusedFile, not_a_file, open_regular, pread_full
from .errors import ArchiveCorruptionError
from .record import (
    MAX_RECORD_LENGTH,
    RECORD_HEADER,
    RECORD_HEADER_LENGTH,
    RecordError,
    iter_records,
)
from .synced import FILE_NAME as SYNCED_FILE
from .synced import REMEDY, read_floor

__all__ = [
    "READ_CHUNK",
    "RESYNC_CRC_BUDGET",
    "RESYNC_WINDOW",
    "BadRecord",
    "SegmentInfo",
    "check_torn_tail",
    "drain_scan",
    "list_segments",
    "open_regular_segment",
    "pread_full",
    "read_log",
    "scan_records",
    "segment_name",
]

READ_CHUNK = 4 << 20
"""Bytes read at a time when scanning records (a larger record is read whole)."""
RESYNC_WINDOW = 1 << 20
"""How far past a bad record recovery looks for valid records at every byte offset."""
RESYNC_CRC_BUDGET = 512 << 20
"""Bytes the resynchronising scan may checksum before it gives up (and reports corruption)."""
SECTOR = 512
"""What a disk writes whole: a power cut keeps or loses each sector of an unsynced write."""

_SEGMENT_NAME = re.compile(r"log-(\d{20})\.seg")
_unpack_header = RECORD_HEADER.unpack_from


class SegmentInfo(NamedTuple):
    """One segment file: it holds the log bytes ``[base, base + length)``."""

    base: int
    path: Path
    length: int

    @property
    def end(self) -> int:
        return self.base + self.length


class BadRecord(NamedTuple):
    """The first record of a scanned range that fails its checks (see :func:`scan_records`)."""

    offset: int
    """File offset of the bad record."""
    reason: str
    length: int | None
    """The record's length field, or None when not even its header is complete."""


def segment_name(base: int) -> str:
    """File name of the segment whose first record is at log position ``base``."""
    return f"log-{base:020d}.seg"


def list_segments(directory: str | os.PathLike[str]) -> list[SegmentInfo]:
    """The segment files in ``directory`` in log order, checked to be contiguous.

    Raises:
        ArchiveCorruptionError: a segment does not start where the previous one ends,
            or a segment's name is a symbolic link or a special file (its bytes are not
            the log's, and reading it may never end).
    """
    directory = Path(directory)
    found: list[tuple[int, Path, int]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            match = _SEGMENT_NAME.fullmatch(entry.name)
            if match is None:
                continue
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):  # skipped, its log would silently go
                refused = not_a_file(entry.path, info.st_mode)
                raise ArchiveCorruptionError(entry.path, int(match.group(1)), str(refused.strerror))
            found.append((int(match.group(1)), Path(entry.path), info.st_size))
    found.sort()
    segments: list[SegmentInfo] = []
    for base, path, size in found:
        segment = SegmentInfo(base, path, size)
        if segments and segments[-1].end != base:
            previous = segments[-1]
            raise ArchiveCorruptionError(
                path,
                previous.end,
                f"segment starts at log position {base} but the previous segment "
                f"{previous.path.name} ends at {previous.end} (segments must be contiguous)",
            )
        segments.append(segment)
    return segments


def open_regular_segment(segment: SegmentInfo) -> tuple[int, int]:
    """Open a listed segment to read it: a regular file still (not replaced by a link
    since it was listed); its descriptor and size.  A reader takes no more than
    ``segment.length`` from it.

    Raises:
        ArchiveCorruptionError: it is a link or a special file now.
        OSError: it cannot be opened (gone meanwhile).
    """
    try:
        return open_regular(segment.path)
    except RefusedFile as exc:
        raise ArchiveCorruptionError(segment.path, segment.base, str(exc.strerror)) from None


def scan_records(
    fd: int, start: int, end: int, base: int = 0, chunk_size: int | None = None
) -> Generator[tuple[int, memoryview], None, BadRecord | None]:
    """Yield ``(base + file_offset, body)`` for the records in file bytes ``[start, end)``.

    Reads ``chunk_size`` bytes at a time, carrying a partial record over to the next
    chunk. Returns None if the range holds whole valid records, else the first bad one.
    Bodies are views of immutable chunks, so they stay valid after the generator moves on.
    """
    if chunk_size is None:
        chunk_size = READ_CHUNK
    buf = b""
    buf_offset = start
    read_offset = start
    while True:
        consumed = 0
        try:
            for offset, body in iter_records(buf):
                if not body:
                    return BadRecord(buf_offset + offset, "empty record", 0)
                yield base + buf_offset + offset, body
                consumed = offset + RECORD_HEADER_LENGTH + len(body)
        except RecordError as exc:
            length, _ = _unpack_header(buf, exc.offset)
            return BadRecord(buf_offset + exc.offset, exc.reason, length)
        remaining = len(buf) - consumed
        header_length: int | None = None
        if remaining >= RECORD_HEADER_LENGTH:
            header_length, _ = _unpack_header(buf, consumed)
        if read_offset >= end:
            if remaining:
                return BadRecord(buf_offset + consumed, "incomplete record", header_length)
            return None
        need = chunk_size
        if header_length is not None:  # iter_records checked it against MAX_RECORD_LENGTH
            need = max(need, RECORD_HEADER_LENGTH + header_length - remaining)
        data = pread_full(fd, min(need, end - read_offset), read_offset)
        if not data:  # the file is shorter than expected
            end = read_offset
            continue
        read_offset += len(data)
        buf = buf[consumed:] + data if remaining else data
        buf_offset += consumed


def drain_scan(scan: Generator[tuple[int, memoryview], None, BadRecord | None]) -> BadRecord | None:
    """Run ``scan`` (from :func:`scan_records`) to the end; return what it returned."""
    while True:
        try:
            next(scan)
        except StopIteration as stop:
            result: BadRecord | None = stop.value
            return result


def _chain_has_valid_record(tail: memoryview, pos: int) -> bool:
    """Whether following the length fields from ``pos`` reaches a valid, non-empty record."""
    while len(tail) - pos >= RECORD_HEADER_LENGTH:
        length, crc = _unpack_header(tail, pos)
        end = pos + RECORD_HEADER_LENGTH + length
        if end > len(tail):
            return False
        if length and zlib.crc32(tail[pos + RECORD_HEADER_LENGTH : end]) == crc:
            return True
        pos = end
    return False


def _resync_finds_valid_record(tail: memoryview, start: int, window: int) -> bool | None:
    """Whether a valid, non-empty record of at most ``window`` bytes starts at any offset in
    ``[start, start + window)``: finds the records after a damaged length field.

    Candidates are checked shortest first. Returns None (undecided) once
    :data:`RESYNC_CRC_BUDGET` bytes have been checksummed, which only data full of
    plausible-looking lengths (small integers with zero high bytes) can cause.
    """
    size = len(tail)
    last = min(size - RECORD_HEADER_LENGTH, start + window - 1)
    candidates: list[int] = []  # length << 32 | pos, so that sorting puts short ones first
    for pos in range(start, last + 1):
        length, _ = _unpack_header(tail, pos)
        if 0 < length <= window and pos + RECORD_HEADER_LENGTH + length <= size:
            candidates.append(length << 32 | pos)
    candidates.sort()
    budget = RESYNC_CRC_BUDGET
    for candidate in candidates:
        length, pos = candidate >> 32, candidate & 0xFFFFFFFF
        budget -= length
        if budget < 0:
            return None
        body_start = pos + RECORD_HEADER_LENGTH
        if zlib.crc32(tail[body_start : body_start + length]) == _unpack_header(tail, pos)[1]:
            return True
    return False


def _intact_length(tail: memoryview, limit: int) -> int | None:
    """The length at which the body after the header at ``tail[0]`` matches its CRC field.

    Finds a complete record whose length field alone is damaged (one CRC per byte).
    """
    if len(tail) < RECORD_HEADER_LENGTH:
        return None
    _, crc = _unpack_header(tail, 0)
    body = tail[RECORD_HEADER_LENGTH : RECORD_HEADER_LENGTH + limit]
    running = 0
    for length in range(1, len(body) + 1):
        running = zlib.crc32(body[length - 1 : length], running)
        if running == crc:
            return length
    return None


def _lost_sector(tail: memoryview, offset: int, span: int) -> bool:
    """Whether a sector overlapping the first ``span`` bytes of ``tail`` (the file's bytes
    from ``offset``, a bad record's start) reads as zeros from there, or from its start,
    to its end or the file's: what a power cut leaves of an unsynced sector it lost."""
    end = min(len(tail), span)
    pos = 0
    while pos < end:
        stop = min(len(tail), pos + SECTOR - (offset + pos) % SECTOR)
        if tail[pos:stop] == bytes(stop - pos):
            return True
        pos = stop
    return False


def _why_not_torn(fd: int, file_length: int, bad: BadRecord) -> str | None:
    """None if the first bad record of the last segment is a torn write, else why not.

    It is torn unless a valid record can be found after its start (by following the chain
    of length fields past it, as a complete record under a damaged length field, or by
    resynchronising at every byte offset within :data:`RESYNC_WINDOW`, after damage to
    several headers) with no lost sector overlapping it (:func:`_lost_sector`) to show
    that those records are the rest of an unsynced write.  If the resynchronising scan
    runs out of budget, only a record cut short by the end of the file (what an
    interrupted write leaves) or a lost sector is taken as torn.  Runs only on the
    failure path; reads the rest of the segment.
    """
    tail = memoryview(pread_full(fd, max(0, file_length - bad.offset), bad.offset))
    plausible = bad.length is not None and bad.length <= MAX_RECORD_LENGTH
    span = RECORD_HEADER_LENGTH + (bad.length or 0 if plausible else 0)
    why = None
    if bad.length is not None and _chain_has_valid_record(tail, RECORD_HEADER_LENGTH + bad.length):
        why = "valid records follow it"
    elif (length := _intact_length(tail, RESYNC_WINDOW)) is not None:
        why = f"its length field is damaged: the record is intact with length {length}"
        span = max(span, RECORD_HEADER_LENGTH + length)
    else:
        found = _resync_finds_valid_record(tail, 1, RESYNC_WINDOW)
        prefix_torn = (  # what an interrupted write of one record leaves
            plausible
            and bad.length is not None
            and bad.length > 0
            and RECORD_HEADER_LENGTH + bad.length > len(tail)
        )
        if found:
            why = "valid records follow it"
        elif found is None and not prefix_torn:
            why = (
                "cannot rule out valid records after it; if the member crashed while "
                "writing and the log is known to be a torn tail, truncate the file at "
                "this offset"
            )
    if why is not None and _lost_sector(tail, bad.offset, span):
        return None  # the rest is the same unsynced write: nothing of it acknowledged
    if why is not None:
        why += ", and no sector of it reads as a power cut leaves one it lost"
    return why


def _corruption(segment: SegmentInfo, bad: BadRecord, why: str) -> ArchiveCorruptionError:
    return ArchiveCorruptionError(
        segment.path,
        segment.base + bad.offset,
        f"{bad.reason} at file offset {bad.offset} (not a torn write: {why}); {REMEDY}",
    )


def check_torn_tail(
    fd: int, segment: SegmentInfo, bad: BadRecord, *, last: bool, synced: int = 0
) -> None:
    """Return if ``bad`` is a torn tail, else raise :class:`ArchiveCorruptionError`.

    ``synced``: the log position below which this member had synced its log
    (:func:`cluster.archive.synced.read_floor`): damage there is never a torn write."""
    if not last:
        why: str | None = "it is not in the last segment"
    elif segment.base + bad.offset < synced:
        why = f"it is below log position {synced}, which this member had synced ({SYNCED_FILE})"
    else:
        why = _why_not_torn(fd, segment.length, bad)
    if why is not None:
        raise _corruption(segment, bad, why)


def read_log(directory: str | os.PathLike[str]) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(position, body)`` for every record of the log in ``directory``, read-only.

    Checks CRCs like :meth:`~cluster.archive.segments.Archive.open` but never repairs: a
    torn tail is simply where reading stops. Corruption raises
    :class:`ArchiveCorruptionError`. Safe to run while a node is appending (it reads up to
    the sizes seen when it starts).
    """
    synced = read_floor(directory)  # first: a node appending meanwhile only moves it on
    return _read_segments(list_segments(directory), synced)


def _read_segments(
    segments: list[SegmentInfo], synced: int = 0
) -> Iterator[tuple[int, memoryview]]:
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        fd, _size = open_regular_segment(segment)
        try:
            bad = yield from scan_records(fd, 0, segment.length, segment.base)
            if bad is None:
                continue
            check_torn_tail(fd, segment, bad, last=last, synced=synced)
            return
        finally:
            os.close(fd)
