"""``archive/synced-position``: a lower bound of where this member's log is durable.

A power cut and bit rot both leave a record that fails its CRC; start-up must truncate
the first (the member never acknowledged those bytes) and refuse the second (those
bytes were acknowledged: dropping them could lose a committed entry).  The argument:

1. With :attr:`~cluster.archive.segments.FsyncPolicy.BATCH` an append counts as
   appended (its position is reported, to the leader or to the leader's own quorum)
   only once its ``fdatasync`` has returned, and the next append writes only after that.
   So at any moment at most one write is unsynced: the last, one contiguous range
   ``[S, E)`` of the last segment beginning at the synced end ``S`` (earlier segments
   were synced before the next was created).
2. A power cut keeps every synced byte.  Of the unsynced write it keeps each 512-byte
   sector whole, new or lost, in any order (a disk writes a page's sectors in any order);
   a lost sector reads as zeros past ``S`` (the file was never durably that long: a
   hole, an unwritten extent), or the file ends before it.
3. So the first record the cut damaged starts at some ``X >= S`` and overlaps a lost
   sector, which reads as zeros from ``X`` (or the sector's start) to the sector's end
   (or the file's).  Every byte after ``X`` belongs to the same unsynced write: valid
   records there were written, never acknowledged.  Truncating at ``X`` loses nothing
   this member acknowledged, and it fetches them again from the leader.
4. Rot changes synced bytes, below ``S``.  ``S`` itself cannot be known at start-up
   without a second flush per append, ordered after the first (a file saying "synced to
   S" may reach the disk before the data its flush covers): 1.0-1.9 ms per append became
   3.6-4.0 ms on the development machine.  This file holds a lower bound ``F <= S``
   instead: written, and ``fdatasync``-ed, after an append's own ``fdatasync`` once
   :data:`MARK_EVERY` bytes were synced since the last mark (one more flush per MiB of
   log: nothing per append); lowered, durably and first, before the log is truncated
   below it; absent (0) in a new or replaced log directory.

Start-up (:func:`cluster.archive.reader.check_torn_tail`) therefore judges the first bad
record of the last segment, at position ``X``: below ``F`` it is rot, refused; with no
valid record after it, or with a zero sector as in 3, a torn write, truncated; anything
else, rot, refused with the file, the position and the remedy.  What it cannot tell
apart: rot after ``F`` (at most :data:`MARK_EVERY` bytes and the last append, the newest
log) in a record that holds a sector of zeros (its own, or made by the rot), or that
leaves nothing valid after it, is taken for a torn write, as a torn write is all it can
be told from.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

from ..fileio import RefusedFile, fsync_directory, read_regular, write_all
from .errors import ArchiveCorruptionError, ArchiveWriteError

logger = logging.getLogger("cluster.archive")

FILE_NAME = "synced-position"
MARK_EVERY = 1 << 20
"""Log bytes synced between two updates of the mark."""
_MAGIC = b"TSYN"
_MARK = struct.Struct("<4sQI")  # magic, position, crc32 of the first 12 bytes
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

REMEDY = (
    "the member's synced log changed on disk (bit rot, a misdirected write): if the "
    "other members are healthy, move this data directory aside and start the member on "
    "an empty --dir (docs/data-directory.md, replacing a failed member: it catches up "
    "from the leader); if they are not, keep the directory for the lost-majority runbook "
    "(docs/operations.md)"
)
"""What to do about damage a torn write cannot explain (named in the refusal)."""


def read_floor(directory: str | os.PathLike[str]) -> int:
    """The log position below which this member synced its log (0 if not recorded)."""
    path = Path(directory) / FILE_NAME
    try:
        data = read_regular(path, _MARK.size)
    except FileNotFoundError:
        return 0
    except (RefusedFile, OSError) as exc:
        raise ArchiveCorruptionError(path, 0, f"unreadable: {exc}") from None
    if not data.strip(b"\0"):  # made, its bytes lost with the power: none recorded
        return 0
    if len(data) == _MARK.size:
        magic, position, crc = _MARK.unpack(data)
        if magic == _MAGIC and zlib.crc32(data[:12]) == crc:
            return int(position)
    raise ArchiveCorruptionError(path, 0, f"not a synced position ({len(data)} bytes); " + REMEDY)


def check_floor(path: Path, end: int, floor: int) -> None:
    """Refuse a log that ends (at ``end``, in file ``path``) below its synced position."""
    if end < floor:
        raise ArchiveCorruptionError(
            path,
            end,
            f"the log ends at {end}, below position {floor} that this member had synced "
            f"({FILE_NAME}): synced log is missing; " + REMEDY,
        )


class SyncedMark:
    """Keeps ``synced-position`` in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, position: int) -> None:
        self.path = directory / FILE_NAME
        self.position = position
        """The position the file holds (durably, or it holds less)."""

    def synced(self, position: int) -> None:
        """The log is synced up to ``position``: record it if :data:`MARK_EVERY` bytes
        have passed.  A failure is logged and changes nothing (the mark stays lower,
        which stays true)."""
        if position - self.position < MARK_EVERY:
            return
        try:
            self._write(position)
        except OSError as exc:
            logger.warning("%s: not updated (%s)", self.path, exc.strerror or exc)

    def lower(self, position: int) -> None:
        """The log is about to be truncated at ``position``: lower the mark first.

        Raises:
            ArchiveWriteError: it could not be written (do not truncate then).
        """
        if position >= self.position:
            return
        try:
            self._write(position)
        except OSError as exc:
            raise ArchiveWriteError(
                exc.errno, f"lowering {self.path} to {position} failed: {exc.strerror or exc}"
            ) from exc

    def _write(self, position: int) -> None:
        head = struct.pack("<4sQ", _MAGIC, position)
        data = head + struct.pack("<I", zlib.crc32(head))
        flags = os.O_WRONLY | os.O_CREAT | _O_CLOEXEC
        new = not self.path.exists()
        fd = os.open(self.path, flags, 0o644)
        try:
            write_all(fd, data, 0)  # one sector: kept whole or not at all
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_directory(self.path.parent)
        self.position = position
