"""A leader handing leadership over (Raft's leadership transfer, with ``TimeoutNow``).

A leader hands over on an operator's request (``cluster-tool transfer-leadership``), when
it is stopped (SIGTERM, ``cluster-tool shutdown`` of one member), when its own log
cannot be made durable for a leader heartbeat timeout (a full or failing disk: writes
must go on elsewhere) and when its disk is slow (a dying disk: every append of the last
``slow_disk_period_ns`` took more than ``slow_disk_threshold_ns`` from being encoded to
being durable here, measured at each slow tick: :class:`DiskLatency`).
:meth:`Handover.start` picks the target, the voting follower heard from lately with the
most log (or the one asked for); meanwhile the leader takes no new work, so the target
catches up; once the target has verified and durably appended all of the leader's log,
the leader sends it :class:`TimeoutNow`, and the target campaigns at once with a
``RequestVote`` flagged ``VOTE_TRANSFER``, which members with a live leader, and the
leader itself, consider (they ignore other candidates while their leader is alive). Its
log is as up to date as any, so it wins within a round trip; the old leader steps down
when it sees the later term. Nothing acknowledged can be lost: the election's rules are
unchanged, only its timing.

A hand-over not done within the election timeout is given up (the leader takes work
again), except for a leader whose log cannot be made durable, which then steps down.
"""

from __future__ import annotations

import logging
from collections import deque

from ..protocol.consensus import TimeoutNow
from .base import ConsensusConfig, ConsensusPort, TermView
from .log import ReplicatedLog
from .tracker import ProgressTracker

log = logging.getLogger("cluster.consensus")


class DiskLatency:
    """How long this leader's own log takes from encoded to durable here, and since
    when every append has taken more than a bound (a dying disk).

    At each slow tick the leader notes the end of its log if it grew (``published``);
    when the archive position passes notes, what became durable took the time since
    the oldest of them (to within a slow tick: its oldest bytes waited that long).  A
    note still not durable after the bound counts as slow too.  An append within the
    bound ends the slow spell; an idle log (nothing pending) neither starts nor ends
    one."""

    __slots__ = ("notes", "period_ns", "slow_since_ns", "threshold_ns", "worst_ns")

    def __init__(self, threshold_ns: int, period_ns: int) -> None:
        self.threshold_ns = threshold_ns
        self.period_ns = period_ns
        self.notes: deque[tuple[int, int]] = deque()
        """(time, log position) of the log ends not yet durable here, oldest first."""
        self.slow_since_ns: int | None = None
        """When the oldest append of the current slow spell began (None: not slow)."""
        self.worst_ns = 0
        """The longest append of the current slow spell."""

    def reset(self) -> None:
        self.notes.clear()
        self.slow_since_ns = None
        self.worst_ns = 0

    def on_tick(self, now_ns: int, published: int, durable: int) -> int | None:
        """Note the log's end; returns how long appends have been slow once that is at
        least the period (None otherwise, or when the rule is off)."""
        if self.threshold_ns <= 0:
            return None
        notes = self.notes
        if notes and notes[0][1] <= durable:
            began, _ = notes.popleft()  # the oldest bytes of what became durable
            while notes and notes[0][1] <= durable:
                notes.popleft()
            self._took(began, now_ns - began)
        if notes and now_ns - notes[0][0] > self.threshold_ns:
            self._took(notes[0][0], now_ns - notes[0][0])
        if published > durable and (not notes or published > notes[-1][1]):
            notes.append((now_ns, published))
        since = self.slow_since_ns
        if since is None or now_ns - since < self.period_ns:
            return None
        return now_ns - since

    def _took(self, began_ns: int, took_ns: int) -> None:
        if took_ns <= self.threshold_ns:
            self.slow_since_ns = None
            self.worst_ns = 0
            return
        if self.slow_since_ns is None:
            self.slow_since_ns = began_ns
        self.worst_ns = max(self.worst_ns, took_ns)


