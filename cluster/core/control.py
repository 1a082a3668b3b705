"""Cluster control: the module state (ACTIVE, SUSPENDED) and the cluster actions that
change it, from an operator or a client's AdminRequest (Aeron's ``ClusterControl``).

A leader puts each action on the log as a ClusterActionRequest, so every member sees
it at the same position: SUSPEND holds ingress (sequenced on RESUME), SNAPSHOT takes a
snapshot, a SNAPSHOT with the terminate flag shuts the cluster down.  A member that
replays a SUSPEND or RESUME from the log follows the module state it records.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol.egress import AdminResponse
from ..protocol.enums import (
    CLUSTER_ACTION_FLAG_TERMINATE,
    AdminRequestType,
    AdminResponseCode,
    ClusterAction,
    ModuleState,
)
from ..protocol.ingress import AdminRequest, SessionMessageHeader
from ..protocol.log import ClusterActionRequest, LogMessage
from .auth import AuthorisationService
from .base import Counters, TermView
from .log import ReplicatedLog
from .session import ClusterSession

MAX_HELD_MESSAGES = 100_000
"""Ingress messages a SUSPENDED module holds for RESUME; more are refused and counted."""


class ClusterControl:
    """The module state and the cluster actions of one member."""

    __slots__ = (
        "append",
        "authorisation",
        "counters",
        "held_messages",
        "log",
        "module_state",
        "view",
    )

    def __init__(
        self,
        log: ReplicatedLog,
        append: Callable[[LogMessage], int],
        view: TermView,
        authorisation: AuthorisationService,
        counters: Counters,
    ) -> None:
        self.log = log
        self.append = append
        self.view = view
        self.authorisation = authorisation
        self.counters = counters
        self.module_state = ModuleState.ACTIVE
        self.held_messages: list[SessionMessageHeader] = []

    def hold(self, header: SessionMessageHeader) -> bool:
        """SUSPENDED: keep ``header`` (stamped) until RESUME; False if the hold is full."""
        if len(self.held_messages) >= MAX_HELD_MESSAGES:
            self.counters.held_messages_dropped += 1
            return False
        self.held_messages.append(header)
        return True

    def request(
        self, action: ClusterAction, now_ns: int, *, terminate: bool = False
    ) -> tuple[bool, str]:
        """Put a cluster action on the log (a ready leader only); ``(accepted, message)``."""
        name = "SHUTDOWN" if terminate else action.name
        view = self.view
        if not view.is_ready_leader:
            return False, (
                f"Current node is not the leader (leaderMemberId = {view.leader_member_id}), "
                f"unable to {name}"
            )
        needed = ModuleState.SUSPENDED if action is ClusterAction.RESUME else ModuleState.ACTIVE
        if self.module_state is not needed:
            return False, (
                f"Unable to {name} as the state of the consensus module is "
                f"{self.module_state.name}, but needs to be {needed.name}"
            )
        rlog = self.log
        timestamp = rlog.stamp(now_ns)
        self.append(
            ClusterActionRequest(
                leadership_term_id=view.leadership_term_id,
                log_position=rlog.published_position,
                timestamp=timestamp,
                action=action,
                flags=CLUSTER_ACTION_FLAG_TERMINATE if terminate else 0,
            )
        )
        self.apply(action)
        return True, f"{name} applied successfully"

    def apply(self, action: ClusterAction) -> None:
        """Enter the module state ``action`` leads to (RESUME sequences what was held)."""
        if action is ClusterAction.SUSPEND:
            self.module_state = ModuleState.SUSPENDED
        elif action is ClusterAction.RESUME:
            self.module_state = ModuleState.ACTIVE
            held, self.held_messages = self.held_messages, []
            for header in held:
                self.append(header)

    def on_admin_request(
        self, msg: AdminRequest, session: ClusterSession, now_ns: int
    ) -> AdminResponse:
        """The answer to a client's AdminRequest (a SNAPSHOT, if its principal may)."""
        if msg.request_type is not AdminRequestType.SNAPSHOT:
            code, text = AdminResponseCode.ERROR, f"unknown request type {msg.request_type}"
        elif not self.authorisation.is_authorised("SNAPSHOT", session.encoded_principal):
            code, text = AdminResponseCode.UNAUTHORISED_ACCESS, "not authorised to SNAPSHOT"
        else:
            ok, text = self.request(ClusterAction.SNAPSHOT, now_ns)
            code = AdminResponseCode.OK if ok else AdminResponseCode.ERROR
        return AdminResponse(
            cluster_session_id=session.cluster_session_id,
            correlation_id=msg.correlation_id,
            request_type=msg.request_type,
            response_code=code,
            message=text,
        )
