"""The persisted log: a directory of append-only segment files of CRC-checked records.

On-disk format
--------------
The log is the concatenation of records framed as in :mod:`cluster.archive.record`
(``u32 length | u32 crc32(body) | body``, little-endian). Its *position* is the global
byte offset in that concatenation, identical on every member. The stream is cut into
segment files::

    <directory>/log-00000000000000000000.seg    records from position 0
    <directory>/log-00000000000000065563.seg    records from position 65563
    ...

``log-{base:020d}.seg`` holds the records starting at global position ``base``, with no
header and no padding: a segment's file size is exactly the number of log bytes it holds,
so the next segment's base equals ``base + size`` (checked on open). A record never spans
two segments. A segment takes appends until its size reaches ``segment_size``; the last
record may overshoot, so a segment ends at the first record boundary at or past
``segment_size`` (a single record larger than ``segment_size`` sits alone in its segment).
This layout depends only on the records, not on how they were batched. Record bodies are
never empty (encoded log messages never are), so a run of zero bytes, which a file system
may leave after a crash that extended a file before writing its data, is never valid data.

Durability and recovery
-----------------------
With :attr:`FsyncPolicy.BATCH` each :meth:`Archive.append` ends with ``fdatasync``
(group commit) and creating a segment fsyncs the directory, so an acknowledged position
survives power loss. Opening the archive checks every record's CRC: the first bad record
of the last segment, if it is a **torn tail**, is truncated (logged as a warning) and
fsynced; any other bad record is **corruption** and raises
:class:`ArchiveCorruptionError` naming the file and position. How the two are told apart,
and why a member stops rather than drop data, is stated in :mod:`cluster.archive.reader`,
which holds the reading side (listing and scanning segment files, :func:`read_log`), and
:mod:`cluster.archive.synced` (``synced-position``, where the log was durable at least).

Compaction and reset
--------------------
:meth:`Archive.purge` deletes whole segment files below a position (never the last
segment), oldest first, so a crash midway leaves a contiguous log; the recording log
names the new start first (``LOG_START``), and :meth:`Archive.open` given that
``start_position`` deletes what a crash left behind.  :meth:`Archive.reset` replaces
the whole log with an empty one beginning at a position (a follower installing its
leader's snapshot): the new directory is built beside the old one and renamed into
place, so a crash leaves one or the other, and :meth:`Archive.open` tidies up.

Only one thread may use an :class:`Archive` at a time (the Trio node calls it through
``trio.to_thread.run_sync``); :func:`read_log` reads a directory without opening it for
writing.
"""

from __future__ import annotations

import bisect
import enum
import errno
import logging
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from ..fileio import fsync_directory, write_all
from ..metrics import LatencyHistogram
from .errors import ArchiveCorruptionError, ArchiveError, ArchiveWriteError
from .layout import drop_below, finish_reset, reset_directory
from .reader import SegmentInfo as SegmentInfo
from .reader import check_torn_tail, drain_scan, pread_full, scan_records, segment_name
from .reader import list_segments as list_segments
from .reader import read_log as read_log
from .record import (
    MAX_RECORD_LENGTH,
    RECORD_HEADER,
    RECORD_HEADER_LENGTH,
    RecordError,
    iter_records,
)
from .synced import SyncedMark, check_floor, read_floor

__all__ = ["DEFAULT_SEGMENT_SIZE", "Archive", "FsyncPolicy", "SegmentInfo", "read_log"]

logger = logging.getLogger("cluster.archive")

DEFAULT_SEGMENT_SIZE = 64 << 20

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_unpack_header = RECORD_HEADER.unpack_from


_unpack_length = struct.Struct("<I").unpack_from


def _whole_records(view: memoryview, total: int) -> bool:
    """True if ``view`` is a sequence of whole, plausible records (a fast check; the
    slow path says what is wrong when it is not)."""
    unpack = _unpack_length
    limit = MAX_RECORD_LENGTH
    pos = 0
    last = total - RECORD_HEADER_LENGTH
    while pos <= last:
        (length,) = unpack(view, pos)
        if not 0 < length <= limit:
            return False
        pos += RECORD_HEADER_LENGTH + length
    return pos == total


class FsyncPolicy(enum.StrEnum):
    """When the archive forces appended data to stable storage."""

    BATCH = "batch"
    """``fdatasync`` once per :meth:`Archive.append` before it returns (group commit)."""
    NONE = "none"
    """Never sync appends: survives a process crash, not a power loss (Aeron's default)."""

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        """Parse a configuration value such as ``"batch"`` (case-insensitive)."""
        try:
            return cls(text.strip().lower())
        except (ValueError, AttributeError):
            choices = ", ".join(repr(p.value) for p in cls)
            raise ValueError(f"invalid fsync policy {text!r}: expected one of {choices}") from None


