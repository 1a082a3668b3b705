"""A leader's side of replication: where each follower's next AppendRequest starts,
what the followers acknowledge, and the commit position a quorum of them makes.

The shell's replicators (``cluster.agents.replication``) move the bytes; they ask this
part where to send from (:meth:`LeaderReplication.next_append`) and build each request
through it (:meth:`LeaderReplication.append_request`), which records what was sent.
Nothing outside the core changes a follower's :class:`~cluster.core.tracker.Progress`.

**Catch-up by snapshot.** A follower whose next append starts below this leader's log
start (:attr:`~cluster.core.log.ReplicatedLog.start_position`: the log below it was
purged) :meth:`needs_snapshot`: the replicator sends it the leader's latest snapshot
instead, a chunk at a time (:meth:`snapshot_next` says which bytes, at most
:data:`SNAPSHOT_WINDOW` unacknowledged; :meth:`snapshot_chunk` builds each and records
it).  The first message of a transfer is an empty probe, answered with how much of that
snapshot the follower already holds durably, so a transfer cut short resumes there.
Once the follower has installed it, it reports the snapshot's position VERIFIED and the
log after it follows as usual.  A follower whose disk has no room for it answers
:data:`~cluster.protocol.consensus.SNAPSHOT_NO_ROOM` (:meth:`take_refusal`: the shell
says so and probes again later).

**Corruption below the snapshot** (issue 33).  A follower whose next record is corrupt
in this leader's archive (never shipped) is sent the snapshot instead, if one is above
that record (:meth:`fall_back_to_snapshot`): it then catches up above the bad record.
"""

from __future__ import annotations

import zlib

from ..protocol.consensus import (
    APPEND_POSITION_CATCHING_UP,
    APPEND_POSITION_VERIFIED,
    MAX_SNAPSHOT_CHUNK,
    SNAPSHOT_HELD,
    SNAPSHOT_NO_ROOM,
    AppendPosition,
    AppendRequest,
    CommitPosition,
    SnapshotChunk,
    SnapshotChunkAck,
)
from .base import ConsensusConfig, ConsensusPort, TermView
from .log import ReplicatedLog
from .tracker import ProgressTracker

SNAPSHOT_WINDOW = 2 * MAX_SNAPSHOT_CHUNK
"""Snapshot bytes sent to a follower and not yet acknowledged, at most (two chunks)."""