class Handover:
    """The leader's hand-over, while one is under way (idle otherwise)."""

    __slots__ = (
        "_stalled_at",
        "_stalled_since_ns",
        "config",
        "consensus",
        "deadline_ns",
        "disk_latency",
        "log",
        "progress",
        "reason",
        "sent",
        "step_down",
        "target",
        "view",
    )

    def __init__(
        self,
        config: ConsensusConfig,
        log: ReplicatedLog,
        progress: ProgressTracker,
        view: TermView,
        consensus: ConsensusPort,
    ) -> None:
        self.config = config
        self.log = log
        self.progress = progress
        self.view = view
        self.consensus = consensus
        self.target = -1
        """The follower leadership goes to (-1: no hand-over under way)."""
        self.reason = ""
        self.deadline_ns = 0
        self.sent = False
        """TimeoutNow has gone to the target."""
        self.step_down = False
        """Step down if the hand-over does not happen in time (the log is not durable)."""
        self._stalled_since_ns: int | None = None
        self._stalled_at = -1
        self.disk_latency = DiskLatency(config.slow_disk_threshold_ns, config.slow_disk_period_ns)
        """The leader's append-to-durable time (a dying disk hands leadership over)."""

    @property
    def active(self) -> bool:
        return self.target >= 0

    def start(
        self,
        now_ns: int,
        to: int | None,
        reason: str,
        *,
        step_down: bool = False,
        warn: bool = False,
    ) -> str:
        """Hand leadership to ``to`` (None: the best voting follower); returns why it
        cannot ("" once under way).  ``warn``: log it as a WARNING (something for an
        operator to look into), as every ``step_down`` one is."""
        if not self.view.is_ready_leader:
            return "this member is not the ready leader"
        if self.active:
            return f"a hand-over to member {self.target} is already under way"
        # heard within a few heartbeat intervals (a follower reports at least once an
        # interval): one silent for longer may be gone, and a hand-over to it would only
        # cost an election timeout
        cfg = self.config
        lately = min(3 * cfg.leader_heartbeat_interval_ns, cfg.leader_heartbeat_timeout_ns)
        candidates = [
            p
            for p in self.progress
            if p.voter and now_ns - p.last_heard_ns < lately and (to is None or p.member_id == to)
        ]
        if not candidates:
            if to is not None and to not in self.config.others:
                return f"member {to} is not another member of this cluster"
            if to is not None:
                return f"member {to} is not a voting follower heard from lately"
            return "no voting follower has been heard from lately"
        best = max(candidates, key=lambda p: (p.match_position, -p.member_id))
        self.target = best.member_id
        self.reason = reason
        self.step_down = step_down
        self.deadline_ns = now_ns + self.config.election_timeout_ns
        self.sent = False
        # asked for (a stop, transfer-leadership): routine; a leader whose disk does not
        # take its log (step_down), or a slow disk (warn), is something to look into
        (log.warning if step_down or warn else log.info)(
            "member %d hands leadership of term %d to member %d: %s",
            self.config.member_id,
            self.view.leadership_term_id,
            self.target,
            reason,
        )
        self.maybe_send()
        return ""

    def maybe_send(self) -> None:
        """Send TimeoutNow once the target holds all of this leader's log (all that is
        durable here, for a leader whose disk has stopped taking writes: what is not
        may never be).  Either way the election's rules decide: a target lacking a
        committed entry is refused by the voters that hold it."""
        if self.sent or not self.active:
            return
        progress = self.progress.get(self.target)
        rlog = self.log
        needed = rlog.archive_position if self.step_down else rlog.published_position
        if progress is None or progress.match_position < needed:
            return
        self.sent = True
        self.consensus.send(
            self.target,
            TimeoutNow(
                leadership_term_id=self.view.leadership_term_id,
                leader_member_id=self.config.member_id,
                target_member_id=self.target,
            ),
        )

    def on_timeout_now(self, msg: TimeoutNow, catching_up: bool) -> bool:
        """Should this follower campaign at once?  Its own leader of this term handed
        leadership to it, and it votes (a catch-up member never campaigns)."""
        view = self.view
        return (
            not catching_up
            and not view.in_election
            and (msg.leadership_term_id, msg.leader_member_id)
            == (view.leadership_term_id, view.leader_member_id)
        )

    def clear(self) -> None:
        """No longer leading (the hand-over happened, or an election came first)."""
        self.target = -1
        self._stalled_since_ns = None
        self.disk_latency.reset()

    def on_slow_tick(self, now_ns: int) -> str | None:
        """Give up a hand-over past its deadline; start one when this leader's log has
        not become durable for a heartbeat timeout.  Returns why to step down, if it must."""
        if self.active:
            if now_ns < self.deadline_ns:
                self.maybe_send()
                return None
            target, self.target = self.target, -1
            log.warning(
                "member %d: the hand-over to member %d did not happen within the election timeout",
                self.config.member_id,
                target,
            )
            if self.step_down:
                return "its log cannot be made durable and no follower took over"
        reason = self._check_durable(now_ns)
        if reason is None and not self.active:
            self._check_slow(now_ns)
        return reason

    def _check_slow(self, now_ns: int) -> None:
        """Hand over when every append has been slow for the period (a dying disk: the
        followers commit without this leader, but its clients wait on a slow member,
        and one sync may come to block its event loop).  Not a step-down: nothing is
        wrong with what it holds, and with no follower to take over it leads on."""
        rlog = self.log
        if self.config.member_count == 1:
            return
        latency = self.disk_latency
        slow_for = latency.on_tick(now_ns, rlog.published_position, rlog.archive_position)
        if slow_for is None:
            return
        worst = latency.worst_ns
        latency.reset()  # a new spell must pass before the next try
        reason = (
            f"its disk is slow: every append of the last {slow_for / 1e9:.1f}s took over "
            f"{latency.threshold_ns / 1e6:.0f} ms to become durable (the "
            f"slowest {worst / 1e6:.0f} ms)"
        )
        why_not = self.start(now_ns, None, reason, warn=True)
        if why_not:
            log.warning("member %d: %s; it leads on: %s", self.config.member_id, reason, why_not)

    def _check_durable(self, now_ns: int) -> str | None:
        rlog = self.log
        if rlog.archive_position >= rlog.published_position or self.config.member_count == 1:
            self._stalled_since_ns = None
            return None
        if self._stalled_since_ns is None or rlog.archive_position != self._stalled_at:
            self._stalled_since_ns, self._stalled_at = now_ns, rlog.archive_position
            return None
        stalled = now_ns - self._stalled_since_ns
        if stalled < self.config.leader_heartbeat_timeout_ns:
            return None
        self._stalled_since_ns = None
        reason = (
            f"its log has not become durable for {stalled / 1e9:.1f}s (at "
            f"{rlog.archive_position} of {rlog.published_position})"
        )
        if self.start(now_ns, None, reason, step_down=True):
            return reason  # nobody to hand over to: step down all the same
        return None
