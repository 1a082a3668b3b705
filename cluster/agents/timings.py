"""How long things take on one member, for its operators (``/metrics``, ``describe``, the
console): the duty cycle, the time from a leader publishing log to its commit (its own
write and sync, or a quorum's, included), and each follower's replication lag in
seconds.  (The archive's ``fdatasync`` times are kept by the archive itself:
:attr:`cluster.archive.segments.Archive.sync_times`.)

Nothing here changes what the member does; the node calls it from its duty cycle, so each
call costs a comparison, an append or a bisect.

Publication times are kept as ``(position, time)`` pairs, one per duty cycle that
published log, from the oldest position a follower has not confirmed; at most
:data:`MAX_MARKS` of them (past that the oldest are forgotten, and a follower further
behind reads as lagging since the oldest one kept).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterable

from ..core.consensus import ConsensusModule
from ..core.tracker import Progress
from ..metrics import LatencyHistogram
from ..protocol.admin import HistogramStatus
from ..protocol.enums import Role

MAX_MARKS = 1 << 16


class Timings:
    def __init__(self) -> None:
        self.duty_cycle = LatencyHistogram()
        self.commit = LatencyHistogram()
        self.replication: dict[int, LatencyHistogram] = {}
        self.leader_changes = 0
        self._leader = (-1, -1)
        self._positions: list[int] = []
        self._times: list[int] = []
        self._committed = 0  # marks before this index are committed (and observed)
        self._drive_began = 0  # perf_counter_ns() at before_drive

    @staticmethod
    def clock() -> int:
        """The clock of :meth:`cycle` (real time, also under the simulator's virtual one)."""
        return time.perf_counter_ns()

    def cycle(self, began_ns: int) -> None:
        """A duty cycle that began at ``began_ns`` (:meth:`clock`) ends now."""
        self.duty_cycle.observe_ns(time.perf_counter_ns() - began_ns)

    def saw_leader(self, term: int, leader: int) -> None:
        if leader >= 0 and (term, leader) != self._leader:
            self._leader = (term, leader)
            self.leader_changes += 1

    def reset(self) -> None:
        """This member stopped or started leading: forget the publication times."""
        self._positions.clear()
        self._times.clear()
        self._committed = 0

    def before_drive(self, cm: ConsensusModule, now_ns: int) -> None:
        """The node is about to drive the consensus module: a leader's log published so
        far is stamped ``now_ns``."""
        self._drive_began = time.perf_counter_ns()
        log = cm.log
        if cm.role is Role.LEADER and log.published_position > log.commit_position:
            # (log already committed is not stamped again: an idle leader's marks are
            # forgotten once confirmed, and it would be observed as committed at once)
            self.published(log.published_position, now_ns)

    def after_drive(self, cm: ConsensusModule, now_ns: int) -> None:
        """The node drove the consensus module, from ``now_ns`` (the time it gave
        :meth:`before_drive`): what it committed, the leader it knows.

        The drive may have taken long (a leader alone, or with its followers' answers in,
        writes and syncs its log inline): the commit is observed at its end, ``now_ns``
        plus the drive's duration, not at ``now_ns``, which would count the log published
        before the drive and committed by it as committed at once.  Log published during
        the drive and not committed by it is stamped at its end."""
        if cm.role is Role.LEADER:
            end_ns = now_ns + max(0, time.perf_counter_ns() - self._drive_began)
            self.committed(cm.log.commit_position, end_ns)
            if cm.log.published_position > cm.log.commit_position:
                self.published(cm.log.published_position, end_ns)
        self.saw_leader(cm.leadership_term_id, cm.leader_member_id)

    def published(self, position: int, now_ns: int) -> None:
        """A leader's log reaches ``position`` at ``now_ns`` (called every duty cycle)."""
        positions = self._positions
        if positions and position <= positions[-1]:
            return
        if not positions and position <= 0:
            return
        positions.append(position)
        self._times.append(now_ns)
        if len(positions) > MAX_MARKS:
            self._forget(len(positions) - MAX_MARKS // 2)

    def committed(self, commit_position: int, now_ns: int) -> None:
        """The commit position is now ``commit_position``: observe the commit latency of
        each publication it covers for the first time."""
        start = self._committed
        positions = self._positions
        if start >= len(positions) or positions[start] > commit_position:
            return
        end = bisect_right(positions, commit_position, lo=start)
        times = self._times
        observe = self.commit.observe_ns
        for i in range(start, end):
            observe(now_ns - times[i])
        self._committed = end

    def lag_ns(self, match_position: int, now_ns: int) -> int:
        """How long ago the oldest log above ``match_position`` was published (0: none)."""
        i = bisect_right(self._positions, match_position)
        return now_ns - self._times[i] if i < len(self._times) else 0

    def sample(self, followers: Iterable[Progress], now_ns: int) -> None:
        """A leader's slow tick: observe each follower's replication lag, then forget the
        marks every follower has confirmed."""
        low: int | None = None
        for f in followers:
            if f.match_position < 0:
                continue
            histogram = self.replication.get(f.member_id)
            if histogram is None:
                histogram = self.replication[f.member_id] = LatencyHistogram()
            histogram.observe_ns(self.lag_ns(f.match_position, now_ns))
            low = f.match_position if low is None else min(low, f.match_position)
        if low is not None:
            confirmed = bisect_right(self._positions, low, hi=self._committed)
            if confirmed > 1024 or confirmed > len(self._positions) >> 1:
                self._forget(confirmed)

    def _forget(self, count: int) -> None:
        del self._positions[:count]
        del self._times[:count]
        self._committed = max(0, self._committed - count)

    def statuses(
        self, sync_times: LatencyHistogram, stalls: LatencyHistogram | None = None
    ) -> list[HistogramStatus]:
        def status(name: str, h: LatencyHistogram, **labels: str) -> HistogramStatus:
            return HistogramStatus(
                name=name,
                labels=labels,
                bounds=h.bounds,
                counts=list(h.counts),
                sum=h.sum_ns / 1e9,
                count=h.count,
            )

        return [
            status("fsync", sync_times),
            status("duty_cycle", self.duty_cycle),
            status("commit", self.commit),
            *(
                status("replication", h, follower=str(member))
                for member, h in sorted(self.replication.items())
            ),
            *([status("stall", stalls)] if stalls is not None else []),
        ]
