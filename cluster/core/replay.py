"""What a member mirrors into its consensus module from each committed log entry it
applies without having appended it (a follower, a member recovering, a new leader
applying the log of earlier terms): the leader's session bookkeeping, its term and
the module state."""

from __future__ import annotations

from typing import Any, Protocol

from ..protocol.enums import Role
from ..protocol.ingress import SessionMessageHeader
from ..protocol.log import (
    ClusterActionRequest,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
)
from .control import ClusterControl
from .log import ReplicatedLog
from .sessions import SessionManager


class Mirrored(Protocol):
    """The consensus module, as replay changes it."""

    log: ReplicatedLog
    session_manager: SessionManager
    control: ClusterControl
    role: Role
    leadership_term_id: int
    leader_member_id: int


def mirror_entry(cm: Mirrored, message: Any, position: int, now_ns: int) -> None:
    """Mirror the leader's session bookkeeping from a committed log entry."""
    rlog = cm.log
    if isinstance(message, SessionMessageHeader):
        rlog.observe_timestamp(message.timestamp)  # a new leader must not stamp earlier
        return
    if isinstance(message, (SessionOpenEvent, SessionCloseEvent)):
        cm.session_manager.mirror(message, position, now_ns)
    elif isinstance(message, NewLeadershipTermEvent):
        # Only ever forward: a leader re-applying its log from earlier terms (or a
        # follower replaying at start-up) must not move back to an old term.
        if message.leadership_term_id > cm.leadership_term_id and cm.role is not Role.LEADER:
            cm.leadership_term_id = message.leadership_term_id
            cm.leader_member_id = message.leader_member_id
    elif isinstance(message, ClusterActionRequest):
        cm.control.apply(message.action)  # SUSPEND and RESUME change the module state
    rlog.observe_timestamp(message.timestamp)
