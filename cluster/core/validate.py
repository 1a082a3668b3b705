"""Checks of a member's consensus message before it reaches the consensus module.

Every byte from the network is checked before it can touch the archive or the module's
state, statelessly here (the module checks the rest against its own log):

* terms within ``[-1, MAX_TERM]`` and positions within ``[0, MAX_POSITION]``: values no
  real cluster reaches, so term arithmetic never overflows the wire types;
* the member ids it names are configured members, and not this member; the one that
  says who sent it is the member whose link brought it (``sender``);
* an AppendRequest's positions are consistent (the term's base not after the data, the
  previous term not after the data's term).  Its data is checked by the follower
  (:func:`check_records`: whole, non-empty, CRC-valid records) once the request's place
  in its log is verified: a request from a position that is not a record boundary of
  the leader's log is a normal step of finding where two logs agree (it fails the term
  check and is answered with a hint), not an error.

:func:`check_consensus_message` returns why a message is refused (None if it is not);
the member link that brought it counts the error, logs it and closes.  One check needs
the member's own term, and the consensus module makes it (:func:`far_term`): a term more
than :data:`MAX_TERM_STEP` ahead of it is refused.
"""

from __future__ import annotations

import zlib

from ..archive.record import MAX_RECORD_LENGTH, RECORD_HEADER
from ..protocol.consensus import (
    MAX_POSITION,
    MAX_SNAPSHOT_CHUNK,
    MAX_SNAPSHOT_LENGTH,
    MAX_TERM,
    SNAPSHOT_HELD,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    ConsensusMessage,
    RequestVote,
    SnapshotChunk,
    SnapshotChunkAck,
    TimeoutNow,
    Vote,
)

MAX_TERM_STEP = 1 << 20
"""The furthest a member's message may be ahead of this member's term.  A real cluster
moves one term an election (a day of back-to-back elections is fewer than a million);
refusing more keeps one forged message from using up the terms left below
:data:`~cluster.protocol.consensus.MAX_TERM`."""

_unpack_header = RECORD_HEADER.unpack_from
_HEADER = RECORD_HEADER.size
_crc32 = zlib.crc32


def _term(value: int) -> bool:
    return -1 <= value <= MAX_TERM


def _position(value: int) -> bool:
    return 0 <= value <= MAX_POSITION


def _check_append(
    message: AppendRequest, members: tuple[int, ...], me: int, sender: int | None
) -> str | None:
    """The common case, kept to plain comparisons (every append a follower receives)."""
    term, prev, data_term = message.leadership_term_id, message.prev_term_id, message.data_term_id
    if not (-1 <= prev <= MAX_TERM and -1 <= data_term <= term <= MAX_TERM):
        if not (_term(term) and _term(prev) and _term(data_term)):
            return "term out of range"
        return "data of a term after the leader's"
    at, base = message.log_position, message.term_base_log_position
    if not (
        0 <= at <= MAX_POSITION - len(message.data)
        and 0 <= base <= MAX_POSITION
        and 0 <= message.commit_position <= MAX_POSITION
    ):
        return "position out of range"
    leader = message.leader_member_id
    if leader == me or leader not in members or (sender is not None and leader != sender):
        return f"leader member {leader} is not the sender"
    if message.data and (base > at or prev > data_term):
        return "data inconsistent with its term"
    return None


def check_records(data: bytes, ends: list[int] | None = None, base: int = 0) -> str | None:
    """Why ``data`` is not a sequence of whole, non-empty, CRC-valid log records (None if
    it is); ``ends`` collects where each record ends (its offset plus ``base``)."""
    end = len(data)
    offset = 0
    unpack, crc32, header, limit = _unpack_header, _crc32, _HEADER, MAX_RECORD_LENGTH
    while offset < end:  # the follower's hot path: one pass, slices of small bodies
        if end - offset < header:
            return f"incomplete record header at offset {offset}"
        length, crc = unpack(data, offset)
        body_end = offset + header + length
        if not 0 < length <= limit or body_end > end:
            if length == 0:
                return f"empty record at offset {offset}"  # no message encodes to nothing
            if length > limit:
                return f"record at offset {offset} is longer than {limit}"
            return f"incomplete record at offset {offset}"
        if crc32(data[offset + header : body_end]) != crc:
            return f"record at offset {offset} fails its CRC"
        offset = body_end
        if ends is not None:
            ends.append(base + body_end)
    return None


