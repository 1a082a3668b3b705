"""Cluster control: the module state (ACTIVE, SUSPENDED) and the cluster actions that
change it, from an operator or a client's AdminRequest (Aeron's ``ClusterControl``).

A leader puts each action on the log as a ClusterActionRequest, so every member sees
it at the same position: SUSPEND holds ingress (sequenced on RESUME), SNAPSHOT takes a
snapshot, a SNAPSHOT with the terminate flag shuts the cluster down.  A member that
replays a SUSPEND or RESUME from the log follows the module state it records.

A SHUTDOWN or an ABORT acts on the cluster it was given to, once
(:meth:`ClusterControl.terminates`): it stops a member only when the member applies it
live (past what its start-up replay covered) and in the term the leader put it on the log
in.  A member that meets it later (it was down while the cluster stopped, its disk was
replaced and it catches up over the whole log, the cluster was restarted after it and
elected a new term) takes the snapshot a SHUTDOWN calls for and goes on: the cluster
that entry stopped is gone, and stopping this member now would stop a cluster that
nobody asked to stop (Aeron acts on a replayed cluster action only in the term it was
appended in, for the same reason).

A client's AdminRequest(SNAPSHOT) is answered when the snapshot is written and recorded
(OK) or fails to be (ERROR, with the reason): the shell reports the outcome with
:meth:`ClusterControl.on_snapshot`.  While the shell reports a disk problem
(:meth:`ClusterControl.on_disk`), a SNAPSHOT is refused at once: it could not be written.

Snapshots also take themselves: every slow tick (:meth:`ClusterControl.on_slow_tick`) the
ready, ACTIVE leader asks its :class:`~cluster.core.autosnapshot.AutoSnapshot` whether
one is due (``--snapshot-log-bytes``, ``--snapshot-interval``) and, if so, puts a
SNAPSHOT on the log as an operator's would.  The rule hears of every snapshot: each one
put on the log here (:meth:`ClusterControl._request`), applied
(``auto.on_taking``, from the shell), and written or failed (:meth:`on_snapshot`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from ..protocol.egress import AdminResponse
from ..protocol.enums import (
    CLUSTER_ACTION_FLAG_TERMINATE,
    AdminRequestType,
    AdminResponseCode,
    CloseReason,
    ClusterAction,
    ModuleState,
)
from ..protocol.ingress import AdminRequest, SessionMessageHeader
from ..protocol.log import ClusterActionRequest, LogMessage
from .auth import AuthorisationService
from .autosnapshot import AutoSnapshot
from .base import Counters, EgressPort, IngressSource, TermView
from .log import ReplicatedLog
from .session import ClusterSession
from .sessions import SessionManager

log = logging.getLogger("cluster.consensus")

MAX_HELD_MESSAGES = 100_000
"""Ingress messages a SUSPENDED module holds for RESUME; more are refused and counted."""

MAX_SNAPSHOT_WAITERS = 1_000
"""Client SNAPSHOT requests waiting for their snapshot to be written; more are refused."""


class ControlView(TermView, Protocol):
    """The consensus module as cluster control sees it: its term, its egress and its
    sessions."""

    @property
    def egress(self) -> EgressPort: ...

    @property
    def session_manager(self) -> SessionManager: ...


class ClusterControl:
    """The module state and the cluster actions of one member."""

    __slots__ = (
        "append",
        "authorisation",
        "auto",
        "counters",
        "disk_problem",
        "held_messages",
        "log",
        "module_state",
        "snapshot_waiters",
        "view",
    )

    def __init__(
        self,
        log: ReplicatedLog,
        append: Callable[[LogMessage], int],
        view: ControlView,
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
        self.disk_problem = ""
        """What the shell last reported of its disk ("" while writes succeed)."""
        self.snapshot_waiters: list[tuple[int, int, ClusterSession, AdminRequest]] = []
        """``(log position, term, session, request)`` of each client SNAPSHOT request whose
        snapshot is not written yet."""
        self.auto = AutoSnapshot()
        """When this member, leading, asks for a snapshot by itself (off until configured)."""

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
        refused, _ = self._request(action, now_ns, terminate)
        name = "SHUTDOWN" if terminate else action.name
        return not refused, refused or f"{name} applied successfully"

    def _request(self, action: ClusterAction, now_ns: int, terminate: bool) -> tuple[str, int]:
        """``("", the log position after it)``, or ``(why it is refused, -1)``."""
        refused = self._refusal(action, terminate)
        if refused:
            return refused, -1
        rlog = self.log
        timestamp = rlog.stamp(now_ns)
        position = self.append(
            ClusterActionRequest(
                leadership_term_id=self.view.leadership_term_id,
                log_position=rlog.published_position,
                timestamp=timestamp,
                action=action,
                flags=CLUSTER_ACTION_FLAG_TERMINATE if terminate else 0,
            )
        )
        self.apply(action)
        if action is ClusterAction.SNAPSHOT and not terminate:
            self.auto.on_requested(position, self.view.leadership_term_id)
        return "", position

    def on_slow_tick(self, now_ns: int) -> int:
        """A ready, ACTIVE leader puts a SNAPSHOT on the log when the automatic rule says
        one is due (:mod:`cluster.core.autosnapshot`); returns work done."""
        auto = self.auto
        if not auto.enabled or not self.active or not self.view.is_ready_leader:
            return 0
        rlog = self.log
        term = self.view.leadership_term_id
        now_ms = rlog.cluster_time(now_ns)
        reason = auto.due(now_ms, rlog.published_position, term, self.disk_problem)
        if not reason:
            return 0
        refused, position = self._request(ClusterAction.SNAPSHOT, now_ns, False)
        if refused:  # not expected: due() checks what _refusal does
            auto.on_failed(-1)
            log.warning("automatic snapshot not requested: %s", refused)
            return 0
        auto.requested += 1
        log.info("automatic snapshot at log position %d: %s", position, reason)
        return 1

    def _refusal(self, action: ClusterAction, terminate: bool) -> str:
        name = "SHUTDOWN" if terminate else action.name
        view = self.view
        if not view.is_ready_leader:
            return (
                f"Current node is not the leader (leaderMemberId = {view.leader_member_id}), "
                f"unable to {name}"
            )
        needed = ModuleState.SUSPENDED if action is ClusterAction.RESUME else ModuleState.ACTIVE
        if self.module_state is not needed:
            return (
                f"Unable to {name} as the state of the consensus module is "
                f"{self.module_state.name}, but needs to be {needed.name}"
            )
        if action is ClusterAction.SNAPSHOT and not terminate and self.disk_problem:
            return f"Unable to SNAPSHOT: {self.disk_problem}"
        return ""

    def leave(
        self, state: ModuleState = ModuleState.QUITTING, *, reason: CloseReason | None = None
    ) -> None:
        """The member is on its way out: a terminating action (SHUTDOWN, ABORT: its
        ``reason``) applied live (QUITTING), then the node draining (TERMINATING).
        Operators see it in ``describe``, so a clean stop is not taken for a crash; a
        leader tells every session's client CLOSED with the ``reason`` first."""
        if reason is not None and self.module_state < ModuleState.QUITTING:
            self.view.session_manager.end_all(reason)
        if state > self.module_state:
            self.module_state = state

    def terminates(self, action: ClusterActionRequest, position: int, replayed_to: int) -> str:
        """Whether the terminating ``action`` (a SHUTDOWN or an ABORT) applied at log
        ``position`` stops this member: "" if it does, else why not (for the log).
        ``replayed_to``: the position this member's start-up replay reached (an entry
        at or below it happened before this start).  The choice decides only whether
        this member stops: a SHUTDOWN's snapshot is taken either way, and an ABORT
        changes no state, so members that choose differently never differ in state."""
        if position <= replayed_to:
            return f"it was applied before this start (replayed up to {replayed_to})"
        term = self.view.leadership_term_id
        if action.leadership_term_id != term:
            return (
                f"it was put on the log in term {action.leadership_term_id} and this member "
                f"is in term {term}: the cluster it stopped has been restarted since"
            )
        return ""

    @property
    def active(self) -> bool:
        """ACTIVE: the leader takes new work (SUSPENDED quiesces it until RESUME)."""
        return self.module_state is ModuleState.ACTIVE

    def apply(self, action: ClusterAction) -> None:
        """Enter the module state ``action`` leads to (RESUME sequences what was held;
        actions that change no state, SNAPSHOT, SHUTDOWN, ABORT, change nothing here)."""
        if action is ClusterAction.SUSPEND:
            self.module_state = ModuleState.SUSPENDED
        elif action is ClusterAction.RESUME:
            self.module_state = ModuleState.ACTIVE
            held, self.held_messages = self.held_messages, []
            for header in held:
                self.append(header)

    def on_admin_request(
        self,
        msg: AdminRequest,
        sessions: SessionManager,
        source: IngressSource | None,
        now_ns: int,
    ) -> None:
        """A client's AdminRequest (a SNAPSHOT, if its principal may), from ``source``:
        refused at once, or answered once the snapshot is written (:meth:`on_snapshot`)."""
        if not self.view.is_ready_leader:
            return
        session = sessions.lookup_open(msg.cluster_session_id, msg.leadership_term_id)
        if session is None or not sessions.holds(session, source):
            return
        session.time_of_last_activity_ns = now_ns
        if msg.request_type is not AdminRequestType.SNAPSHOT:
            code, text = AdminResponseCode.ERROR, f"unknown request type {msg.request_type}"
        elif not self.authorisation.is_authorised("SNAPSHOT", session.encoded_principal):
            code, text = AdminResponseCode.UNAUTHORISED_ACCESS, "not authorised to SNAPSHOT"
        elif len(self.snapshot_waiters) >= MAX_SNAPSHOT_WAITERS:
            code, text = AdminResponseCode.ERROR, "too many SNAPSHOT requests waiting"
        else:
            text, position = self._request(ClusterAction.SNAPSHOT, now_ns, False)
            if not text:  # answered when the snapshot at ``position`` is written, or fails
                term = self.view.leadership_term_id
                self.snapshot_waiters.append((position, term, session, msg))
                return
            code = AdminResponseCode.ERROR
        self._answer(session, msg, code, text)

    def on_snapshot(
        self, position: int, error: str = "", *, timestamp: int = 0, size: int = 0
    ) -> None:
        """The shell wrote and recorded the snapshot at log ``position`` (cluster time
        ``timestamp``, ``size`` bytes) or, with an ``error``, failed to: answer the
        requests that asked for it.  Requests of an earlier term, or for an earlier
        position (a log cut by a new leader), are dropped: this member no longer answers
        for them."""
        if error:
            self.auto.on_failed(position)
        else:
            self.auto.on_recorded(position, timestamp, size)
        view = self.view
        waiting, self.snapshot_waiters = self.snapshot_waiters, []
        for waiter in waiting:
            at, term, session, msg = waiter
            if at > position:
                self.snapshot_waiters.append(waiter)
            elif at == position and term == view.leadership_term_id and view.is_ready_leader:
                if error:
                    self._answer(session, msg, AdminResponseCode.ERROR, error)
                else:
                    text = f"SNAPSHOT taken at log position {position}"
                    self._answer(session, msg, AdminResponseCode.OK, text)

    def on_disk(self, problem: str) -> None:
        """The shell's disk state: "" while its writes succeed, else what fails ("disk
        full: ..."): SNAPSHOT requests are refused meanwhile."""
        self.disk_problem = problem

    def _answer(
        self, session: ClusterSession, msg: AdminRequest, code: AdminResponseCode, text: str
    ) -> None:
        self.view.egress.send(
            session.egress_id,
            AdminResponse(
                cluster_session_id=session.cluster_session_id,
                correlation_id=msg.correlation_id,
                request_type=msg.request_type,
                response_code=code,
                message=text,
            ),
        )
