"""Consensus channel: member <-> member (Aeron ids 50-57, 75-76, plus Triarch's own 58-61).

Triarch ships the replicated log over the same member link as the consensus messages
(Aeron uses a separate log channel): :class:`AppendRequest` carries a byte range of the
log exactly as it is in the leader's archive, so followers append it unchanged.
"""

from __future__ import annotations

from .._typing import Int32, Int64
from ._base import Message

MAX_TERM = 1 << 62
"""No real cluster reaches a term above this; a message naming one is a protocol error
(so term arithmetic, a candidate's ``term + 1``, never overflows the Int64 wire type)."""

MAX_POSITION = 1 << 62
"""No real log reaches a position above this (4 EiB); a message naming one is a protocol
error."""


CANVASS_CATCHING_UP = 1
"""CanvassPosition flag: the member's durable state is new or lost; it votes for nobody
and counts toward no quorum until a leader elected by others has caught it up."""


class CanvassPosition(Message, tag=50):
    log_leadership_term_id: Int64
    log_position: Int64
    leadership_term_id: Int64
    follower_member_id: Int32
    protocol_version: Int32
    flags: Int32 = 0


VOTE_TRANSFER = 1
"""RequestVote flag: the candidate campaigns because its leader handed leadership over
(:class:`TimeoutNow`): members with a live leader, and the leader itself, consider it."""


class RequestVote(Message, tag=51):
    log_leadership_term_id: Int64
    log_position: Int64
    candidate_term_id: Int64
    candidate_member_id: Int32
    protocol_version: Int32
    flags: Int32 = 0


class Vote(Message, tag=52):
    candidate_term_id: Int64
    log_leadership_term_id: Int64
    log_position: Int64
    candidate_member_id: Int32
    follower_member_id: Int32
    vote: bool


class NewLeadershipTerm(Message, tag=53):
    log_leadership_term_id: Int64
    next_leadership_term_id: Int64
    next_term_base_log_position: Int64
    next_log_position: Int64
    leadership_term_id: Int64
    term_base_log_position: Int64
    log_position: Int64
    leader_recording_id: Int64
    timestamp: Int64
    leader_member_id: Int32
    log_session_id: Int32
    app_version: Int32
    is_startup: bool


APPEND_POSITION_VERIFIED = 1
"""AppendPosition flag: the follower's log is known to match the leader's up to the position."""

APPEND_POSITION_CATCHING_UP = 2
"""AppendPosition flag: the follower is a catch-up member (new or lost state): the leader
replicates to it but counts it toward no quorum."""


class AppendPosition(Message, tag=54):
    """A follower's report of its log.  ``read_round``: the answer to the leader's
    :class:`CommitPosition` of that read round (0: none), which tells the leader this
    member still follows it in its term (ReadIndex, :mod:`cluster.core.reads`)."""

    leadership_term_id: Int64
    log_position: Int64
    follower_member_id: Int32
    flags: Int32 = 0
    read_round: Int64 = 0


class CommitPosition(Message, tag=55):
    """The leader's commit heartbeat.  ``read_round`` > 0: a read round (ReadIndex,
    :mod:`cluster.core.reads`): each follower of this leader in this term answers at
    once with an :class:`AppendPosition` of the same ``read_round``; one of a later
    term answers with its term, so a deposed leader learns it at once."""

    leadership_term_id: Int64
    log_position: Int64
    leader_member_id: Int32
    read_round: Int64 = 0


class CatchupPosition(Message, tag=56):
    leadership_term_id: Int64
    log_position: Int64
    follower_member_id: Int32
    catchup_endpoint: str = ""


class StopCatchup(Message, tag=57):
    leadership_term_id: Int64
    follower_member_id: Int32


class MemberHello(Message, tag=58):
    """First frame on a member link: who is calling, and with which protocol version."""

    member_id: Int32
    protocol_version: Int32
    cluster_id: Int32 = 0
    members_digest: bytes = b""
    """A digest of the caller's ``--members`` (:func:`cluster.config.members_digest`); empty
    from a caller that does not say."""


