"""Taking and loading snapshots of the consensus module and the service (seed 004).

A snapshot is taken by every member when it *applies* a ClusterActionRequest(SNAPSHOT)
from the log, so it captures the committed state at exactly that log position on every
member: the sessions the service knows, every timer not yet applied as fired, the
pending service messages, and whatever the service's ``on_take_snapshot`` returns.

Layout (seed 004)::

    SnapshotMarker(type 1, BEGIN)        consensus module
    ConsensusModuleState
    ClusterSessionSnapshot ...           every open session (time of last activity -1)
    Timer ...
    PendingMessageTracker, PendingMessage ...
    SnapshotMarker(type 1, END)
    SnapshotMarker(type 2, BEGIN)        service
    ClientSession ...                    with the last sequence applied (issue 42)
    ServiceState                         the service's own bytes
    SnapshotMarker(type 2, END)

Sessions loaded from a snapshot are live like those replayed from the log: their
clients may resume them with their secret after a restart, or they time out (unlike
seed 004, which closes them after the first election: one policy for every session).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocol.codec import encode
from ..protocol.enums import ClusterTimeUnit, SnapshotMark
from ..protocol.snapshot import (
    ClientSession,
    ClusterSessionSnapshot,
    ConsensusModuleState,
    PendingMessage,
    PendingMessageTracker,
    ServiceState,
    SnapshotMarker,
    SnapshotRecord,
    Timer,
)
from ..service import take_service_snapshot
from .consensus import ConsensusModule
from .service_container import ServiceContainer

CONSENSUS_MODULE_TYPE_ID = 1
SERVICE_TYPE_ID = 2
NULL_VALUE = -1


class SnapshotError(ValueError):
    """A snapshot whose records are not in the expected layout."""


def take_snapshot(
    cm: ConsensusModule, container: ServiceContainer, log_position: int, leadership_term_id: int
) -> list[Any]:
    """The records of a snapshot at ``log_position`` (call while applying that position)."""

    def marker(type_id: int, mark: SnapshotMark) -> SnapshotMarker:
        return SnapshotMarker(
            type_id=type_id,
            log_position=log_position,
            leadership_term_id=leadership_term_id,
            index=0,
            mark=mark,
            time_unit=ClusterTimeUnit.MILLIS,
            app_version=cm.config.app_version,
        )

    tracker = cm.service_messages
    sessions = sorted(container.sessions.values(), key=lambda s: s.id)
    records: list[Any] = [
        marker(CONSENSUS_MODULE_TYPE_ID, SnapshotMark.BEGIN),
        ConsensusModuleState(
            next_session_id=container.max_session_id + 1,
            next_service_session_id=tracker.next_service_session_id,
            log_service_session_id=tracker.log_service_session_id,
            pending_message_capacity=0,
        ),
    ]
    records += [
        ClusterSessionSnapshot(
            cluster_session_id=s.id,
            correlation_id=0,
            opened_log_position=0,
            time_of_last_activity=NULL_VALUE,
            close_reason=NULL_VALUE,
            response_stream_id=s.response_stream_id,
            response_channel=s.response_channel,
        )
        for s in sessions
    ]
    records += [Timer(correlation_id=c, deadline=d) for c, d in cm.timers.snapshot()]
    records.append(
        PendingMessageTracker(
            next_service_session_id=tracker.next_service_session_id,
            log_service_session_id=tracker.log_service_session_id,
            pending_message_capacity=0,
            service_id=0,
        )
    )
    records += [PendingMessage(seq, payload) for seq, payload in tracker.pending()]
    records.append(marker(CONSENSUS_MODULE_TYPE_ID, SnapshotMark.END))
    records.append(marker(SERVICE_TYPE_ID, SnapshotMark.BEGIN))
    records += [
        ClientSession(
            s.id,
            s.response_stream_id,
            s.response_channel,
            s.encoded_principal,
            s.secret_hash,
            s.applied_sequence,
            s.replies.last,
            s.replies.confirmed,
            [encode(reply) for reply in s.replies.records()],
        )
        for s in sessions
    ]
    # ServiceStateError when the service raises or returns no bytes: no snapshot at all
    records.append(ServiceState(take_service_snapshot(container.service)))
    records.append(marker(SERVICE_TYPE_ID, SnapshotMark.END))
    return records


@dataclass
class LoadedSnapshot:
    log_position: int
    leadership_term_id: int
    module: ConsensusModuleState
    sessions: list[ClusterSessionSnapshot] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)
    tracker: PendingMessageTracker | None = None
    pending: list[PendingMessage] = field(default_factory=list)
    client_sessions: list[ClientSession] = field(default_factory=list)
    service_state: bytes = b""


def parse_snapshot(records: list[SnapshotRecord]) -> LoadedSnapshot:
    """Check the layout and gather the parts; SnapshotError if it is not a snapshot."""
    if len(records) < 4 or not isinstance(records[0], SnapshotMarker):
        raise SnapshotError("snapshot does not begin with a SnapshotMarker")
    begin = records[0]
    markers = [r for r in records if isinstance(r, SnapshotMarker)]
    expected = [
        (CONSENSUS_MODULE_TYPE_ID, SnapshotMark.BEGIN),
        (CONSENSUS_MODULE_TYPE_ID, SnapshotMark.END),
        (SERVICE_TYPE_ID, SnapshotMark.BEGIN),
        (SERVICE_TYPE_ID, SnapshotMark.END),
    ]
    if [(m.type_id, m.mark) for m in markers] != expected or any(
        m.log_position != begin.log_position for m in markers
    ):
        raise SnapshotError("snapshot markers are missing, out of order or disagree")
    modules = [r for r in records if isinstance(r, ConsensusModuleState)]
    states = [r for r in records if isinstance(r, ServiceState)]
    if len(modules) != 1 or len(states) != 1:
        raise SnapshotError("snapshot needs one ConsensusModuleState and one ServiceState")
    trackers = [r for r in records if isinstance(r, PendingMessageTracker)]
    return LoadedSnapshot(
        log_position=begin.log_position,
        leadership_term_id=begin.leadership_term_id,
        module=modules[0],
        sessions=[r for r in records if isinstance(r, ClusterSessionSnapshot)],
        timers=[r for r in records if isinstance(r, Timer)],
        tracker=trackers[0] if trackers else None,
        pending=[r for r in records if isinstance(r, PendingMessage)],
        client_sessions=[r for r in records if isinstance(r, ClientSession)],
        service_state=states[0].data,
    )


def load_snapshot(
    snapshot: LoadedSnapshot, cm: ConsensusModule, container: ServiceContainer, now_ns: int
) -> None:
    """Restore the consensus module and the container (then start the service with
    ``snapshot.service_state``)."""
    hashes = {r.cluster_session_id: r.secret_hash for r in snapshot.client_sessions}
    cm.session_manager.restore(
        (
            (
                r.cluster_session_id,
                r.correlation_id,
                r.response_stream_id,
                r.response_channel,
                hashes.get(r.cluster_session_id, b""),
            )
            for r in snapshot.sessions
        ),
        snapshot.module.next_session_id,
        now_ns,
    )
    for timer in snapshot.timers:
        cm.timers.schedule(timer.correlation_id, timer.deadline)
    cm.service_messages.restore(
        snapshot.module.next_service_session_id,
        snapshot.module.log_service_session_id,
        [(p.seq, p.payload) for p in snapshot.pending],
    )
    container.restore_sessions(snapshot.client_sessions)
    container.max_session_id = snapshot.module.next_session_id - 1
    container.log_position = snapshot.log_position
    container.leadership_term_id = snapshot.leadership_term_id
    cm.on_applied(snapshot.log_position)
