"""The leader's view of each follower's log (etcd-io/raft's ``tracker`` package, in bytes).

:class:`Progress` is one follower: where the next AppendRequest starts
(``next_position``, Raft's nextIndex), what the follower has confirmed durably
appended and verified against this leader's log (``match_position``, matchIndex), when
it was last heard and the highest commit position it has been told; and, while it is
sent a snapshot (it needs log this leader has purged), how far that transfer is.  Only its methods
change it, and only the consensus module calls them: the replicators in the shell ask
the module where to send from and report what they sent.

:class:`ProgressTracker` holds one Progress per follower and computes the leader's
commit position from them (the only place that does).
"""

from __future__ import annotations

from collections.abc import Iterator

from . import quorum


class Progress:
    """One follower, as its leader sees it."""

    __slots__ = (
        "commit_sent",
        "last_heard_ns",
        "match_position",
        "member_id",
        "next_position",
        "reachable",
        "reported",
        "snapshot_acked",
        "snapshot_length",
        "snapshot_position",
        "snapshot_sent",
        "voter",
    )

    def __init__(self, member_id: int, next_position: int, now_ns: int) -> None:
        self.member_id = member_id
        self.next_position = next_position
        self.match_position = -1
        self.last_heard_ns = now_ns
        self.reported = False
        """It has reported in this term (``last_heard_ns`` is then its last report, not
        the grace a new term gives every follower)."""
        self.reachable = False
        """The last message this leader's core sent it (the commit heartbeat, every
        heartbeat interval) could be queued: the shell's link to it is up.  A member
        that is down cannot be reached, whoever dials in its name."""
        self.commit_sent = -1
        """The highest commit position shipped to it (in an AppendRequest or
        CommitPosition)."""
        self.snapshot_position = -1
        """The log position of the snapshot being sent to it (-1: none)."""
        self.snapshot_length = 0
        self.snapshot_acked = -1
        """Bytes of that snapshot it holds durably (-1: not known, probe)."""
        self.snapshot_sent = -1
        """Bytes of it sent (-1: not even the probe)."""
        self.voter = True
        """Whether it counts toward a quorum: each report says whether it is a catch-up
        member (new or lost state), which counts toward none.  Before its first report
        it holds nothing this leader counts, and is given the heartbeat timeout's grace
        as any follower is."""

    def __repr__(self) -> str:
        return (
            f"Progress(member={self.member_id}, next={self.next_position}, "
            f"match={self.match_position}{'' if self.voter else ', catching up'})"
        )

    def heard(self, now_ns: int) -> None:
        self.last_heard_ns = now_ns
        self.reported = True

    def maybe_update(self, position: int) -> None:
        """The follower verified and appended the log up to ``position``."""
        self.match_position = position
        if self.next_position < position:
            self.next_position = position

    def maybe_decr_to(self, hint: int) -> None:
        """A hint (a gap, a disagreeing term, a follower not yet verified): only ever
        move back.  Moving forward to an unverified position would undo the search for
        where the logs agree and can livelock it."""
        if hint < self.next_position:
            self.next_position = hint

    def sent(self, stop: int) -> None:
        """An AppendRequest carrying the log up to ``stop`` went out."""
        self.next_position = stop

    def sent_commit(self, position: int) -> None:
        self.commit_sent = position

    def start_snapshot(self, position: int, length: int) -> None:
        """Begin sending it the snapshot at ``position`` (``length`` bytes): probe
        first, for how much of it the follower already holds."""
        self.snapshot_position = position
        self.snapshot_length = length
        self.snapshot_acked = self.snapshot_sent = -1

    def rewind_snapshot(self) -> None:
        """What was sent may be lost (a broken link, no answer): probe again."""
        self.snapshot_acked = self.snapshot_sent = -1

    def reset_to_match(self) -> None:
        """The link broke (data sent on it may be lost): resend from what the follower
        has confirmed."""
        if self.match_position >= 0:
            self.next_position = self.match_position


class ProgressTracker:
    """Every follower's :class:`Progress` (empty unless this member leads)."""

    __slots__ = ("_progress", "member_count")

    def __init__(self, member_count: int) -> None:
        self.member_count = member_count
        self._progress: dict[int, Progress] = {}

    def reset(self, followers: list[int], position: int, now_ns: int) -> None:
        """A new term: every follower is sent the log from ``position`` on."""
        self._progress = {m: Progress(m, position, now_ns) for m in followers}

    def clear(self) -> None:
        self._progress = {}

    def get(self, member_id: int) -> Progress | None:
        return self._progress.get(member_id)

    def __len__(self) -> int:
        return len(self._progress)

    def __iter__(self) -> Iterator[Progress]:
        return iter(self._progress.values())

    def committed(self, own_position: int) -> int:
        """The highest position a quorum holds: this leader's durable ``own_position``
        and each voting follower's confirmed match position (a catch-up member counts
        toward no quorum), capped at ``own_position`` (a
        follower cannot hold more of this leader's log than the leader has written)."""
        positions = [own_position]
        positions.extend(
            min(max(p.match_position, 0), own_position) for p in self._progress.values() if p.voter
        )
        return quorum.committed(positions, self.member_count)

    def in_touch(self, member_id: int, now_ns: int, window_ns: int) -> bool:
        """Is this leader in touch with follower ``member_id``: it reported in this term
        within ``window_ns``, or this leader's messages reach it (its link is up)?"""
        progress = self._progress.get(member_id)
        return progress is not None and (
            progress.reachable
            or (progress.reported and progress.last_heard_ns >= now_ns - window_ns)
        )

    def quorum_active(self, now_ns: int, timeout_ns: int) -> bool:
        """Have enough voting followers been heard within ``timeout_ns`` to make, with
        this leader, a quorum?  (Always true with no followers: a cluster of one.)"""
        if not self._progress:
            return True
        deadline = now_ns - timeout_ns
        active = sum(1 for p in self._progress.values() if p.voter and p.last_heard_ns >= deadline)
        return quorum.has_quorum(active + 1, self.member_count)
