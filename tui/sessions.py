"""The console's session list: the leader's sessions, and those it no longer lists.

A node lists its open sessions in ``describe`` and forgets one when it closes, without
saying why.  :class:`SessionTable` keeps, from the leader's successive listings, one
:class:`SessionRow` per session: the first listing is the baseline (its sessions were
open when the console started), a session listed for the first time has *opened*, and
one that disappears is kept as CLOSED (dimmed) for ``closed_retention`` seconds
(:meth:`SessionTable.expire`).  Why it closed is guessed from the counters: when the
leader's ``timed_out_sessions`` counter moved in the same poll
(:meth:`SessionTable.timed_out`) the console says TIMEOUT, most idle sessions first;
otherwise ``gone`` (closed by the client or the service).

What happens to members, the leader and the counters is :mod:`tui.model`'s, which
feeds this table the leader's listing once per round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cluster.protocol.admin import SessionStatus

from .events import Event, Severity

__all__ = ["SessionRow", "SessionTable"]


@dataclass(slots=True)
class SessionRow:
    session_id: int
    state: str
    response_channel: str = ""
    last_activity_ms: int | None = None
    close_reason: str | None = None
    closed_at: float | None = None  # monotonic
    seen_at: float = 0.0  # monotonic time of the last describe that listed it
    existing: bool = False  # open when the console first listed sessions

    @property
    def closed(self) -> bool:
        return self.closed_at is not None


class SessionTable:
    """The session rows (``rows``, the dict :attr:`tui.model.ClusterModel.sessions` is),
    updated from the leader's listings (see the module docstring)."""

    def __init__(
        self,
        rows: dict[int, SessionRow],
        event: Callable[[str, str, Severity], Event],
    ) -> None:
        self.rows = rows
        self._event = event
        self._listed = False
        self._timeouts_pending = 0

    def timed_out(self, count: int) -> None:
        """The leader's ``timed_out_sessions`` counter moved by ``count`` this poll."""
        self._timeouts_pending += count

    def event(self, kind: str, text: str, severity: Severity = "information") -> Event:
        return self._event(kind, text, severity)

    def update(
        self, listed: Sequence[SessionStatus], now: float, leader_id: int | None
    ) -> list[Event]:
        """Take the leader's listing; return the events it reveals."""
        events: list[Event] = []
        current: dict[int, SessionStatus] = {s.cluster_session_id: s for s in listed}
        if not self._listed:  # the first listing is the baseline: no "opened"
            self._listed = True
            for s in current.values():
                self.rows[s.cluster_session_id] = SessionRow(
                    s.cluster_session_id, s.state, existing=True
                )
            if current:
                n = len(current)
                events.append(
                    self.event(
                        "session",
                        f"{n} session{'s' if n > 1 else ''} open when the console started "
                        f"(leader {leader_id})",
                    )
                )
        for sid, s in current.items():
            row = self.rows.get(sid)
            state = s.state
            channel = s.response_channel
            if row is None or row.closed:
                if row is None:
                    events.append(self.event("session", f"session {sid} opened ({channel})"))
                else:
                    events.append(self.event("session", f"session {sid} listed again"))
                row = SessionRow(sid, state)
                self.rows[sid] = row
            row.state = state
            row.response_channel = channel
            row.last_activity_ms = s.last_activity_ms_ago
            row.close_reason = s.close_reason or None
            row.seen_at = now
        vanished = [row for sid, row in self.rows.items() if not row.closed and sid not in current]
        vanished.sort(key=lambda r: -(r.last_activity_ms or 0))
        for row in vanished:
            row.closed_at = now
            row.state = "CLOSED"
            if row.close_reason is None and self._timeouts_pending > 0:
                self._timeouts_pending -= 1
                row.close_reason = "TIMEOUT"
            if row.close_reason == "TIMEOUT":
                idle = row.last_activity_ms
                after = f" after {idle / 1000:.1f}s idle" if idle is not None else ""
                events.append(
                    self.event("session", f"session {row.session_id} timed out{after}", "warning")
                )
            else:
                if row.close_reason is None:
                    row.close_reason = "gone"
                events.append(
                    self.event("session", f"session {row.session_id} closed ({row.close_reason})")
                )
        if self._timeouts_pending:
            plural = "s" if self._timeouts_pending > 1 else ""
            events.append(
                self.event(
                    "session",
                    f"{self._timeouts_pending} session{plural} timed out before opening",
                    "warning",
                )
            )
        self._timeouts_pending = 0
        return events

    def expire(self, now: float, retention: float) -> list[int]:
        """Forget sessions closed more than ``retention`` seconds ago."""
        gone = [
            sid
            for sid, row in self.rows.items()
            if row.closed_at is not None and now - row.closed_at > retention
        ]
        for sid in gone:
            del self.rows[sid]
        return gone
