"""A follower's side of replication: log matching, the commit position it may use, and
its AppendPosition reports (Raft's AppendEntries receiver, in byte positions).

The leader ships its log as byte ranges (:class:`AppendRequest`), each within one term.
A follower appends a range only where its own log agrees with the leader's up to the
range's start (the term of the entry ending there is the request's ``prev_term_id``),
and only whole records that pass their length and CRC checks;
entries it already holds from the same term at the same positions are the same entries
and are skipped, and it truncates only from the first entry that really differs (never
below its commit position).  ``verified_end`` is how far its log is known to match the
current leader's: it reports that (once durable) as VERIFIED, anything else as a hint
of where to resend from (never below its commit position: what is committed is the same
on every member, and the leader may have purged the log below it).

A follower that needs log its leader has purged is sent a snapshot instead
(:class:`~cluster.core.install.SnapshotReceiver`); once the shell has installed it, the
log here begins at the snapshot's position (:meth:`FollowerReplica.on_snapshot_installed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..protocol.consensus import (
    APPEND_POSITION_CATCHING_UP,
    APPEND_POSITION_VERIFIED,
    AppendPosition,
    AppendRequest,
    SnapshotChunk,
)
from .base import ConsensusConfig, ConsensusPort, Counters, StoragePort, TermView
from .install import SnapshotReceiver, Transfer
from .log import ReplicatedLog
from .validate import check_records
from .voting import VotingRights

log = logging.getLogger("cluster.consensus")

LEADER_MESSAGES = (AppendRequest, SnapshotChunk)
"""What a leader sends a follower about the log (:meth:`FollowerReplica.on_append_request`)."""


class FollowerReplica:
    """The follower's log matching and reporting (idle while this member leads)."""

    __slots__ = (
        "_last_reported",
        "_next_report_ns",
        "config",
        "consensus",
        "counters",
        "leader_commit_position",
        "log",
        "refuse",
        "snapshot",
        "storage",
        "verified_end",
        "view",
        "voting",
    )

    def __init__(
        self,
        config: ConsensusConfig,
        log: ReplicatedLog,
        view: TermView,
        consensus: ConsensusPort,
        storage: StoragePort,
        counters: Counters,
        refuse: Callable[[int, str], None],
        voting: VotingRights,
    ) -> None:
        self.config = config
        self.log = log
        self.view = view
        self.consensus = consensus
        self.storage = storage
        self.counters = counters
        self.refuse = refuse
        self.voting = voting
        self.verified_end = -1
        """How far this log is known to match the current leader's (-1: not at all)."""
        self.leader_commit_position = -1
        self._last_reported: tuple[int, int] = (-1, -1)
        self._next_report_ns = 0
        self.snapshot = SnapshotReceiver(config, log, view, consensus)
        """A snapshot being received from the leader (it purged the log this one needs)."""

    def new_leader(self) -> None:
        """Following another leader (or none yet): nothing is verified against it."""
        self.verified_end = -1
        self.leader_commit_position = -1

    def on_append_request(self, msg: AppendRequest | SnapshotChunk, now_ns: int) -> None:
        """Apply ``msg`` from the leader this member now follows."""
        if isinstance(msg, SnapshotChunk):
            self.snapshot.on_chunk(msg)
            return
        if self.snapshot.installing:
            return  # the log is about to be replaced; the leader resends after
        rlog = self.log
        terms = rlog.terms
        start = msg.log_position
        end = rlog.published_position
        if start > end:
            self.send_position(msg.leader_member_id, end, False)  # a gap: send from end
            return
        if terms.term_at(start) != msg.prev_term_id:
            # Our entry ending at `start` is from another term: ask the leader to go back
            # to where that term of ours began.  Nothing is truncated yet: only entries
            # that really differ are, once the leader sends them (below).
            # Never below the commit position: committed entries are the same on every
            # member (and the leader may have purged the log below them).
            hint = max(terms.term_start_containing(start), rlog.commit_position)
            self.send_position(msg.leader_member_id, min(hint, start), False)
            return
        data = msg.data
        end_of_data = start + len(data)
        cut = 0  # bytes of data skipped as already held
        if data:
            commit = rlog.commit_position
            if start < commit:
                skip = min(len(data), commit - start)  # identical, committed
                data = data[skip:]
                start += skip
                cut += skip
            if data and start < rlog.published_position:
                # Entries we hold from the same term at the same positions are the same
                # entries (log matching): skip them, truncate only from the first one
                # that differs.
                our_term, _ = terms.term_for_data_at(start)
                if our_term == msg.data_term_id:
                    same_until = min(
                        rlog.published_position,
                        end_of_data,
                        terms.next_base_after(start) or rlog.published_position,
                    )
                    cut += same_until - start
                    data = data[same_until - start :]
                    start = same_until
            if data:
                # Only now, with its place in the log verified, is the data checked
                # (a request from a position that is not a record boundary of the
                # leader's log fails the term check above and is answered with a hint;
                # one that passes it and still is not whole, CRC-valid records, or
                # would leave what is appended starting inside a record, comes from a
                # buggy or forged leader): refused, nothing appended.
                ends: list[int] = []  # where each record ends, in log positions
                reason = check_records(msg.data, ends, msg.log_position)
                if reason is None and cut and msg.log_position + cut not in ends:
                    reason = f"what is not held yet starts inside a record (at {start})"
                if (
                    reason is None
                    and start < rlog.published_position
                    and not rlog.is_boundary(start)
                ):
                    reason = f"it would cut this log inside a record (at {start})"
                if (
                    reason is None
                    and msg.data_term_id != terms.term_at(start)
                    and not (
                        terms.term_start_containing(start) <= msg.term_base_log_position <= start
                    )
                ):
                    # a new term must begin after the one before it and by the data
                    reason = f"term {msg.data_term_id} cannot begin at {msg.term_base_log_position}"
                if reason is not None:
                    self.refuse(
                        msg.leader_member_id, f"AppendRequest at {msg.log_position}: {reason}"
                    )
                    return
            if data:
                if start < rlog.published_position:
                    self._truncate(start)
                if msg.data_term_id != terms.last_term:
                    if msg.data_term_id < terms.last_term:
                        terms.truncate(start)
                        self.storage.remove_terms_from(start)
                    terms.append(msg.data_term_id, msg.term_base_log_position)
                    self.storage.record_term(
                        msg.data_term_id, msg.term_base_log_position, rlog.cluster_time(now_ns)
                    )
                if cut:
                    ends = [end for end in ends if end > msg.log_position + cut]
                rlog.append_data(data, ends)
            self.verified_end = max(self.verified_end, end_of_data)
        else:
            self.verified_end = max(self.verified_end, start)
        if msg.timestamp > rlog.timestamp:
            # the leader's cluster time, at or past every entry it sent: should this
            # member lead next, its first entry is not stamped before them (its wall
            # clock may be behind the leader's)
            rlog.timestamp = msg.timestamp
        self.advance_commit(msg.commit_position)
        if not msg.data:
            self.report(now_ns, force=True)

    def on_snapshot_installed(self, transfer: Transfer, now_ns: int) -> None:
        """The shell installed ``transfer``'s snapshot: the log begins there, and it
        matches the leader's up to there (the snapshot is of its committed log)."""
        self.snapshot.finish()
        position = transfer.log_position
        self.log.reset(position, transfer.snapshot_term_id, transfer.term_base_log_position)
        view = self.view
        if (transfer.leadership_term_id, transfer.leader_member_id) == (
            view.leadership_term_id,
            view.leader_member_id,
        ):
            self.verified_end = position
        else:
            self.verified_end = -1
        self.report(now_ns, force=True)

    def advance_commit(self, leader_commit: int) -> None:
        """The leader's commit position is at least ``leader_commit``: commit what of it
        this log holds and has verified."""
        if leader_commit > self.leader_commit_position:
            self.leader_commit_position = leader_commit
        rlog = self.log
        # only what is durable here and verified against this leader's log
        position = min(self.leader_commit_position, self.verified_end, rlog.archive_position)
        if rlog.pending_truncate is not None:
            # until the archive has dropped the old bytes, positions past the truncation
            # point name bytes that are still the old ones there
            position = min(position, rlog.pending_truncate)
        rlog.commit(position)

    def check_caught_up(self, now_ns: int) -> None:
        """A catch-up member this member's leader has brought to its commit position
        votes again (:mod:`cluster.core.voting`); the leader counts it from then on."""
        view = self.view
        if self.voting.caught_up(
            self.log, view.leader_member_id, view.leadership_term_id, self.leader_commit_position
        ):
            self.report(now_ns, force=True)

    def _truncate(self, position: int) -> None:
        """Drop the log from ``position`` on (never below the commit position)."""
        rlog = self.log
        if position >= rlog.published_position:
            return
        self.counters.truncations += 1
        self.counters.truncated_bytes += rlog.published_position - position
        log.warning(
            "member %d truncates its log from %d to %d (uncommitted entries of an old term)",
            self.config.member_id,
            rlog.published_position,
            position,
        )
        rlog.truncate(position)
        if rlog.terms.truncate(position):
            self.storage.remove_terms_from(position)
        self.verified_end = min(self.verified_end, position)

    def report(self, now_ns: int, *, force: bool, read_round: int = 0) -> None:
        """Tell the leader how far this log is durable and verified: at once when
        ``force``d or changed, else once a heartbeat interval.  ``read_round``: the
        answer to the leader's read round (:mod:`cluster.core.reads`), sent at once."""
        view = self.view
        if view.leader_member_id < 0 or view.leader_member_id == self.config.member_id:
            return  # no leader, or this member leads
        rlog = self.log
        if self.verified_end >= 0:
            position, verified = min(rlog.archive_position, self.verified_end), True
        else:
            position, verified = rlog.published_position, False
        key = (view.leadership_term_id, position if verified else -position - 1)
        if force or read_round or key != self._last_reported or now_ns >= self._next_report_ns:
            self.send_position(view.leader_member_id, position, verified, read_round=read_round)
            self._last_reported = key
            self._next_report_ns = now_ns + self.config.leader_heartbeat_interval_ns

    def refuse_read_round(self, leader: int, term: int) -> None:
        """A read round of a leader of a term before this member's (:mod:`cluster.core.reads`):
        it is deposed, and may not know it (it was paused or cut off): it is told the
        later ``term`` (it steps down), and its round is never answered here."""
        self.send_position(leader, self.log.published_position, False, term=term)

    def send_position(
        self,
        member: int,
        position: int,
        verified: bool,
        *,
        term: int | None = None,
        read_round: int = 0,
    ) -> None:
        if member < 0 or member == self.config.member_id:
            return
        self.consensus.send(
            member,
            AppendPosition(
                leadership_term_id=self.view.leadership_term_id if term is None else term,
                log_position=position,
                follower_member_id=self.config.member_id,
                flags=(APPEND_POSITION_VERIFIED if verified else 0)
                | (APPEND_POSITION_CATCHING_UP if self.voting.catching_up else 0),
                read_round=read_round,
            ),
        )