def _check_chunk(message: SnapshotChunk) -> str | None:
    """A snapshot chunk's numbers hold together and its data is what its CRC says."""
    if not (_term(message.leadership_term_id) and message.snapshot_term_id >= 0):
        return "term out of range"
    if message.snapshot_term_id > message.leadership_term_id:
        return "snapshot of a term after the leader's"
    if not (_position(message.log_position) and message.term_base_log_position >= 0):
        return "position out of range"
    if message.term_base_log_position >= message.log_position:
        return "snapshot position not after its term's base"
    length, offset, size = message.length, message.offset, len(message.data)
    if not 0 < length <= MAX_SNAPSHOT_LENGTH:
        return f"snapshot length {length} out of range"
    if size > MAX_SNAPSHOT_CHUNK or not 0 <= offset <= length - size:
        return f"chunk [{offset}, {offset + size}) outside the snapshot's {length} bytes"
    if _crc32(message.data) != message.crc:
        return "chunk fails its CRC"
    return None


def sender_of(message: ConsensusMessage) -> int:
    """The member a consensus message says it comes from (-1 if it names none)."""
    if isinstance(message, (AppendRequest, CommitPosition, SnapshotChunk, TimeoutNow)):
        return message.leader_member_id
    if isinstance(message, RequestVote):
        return message.candidate_member_id
    if isinstance(message, (AppendPosition, CanvassPosition, Vote, SnapshotChunkAck)):
        return message.follower_member_id
    return -1


def far_term(message: ConsensusMessage, candidate_term_id: int) -> str | None:
    """Why ``message`` is refused by a member whose candidate term is
    ``candidate_term_id`` for a term too far ahead (None if it is not).  Terms grow by
    one an election, and only after a quorum canvassed: a term this far ahead is a buggy
    or forged member's, and adopting it would let one message use up the terms the
    cluster has left."""
    term = (
        message.candidate_term_id
        if isinstance(message, (RequestVote, Vote))
        else getattr(message, "leadership_term_id", -1)
    )
    if term <= candidate_term_id + MAX_TERM_STEP:
        return None
    return (
        f"{type(message).__name__} of term {term}, far beyond this member's "
        f"term {candidate_term_id}"
    )


def check_consensus_message(
    message: ConsensusMessage, members: tuple[int, ...], me: int, sender: int | None = None
) -> str | None:
    """Why ``message`` from another member (``sender``, the member its link said hello
    as; None: not known) must be refused, or None."""

    if type(message) is AppendRequest:
        return _check_append(message, members, me, sender)

    def member(value: int) -> bool:
        return value in members and value != me and (sender is None or value == sender)

    if isinstance(message, AppendPosition):
        if not _term(message.leadership_term_id) or not _position(message.log_position):
            return "term or position out of range"
        if message.read_round < 0:
            return "read round out of range"
        return None if member(message.follower_member_id) else "follower member is not the sender"
    if isinstance(message, CommitPosition):
        if not _term(message.leadership_term_id) or not _position(message.log_position):
            return "term or position out of range"
        if message.read_round < 0:
            return "read round out of range"
        return None if member(message.leader_member_id) else "leader member is not the sender"
    if isinstance(message, CanvassPosition):
        if not (_term(message.log_leadership_term_id) and _term(message.leadership_term_id)):
            return "term out of range"
        if not _position(message.log_position):
            return "position out of range"
        return None if member(message.follower_member_id) else "member is not the sender"
    if isinstance(message, RequestVote):
        if not (_term(message.log_leadership_term_id) and _term(message.candidate_term_id)):
            return "term out of range"
        if message.log_leadership_term_id > message.candidate_term_id:
            return "log term after the candidate term"
        if not _position(message.log_position):
            return "position out of range"
        return None if member(message.candidate_member_id) else "candidate is not the sender"
    if isinstance(message, Vote):
        if not (_term(message.log_leadership_term_id) and _term(message.candidate_term_id)):
            return "term out of range"
        if not _position(message.log_position):
            return "position out of range"
        if message.candidate_member_id != me:
            return "a vote for another member"
        return None if member(message.follower_member_id) else "voter is not the sender"
    if isinstance(message, SnapshotChunk):
        reason = _check_chunk(message)
        if reason is not None:
            return reason
        return None if member(message.leader_member_id) else "leader member is not the sender"
    if isinstance(message, SnapshotChunkAck):
        if not _term(message.leadership_term_id) or not _position(message.log_position):
            return "term or position out of range"
        if not (message.offset == SNAPSHOT_HELD or 0 <= message.offset <= MAX_SNAPSHOT_LENGTH):
            return "snapshot offset out of range"
        return None if member(message.follower_member_id) else "follower member is not the sender"
    if isinstance(message, TimeoutNow):
        if not _term(message.leadership_term_id):
            return "term out of range"
        if message.target_member_id != me:
            return "a hand-over to another member"
        return None if member(message.leader_member_id) else "leader member is not the sender"
    return f"unexpected {type(message).__name__} on a member link"
