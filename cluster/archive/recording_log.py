"""The recording log (``recording.log``): index of leadership terms and snapshots.

Modelled on Aeron Cluster's ``RecordingLog``. The file is an array of fixed 64-byte
little-endian entries, appended in the order they are created and updated in place::

    offset  type  field
         0  i64   recording_id
         8  i64   leadership_term_id
        16  i64   term_base_log_position
        24  i64   log_position    term end once committed (-1 while open); snapshot position
        32  i64   timestamp       cluster time units
        40  i32   service_id      -1 for the consensus module and for TERM entries
        44  i32   entry_type      TERM=0, SNAPSHOT=1, LOG_START=2, LOG_RESET=3;
                                  bit 31 set = invalidated
        48  12 x  reserved (zero)
        60  u32   crc32 of bytes 0..59

Every write is one aligned 64-byte ``pwrite`` followed by ``fsync`` (and the directory is
fsynced when the file is created). On open, a partial or CRC-failing *last* entry is a
torn write and is truncated with a warning; a bad entry before the last one raises
:class:`ArchiveCorruptionError` naming the file and byte offset.

**Log start.** Compaction deletes archive segments wholly below a retained snapshot;
a ``LOG_START`` entry (written *before* the files are deleted) says the log now begins
at ``log_position`` (a segment base), so start-up finishes an interrupted deletion and
recovery never looks below it.  A ``LOG_RESET`` entry is written by a follower that
installs a snapshot sent by its leader, *before* it replaces its archive with an empty
one beginning at the snapshot's position: until the snapshot itself is recorded after
it, start-up redoes the install's last steps (:mod:`cluster.archive.compaction`).
:attr:`log_start` is the highest position either names.

:attr:`RecordingLog.entries` is sorted as in Aeron: by leadership term, term base, TERM
before SNAPSHOT, log position, then service id descending, so a consensus-module
snapshot (service -1) comes right after the service snapshots taken with it.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Self

from ..fileio import fsync_directory, read_regular
from .errors import ArchiveCorruptionError

__all__ = [
    "ENTRY_LENGTH",
    "ENTRY_TYPE_LOG_RESET",
    "ENTRY_TYPE_LOG_START",
    "ENTRY_TYPE_SNAPSHOT",
    "ENTRY_TYPE_TERM",
    "Entry",
    "RecordingLog",
]

logger = logging.getLogger("cluster.archive")

FILE_NAME = "recording.log"
ENTRY_TYPE_TERM = 0
ENTRY_TYPE_SNAPSHOT = 1
ENTRY_TYPE_LOG_START = 2
"""The archive was compacted: the log begins at ``log_position`` (segments below it were
deleted)."""
ENTRY_TYPE_LOG_RESET = 3
"""A snapshot install from the leader replaced the whole log: it begins, empty, at
``log_position``, the snapshot's position (term ``leadership_term_id``, which began at
``term_base_log_position``)."""
_LOG_START_TYPES = (ENTRY_TYPE_LOG_START, ENTRY_TYPE_LOG_RESET)
INVALID_FLAG = -(1 << 31)
"""Bit 31 of ``entry_type`` (as a signed i32): the entry has been invalidated."""
NULL_POSITION = -1
CM_SERVICE_ID = -1

_ENTRY = struct.Struct("<qqqqqii12xI")
ENTRY_LENGTH = _ENTRY.size
_CRC_OFFSET = ENTRY_LENGTH - 4
assert ENTRY_LENGTH == 64


@dataclass(frozen=True, slots=True)
class Entry:
    """One recording-log entry; ``index`` is its slot in the file."""

    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int
    timestamp: int
    service_id: int
    entry_type: int
    index: int

    @property
    def type(self) -> int:
        """``entry_type`` without the invalid flag."""
        return self.entry_type & 0x7FFFFFFF

    @property
    def is_valid(self) -> bool:
        return self.entry_type >= 0

    def encode(self) -> bytes:
        fields = (self.recording_id, self.leadership_term_id, self.term_base_log_position)
        rest = (self.log_position, self.timestamp, self.service_id, self.entry_type)
        packed = bytearray(_ENTRY.pack(*fields, *rest, 0))
        struct.pack_into("<I", packed, _CRC_OFFSET, zlib.crc32(packed[:_CRC_OFFSET]))
        return bytes(packed)


def _decode(raw: bytes, index: int) -> Entry:
    recording_id, term_id, term_base, log_position, timestamp, service_id, entry_type, _ = (
        _ENTRY.unpack(raw)
    )
    return Entry(
        recording_id, term_id, term_base, log_position, timestamp, service_id, entry_type, index
    )


def _sort_key(entry: Entry) -> tuple[int, int, int, int, int]:
    return (
        entry.leadership_term_id,
        entry.term_base_log_position,
        entry.type,
        entry.log_position,
        -entry.service_id,
    )


def _parse(path: Path, data: bytes) -> list[Entry]:
    """The entries in a recording log's bytes, up to a torn last one (left out); a bad
    entry before the last raises :class:`ArchiveCorruptionError`."""
    slots: list[Entry] = []
    count = len(data) // ENTRY_LENGTH
    for index in range(count):
        offset = index * ENTRY_LENGTH
        raw = data[offset : offset + ENTRY_LENGTH]
        (crc,) = struct.unpack_from("<I", raw, _CRC_OFFSET)
        if zlib.crc32(raw[:_CRC_OFFSET]) != crc:
            if index < count - 1:
                raise ArchiveCorruptionError(path, offset, "recording log entry crc mismatch")
            break
        slots.append(_decode(raw, index))
    return slots


class RecordingLog:
    """The ``recording.log`` of one member. Not thread-safe."""

    def __init__(self, path: Path, fd: int, slots: list[Entry], torn_at: int | None = None) -> None:
        """Internal: use :meth:`RecordingLog.open`."""
        self._path = path
        self._fd = fd
        self._slots = slots
        self.torn_at = torn_at
        """:meth:`read` only: the byte offset of a torn last entry it left out (None:
        the file is whole)."""

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> RecordingLog:
        """Open or create ``<directory>/recording.log``, repairing a torn last entry."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / FILE_NAME
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if created:
                os.fsync(fd)
                fsync_directory(directory)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            slots = _parse(path, data)
            good = len(slots) * ENTRY_LENGTH
            if good != len(data):
                os.ftruncate(fd, good)
                os.fsync(fd)
                logger.warning(
                    "%s: truncated torn entry at offset %d: dropped %d bytes",
                    path,
                    good,
                    len(data) - good,
                )
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, slots)

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> RecordingLog:
        """``<directory>/recording.log`` read and never written (offline tools): a torn
        last entry is left out, not truncated (:attr:`torn_at` says where); a bad entry
        before it raises :class:`ArchiveCorruptionError`, and so does a file that cannot
        be read, a link or a special file in its place; a missing file reads as empty.
        Its write methods fail (there is no descriptor)."""
        path = Path(directory) / FILE_NAME
        try:
            data = read_regular(path)
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            raise ArchiveCorruptionError(
                path, 0, f"cannot read the recording log: {exc.strerror or exc}"
            ) from None
        return cls.of_bytes(path, data)

    @classmethod
    def of_bytes(cls, path: Path, data: bytes) -> RecordingLog:
        """The recording log whose file ``path`` held ``data`` (see :meth:`read`)."""
        slots = _parse(path, data)
        whole = len(slots) * ENTRY_LENGTH
        return cls(path, -1, slots, None if whole == len(data) else whole)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def entries(self) -> list[Entry]:
        """All entries, invalidated ones included, in Aeron's sort order."""
        return sorted(self._slots, key=_sort_key)

    def _write(self, entry: Entry) -> Entry:
        os.pwrite(self._fd, entry.encode(), entry.index * ENTRY_LENGTH)
        os.fsync(self._fd)
        if entry.index == len(self._slots):
            self._slots.append(entry)
        else:
            self._slots[entry.index] = entry
        return entry

    def _terms(self) -> list[Entry]:
        return [e for e in self._slots if e.is_valid and e.type == ENTRY_TYPE_TERM]

    def get_term_entry(self, leadership_term_id: int) -> Entry | None:
        return next((e for e in self._terms() if e.leadership_term_id == leadership_term_id), None)

    def find_last_term(self) -> Entry | None:
        """The valid TERM entry with the highest leadership term id."""
        return max(self._terms(), key=lambda e: e.leadership_term_id, default=None)

    def append_term(
        self,
        leadership_term_id: int,
        term_base_log_position: int,
        timestamp: int,
        recording_id: int = 0,
    ) -> Entry:
        """Record the start of a term, committing the previous term's end to its base.

        Raises:
            ValueError: the term is already recorded, or its base precedes the previous
                term's base.
        """
        terms = self._terms()
        if any(e.leadership_term_id == leadership_term_id for e in terms):
            raise ValueError(f"leadership term {leadership_term_id} is already in the log")
        earlier = [e for e in terms if e.leadership_term_id < leadership_term_id]
        later = [e for e in terms if e.leadership_term_id > leadership_term_id]
        previous = max(earlier, key=lambda e: e.leadership_term_id, default=None)
        following = min(later, key=lambda e: e.leadership_term_id, default=None)
        if previous is not None and term_base_log_position < previous.term_base_log_position:
            raise ValueError(
                f"term {leadership_term_id} base {term_base_log_position} precedes term "
                f"{previous.leadership_term_id} base {previous.term_base_log_position}"
            )
        if previous is not None and previous.log_position != term_base_log_position:
            self._write(replace(previous, log_position=term_base_log_position))
        end = NULL_POSITION if following is None else following.term_base_log_position
        entry = Entry(
            recording_id,
            leadership_term_id,
            term_base_log_position,
            end,
            timestamp,
            CM_SERVICE_ID,
            ENTRY_TYPE_TERM,
            index=len(self._slots),
        )
        return self._write(entry)

    def remove_terms_from(self, log_position: int) -> list[int]:
        """Invalidate every TERM entry whose base is at or after ``log_position``.

        Used when the log is truncated (a deposed leader's uncommitted entries are
        discarded): those terms no longer have entries here.  The last remaining term is
        reopened (its end set back to -1).  Returns the removed term ids.
        """
        removed = []
        for entry in self._terms():
            if entry.term_base_log_position >= log_position:
                self._write(replace(entry, entry_type=entry.entry_type | INVALID_FLAG))
                removed.append(entry.leadership_term_id)
        last = self.find_last_term()
        if removed and last is not None and last.log_position != NULL_POSITION:
            self._write(replace(last, log_position=NULL_POSITION))
        return removed

    def commit_log_position(self, leadership_term_id: int, log_position: int) -> None:
        """Set the end position of a term. Raises ValueError for an unknown term."""
        entry = self.get_term_entry(leadership_term_id)
        if entry is None:
            raise ValueError(f"unknown leadership term {leadership_term_id}")
        if entry.log_position != log_position:
            self._write(replace(entry, log_position=log_position))

    def append_snapshot(
        self,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        timestamp: int,
        service_id: int,
        recording_id: int = 0,
    ) -> Entry:
        """Record a snapshot (services first, then the consensus module with id -1).

        Appending an invalidated snapshot again with the same fields restores it.
        """
        entry = Entry(
            recording_id,
            leadership_term_id,
            term_base_log_position,
            log_position,
            timestamp,
            service_id,
            ENTRY_TYPE_SNAPSHOT,
            index=len(self._slots),
        )
        for old in self._slots:
            if not old.is_valid and replace(old, entry_type=ENTRY_TYPE_SNAPSHOT) == replace(
                entry, index=old.index
            ):
                return self._write(replace(old, entry_type=ENTRY_TYPE_SNAPSHOT))
        return self._write(entry)

    def snapshots(self, service_id: int = CM_SERVICE_ID) -> list[Entry]:
        """The valid snapshot entries of ``service_id`` at or after :attr:`log_start`
        (older ones have no log after them), oldest first."""
        start = self.log_start
        return [
            e
            for e in sorted(self._slots, key=lambda e: (e.log_position, e.index))
            if e.is_valid
            and e.type == ENTRY_TYPE_SNAPSHOT
            and e.service_id == service_id
            and e.log_position >= start
        ]

    def latest_log_start(self) -> Entry | None:
        """The valid LOG_START or LOG_RESET entry with the highest position (the later
        one of equals), or None if the log was never compacted or reset."""
        best: Entry | None = None
        for entry in self._slots:
            if (
                entry.is_valid
                and entry.type in _LOG_START_TYPES
                and (best is None or entry.log_position >= best.log_position)
            ):
                best = entry
        return best

    @property
    def log_start(self) -> int:
        """Where the log begins: nothing below it is kept (0 if never compacted)."""
        entry = self.latest_log_start()
        return 0 if entry is None else entry.log_position

    def append_log_start(
        self,
        log_position: int,
        leadership_term_id: int,
        term_base_log_position: int,
        timestamp: int,
        *,
        reset: bool = False,
    ) -> Entry:
        """Record that the log now begins at ``log_position`` (``reset``: it was
        replaced by a snapshot install).  Written before any file is deleted.

        Raises:
            ValueError: the position is below the current :attr:`log_start`.
        """
        if log_position < self.log_start:
            raise ValueError(f"log start {log_position} is below the current {self.log_start}")
        entry = Entry(
            0,
            leadership_term_id,
            term_base_log_position,
            log_position,
            timestamp,
            CM_SERVICE_ID,
            ENTRY_TYPE_LOG_RESET if reset else ENTRY_TYPE_LOG_START,
            index=len(self._slots),
        )
        return self._write(entry)

    def replace_terms(
        self, leadership_term_id: int, term_base_log_position: int, timestamp: int
    ) -> None:
        """Invalidate every TERM entry and record ``leadership_term_id`` as the only
        term (a snapshot install replaced the whole log)."""
        for entry in self._terms():
            self._write(replace(entry, entry_type=entry.entry_type | INVALID_FLAG))
        self.append_term(leadership_term_id, term_base_log_position, timestamp)

    def get_latest_snapshot(self, service_id: int) -> Entry | None:
        """The newest valid snapshot entry of ``service_id`` (-1: the consensus module)."""
        for entry in reversed(self.entries):
            if (
                entry.is_valid
                and entry.type == ENTRY_TYPE_SNAPSHOT
                and entry.service_id == service_id
            ):
                return entry
        return None

    def invalidate_latest_snapshot(self) -> bool:
        """Invalidate the newest valid CM snapshot and the service snapshots taken with it.

        Returns False if there is no valid consensus-module snapshot.
        """
        entries = self.entries
        for k in range(len(entries) - 1, -1, -1):
            cm = entries[k]
            if cm.is_valid and cm.type == ENTRY_TYPE_SNAPSHOT and cm.service_id == CM_SERVICE_ID:
                break
        else:
            return False
        self._write(replace(cm, entry_type=cm.entry_type | INVALID_FLAG))
        for entry in reversed(entries[:k]):
            if (
                entry.type != ENTRY_TYPE_SNAPSHOT
                or entry.service_id < 0
                or (entry.leadership_term_id, entry.log_position)
                != (cm.leadership_term_id, cm.log_position)
            ):
                break
            if entry.is_valid:
                self._write(replace(entry, entry_type=entry.entry_type | INVALID_FLAG))
        return True

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
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
