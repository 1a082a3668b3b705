"""The console's own messages (posted by its workers, handled by the app)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from .source import ActionResult, MemberPoll

__all__ = ["ActionDone", "ClusterPolled"]


@dataclass
class ClusterPolled(Message, bubble=False):
    """One polling round: every member that answered (or failed) since the last round,
    in member-id order, with its ``errors`` records when they were fetched this round."""

    polls: list[tuple[MemberPoll, list[dict[str, Any]] | None]]


@dataclass
class ActionDone(Message, bubble=False):
    """A snapshot, suspend or resume finished (or was refused)."""

    result: ActionResult
