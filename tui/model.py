"""What the console knows about the cluster, built from successive ``describe`` polls.

No Textual here: :class:`ClusterModel` takes :class:`~tui.source.MemberPoll`\\ s (each a
typed :class:`~cluster.protocol.admin.MemberStatus`, and the ``errors`` records) and keeps
the rows the screen shows, and returns the
:class:`Event`\\ s worth a line in the events log.  Things a single ``describe`` cannot say
are derived across polls:

- **leader and elections**: the reachable member that says LEADER with the highest
  term; a change of leader or term is an event, and so is a member's ``elections``
  counter moving (it started an election);
- **closed sessions**: a session that disappears from the leader's ``describe`` is kept
  as CLOSED for ``closed_retention`` seconds, TIMEOUT or ``gone`` as the leader's
  ``timed_out_sessions`` counter tells (:mod:`tui.sessions`, fed the leader's listing
  once per round);
- **redirects**: the nodes count redirected sessions (``redirected_sessions``) but do
  not say which client was redirected, so the recent-redirects list is made of counter
  deltas: when, which member, how many, and the leader they were sent to;
- **throughput**: committed bytes/s from the leader's commit position, and the
  leader's ingress messages/s (every ingress frame, keepalives included), over windows
  of at least ``rate_window`` seconds;
- **disk**: a member whose writes fail (``MemberStatus.disk``: a full disk) is marked
  on its row, and its disk filling up and having space again are events;
- **module state and shutdown**: the leader's module state (SUSPENDED, SNAPSHOT,
  QUITTING, TERMINATING) is the cluster's (:attr:`ClusterModel.headline`).  A member
  that stops answering after it reported a stopping state (QUITTING, TERMINATING,
  CLOSED) has *shut down*; one that vanishes while ACTIVE is *down*.  When every member
  stops within ``together`` seconds the cluster has *stopped* (a shutdown, or its host
  went away): that is said once, not as a crash and an election;
- **timings**: fsync, duty-cycle and commit times per member from the histograms in
  ``describe`` over the last ``timing_window`` seconds (:mod:`tui.timings`);
- **the console's own session**: ``s`` opens a session to the leader only; if that
  member no longer leads it redirects the console, and that redirect is the console's,
  not a client's (:meth:`ClusterModel.expect_own_session`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.config import MemberEndpoints
from cluster.protocol.admin import FollowerStatus, IngressStatus, MemberStatus
from cluster.transport.tls import is_tls_problem

from .errorfeed import error_events
from .events import Event, Severity
from .headline import STOPPING, Headline, headline
from .sessions import SessionRow, SessionTable
from .source import MemberPoll
from .timings import HistogramWindow, Timing

__all__ = [
    "STOPPING",
    "ClusterModel",
    "Event",
    "Headline",
    "MemberRow",
    "RedirectRow",
    "SessionRow",
    "Severity",
]


@dataclass(slots=True)
class MemberRow:
    member_id: int
    endpoint: str
    up: bool = False
    known: bool = False  # polled at least once
    role: str = "-"
    catching_up: bool = False  # a new or lost disk, not yet caught up by a leader
    term: int | None = None
    commit: int | None = None
    append: int | None = None
    lag: int | None = None
    election: str = "-"
    module: str = "-"
    sessions: int | None = None
    heartbeat_ms: int | None = None  # leader's last word from this follower
    redirects: int = 0
    error: str = ""
    last_up: float | None = None  # monotonic time of the last good poll
    changed_at: float | None = None  # monotonic time of the last up/down change
    pid: int | None = None
    disk: str = ""  # "disk full" (or "disk error") while the member's writes fail
    disk_problem: str = ""
    version: str = ""
    uptime_s: float | None = None
    archive_bytes: int | None = None
    leader_changes: int | None = None
    lag_s: float | None = None  # the leader's view: seconds behind (followers only)
    fsync: Timing | None = None
    cycle: Timing | None = None
    commit_time: Timing | None = None  # leader only
    stopped: str = ""  # "shut down" (said so before it went) or "stopped" (all went together)
    snapshot_at: float | None = None  # monotonic time its snapshot count last grew
    snapshot_position: int | None = None  # the log position of its last snapshot
    snapshot_age_s: float | None = None  # seconds since it, when polled
    own_redirects: int = 0  # redirects of the console's own session (this pid)

    @property
    def client_redirects(self) -> int:
        return max(0, self.redirects - self.own_redirects)


@dataclass(frozen=True, slots=True)
class RedirectRow:
    at: float  # wall-clock seconds
    member_id: int
    count: int
    leader_id: int | None


@dataclass(slots=True)
class _Baseline:
    """The previous poll's counters of one member process (reset when the pid changes)."""

    pid: int
    counters: dict[str, int]
    ingress: IngressStatus
    snapshots: int
    module: str
    role: str


