"""Snapshots that take themselves: when a ready leader asks for one by itself.

A snapshot is what lets compaction free the log below it and what bounds the replay of
a restarted member, so a cluster that nobody asks to snapshot grows its log, and its
recovery time, for ever.  :class:`AutoSnapshot` decides when the ready leader puts a
SNAPSHOT on the log by itself (:meth:`~cluster.core.control.ClusterControl.on_slow_tick`
asks it every slow tick), exactly as an operator's snapshot goes: every member takes it
at the same log position.  It is due when

* ``--snapshot-log-bytes`` of log were written since the last snapshot (and at least as
  much as that snapshot's size: a service whose state outgrows the setting is not made
  to write more snapshot than log), or
* ``--snapshot-interval`` passed since it (cluster time) and some log was written.

"The last snapshot" is the last one recorded on this member, whoever asked for it (an
operator, a client, an earlier leader, this rule), after a restart the recording log's
latest.  At most one snapshot is in flight: none is asked for while one this leader
asked for is not yet applied (a request of an earlier term was either applied before
this leader was ready, or cut from the log), nor while one applied here is still being
written, so a leader that took over from one that had asked does not ask again.  A
snapshot that fails (a full disk) backs the next attempt off, 5 s doubling up to 5
minutes, and none is asked for while the shell reports a disk problem.

Pure state: positions and cluster time (ms) come in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_BACKOFF_MS = 5_000
"""How long after a failed snapshot the next automatic one waits (doubling each time)."""
MAX_BACKOFF_MS = 300_000
"""The longest wait after failed snapshots."""


@dataclass(frozen=True, slots=True)
class SnapshotView:
    """What a member knows of its last snapshot (for ``describe`` and ``/metrics``)."""

    position: int
    """The log position of the last snapshot recorded here (-1: none)."""
    timestamp_ms: int
    """Its cluster time (epoch ms; 0: none)."""
    log_bytes_since: int
    """Log written after it (all of it when there is none)."""
    requested: int
    """Automatic snapshots this member asked for as leader since it started."""


class AutoSnapshot:
    """The automatic snapshot rule of one member (it acts only while it leads)."""

    __slots__ = (
        "_backoff_pending",
        "failures",
        "interval_ms",
        "last_position",
        "last_size",
        "last_timestamp_ms",
        "log_bytes",
        "requested",
        "requested_position",
        "requested_term",
        "retry_at_ms",
        "since_ms",
        "taking",
    )

    def __init__(self, log_bytes: int = 0, interval_ms: int = 0) -> None:
        self.log_bytes = log_bytes
        """Log bytes since the last snapshot that make one due (0: never)."""
        self.interval_ms = interval_ms
        """Cluster time since the last snapshot that makes one due, with some log (0: never)."""
        self.last_position = -1
        self.last_timestamp_ms = 0
        self.last_size = 0
        self.requested_position = -1
        """The log position of a SNAPSHOT this member put on the log, not yet applied."""
        self.requested_term = -1
        self.taking = -1
        """The log position of a snapshot applied here and not yet written and recorded."""
        self.failures = 0
        """Snapshots that failed in a row (reset by one that is recorded)."""
        self.retry_at_ms = 0
        self.since_ms = 0
        """When the interval began to count on a member with no snapshot."""
        self.requested = 0
        """Automatic snapshots asked for since start."""
        self._backoff_pending = False

    def configure(self, log_bytes: int, interval_ms: int) -> None:
        self.log_bytes = max(0, log_bytes)
        self.interval_ms = max(0, interval_ms)

    @property
    def enabled(self) -> bool:
        return self.log_bytes > 0 or self.interval_ms > 0

    @property
    def threshold(self) -> int:
        """The log since the last snapshot that makes the next one due: the setting, or
        the last snapshot's size if that is more (0: the bytes rule is off)."""
        return max(self.log_bytes, self.last_size) if self.log_bytes > 0 else 0

    # ------------------------------------------------------------------ what happened

    def restore(self, position: int, timestamp_ms: int, size: int = 0) -> None:
        """The latest snapshot this member holds (at start-up, or installed from the
        leader): counting starts from it."""
        if position >= self.last_position:
            self.last_position, self.last_timestamp_ms, self.last_size = (
                position,
                timestamp_ms,
                size,
            )

    def on_requested(self, position: int, term: int) -> None:
        """A SNAPSHOT was put on the log by this leader (of any origin), ending at
        ``position``."""
        self.requested_position, self.requested_term = position, term

    def on_taking(self, position: int) -> None:
        """A SNAPSHOT at ``position`` was applied here: its snapshot is being written."""
        self.taking = position
        if position >= self.requested_position:
            self.requested_position = -1

    def on_recorded(self, position: int, timestamp_ms: int, size: int = 0) -> None:
        """The snapshot at ``position`` is written and recorded."""
        if position >= self.taking:
            self.taking = -1
        self.failures = 0
        self.retry_at_ms = 0
        self._backoff_pending = False
        self.restore(position, timestamp_ms, size)

    def on_failed(self, position: int) -> None:
        """The snapshot at ``position`` could not be taken or written: the next one
        waits (from the next check on, :meth:`due` knows the time)."""
        if position >= self.taking:
            self.taking = -1
        self.failures += 1
        self._backoff_pending = True

    # ------------------------------------------------------------------ the decision

    def in_flight(self, term: int) -> bool:
        """A snapshot asked for by this leader in ``term`` and not yet applied, or one
        applied here and not yet written."""
        if self.requested_position >= 0 and self.requested_term != term:
            self.requested_position = -1  # applied before this term was ready, or cut
        return self.requested_position >= 0 or self.taking >= 0

    def backoff_ms(self) -> int:
        """The wait after the current run of failures."""
        if self.failures <= 0:
            return 0
        return min(MAX_BACKOFF_MS, FIRST_BACKOFF_MS << min(self.failures - 1, 16))

    def due(self, now_ms: int, position: int, term: int, disk_problem: str = "") -> str:
        """Why a ready, ACTIVE leader of ``term`` whose log ends at ``position`` should
        ask for a snapshot now ("" if it should not)."""
        if not self.enabled:
            return ""
        if self.since_ms == 0:
            self.since_ms = now_ms
        if self._backoff_pending:
            self._backoff_pending = False
            self.retry_at_ms = now_ms + self.backoff_ms()
        if disk_problem or now_ms < self.retry_at_ms or self.in_flight(term):
            return ""
        last = max(self.last_position, 0)
        written = position - last
        if written <= 0:
            return ""
        threshold = self.threshold
        if threshold and written >= threshold:
            return f"{written} bytes of log since the last snapshot (at {last})"
        base = self.last_timestamp_ms if self.last_position >= 0 else self.since_ms
        if self.interval_ms and now_ms - base >= self.interval_ms:
            age = (now_ms - base) / 1000
            return f"{age:.0f} s and {written} bytes of log since the last snapshot (at {last})"
        return ""

    def view(self, position: int) -> SnapshotView:
        """The last snapshot, as a member whose log ends at ``position`` sees it."""
        return SnapshotView(
            position=self.last_position,
            timestamp_ms=self.last_timestamp_ms if self.last_position >= 0 else 0,
            log_bytes_since=max(0, position - max(self.last_position, 0)),
            requested=self.requested,
        )
