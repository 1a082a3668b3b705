"""Enumerations shared by the message channels (Aeron Cluster's codes, same values)."""

from __future__ import annotations

import enum


class EventCode(enum.IntEnum):
    """Code carried by a :class:`~cluster.protocol.egress.SessionEvent`."""

    OK = 0
    ERROR = 1
    REDIRECT = 2
    AUTHENTICATION_REJECTED = 3
    CLOSED = 4


class QueryStatus(enum.IntEnum):
    """Outcome carried by a :class:`~cluster.protocol.egress.QueryResponse` (Triarch's)."""

    OK = 0
    #: the service's ``on_query`` raised, or the service answers no queries
    SERVICE_ERROR = 1
    #: this member does not lead (or no longer does, or is not ready yet): ask the leader
    NOT_LEADER = 2
    #: too many queries in flight (the session's or the member's bound): try again later
    BUSY = 3
    #: the request cannot be answered as asked (an unknown consistency level)
    REFUSED = 4


class CloseReason(enum.IntEnum):
    """Why a ClusterSession was closed."""

    CLIENT_ACTION = 0
    SERVICE_ACTION = 1
    TIMEOUT = 2
    #: Triarch's, after the seeds' three: the cluster was shut down (``cluster-tool
    #: shutdown``), or aborted (``cluster-tool abort``), with the session open
    SHUTDOWN = 3
    ABORT = 4


class ClusterAction(enum.IntEnum):
    """Action carried by a ClusterActionRequest on the log.

    ``ABORT`` is Triarch's: every member stops at that log position without a snapshot.
    SHUTDOWN is ``SNAPSHOT`` with :data:`CLUSTER_ACTION_FLAG_TERMINATE` set.
    """

    SUSPEND = 0
    RESUME = 1
    SNAPSHOT = 2
    ABORT = 3


CLUSTER_ACTION_FLAG_TERMINATE = 0x100
"""ClusterActionRequest flag: stop every member once the action is applied (SHUTDOWN)."""


class ModuleState(enum.IntEnum):
    """The consensus module's state (Aeron's ``ConsensusModule.State``)."""

    INIT = 0
    ACTIVE = 1
    SUSPENDED = 2
    SNAPSHOT = 3
    QUITTING = 4
    TERMINATING = 5
    CLOSED = 6


class SnapshotMark(enum.IntEnum):
    BEGIN = 0
    SECTION = 1
    END = 2


class ClusterTimeUnit(enum.IntEnum):
    MILLIS = 0
    MICROS = 1
    NANOS = 2


class AdminRequestType(enum.IntEnum):
    SNAPSHOT = 0


class AdminResponseCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    UNAUTHORISED_ACCESS = 2


class ChangeType(enum.IntEnum):
    JOIN = 0
    QUIT = 1


class Role(enum.IntEnum):
    """Cluster role of a member (Aeron's ``Cluster.Role``)."""

    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
