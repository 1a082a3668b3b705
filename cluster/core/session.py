"""ClusterSession: the consensus module's view of one client session (seed 000)."""

from __future__ import annotations

import enum

from ..protocol.enums import CloseReason


class State(enum.Enum):
    """Lifecycle of a ClusterSession (Aeron's ``ClusterSession.State``)."""

    INIT = 0
    CONNECTING = 1
    CONNECTED = 2
    CHALLENGED = 3
    AUTHENTICATED = 4
    REJECTED = 5
    OPEN = 6
    CLOSING = 7
    INVALID = 8
    CLOSED = 9


class Action(enum.Enum):
    """Why the session was created (Aeron's ``ClusterSession.Action``)."""

    CLIENT = 0
    BACKUP = 1
    HEARTBEAT = 2
    STANDBY_SNAPSHOT = 3


class ClusterSession:
    """One client session as the consensus module tracks it.

    ``egress_id`` names the session's egress connection in the egress publisher: the
    ``cluster_session_id`` once one is assigned, a negative local id for sessions a
    follower only keeps long enough to redirect.
    """

    __slots__ = (
        "action",
        "close_reason",
        "cluster_session_id",
        "correlation_id",
        "egress_backoff_ns",
        "egress_connected",
        "egress_id",
        "egress_retry_ns",
        "egress_up_since_ns",
        "encoded_principal",
        "has_new_leader_event_pending",
        "has_open_event_pending",
        "opened_log_position",
        "rejection",
        "response_channel",
        "response_stream_id",
        "restored_from_snapshot",
        "state",
        "time_of_last_activity_ns",
    )

    def __init__(
        self,
        cluster_session_id: int,
        egress_id: int,
        correlation_id: int,
        response_stream_id: int,
        response_channel: str,
        now_ns: int,
        action: Action = Action.CLIENT,
    ) -> None:
        self.cluster_session_id = cluster_session_id
        self.egress_id = egress_id
        self.correlation_id = correlation_id
        self.response_stream_id = response_stream_id
        self.response_channel = response_channel
        self.time_of_last_activity_ns = now_ns
        self.action = action
        self.state = State.INIT
        self.close_reason: CloseReason | None = None
        self.opened_log_position = -1
        self.encoded_principal = b""
        self.egress_connected = False
        self.egress_retry_ns: int | None = None  # re-dial a lost egress at this time
        self.egress_backoff_ns = 0  # the last wait before a re-dial (0: none yet)
        self.egress_up_since_ns: int | None = None  # connected since (first seen)
        self.has_open_event_pending = False
        self.has_new_leader_event_pending = False
        self.rejection: tuple[int, str] | None = None  # (EventCode, detail) for a rejected session
        self.restored_from_snapshot = False  # closed after the first election (seed 004)

    def __repr__(self) -> str:
        return (
            f"ClusterSession(id={self.cluster_session_id}, state={self.state.name}, "
            f"channel={self.response_channel!r})"
        )