class LeaderReplication:
    """The leader's replication state for its term (idle on a follower)."""

    chunk_size = MAX_SNAPSHOT_CHUNK
    """Snapshot bytes per chunk (the simulator makes it small, so that its small
    snapshots take many chunks); at most two chunks are unacknowledged."""

    __slots__ = (
        "_next_heartbeat_ns",
        "_refused",
        "bad_positions",
        "config",
        "consensus",
        "log",
        "progress",
        "term_base_position",
        "view",
    )

    def __init__(
        self, config: ConsensusConfig, log: ReplicatedLog, view: TermView, consensus: ConsensusPort
    ) -> None:
        self.config = config
        self.log = log
        self.view = view
        self.consensus = consensus
        self.progress = ProgressTracker(config.member_count)
        self.term_base_position = -1
        """Where this leader's term began: only entries after it commit by counting."""
        self._next_heartbeat_ns = 0
        self._refused: set[int] = set()
        self.bad_positions: dict[int, int] = {}
        """Per follower, a position of this log that cannot be shipped (a corrupt
        record): it is sent a snapshot above it instead."""

    def start(self, position: int, now_ns: int) -> None:
        """A new term from ``position``: every follower is sent the log from there."""
        self.term_base_position = position
        self.progress.reset(self.config.others, position, now_ns)
        self._refused.clear()
        self.bad_positions.clear()

    def stop(self) -> None:
        self.progress.clear()

    def on_append_position(self, msg: AppendPosition, now_ns: int) -> bool | None:
        """A follower's report in this leader's term; True if it acknowledged more log
        (the commit position may move), None if the report is impossible (more log
        verified than this leader has: a buggy or forged report, refused).  A hint
        beyond this leader's log is normal: a follower with an uncommitted tail of an
        older term."""
        progress = self.progress.get(msg.follower_member_id)
        if progress is None:
            return False
        verified = msg.flags & APPEND_POSITION_VERIFIED
        if verified and msg.log_position > self.log.published_position:
            return None
        progress.heard(now_ns)
        progress.voter = not msg.flags & APPEND_POSITION_CATCHING_UP
        if verified:
            progress.maybe_update(msg.log_position)
            return True
        progress.maybe_decr_to(msg.log_position)
        return False

    def quorum_position(self) -> int | None:
        """The commit position a quorum makes, if it is past the current one and
        within this leader's term (None otherwise)."""
        rlog = self.log
        position = self.progress.committed(rlog.archive_position)
        # Only an entry of the current term may be committed by counting replicas (Raft
        # section 5.4.2); earlier entries commit with it.
        if position > self.term_base_position and position > rlog.commit_position:
            return position
        return None

    def next_append(self, member_id: int, reconnected: bool = False) -> int | None:
        """Where the next AppendRequest to ``member_id`` starts (None: not a follower of
        this leader).  ``reconnected``: its link broke since the last one, so what was
        sent on it may be lost; resend from what it has confirmed."""
        progress = self.progress.get(member_id)
        if progress is None:
            return None
        if reconnected:
            progress.reset_to_match()
        return progress.next_position

    def unacknowledged(self, member_id: int) -> int:
        """Log bytes sent to ``member_id`` that it has not yet reported durable (from
        this term's start while it has reported nothing): what it may hold in memory."""
        progress = self.progress.get(member_id)
        if progress is None:
            return 0
        acked = progress.match_position
        if acked < 0:
            acked = self.term_base_position
        return max(0, progress.next_position - acked)

    def append_request(self, member_id: int, start: int, data: bytes) -> AppendRequest:
        """The AppendRequest that ships ``data`` (the log from ``start``) to a follower;
        the follower's next append starts after it.  ``data`` must not cross a term
        boundary (see :meth:`replication_stop`)."""
        terms = self.log.terms
        term, base = terms.term_for_data_at(start)
        commit = self.log.commit_position
        progress = self.progress.get(member_id)
        if progress is not None:
            progress.sent_commit(commit)
            if data:
                progress.sent(start + len(data))
        return AppendRequest(
            leadership_term_id=self.view.leadership_term_id,
            leader_member_id=self.config.member_id,
            log_position=start,
            prev_term_id=terms.term_at(start),
            data_term_id=term,
            term_base_log_position=base,
            commit_position=commit,
            data=data,
            timestamp=self.log.timestamp,
        )

    # ------------------------------------------------------------------ snapshots

    def needs_snapshot(self, member_id: int) -> bool:
        """Does ``member_id`` need log below this leader's log start (purged), or log at
        a position that cannot be shipped (:meth:`fall_back_to_snapshot`)?"""
        progress = self.progress.get(member_id)
        if progress is None:
            return False
        position = progress.next_position
        return position < self.log.start_position or position <= self.bad_positions.get(
            member_id, -1
        )

    def holds(self, member_id: int, position: int) -> bool:
        """Does ``member_id``'s log hold ``position`` (as far as this leader knows)?"""
        progress = self.progress.get(member_id)
        return progress is not None and progress.next_position >= position

    def fall_back_to_snapshot(self, member_id: int, bad_position: int, snapshot: int) -> bool:
        """``member_id``'s next append, at ``bad_position``, cannot be shipped (the record
        there is corrupt in this archive): send it the snapshot at log position
        ``snapshot`` instead, if that is above it (False: it is not, nothing changes)."""
        if snapshot <= bad_position or member_id not in self.config.others:
            return False
        self.bad_positions[member_id] = bad_position
        return True

    def take_refusal(self, member_id: int) -> bool:
        """Has ``member_id`` refused the snapshot being sent for want of room (since the
        last call)?"""
        if member_id in self._refused:
            self._refused.discard(member_id)
            return True
        return False

    def snapshot_next(self, member_id: int, position: int, length: int) -> tuple[int, int] | None:
        """``(offset, size)`` of the next chunk of the snapshot at ``position``
        (``length`` bytes) to send ``member_id`` (size 0: a probe), or None: wait for its
        answer."""
        progress = self.progress.get(member_id)
        if progress is None:
            return None
        if progress.snapshot_position != position or progress.snapshot_length != length:
            progress.start_snapshot(position, length)
        if progress.snapshot_acked < 0:
            return (0, 0) if progress.snapshot_sent < 0 else None
        sent, chunk = progress.snapshot_sent, self.chunk_size
        if sent >= length or sent - progress.snapshot_acked >= 2 * chunk:
            return None
        return sent, min(chunk, length - sent)

    def snapshot_chunk(
        self,
        member_id: int,
        *,
        position: int,
        term: int,
        term_base: int,
        length: int,
        offset: int,
        data: bytes,
    ) -> SnapshotChunk:
        """The chunk ``[offset, offset + len(data))`` of the snapshot at ``position``
        for ``member_id`` (recorded as sent)."""
        progress = self.progress.get(member_id)
        if progress is not None and progress.snapshot_position == position:
            progress.snapshot_sent = max(progress.snapshot_sent, offset + len(data))
        return SnapshotChunk(
            leadership_term_id=self.view.leadership_term_id,
            leader_member_id=self.config.member_id,
            log_position=position,
            snapshot_term_id=term,
            term_base_log_position=term_base,
            length=length,
            offset=offset,
            crc=zlib.crc32(data),
            data=data,
        )

    def snapshot_acked(self, member_id: int) -> int:
        """Bytes of the snapshot being sent that ``member_id`` holds (-1: not known)."""
        progress = self.progress.get(member_id)
        return -1 if progress is None else progress.snapshot_acked

    def rewind_snapshot(self, member_id: int) -> None:
        """Chunks sent may be lost (a broken link, a silent follower): probe again."""
        progress = self.progress.get(member_id)
        if progress is not None:
            progress.rewind_snapshot()

    def on_snapshot_ack(self, msg: SnapshotChunkAck, now_ns: int) -> None:
        """A follower says how much of the snapshot it holds.  Anything not about the
        transfer under way in this term (a stale or forged answer) is ignored."""
        progress = self.progress.get(msg.follower_member_id)
        if (
            progress is None
            or msg.leadership_term_id != self.view.leadership_term_id
            or msg.log_position != progress.snapshot_position
        ):
            return
        progress.heard(now_ns)
        offset = msg.offset
        if msg.flags & SNAPSHOT_NO_ROOM:
            self._refused.add(msg.follower_member_id)
            return
        if offset == SNAPSHOT_HELD:
            # its log holds the snapshot's position: send it the log from there
            progress.snapshot_position = -1
            if progress.next_position < msg.log_position:
                progress.next_position = msg.log_position
            return
        if not 0 <= offset <= progress.snapshot_length:
            return  # not a place in this snapshot: refused
        acked = progress.snapshot_acked
        if acked < 0 or offset < acked or offset > progress.snapshot_sent:
            # the answer to a probe, or it holds less (it restarted) or more (from an
            # earlier transfer) than was sent: go on from what it holds
            progress.snapshot_sent = offset
        progress.snapshot_acked = offset

    def replication_stop(self, start: int, limit: int) -> int:
        """End of the chunk to ship from ``start``: at most ``limit``, within one term."""
        boundary = self.log.terms.next_base_after(start)
        return limit if boundary is None else min(limit, boundary)

    def send_commit_position(self, *, every: bool = False, read_round: int = 0) -> None:
        """A CommitPosition to each follower that no AppendRequest has told the current
        commit position (every slow tick, so followers learn it within one, and before a
        leader stops), or to ``every`` follower (the heartbeat; with ``read_round``, a
        read round that each follower answers at once: :mod:`cluster.core.reads`)."""
        position = self.log.commit_position
        message: CommitPosition | None = None
        for progress in self.progress:
            if every or progress.commit_sent < position:
                if message is None:
                    message = CommitPosition(
                        leadership_term_id=self.view.leadership_term_id,
                        log_position=position,
                        leader_member_id=self.config.member_id,
                        read_round=read_round,
                    )
                progress.reachable = self.consensus.send(progress.member_id, message)
                progress.sent_commit(position)

    def on_slow_tick(self, now_ns: int) -> bool:
        """The commit heartbeat (to every follower each heartbeat interval, else to
        those no append told); False if too few followers were heard from lately to make
        a quorum (the leader must step down)."""
        cfg = self.config
        if now_ns >= self._next_heartbeat_ns:
            self.send_commit_position(every=True)
            self._next_heartbeat_ns = now_ns + cfg.leader_heartbeat_interval_ns
        else:
            self.send_commit_position()
        return self.progress.quorum_active(now_ns, cfg.leader_heartbeat_timeout_ns)