@dataclass(slots=True)
class _RateWindow:
    at: float
    commit: int
    frames: int
    member_id: int


@dataclass
class ClusterModel:
    """The console's state (see the module docstring)."""

    endpoints: Sequence[MemberEndpoints]
    closed_retention: float = 60.0
    history: int = 60
    rate_window: float = 1.0
    together: float = 3.0
    timing_window: float = 5.0
    wall_clock: Callable[[], float] = time.time
    members: dict[int, MemberRow] = field(init=False)
    sessions: dict[int, SessionRow] = field(init=False, default_factory=dict)
    redirects: deque[RedirectRow] = field(init=False)
    bytes_per_s: deque[float] = field(init=False)
    messages_per_s: deque[float] = field(init=False)
    leader_id: int | None = field(init=False, default=None)
    leader_term: int | None = field(init=False, default=None)
    polls: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.members = {
            m.member_id: MemberRow(m.member_id, f"{m.host}:{m.admin_port}") for m in self.endpoints
        }
        self.redirects = deque(maxlen=20)
        self.bytes_per_s = deque(maxlen=self.history)
        self.messages_per_s = deque(maxlen=self.history)
        self._baselines: dict[int, _Baseline] = {}
        self._describes: dict[int, MemberStatus] = {}
        self._leader_seen = False
        self._last_leader = "none"
        self._window: _RateWindow | None = None
        self._error_marks: dict[int, tuple[int | None, float]] = {}
        self._windows = {m.member_id: HistogramWindow(self.timing_window) for m in self.endpoints}
        self._session_table = SessionTable(self.sessions, self.event)
        self._held: list[Event] = []  # told a round later (see apply_round)
        self._own_pending: dict[int, float] = {}  # member dialled -> until when (monotonic)
        self.stopped_at: float | None = None  # monotonic: when the whole cluster stopped
        self.stopped_clean = False

    # ------------------------------------------------------------------ derived views

    @property
    def up_count(self) -> int:
        return sum(1 for m in self.members.values() if m.up)

    @property
    def leader_commit(self) -> int | None:
        if self.leader_id is None:
            return None
        return self.members[self.leader_id].commit

    @property
    def bytes_rate(self) -> float | None:
        return self.bytes_per_s[-1] if self.bytes_per_s else None

    @property
    def messages_rate(self) -> float | None:
        return self.messages_per_s[-1] if self.messages_per_s else None

    # ------------------------------------------------------------------ polls

    def event(self, kind: str, text: str, severity: Severity = "information") -> Event:
        return Event(self.wall_clock(), kind, text, severity)

    def apply(self, poll: MemberPoll) -> list[Event]:
        """Take one member's poll; return the events it reveals."""
        return self.apply_round([poll])

    def apply_round(self, polls: Sequence[MemberPoll]) -> list[Event]:
        """Take one round of polls (every member that answered or failed); return the
        events they reveal.  The leader is judged once, after the whole round.

        A member that went away, and the leader lost with it, are told a round later
        (:attr:`_held`): if the others follow within that round the cluster stopped, and
        one line says so instead of a member "down" and an election."""
        events: list[Event] = []
        polls = [p for p in polls if p.member_id in self.members]
        if not polls:
            return events
        held, self._held = self._held, []
        for poll in polls:
            self.polls += 1
            row = self.members[poll.member_id]
            status = poll.describe
            if status is None:
                events += self._member_down(row, poll)
            else:
                events += self._member_up(row, poll, status)
        now = max(p.at for p in polls)
        stopped = self._cluster_stopped(now)
        events += self._elect(now)
        if stopped:  # what was held, or went this round, is told by the one line
            events = stopped + events
            self._held = []
        elif any(m.up for m in self.members.values()):
            events = held + events
        else:  # nobody left to follow: nothing to wait for
            events = held + self._held + events
            self._held = []
        for poll in polls:
            status = poll.describe
            if status is not None and poll.member_id == self.leader_id:
                events += self._session_table.update(status.sessions, poll.at, self.leader_id)
                self._sample_rates(poll.member_id, status, poll.at)
        self._timings()
        return events

    def _member_down(self, row: MemberRow, poll: MemberPoll) -> list[Event]:
        events: list[Event] = []
        mid = row.member_id
        if row.up and row.module in STOPPING:
            row.stopped = "shut down"
            self._held.append(self.event("member", f"member {mid} shut down (was {row.module})"))
            row.changed_at = poll.at
        elif row.up:
            text = poll.error if is_tls_problem(poll.error) else f"member {mid} down: {poll.error}"
            self._held.append(self.event("member", text, "warning"))
            row.changed_at = poll.at
        elif not row.known:
            # a TLS mistake of ours (no --certs-dir, the wrong one) is said as it is
            tls = is_tls_problem(poll.error)
            text = poll.error if tls else f"member {mid} unreachable: {poll.error}"
            events.append(self.event("member", text, "error" if tls else "warning"))
            row.changed_at = poll.at
        row.known = True
        row.up = False
        row.error = poll.error
        row.role = "-"
        row.catching_up = False
        row.heartbeat_ms = None
        row.lag = None
        row.lag_s = None
        self._describes.pop(row.member_id, None)
        return events

    def _cluster_stopped(self, now: float) -> list[Event]:
        """Every member that was up gone within ``together`` seconds (two at least, or
        all of them): the cluster stopped."""
        rows = list(self.members.values())
        if self.stopped_at is not None or any(r.up for r in rows):
            return []
        went = [
            r
            for r in rows
            if r.last_up is not None
            and r.changed_at is not None
            and now - r.changed_at <= self.together
        ]
        if not went or (len(went) < 2 and len(went) < len(rows)):
            return []
        first = min(r.changed_at or now for r in went)
        shut = [r.member_id for r in went if r.stopped == "shut down"]
        snapshotted = [
            r.member_id
            for r in went
            if r.snapshot_at is not None and (r.changed_at or now) - r.snapshot_at <= self.together
        ]
        self.stopped_at = now
        self.stopped_clean = bool(shut or snapshotted)
        for r in went:
            r.stopped = r.stopped or "stopped"
        took = f"{now - first:.1f}s" if now - first >= 0.1 else "one poll"
        if shut:
            how = "a clean shutdown (members said so before they went)"
        elif snapshotted:
            how = "right after a snapshot: a clean SHUTDOWN, as far as the console can tell"
        else:
            how = "a shutdown (cluster-tool shutdown, Ctrl-C), or their host went away"
        if len(went) == len(rows):
            who = f"all {len(rows)} members"
        else:
            ids = ", ".join(str(r.member_id) for r in went)
            before = ", ".join(str(r.member_id) for r in rows if r not in went)
            who = f"the {len(went)} members up ({ids}; {before} already down)"
        return [self.event("member", f"cluster stopped: {who} within {took}, {how}")]

    def _member_up(self, row: MemberRow, poll: MemberPoll, status: MemberStatus) -> list[Event]:
        events: list[Event] = []
        mid = row.member_id
        role = status.role
        term = status.leadership_term_id
        if not row.up:
            how = "back up" if row.known else "up"
            events.append(self.event("member", f"member {mid} {how}: {role}, term {term}"))
            row.changed_at = poll.at
            row.stopped = ""
            self.stopped_at = None
            self.stopped_clean = False
        row.known = True
        row.up = True
        row.error = ""
        row.last_up = poll.at
        row.role = role
        events += self._catch_up_events(row, status)
        row.term = term
        row.commit = status.commit_position
        row.append = status.append_position
        row.election = status.election_state
        row.module = status.module_state
        row.sessions = len(status.sessions)
        row.version = status.version
        row.uptime_s = status.uptime_s
        row.archive_bytes = status.archive_bytes
        has_snapshot = status.last_snapshot_position >= 0
        row.snapshot_position = status.last_snapshot_position if has_snapshot else None
        row.snapshot_age_s = status.last_snapshot_age_s if has_snapshot else None
        row.leader_changes = status.leader_changes
        self._windows[mid].add(poll.at, status.pid, status.histograms)
        events += self._disk_events(row, status)
        if role != "LEADER" and self.leader_id == mid:
            row.lag = None
        if role == "LEADER":
            row.lag = 0
            row.lag_s = None
            row.heartbeat_ms = None
            self._apply_followers(status.followers)
        self._describes[mid] = status
        events += self._counter_events(row, status)
        return events

    def _catch_up_events(self, row: MemberRow, status: MemberStatus) -> list[Event]:
        was, row.catching_up = row.catching_up, status.catching_up
        mid = row.member_id
        if status.catching_up and not was:
            text = f"member {mid} catching up: a new or lost disk, it counts toward no quorum"
            return [self.event("member", text, "warning")]
        if was and not status.catching_up:
            return [self.event("member", f"member {mid} caught up: a voting member again")]
        return []

    def _disk_events(self, row: MemberRow, status: MemberStatus) -> list[Event]:
        disk = status.disk
        was, row.disk, row.disk_problem = row.disk, disk.label, disk.problem
        mid = row.member_id
        if disk.label and not was:
            return [self.event("disk", f"member {mid}: {disk.summary()}", "error")]
        if was and not disk.label:
            return [self.event("disk", f"member {mid}: disk writes resumed ({was} before)")]
        return []

    @property
    def disk_trouble(self) -> list[MemberRow]:
        """The members up whose writes fail (a full disk)."""
        return [m for m in self.members.values() if m.up and m.disk]

    def _apply_followers(self, followers: Sequence[FollowerStatus]) -> None:
        for f in followers:
            follower = self.members.get(f.member_id)
            if follower is None:
                continue
            follower.lag = f.lag_bytes
            follower.lag_s = f.lag_s
            follower.heartbeat_ms = f.last_heard_ms_ago

    def _counter_events(self, row: MemberRow, status: MemberStatus) -> list[Event]:
        mid = row.member_id
        pid = status.pid
        counters = dict(status.counters)
        ingress = status.ingress
        snapshots = status.snapshots_taken
        module = row.module
        previous = self._baselines.get(mid)
        self._baselines[mid] = _Baseline(pid, counters, ingress, snapshots, module, row.role)
        row.redirects = counters.get("redirected_sessions", 0)
        if row.pid != pid:
            row.own_redirects = 0
        row.pid = pid
        if previous is None:
            return []
        events: list[Event] = []
        if previous.pid != pid:
            events.append(self.event("member", f"member {mid} restarted (pid {pid})", "warning"))
            return events

        def delta(name: str) -> int:
            return max(0, counters.get(name, 0) - previous.counters.get(name, 0))

        if delta("elections"):
            state = status.election_state
            events.append(self.event("election", f"member {mid} started an election ({state})"))
        if snapshots > previous.snapshots:
            row.snapshot_at = row.last_up
            events.append(
                self.event(
                    "snapshot",
                    f"member {mid} took a snapshot ({snapshots} since it started; "
                    f"log now at {row.commit})",
                )
            )
        if module != previous.module:
            severity: Severity = "information" if module == "ACTIVE" else "warning"
            events.append(
                self.event("member", f"member {mid} {previous.module} -> {module}", severity)
            )
        redirected = delta("redirected_sessions")
        if redirected and self._own_pending.pop(mid, None) is not None:
            redirected -= 1
            row.own_redirects += 1
            events.append(
                self.event(
                    "redirect",
                    f"member {mid} redirected the console's own session (not a client's)",
                )
            )
        if redirected:
            leader = status.leader_member_id if status.leader_member_id >= 0 else None
            self.redirects.appendleft(RedirectRow(self.wall_clock(), mid, redirected, leader))
            to = f"leader {leader}" if leader is not None else "no known leader"
            plural = "s" if redirected > 1 else ""
            events.append(
                self.event(
                    "redirect", f"member {mid} redirected {redirected} client{plural} to {to}"
                )
            )
        if timed_out := delta("timed_out_sessions"):
            self._session_table.timed_out(timed_out)
        if rejected := delta("rejected_sessions"):
            events.append(
                self.event("session", f"member {mid} rejected {rejected} session(s)", "warning")
            )
        if failures := delta("egress_failures"):
            events.append(
                self.event("error", f"member {mid}: {failures} egress send failure(s)", "warning")
            )
        if truncations := delta("truncations"):
            events.append(
                self.event(
                    "error", f"member {mid} truncated its log {truncations} time(s)", "warning"
                )
            )
        if bad := max(0, ingress.protocol_errors - previous.ingress.protocol_errors):
            last = ingress.last_error
            detail = f": {last}" if last else ""
            events.append(
                self.event(
                    "error", f"member {mid}: {bad} ingress protocol error(s){detail}", "error"
                )
            )
        return events

    def _elect(self, now: float) -> list[Event]:
        leaders = [
            (row.term if row.term is not None else -1, row.member_id)
            for row in self.members.values()
            if row.up and row.role == "LEADER"
        ]
        leader = max(leaders)[1] if leaders else None
        term = self.members[leader].term if leader is not None else None
        events: list[Event] = []
        if leader != self.leader_id:
            if leader is None:
                self._held += self._leader_lost()
            elif not self._leader_seen:
                events.append(self.event("leader", f"leader is member {leader}, term {term}"))
            else:
                was = self._last_leader
                events.append(
                    self.event(
                        "leader", f"new leader: member {leader}, term {term} (was {was})", "warning"
                    )
                )
            self._window = None
        elif leader is not None and term != self.leader_term:
            events.append(self.event("leader", f"member {leader} leads again, term {term}"))
        if leader is not None:
            self._leader_seen = True
            self._last_leader = f"member {leader}, term {term}"
        self.leader_id = leader
        self.leader_term = term
        if leader is not None:
            for row in self.members.values():
                if row.member_id != leader and (not row.up or row.role == "LEADER"):
                    row.lag = None
        return events

    def _leader_lost(self) -> list[Event]:
        was = self.leader_id
        assert was is not None
        row = self.members[was]
        if self.stopped_at is not None:
            return []  # said once, by the cluster-stopped event
        if row.stopped == "shut down":
            return [self.event("leader", f"no leader: member {was} shut down")]
        if row.up:
            text = f"no leader: member {was} no longer leads ({row.role}): election"
        elif any(m.up for m in self.members.values()):
            text = f"no leader: member {was} is down; the others elect a new one"
        else:
            text = f"no leader: member {was} is down and no member answers"
        return [self.event("leader", text, "warning")]

    @property
    def headline(self) -> Headline:
        """What the banner says the cluster is doing (see the module docstring)."""
        return headline(self.members, self.leader_id, self.stopped_at, self.stopped_clean)

    # ------------------------------------------------------------------ actions

    def snapshot_target(self) -> tuple[int | None, str]:
        """Where ``s`` sends its session: the leader, or None and why not."""
        if self.leader_id is None:
            return None, "no leader: nothing sent, so there is no AdminResponse"
        module = self.members[self.leader_id].module
        if module != "ACTIVE":
            return None, f"the leader (member {self.leader_id}) is {module}: nothing sent"
        return self.leader_id, ""

    def expect_own_session(self, member_id: int, until: float) -> None:
        """The console opens a session at ``member_id``: a redirect counted there before
        ``until`` (monotonic) is the console's own, not a client's."""
        self._own_pending[member_id] = until

    def own_session_done(self, member_id: int, redirected: bool, now: float) -> None:
        """The console's session ended; unless it was redirected, no redirect is owed."""
        if not redirected:
            self._own_pending.pop(member_id, None)
        for mid, until in list(self._own_pending.items()):
            if until < now:
                del self._own_pending[mid]

    # ------------------------------------------------------------------ timings

    def _timings(self) -> None:
        leader = self.leader_id
        for mid, row in self.members.items():
            window = self._windows[mid]
            if not row.up:
                continue
            row.fsync = window.timing("fsync")
            row.cycle = window.timing("duty_cycle")
            row.commit_time = window.timing("commit") if mid == leader else None

    def replication_time(self, follower: int) -> Timing | None:
        """The leader's replication-lag histogram for ``follower`` over the window."""
        if self.leader_id is None:
            return None
        return self._windows[self.leader_id].timing("replication", follower=str(follower))

    # ------------------------------------------------------------------ sessions

    def expire(self, now: float) -> list[int]:
        """Forget sessions closed more than ``closed_retention`` seconds ago."""
        return self._session_table.expire(now, self.closed_retention)

    # ------------------------------------------------------------------ throughput

    def _sample_rates(self, member_id: int, status: MemberStatus, now: float) -> None:
        commit = status.commit_position
        frames = status.ingress.frames
        window = self._window
        if window is None or commit < window.commit:
            self._window = _RateWindow(now, commit, frames, member_id)
            return
        elapsed = now - window.at
        if elapsed < self.rate_window:
            return
        self.bytes_per_s.append((commit - window.commit) / elapsed)
        if window.member_id == member_id:
            self.messages_per_s.append(max(0, frames - window.frames) / elapsed)
        self._window = _RateWindow(now, commit, frames, member_id)

    # ------------------------------------------------------------------ errors

    def apply_errors(self, member_id: int, records: Iterable[dict[str, Any]]) -> list[Event]:
        """Take a member's ``errors`` records; new ones (after the first fetch) are events."""
        row = self.members.get(member_id)
        if row is None:
            return []
        return error_events(self._error_marks, member_id, row.pid, records, self.wall_clock())