class Archive:
    """The persisted log of one member; see the module docstring for the format.

    Create it with :meth:`Archive.open`. Not thread-safe: one thread at a time.
    """

    def __init__(
        self,
        directory: Path,
        segments: list[SegmentInfo],
        fd: int | None,
        *,
        segment_size: int,
        fsync: FsyncPolicy,
        recovered_truncated_bytes: int,
        synced: int = 0,
    ) -> None:
        """Internal: use :meth:`Archive.open`."""
        self._directory = directory
        self._bases = [s.base for s in segments]
        self._paths = [s.path for s in segments]
        self._position = segments[-1].end if segments else 0
        self._fd = fd  # read-write descriptor of the last segment
        self._segment_size = segment_size
        self._fsync = fsync
        self._closed = False
        self._broken = False
        self._mark = SyncedMark(directory, synced)
        self.recovered_truncated_bytes = recovered_truncated_bytes
        """Bytes of torn tail that :meth:`open` cut off (0 after a clean shutdown)."""
        self.sync_times = LatencyHistogram()
        """How long each ``fdatasync`` of :meth:`append` took."""

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        fsync: FsyncPolicy = FsyncPolicy.BATCH,
        verify_from: int = 0,
        start_position: int = 0,
    ) -> Archive:
        """Open (creating if needed) the archive in ``directory`` and recover it.

        ``start_position`` is where the recording log says the log begins (after a
        compaction or a reset): segments wholly below it are deleted (a purge a crash
        cut short), and an archive with no segment left begins, empty, there.

        Every record from ``verify_from`` on (a record boundary, e.g. the latest
        snapshot's position, so that start-up time does not grow with the history behind
        it) is CRC-checked; a torn tail is truncated with a warning.  Records before
        ``verify_from`` are checked when they are read.

        Raises:
            ArchiveCorruptionError: segments are not contiguous, or a bad record is not a
                torn tail.
            ValueError: ``segment_size`` is not positive.
        """
        if segment_size <= 0:
            raise ValueError(f"segment_size must be positive, got {segment_size}")
        fsync = FsyncPolicy(fsync)
        path = Path(directory)
        finish_reset(path)
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            fsync_directory(path.parent)
        segments = drop_below(path, list_segments(path), start_position)
        synced = read_floor(path)
        truncated = 0
        fd: int | None = None
        try:
            for index, segment in enumerate(segments):
                last = index == len(segments) - 1
                flags = (os.O_RDWR if last else os.O_RDONLY) | _O_CLOEXEC
                if not last and segment.base + segment.length <= verify_from:
                    continue  # trusted history behind the verification point
                fd = os.open(segment.path, flags)
                scan_from = min(max(0, verify_from - segment.base), segment.length)
                bad = drain_scan(scan_records(fd, scan_from, segment.length))
                if bad is not None:
                    check_torn_tail(fd, segment, bad, last=last, synced=synced)
                    dropped = segment.length - bad.offset
                    os.ftruncate(fd, bad.offset)
                    os.fsync(fd)
                    logger.warning(
                        "%s: truncated torn tail at log position %d (%s): dropped %d bytes",
                        segment.path,
                        segment.base + bad.offset,
                        bad.reason,
                        dropped,
                    )
                    truncated += dropped
                    segments[index] = segment._replace(length=bad.offset)
                if not last:
                    os.close(fd)
                    fd = None
            if segments:
                check_floor(segments[-1].path, segments[-1].end, synced)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return cls(
            path,
            segments,
            fd,
            segment_size=segment_size,
            fsync=fsync,
            recovered_truncated_bytes=truncated,
            synced=synced,
        )

    # -- properties ---------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def position(self) -> int:
        """End of the durable log: the position of the next append."""
        return self._position

    @property
    def start_position(self) -> int:
        """Position of the first byte held (the first segment's base; 0 when empty)."""
        return self._bases[0] if self._bases else 0

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def fsync_policy(self) -> FsyncPolicy:
        return self._fsync

    @property
    def size(self) -> int:
        """Bytes of log held in the segments."""
        return self._position - self._bases[0] if self._bases else 0

    @property
    def segments(self) -> list[SegmentInfo]:
        """The segment files in log order."""
        if not self._bases:
            return []
        ends = [*self._bases[1:], self._position]
        return [
            SegmentInfo(base, path, end - base)
            for base, path, end in zip(self._bases, self._paths, ends, strict=True)
        ]

    def __repr__(self) -> str:
        return (
            f"<Archive {str(self._directory)!r} [{self.start_position}, {self._position}) "
            f"segments={len(self._bases)} fsync={self._fsync.value}>"
        )

    # -- writing ------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, *, checked: bool = False) -> int:
        """Append whole records at the end of the log; return the new :attr:`position`.

        With :attr:`FsyncPolicy.BATCH` the data is durable when this returns.
        ``checked``: the caller knows ``data`` to be whole records (the consensus module
        encoded them, or checked each one's length and CRC when it arrived), so they are
        walked only where the data must be cut between two segments.

        Raises:
            ValueError: ``data`` is not a sequence of whole, non-empty records.
            ArchiveWriteError: the write or sync failed (e.g. ENOSPC); the archive was
                rolled back to its previous position, so the call may be retried.
        """
        self._check_writable()
        view = memoryview(data)
        if not view.c_contiguous:
            raise ValueError("data must be a contiguous buffer")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if not view.nbytes:
            return self._position
        chunks = self._plan(view, checked)
        previous = (list(self._bases), list(self._paths), self._position)
        created: list[Path] = []
        try:
            for new_segment, begin, end in chunks:
                if new_segment:
                    self._create_segment(created)
                assert self._fd is not None
                self._write_all(self._fd, view[begin:end])
                self._position += end - begin
                if self._fsync is FsyncPolicy.BATCH:
                    began = time.perf_counter_ns()
                    os.fdatasync(self._fd)
                    self.sync_times.observe_ns(time.perf_counter_ns() - began)
                    self._mark.synced(self._position)
        except OSError as exc:
            self._rollback(*previous, created)
            failed = self._paths[-1] if self._paths else self._directory
            raise ArchiveWriteError(
                exc.errno,
                f"append of {view.nbytes} bytes at log position {previous[2]} failed "
                f"({exc.strerror or exc}); "
                + ("archive is unusable, reopen it" if self._broken else "rolled back"),
                str(failed),
            ) from exc
        return self._position

    def _plan(self, view: memoryview, checked: bool) -> list[tuple[bool, int, int]]:
        """Validate ``view`` (unless ``checked``) and cut it into ``(new_segment, begin,
        end)`` pieces."""
        size = self._segment_size
        new_segment = not self._bases or self._position - self._bases[-1] >= size
        filled = 0 if new_segment else self._position - self._bases[-1]
        total = view.nbytes
        if filled + total <= size and (checked or _whole_records(view, total)):
            return [(new_segment, 0, total)]  # the common case: it all fits
        chunks: list[tuple[bool, int, int]] = []
        begin = pos = 0
        while pos < total:
            if filled + (pos - begin) >= size and pos > begin:
                chunks.append((new_segment, begin, pos))
                new_segment, begin, filled = True, pos, 0
            if total - pos < RECORD_HEADER_LENGTH:
                raise ValueError(f"data ends inside a record header at offset {pos}")
            length, _ = _unpack_header(view, pos)
            if length == 0:
                raise ValueError(f"empty record at offset {pos}")
            if length > MAX_RECORD_LENGTH:
                raise ValueError(f"record at offset {pos} is longer than {MAX_RECORD_LENGTH}")
            if pos + RECORD_HEADER_LENGTH + length > total:
                raise ValueError(f"data ends inside the record at offset {pos}")
            pos += RECORD_HEADER_LENGTH + length
        chunks.append((new_segment, begin, total))
        return chunks

    def _create_segment(self, created: list[Path]) -> None:
        base = self._position
        path = self._directory / segment_name(base)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        created.append(path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._bases.append(base)
        self._paths.append(path)
        if self._fsync is FsyncPolicy.BATCH:
            fsync_directory(self._directory)

    def _write_all(self, fd: int, data: memoryview) -> None:
        write_all(fd, data, self._position - self._bases[-1])

    def _rollback(
        self, bases: list[int], paths: list[Path], position: int, created: list[Path]
    ) -> None:
        """Restore the state before a failed append, on disk and in memory."""
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
            self._bases, self._paths, self._position = bases, paths, position
            for path in created:
                path.unlink(missing_ok=True)
            if bases:
                self._fd = os.open(paths[-1], os.O_RDWR | _O_CLOEXEC)
                length = position - bases[-1]
                if os.fstat(self._fd).st_size != length:
                    os.ftruncate(self._fd, length)
            if created:
                fsync_directory(self._directory)
        except OSError:
            self._broken = True
            logger.exception("%s: rolling back a failed append failed", self._directory)

    def truncate(self, position: int) -> None:
        """Drop the log at and after ``position`` (a record boundary) and sync.

        Later segments are deleted from the last one backwards, so a crash midway leaves a
        contiguous log.

        Raises:
            ValueError: ``position`` is outside ``[start_position, position]`` or is not a
                record boundary (checked by scanning the segment that holds it).
            ArchiveWriteError: a file operation failed.
        """
        self._check_writable()
        if not self.start_position <= position <= self._position:
            raise ValueError(
                f"cannot truncate at {position}: log is [{self.start_position}, {self._position}]"
            )
        if not self._bases:
            return
        keep = max(0, bisect.bisect_left(self._bases, position) - 1)
        self._check_boundary(keep, position)
        self._mark.lower(position)  # first: it must never say more than the log holds
        try:
            removed = False
            while len(self._bases) > keep + 1:
                if self._fd is not None:
                    fd, self._fd = self._fd, None
                    os.close(fd)
                path = self._paths[-1]
                path.unlink()
                removed = True
                self._position = self._bases.pop()
                self._paths.pop()
            if self._fd is None:
                self._fd = os.open(self._paths[-1], os.O_RDWR | _O_CLOEXEC)
            os.ftruncate(self._fd, position - self._bases[-1])
            self._position = position
            os.fsync(self._fd)
            if removed:
                fsync_directory(self._directory)
        except OSError as exc:
            raise ArchiveWriteError(
                exc.errno, f"truncating the log at {position} failed: {exc.strerror or exc}"
            ) from exc

    def _check_boundary(self, index: int, position: int) -> None:
        """Raise ValueError unless ``position`` is a record boundary in segment ``index``."""
        base, path = self._bases[index], self._paths[index]
        if position == base:
            return
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            bad = drain_scan(scan_records(fd, 0, position - base))
        finally:
            os.close(fd)
        if bad is None:
            return
        if bad.reason == "incomplete record":
            raise ValueError(
                f"cannot truncate at {position}: it is inside the record at {base + bad.offset}"
            )
        raise ArchiveCorruptionError(
            path, base + bad.offset, f"{bad.reason} at file offset {bad.offset}"
        )

    # -- compaction -----------------------------------------------------------------------

    def purge_point(self, position: int) -> int:
        """Where the log would begin if everything wholly below ``position`` were
        purged: the base of the segment holding ``position`` (never past the last
        segment's base)."""
        if not self._bases:
            return self.start_position
        position = min(position, self._position)
        index = max(0, bisect.bisect_right(self._bases, position) - 1)
        return self._bases[index]

    def purge(self, position: int) -> int:
        """Delete the segment files wholly below ``position`` (a segment base, see
        :meth:`purge_point`; the last segment is never deleted), oldest first; return
        the bytes freed.  The recording log must already say the log begins there.

        Raises:
            ValueError: ``position`` is not a segment base within the log.
            ArchiveWriteError: deleting a file failed (the archive then begins at the
                first segment still there).
        """
        self._check_writable()
        if position == self.start_position:
            return 0
        if position not in self._bases:
            raise ValueError(f"cannot purge below {position}: not a segment base")
        count = self._bases.index(position)
        doomed = list(zip(self._bases[:count], self._paths[:count], self._bases[1:], strict=False))
        freed = 0
        try:
            for base, path, end in doomed:
                path.unlink(missing_ok=True)
                freed += end - base
                del self._bases[0]
                del self._paths[0]
            fsync_directory(self._directory)
        except OSError as exc:
            raise ArchiveWriteError(
                exc.errno, f"purging the log below {position} failed: {exc.strerror or exc}"
            ) from exc
        logger.info(
            "%s: purged %d segment(s) below log position %d (%d bytes)",
            self._directory,
            len(doomed),
            position,
            freed,
        )
        return freed

    def reset(self, position: int) -> None:
        """Replace the whole log with an empty one beginning at ``position`` (a
        follower installing its leader's snapshot: its own log is not the leader's).

        The new directory is made beside the old one and renamed into place, so a crash
        leaves either whole (:meth:`open` removes the other).

        Raises:
            ArchiveWriteError: a file operation failed (the archive is then unusable:
                reopen it).
        """
        self._check_open()
        directory = self._directory
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
            self._broken = True  # until the new log is in place
            segment = reset_directory(directory, position)
            self._fd = os.open(segment, os.O_RDWR | _O_CLOEXEC)
        except OSError as exc:
            raise ArchiveWriteError(
                exc.errno, f"resetting the log to {position} failed: {exc.strerror or exc}"
            ) from exc
        self._bases = [position]
        self._paths = [segment]
        self._position = position
        self._mark = SyncedMark(directory, 0)  # the new directory has none
        self._broken = False
        logger.info("%s: log replaced by an empty one beginning at %d", directory, position)

    # -- reading ------------------------------------------------------------------------

    def read(self, start: int, stop: int | None = None) -> bytes:
        """Raw log bytes ``[start, stop)`` (``stop`` defaults to :attr:`position`).

        Raises:
            ValueError: the range is not within ``[start_position, position]``.
        """
        self._check_open()
        if stop is None:
            stop = self._position
        if not self.start_position <= start <= stop <= self._position:
            raise ValueError(
                f"range [{start}, {stop}) is outside the log [{self.start_position}, "
                f"{self._position})"
            )
        parts: list[bytes] = []
        index = bisect.bisect_right(self._bases, start) - 1
        while start < stop:
            base = self._bases[index]
            end = self._bases[index + 1] if index + 1 < len(self._bases) else self._position
            size = min(stop, end) - start
            if size > 0:
                parts.append(self._read_segment(index, start - base, size))
                start += size
            index += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_checked(self, start: int, stop: int | None = None) -> bytes:
        """:meth:`read`, with every whole record checked (length, CRC): what is shipped
        to another member must be what was written.  Returns the records up to the first
        one that fails (a trailing part of a record, cut by ``stop``, is returned
        unchecked: the caller does not ship it).

        Raises:
            ArchiveCorruptionError: the record at ``start`` fails its check (naming the
                segment file and the record's log position).
        """
        data = self.read(start, stop)
        try:
            for _ in iter_records(data):
                pass
        except RecordError as exc:
            if exc.offset > 0:
                return data[: exc.offset]  # the intact records before it
            index = bisect.bisect_right(self._bases, start) - 1
            raise ArchiveCorruptionError(self._paths[index], start, exc.reason) from None
        return data

    def _read_segment(self, index: int, offset: int, size: int) -> bytes:
        path = self._paths[index]
        if index == len(self._paths) - 1 and self._fd is not None:
            data = pread_full(self._fd, size, offset)
        else:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
            try:
                data = pread_full(fd, size, offset)
            finally:
                os.close(fd)
        if len(data) != size:
            raise ArchiveCorruptionError(
                path,
                self._bases[index] + offset + len(data),
                "segment file is shorter than expected",
            )
        return data

    def records(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(position, body)`` for each record in ``[start, stop)``, CRC-checked.

        ``start`` must be a record boundary (otherwise the first record fails its check);
        ``stop`` defaults to the current :attr:`position`. Reads one segment at a time in
        chunks of :data:`~cluster.archive.reader.READ_CHUNK` bytes.

        Raises:
            ValueError: the range is outside the log, or ``stop`` is inside a record.
            ArchiveCorruptionError: a record fails its length or CRC check.
        """
        self._check_open()
        if stop is None:
            stop = self._position
        if not self.start_position <= start <= stop <= self._position:
            raise ValueError(
                f"range [{start}, {stop}) is outside the log [{self.start_position}, "
                f"{self._position})"
            )
        return self._records(start, stop, self.segments)

    def _records(
        self, start: int, stop: int, segments: list[SegmentInfo]
    ) -> Iterator[tuple[int, memoryview]]:
        for segment in segments:
            low = max(start, segment.base)
            high = min(stop, segment.end)
            if low >= high:
                continue
            fd = os.open(segment.path, os.O_RDONLY | _O_CLOEXEC)
            try:
                bad = yield from scan_records(
                    fd, low - segment.base, high - segment.base, segment.base
                )
            finally:
                os.close(fd)
            if bad is None:
                continue
            position = segment.base + bad.offset
            if high == stop < segment.end and bad.reason == "incomplete record":
                raise ValueError(f"stop {stop} is inside the record at {position}")
            hint = " (is start a record boundary?)" if position == start > segment.base else ""
            raise ArchiveCorruptionError(
                segment.path, position, f"{bad.reason} at file offset {bad.offset}{hint}"
            )

    # -- lifecycle ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ArchiveError(f"archive {self._directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._broken:
            raise ArchiveWriteError(
                errno.EIO,
                f"archive {self._directory} failed to roll back a failed write; reopen it",
            )

    def close(self) -> None:
        """Release file descriptors; idempotent."""
        self._closed = True
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
