"""A member's status, as ``describe`` on its admin port answers it: a typed
:class:`~cluster.protocol.admin.MemberStatus` that ``cluster-tool`` and ``cluster-tui``
decode with the same type.  Each part reports its own piece (the ingress agent's and the
member links' ``statistics()``, the consensus module's state); this module puts them
together."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from . import __version__
from .config import MemberEndpoints
from .core.consensus import ConsensusModule
from .protocol.admin import (
    DiskStatus,
    FollowerStatus,
    IngressStatus,
    LinkStatus,
    MemberAddress,
    MemberStatus,
    SessionStatus,
    StallsStatus,
)
from .protocol.enums import Role

if TYPE_CHECKING:
    from .agents.stalls import StallWatch
    from .agents.timings import Timings
    from .archive.segments import Archive


def _ms_ago(now_ns: int, then_ns: int) -> int | None:
    return (now_ns - then_ns) // 1_000_000 if then_ns else None


def role_name(cm: ConsensusModule) -> str:
    """LEADER, FOLLOWER, or CANDIDATE for a member in an election."""
    if cm.role is Role.LEADER:
        return "LEADER"
    if cm.election is not None or cm.role is Role.CANDIDATE:
        return "CANDIDATE"
    return "FOLLOWER"


def sees_quorum(cm: ConsensusModule, now_ns: int) -> bool:
    """A ready leader that heard from a quorum within the heartbeat timeout, or a
    follower that heard from its leader within it."""
    if cm.role is Role.LEADER:
        return cm.is_ready_leader and cm.followers.quorum_active(
            now_ns, cm.config.leader_heartbeat_timeout_ns
        )
    deadline = cm.leader_deadline_ns
    return cm.leader_member_id >= 0 and deadline is not None and now_ns < deadline


def follower_statuses(
    cm: ConsensusModule, now_ns: int, timings: Timings | None = None
) -> list[FollowerStatus]:
    """A leader's view of its followers (empty on any other member)."""
    if cm.role is not Role.LEADER:
        return []
    durable = cm.log.archive_position
    return [
        FollowerStatus(
            member_id=f.member_id,
            next_position=f.next_position,
            match_position=f.match_position,
            lag_bytes=max(0, durable - f.match_position) if f.match_position >= 0 else None,
            last_heard_ms_ago=_ms_ago(now_ns, f.last_heard_ns),
            lag_s=(
                round(timings.lag_ns(f.match_position, now_ns) / 1e9, 6)
                if timings is not None and f.match_position >= 0
                else None
            ),
        )
        for f in sorted(cm.followers, key=lambda f: f.member_id)
    ]


def session_statuses(cm: ConsensusModule, now_ns: int) -> list[SessionStatus]:
    progress = cm.session_manager.sequencing.progress
    statuses = []
    for s in sorted(cm.sessions.values(), key=lambda s: s.cluster_session_id):
        status = SessionStatus(
            cluster_session_id=s.cluster_session_id,
            state=s.state.name,
            response_channel=s.response_channel,
            last_activity_ms_ago=(now_ns - s.time_of_last_activity_ns) // 1_000_000,
            close_reason=s.close_reason.name if s.close_reason is not None else None,
        )
        known = progress(s.cluster_session_id)
        if known is not None:
            status.applied_sequence = known.applied_sequence
            status.last_reply = known.replies.last
            status.kept_replies = len(known.replies.kept)
            status.kept_reply_bytes = known.replies.size
        statuses.append(status)
    return statuses


class StatusParts(Protocol):
    """The parts of a running node that report a piece of its status (the node is one)."""

    config: Any
    cm: ConsensusModule
    members: list[MemberEndpoints]
    started_ns: int
    archive_errors: int
    ingress: Any  # each part's statistics(), status() or counters, as below
    links: Any
    snapshots: Any
    verifier: Any
    storage: Any
    timings: Any
    archive: Any
    stalls: Any

    def now_ns(self) -> int: ...


def node_status(node: StatusParts) -> MemberStatus:
    """A running node's :class:`MemberStatus`: each of its parts' piece, put together."""
    now = node.now_ns()
    return member_status(
        node.config.member_id,
        node.cm,
        now,
        ingress=node.ingress.statistics(),
        links=node.links.statistics(),
        members=node.members,
        snapshots_taken=node.snapshots.taken,
        uptime_s=round((now - node.started_ns) / 1e9, 3),
        archive_verified=node.verifier.verified,
        archive_errors=node.archive_errors,
        link_protocol_errors=node.links.protocol_errors,
        disk=node.storage.disk.status(),
        timings=node.timings,
        archive=node.archive,
        stalls=node.stalls,
    )


def member_status(
    member_id: int,
    cm: ConsensusModule,
    now_ns: int,
    *,
    ingress: IngressStatus,
    links: list[LinkStatus],
    members: Iterable[MemberEndpoints],
    snapshots_taken: int,
    uptime_s: float,
    archive_verified: int = 0,
    archive_errors: int = 0,
    link_protocol_errors: int = 0,
    disk: DiskStatus | None = None,
    timings: Timings | None = None,
    archive: Archive | None = None,
    stalls: StallWatch | None = None,
) -> MemberStatus:
    rlog = cm.log
    manager = cm.session_manager
    auto = cm.control.auto
    last = auto.view(rlog.published_position)
    return MemberStatus(
        member_id=member_id,
        role=role_name(cm),
        leadership_term_id=cm.leadership_term_id,
        candidate_term_id=cm.candidate_term_id,
        leader_member_id=cm.leader_member_id,
        commit_position=rlog.commit_position,
        append_position=rlog.archive_position,
        published_position=rlog.published_position,
        applied_position=rlog.applied_position,
        election_state=cm.election_state.name,
        module_state=cm.control.module_state.name,
        catching_up=cm.voting.catching_up,
        sees_quorum=sees_quorum(cm, now_ns),
        sessions=session_statuses(cm, now_ns),
        pending_sessions=len(manager.admission.pending_sessions),
        redirect_sessions=len(manager.admission.redirect_sessions),
        redirects=cm.counters.redirected_sessions,
        counters=dataclasses.asdict(cm.counters),
        ingress=ingress,
        followers=follower_statuses(cm, now_ns, timings),
        links=links,
        members=[
            MemberAddress(
                member_id=m.member_id,
                host=m.host,
                ingress_port=m.ingress_port,
                consensus_port=m.consensus_port,
                admin_port=m.admin_port,
            )
            for m in members
        ],
        snapshots_taken=snapshots_taken,
        uptime_s=uptime_s,
        pid=os.getpid(),
        archive_verified=archive_verified,
        archive_errors=archive_errors,
        link_protocol_errors=link_protocol_errors,
        disk=disk or DiskStatus(),
        version=__version__,
        archive_bytes=archive.size if archive is not None else 0,
        leader_changes=timings.leader_changes if timings is not None else 0,
        histograms=(
            timings.statuses(archive.sync_times, stalls.stalls if stalls is not None else None)
            if timings is not None and archive is not None
            else []
        ),
        stalls=stalls.status() if stalls is not None else StallsStatus(),
        last_snapshot_position=last.position,
        last_snapshot_time_ms=last.timestamp_ms,
        last_snapshot_age_s=(
            round(max(0, rlog.cluster_time(now_ns) - last.timestamp_ms) / 1e3, 3)
            if last.position >= 0
            else None
        ),
        log_bytes_since_snapshot=last.log_bytes_since,
        snapshot_log_bytes=auto.threshold,
        auto_snapshots=last.requested,
    )
