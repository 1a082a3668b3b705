"""The events log's lines, and the filters the console cycles through (``f``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["FILTERS", "Event", "EventFilter", "Severity"]

Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the events log."""

    at: float  # wall-clock seconds
    kind: str  # election, leader, member, snapshot, session, redirect, error, action, disk
    text: str
    severity: Severity = "information"


@dataclass(frozen=True, slots=True)
class EventFilter:
    name: str
    keep: Callable[[Event], bool]


FILTERS: tuple[EventFilter, ...] = (
    EventFilter("all", lambda e: True),
    EventFilter("warnings and errors", lambda e: e.severity != "information"),
    EventFilter("errors", lambda e: e.severity == "error" or e.kind in ("error", "disk")),
    EventFilter(
        "cluster (leader, election, member, snapshot)",
        lambda e: e.kind in ("leader", "election", "member", "snapshot", "disk"),
    ),
    EventFilter("sessions and redirects", lambda e: e.kind in ("session", "redirect")),
    EventFilter("console actions", lambda e: e.kind in ("action", "console")),
)
"""In the order ``f`` cycles through them."""
