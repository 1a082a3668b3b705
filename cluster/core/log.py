"""The consensus module's view of the replicated log (etcd-io/raft's ``raftLog`` and
``unstable``, in byte positions).

Positions, all byte offsets into the log:

* ``published_position``: end of the records encoded here or received from a leader
  (in memory; the *unstable* tail ``[base, published_position)`` not yet taken by the
  shell to be written);
* ``archive_position``: end of what the local archive has durably appended (reported
  by the shell);
* ``commit_position``: end of what may be applied (a quorum has it);
* ``applied_position``: end of what the service has applied (reported by the shell).

A leader also keeps the messages it encoded (``own records``) until the shell applies
them, so it applies its own entries without decoding the bytes it has just encoded.

Truncation (a follower dropping uncommitted entries of an old term) happens only where
one of its records ends (:attr:`ReplicatedLog.boundaries` keeps the ends of the records
above the commit position), and is a request to the shell: ``pending_truncate`` names
the position until the shell reports it done; until then no write report counts and
nothing past that position may be applied.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable

from ..archive.record import RECORD_HEADER
from ..protocol.codec import encode as _encode
from ..protocol.enums import ClusterTimeUnit
from ..protocol.log import LogMessage, NewLeadershipTermEvent
from .terms import TermHistory

_pack_record_header = RECORD_HEADER.pack
_crc32 = zlib.crc32

OwnRecord = tuple[int, int, LogMessage]
"""``(start, end, message)`` of a record a leader encoded."""


class ReplicatedLog:
    """The log's positions, its unstable tail, its terms and its clock."""

    __slots__ = (
        "_base",
        "applied_position",
        "archive_position",
        "boundaries",
        "buffer",
        "commit_position",
        "epoch_offset_ns",
        "own_records",
        "pending_truncate",
        "start_position",
        "terms",
        "timestamp",
    )

    def __init__(self, position: int, terms: TermHistory, epoch_offset_ns: int) -> None:
        self.buffer = bytearray()
        """Records encoded or received but not yet taken by the shell."""
        self._base = position
        self.own_records: deque[OwnRecord] = deque()
        self.boundaries: deque[int] = deque()
        """The ends of the records above the commit position, in order: the only places
        the log may be cut (a follower truncating an uncommitted tail)."""
        self.pending_truncate: int | None = None
        self.archive_position = position
        self.commit_position = position
        self.applied_position = position
        self.start_position = 0
        """Where the log held here begins (set by the shell: after a compaction or a
        snapshot install, the log below it is gone; followers that need it are sent a
        snapshot)."""
        self.terms = terms
        self.epoch_offset_ns = epoch_offset_ns
        self.timestamp = 0
        """Cluster time (epoch ms) of the latest log entry: never goes back."""

    # ------------------------------------------------------------------ time

    def cluster_time(self, now_ns: int) -> int:
        """Cluster time in ms: this member's wall clock (``now_ns`` plus the epoch
        offset), never behind the last timestamp put on or seen in the log.  A wall
        clock stepped back leaves cluster time standing until it passes that timestamp
        again; one jumped forward moves it forward at once (timers due by then fire,
        :data:`~cluster.core.timers.POLL_LIMIT` per cycle, as in Aeron)."""
        t = (now_ns + self.epoch_offset_ns) // 1_000_000
        return t if t > self.timestamp else self.timestamp

    def set_epoch_offset(self, epoch_offset_ns: int) -> int:
        """The shell read the wall clock again: ``epoch_offset_ns`` is epoch time less
        the monotonic clock now.  Returns how far the wall clock moved since the last
        reading (ns, negative: stepped back), as the monotonic clock measures it."""
        step = epoch_offset_ns - self.epoch_offset_ns
        self.epoch_offset_ns = epoch_offset_ns
        return step

    def stamp(self, now_ns: int) -> int:
        """The timestamp for an entry about to be appended (and remember it)."""
        self.timestamp = timestamp = self.cluster_time(now_ns)
        return timestamp

    def observe_timestamp(self, timestamp: int) -> None:
        """An entry of another leader carried ``timestamp``: never stamp earlier."""
        if timestamp > self.timestamp:
            self.timestamp = timestamp

    # ------------------------------------------------------------------ the tail

    @property
    def published_position(self) -> int:
        return self._base + len(self.buffer)

    def start_term(self, term: int, leader: int, app_version: int, now_ns: int) -> tuple[int, int]:
        """A leader's new term begins here: its NewLeadershipTermEvent appended (applied
        by decoding it, as a follower would).  Returns the term's base position and the
        position after the event."""
        timestamp = self.stamp(now_ns)
        base = self.published_position
        self.terms.append(term, base)
        event = NewLeadershipTermEvent(
            leadership_term_id=term,
            log_position=base,
            timestamp=timestamp,
            term_base_log_position=base,
            leader_member_id=leader,
            log_session_id=0,
            time_unit=ClusterTimeUnit.MILLIS,
            app_version=app_version,
        )
        return base, self.append(event, False)

    def append(self, message: LogMessage, own: bool) -> int:
        """Encode ``message`` as a log record; return the position after it.  ``own``
        (a leader's entry) keeps the message for :meth:`take_own_records`."""
        body = _encode(message)
        buf = self.buffer
        start = self._base + len(buf)
        buf += _pack_record_header(len(body), _crc32(body))
        buf += body
        end = self._base + len(buf)
        self.boundaries.append(end)
        if own:
            self.own_records.append((start, end, message))
        return end

    def append_data(self, data: bytes, ends: Iterable[int]) -> None:
        """Checked log records from the leader, appended as they are; ``ends`` are the
        positions where each of them ends."""
        self.buffer += data
        self.boundaries.extend(ends)

    def is_boundary(self, position: int) -> bool:
        """Does a record of this log end at ``position`` (at or above the commit
        position; below it the log is never cut)?"""
        return position == self.commit_position or position in self.boundaries

    def restore(self, position: int, ends: Iterable[int]) -> None:
        """Recovery applied the log up to ``position``; ``ends`` are where the records
        of the tail after it end."""
        self.commit_position = self.applied_position = position
        self.boundaries = deque(e for e in ends if e > position)

    def reset(self, position: int, term: int, term_base: int) -> None:
        """A snapshot at ``position`` (taken in ``term``, which began at ``term_base``)
        replaced the whole log: it begins, empty, there."""
        self.buffer = bytearray()
        self._base = position
        self.own_records.clear()
        self.boundaries.clear()
        self.pending_truncate = None
        self.archive_position = self.commit_position = self.applied_position = position
        self.start_position = position
        self.terms.truncate(0)
        self.terms.append(term, term_base)

    def take_batch(self) -> tuple[int, bytearray] | None:
        """Hand the unstable tail to the shell: ``(start_position, data)``."""
        if not self.buffer:
            return None
        batch = (self._base, self.buffer)
        self._base += len(self.buffer)
        self.buffer = bytearray()
        return batch

    def take_own_records(self, start: int, stop: int) -> list[OwnRecord]:
        """The records this member encoded in ``[start, stop)``, as long as they are
        contiguous from ``start`` (empty if the record at ``start`` is not one of them).

        Records before ``start`` are dropped: whatever was applied another way is never
        asked for again.  The messages must not be changed: they are what was encoded."""
        own = self.own_records
        while own and own[0][0] < start:
            own.popleft()
        taken: list[OwnRecord] = []
        if own and own[0][0] == start:
            position = start
            while own and own[0][0] == position and own[0][1] <= stop:
                record = own.popleft()
                taken.append(record)
                position = record[1]
        return taken

    def truncate(self, position: int) -> None:
        """Drop the log from ``position`` on (never below the commit position).  Bytes
        the shell has already taken are dropped once it reports :meth:`on_truncated`."""
        if position < self.commit_position:
            raise AssertionError(
                f"refusing to truncate committed log: {position} < {self.commit_position}"
            )
        self.own_records.clear()
        boundaries = self.boundaries
        while boundaries and boundaries[-1] > position:
            boundaries.pop()
        if position >= self._base:
            del self.buffer[position - self._base :]
        else:
            self.buffer = bytearray()
            self._base = position
            pending = self.pending_truncate
            self.pending_truncate = position if pending is None else min(pending, position)

    # ------------------------------------------------------------------ shell reports

    def on_archived(self, position: int) -> bool:
        """The archive has durably appended up to ``position``; False if the report is
        void (a write that finished before a truncation it is about to undergo)."""
        if self.pending_truncate is not None:
            return False
        self.archive_position = position
        return True

    def on_truncated(self, position: int) -> bool:
        """The shell truncated the archive to ``position``; True if that completes the
        pending truncation."""
        self.archive_position = min(self.archive_position, position)
        if self.pending_truncate is not None and self.pending_truncate >= position:
            self.pending_truncate = None
            return True
        return False

    def commit(self, position: int) -> bool:
        """Move the commit position forward to ``position``; True if it moved."""
        if position <= self.commit_position:
            return False
        self.commit_position = position
        boundaries = self.boundaries
        while boundaries and boundaries[0] <= position:
            boundaries.popleft()
        return True
