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
the member link that brought it counts the error, logs it and closes.
"""

from __future__ import annotations

import zlib

from ..archive.record import MAX_RECORD_LENGTH, RECORD_HEADER
from ..protocol.consensus import (
    MAX_POSITION,
    MAX_TERM,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    ConsensusMessage,
    RequestVote,
    Vote,
)

_unpack_header = RECORD_HEADER.unpack_from
_HEADER = RECORD_HEADER.size
_crc32 = zlib.crc32


def _term(value: int) -> bool:
    return -1 <= value <= MAX_TERM


def _position(value: int) -> bool:
    return 0 <= value <= MAX_POSITION


def check_records(data: bytes) -> str | None:
    """Why ``data`` is not a sequence of whole, non-empty, CRC-valid log records (None if
    it is)."""
    view = memoryview(data)
    end = len(view)
    offset = 0
    while offset < end:
        if end - offset < _HEADER:
            return f"incomplete record header at offset {offset}"
        length, crc = _unpack_header(view, offset)
        if length == 0:
            return f"empty record at offset {offset}"  # no log message encodes to nothing
        if length > MAX_RECORD_LENGTH:
            return f"record at offset {offset} is longer than {MAX_RECORD_LENGTH}"
        body_end = offset + _HEADER + length
        if body_end > end:
            return f"incomplete record at offset {offset}"
        if _crc32(view[offset + _HEADER : body_end]) != crc:
            return f"record at offset {offset} fails its CRC"
        offset = body_end
    return None


def record_boundary(data: bytes, offset: int) -> bool:
    """Is ``offset`` where a record of ``data`` (whole records) starts, or its end?"""
    position = 0
    while position < offset:
        position += _HEADER + _unpack_header(data, position)[0]
    return position == offset


def check_consensus_message(
    message: ConsensusMessage, members: tuple[int, ...], me: int, sender: int | None = None
) -> str | None:
    """Why ``message`` from another member (``sender``, the member its link said hello
    as; None: not known) must be refused, or None."""

    def member(value: int) -> bool:
        return value in members and value != me and (sender is None or value == sender)

    if isinstance(message, AppendRequest):
        if not (
            _term(message.leadership_term_id)
            and _term(message.prev_term_id)
            and _term(message.data_term_id)
        ):
            return "term out of range"
        if not (
            _position(message.log_position)
            and _position(message.term_base_log_position)
            and _position(message.commit_position)
            and message.log_position + len(message.data) <= MAX_POSITION
        ):
            return "position out of range"
        if not member(message.leader_member_id):
            return f"leader member {message.leader_member_id} is not the sender"
        if message.data_term_id > message.leadership_term_id:
            return "data of a term after the leader's"
        if message.data and (
            message.term_base_log_position > message.log_position
            or message.prev_term_id > message.data_term_id
        ):
            return "data inconsistent with its term"
        return None
    if isinstance(message, AppendPosition):
        if not _term(message.leadership_term_id) or not _position(message.log_position):
            return "term or position out of range"
        return None if member(message.follower_member_id) else "follower member is not the sender"
    if isinstance(message, CommitPosition):
        if not _term(message.leadership_term_id) or not _position(message.log_position):
            return "term or position out of range"
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
    return f"unexpected {type(message).__name__} on a member link"