class AppendRequest(Message, tag=59):
    """A byte range of the leader's log, ``[log_position, log_position + len(data))``.

    ``prev_term_id`` is the term of the entry that ends at ``log_position`` in the leader's
    log (-1 at position 0): the follower appends only if its own log agrees there (Raft's
    log matching check).  All of ``data`` belongs to term ``data_term_id``, which began at
    ``term_base_log_position``.  An empty ``data`` is a probe/heartbeat.  ``timestamp``:
    the leader's cluster time, at or after every entry of its log, which a follower
    never stamps before should it lead next (a trailing field: 0 from a leader that
    predates it; a follower that predates it ignores it).
    """

    leadership_term_id: Int64
    leader_member_id: Int32
    log_position: Int64
    prev_term_id: Int64
    data_term_id: Int64
    term_base_log_position: Int64
    commit_position: Int64
    data: bytes
    timestamp: Int64 = 0


MAX_SNAPSHOT_CHUNK = 1 << 20
"""The most snapshot bytes one :class:`SnapshotChunk` carries."""

MAX_SNAPSHOT_LENGTH = 1 << 36
"""No snapshot a leader sends is larger (64 GiB); a chunk naming a larger one is a
protocol error."""


class SnapshotChunk(Message, tag=60):
    """A piece of the leader's latest snapshot, for a follower that needs log the leader
    has purged (Raft's InstallSnapshot; Aeron replicates the snapshot during catch-up).

    The snapshot file ``[offset, offset + len(data))`` of ``length`` bytes, taken at
    ``log_position`` in term ``snapshot_term_id`` (which began at
    ``term_base_log_position``); ``crc`` is the CRC-32 of ``data``.  An empty ``data`` is
    a probe: the follower answers with how much of this snapshot it holds.
    """

    leadership_term_id: Int64
    leader_member_id: Int32
    log_position: Int64
    snapshot_term_id: Int64
    term_base_log_position: Int64
    length: Int64
    offset: Int64
    crc: Int64
    data: bytes


SNAPSHOT_HELD = -1
"""SnapshotChunkAck offset: this follower's log already holds the snapshot's position
(committed, or an entry of the snapshot's term ends there): send it the log from there."""


SNAPSHOT_NO_ROOM = 1
"""SnapshotChunkAck flag: the follower refuses the transfer, its disk has no room for the
snapshot's declared length (and a reserve); the leader says so and asks again later."""


class SnapshotChunkAck(Message, tag=61):
    """A follower holds the first ``offset`` bytes of the snapshot at ``log_position``
    durably (the next chunk it wants), or :data:`SNAPSHOT_HELD`.  Once it holds them all
    it installs the snapshot and reports ``AppendPosition(log_position, VERIFIED)``.
    ``flags`` :data:`SNAPSHOT_NO_ROOM`: it refuses the transfer (offset 0)."""

    leadership_term_id: Int64
    follower_member_id: Int32
    log_position: Int64
    offset: Int64
    flags: Int32 = 0


class TimeoutNow(Message, tag=62):
    """Leadership hand-over (Raft's TimeoutNow): the leader of ``leadership_term_id`` tells
    the follower it has brought fully up to date to start an election at once."""

    leadership_term_id: Int64
    leader_member_id: Int32
    target_member_id: Int32


class TerminationPosition(Message, tag=75):
    leadership_term_id: Int64
    log_position: Int64


class TerminationAck(Message, tag=76):
    leadership_term_id: Int64
    log_position: Int64
    member_id: Int32


ConsensusMessage = (
    CanvassPosition
    | RequestVote
    | Vote
    | NewLeadershipTerm
    | AppendPosition
    | CommitPosition
    | CatchupPosition
    | StopCatchup
    | MemberHello
    | AppendRequest
    | SnapshotChunk
    | SnapshotChunkAck
    | TimeoutNow
    | TerminationPosition
    | TerminationAck
)
