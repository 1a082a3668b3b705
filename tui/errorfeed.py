"""New warnings and errors of a member (its ``errors`` admin reply) as events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .events import Event, Severity

__all__ = ["ERRORS_PER_FETCH", "error_events"]

ERRORS_PER_FETCH = 5  # at most this many new error records per member and fetch become events


def error_events(
    marks: dict[int, tuple[int | None, float]],
    member_id: int,
    pid: int | None,
    records: Iterable[dict[str, Any]],
    now: float,
) -> list[Event]:
    """The records newer than the last fetch's (``marks``: per member, its pid and the
    newest time seen).  The first fetch is summed up in one line; a restarted member's
    records are all new.  A distinct error seen again is new again (its ``time`` is the
    last time it was seen) and says how often it was seen."""
    items = [r for r in records if isinstance(r.get("time"), int | float)]
    newest = max((float(r["time"]) for r in items), default=0.0)
    mark = marks.get(member_id)
    if mark is None or mark[0] != pid:
        marks[member_id] = (pid, newest)
        if mark is None and items:
            return [
                Event(
                    now,
                    "error",
                    f"member {member_id}: {len(items)} earlier warning(s)/error(s) "
                    "(cluster-tool errors)",
                )
            ]
        if mark is None:
            return []
        since = 0.0  # restarted: everything it logged is new
    else:
        since = mark[1]
    fresh = sorted((r for r in items if float(r["time"]) > since), key=lambda r: r["time"])
    marks[member_id] = (pid, max(newest, since))
    events: list[Event] = []
    if len(fresh) > ERRORS_PER_FETCH:
        skipped = len(fresh) - ERRORS_PER_FETCH
        text = f"member {member_id}: {skipped} more warning(s) not shown"
        events.append(Event(now, "error", text))
        fresh = fresh[-ERRORS_PER_FETCH:]
    for r in fresh:
        level = str(r.get("level", "WARNING"))
        message = str(r.get("message", "")).splitlines()[0] if r.get("message") else ""
        count = r.get("count")
        if isinstance(count, int) and count > 1:
            message += f" (seen {count} times)"
        severity: Severity = "warning" if level == "WARNING" else "error"
        events.append(
            Event(float(r["time"]), "error", f"member {member_id} {level}: {message}", severity)
        )
    return events
