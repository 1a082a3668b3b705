"""Exactly once in (issue 42), in the core: a ready leader appends only a session's next
sequence (a duplicate is dropped, a gap dropped and the client asked to resend); every
member knows a session's last sequence from what it applied, and snapshots keep it, so a
new leader decides as the old one would; the client hears what was applied (replies,
acknowledgements) and, at a close, the last one applied."""

from __future__ import annotations

from test_service_container import TERM, Node

from cluster.core.session import RESEND_AGAIN_NS
from cluster.core.snapshot import load_snapshot, parse_snapshot, take_snapshot
from cluster.protocol.egress import SessionAck, SessionEvent
from cluster.protocol.enums import EventCode, Role
from cluster.protocol.ingress import (
    SessionCloseRequest,
    SessionKeepAlive,
    SessionMessageHeader,
)


def header(sid: int, sequence: int, term: int = TERM) -> SessionMessageHeader:
    return SessionMessageHeader(term, sid, 0, f"m{sequence}".encode(), sequence)


def acks(node: Node, sid: int) -> list[SessionAck]:
    return [c[2] for c in node.egress.calls if c[0] == "send" and isinstance(c[2], SessionAck)]


def applied_payloads(node: Node, sid: int) -> list[bytes]:
    return [e[3] for e in node.service.events if e[0] == "message" and e[1] == sid]


def test_the_leader_appends_only_the_sessions_next() -> None:
    node = Node()
    sid = node.open()
    cm = node.cm
    # the hot path: in order, one compare each
    cm.on_batch([node.source, header(sid, 1), header(sid, 2)], node.now)
    assert cm.sessions[sid].last_sequence == 2
    # a resend of what the log holds: dropped, counted, nothing said
    cm.on_batch([node.source, header(sid, 2), header(sid, 1)], node.now)
    assert cm.counters.duplicate_messages == 2
    assert not acks(node, sid)
    # a gap (3 lost on the way): dropped, and the client asked for what follows 2, once
    cm.on_batch([node.source, header(sid, 4), header(sid, 5)], node.now)
    assert cm.counters.sequence_gaps == 2
    (ask,) = acks(node, sid)
    assert (ask.resend, ask.logged, ask.applied) == (True, 2, 0)
    # the resend: 3, 4, 5 in order
    cm.on_batch([node.source, header(sid, 3), header(sid, 4), header(sid, 5)], node.now)
    node.apply_all()
    assert applied_payloads(node, sid) == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    # the replies tell the client what was applied: it forgets those
    replies = [m for s, m in node.egress.replies() if s == sid]
    assert [r.sequence for r in replies] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_a_gap_still_there_later_is_told_again() -> None:
    node = Node()
    sid = node.open()
    cm = node.cm
    cm.on_batch([node.source, header(sid, 2)], node.now)
    cm.on_batch([node.source, header(sid, 3)], node.now + RESEND_AGAIN_NS - 1)
    assert len(acks(node, sid)) == 1
    cm.on_batch([node.source, header(sid, 4)], node.now + RESEND_AGAIN_NS)
    assert len(acks(node, sid)) == 2  # the first word (or the resend) was lost


def test_a_keepalive_beyond_the_log_asks_for_the_rest() -> None:
    """A client that went quiet after its last messages were dropped (a hand-over that
    did not happen) is not left waiting: its keepalive says how far it sent."""
    node = Node()
    sid = node.open()
    node.cm.on_batch([node.source, header(sid, 1)], node.now)
    node.cm.on_batch([node.source, SessionKeepAlive(TERM, sid, 1)], node.now)
    assert not acks(node, sid)
    node.cm.on_batch([node.source, SessionKeepAlive(TERM, sid, 3)], node.now)
    (ask,) = acks(node, sid)
    assert (ask.resend, ask.logged) == (True, 1)


def test_unsequenced_messages_are_appended_as_they_come() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"old")
    node.send(sid, b"old")
    node.apply_all()
    assert applied_payloads(node, sid) == [b"old", b"old"]


def test_an_application_without_replies_hears_what_was_applied() -> None:
    node = Node()
    sid = node.open()
    node.service.on_session_message = lambda session, timestamp, payload: None  # type: ignore[method-assign]
    node.cm.on_batch([node.source, header(sid, 1), header(sid, 2)], node.now)
    node.apply_all()
    node.tick()
    (ack,) = acks(node, sid)
    assert (ack.applied, ack.logged, ack.resend) == (2, 2, False)
    node.tick()
    assert len(acks(node, sid)) == 1  # told once


def test_a_new_leader_knows_each_sessions_last_sequence() -> None:
    leader = Node()
    sid = leader.open()
    leader.cm.on_batch([leader.source, header(sid, 1), header(sid, 2)], leader.now)
    log = leader.log_bytes()
    follower = Node(Role.FOLLOWER)
    follower.container.apply(log, 0, mirror_into_consensus=True)
    assert follower.container.sessions[sid].applied_sequence == 2
    # the follower leads: ready once its term's first entry is applied
    cm = follower.cm
    cm.restore(len(log))
    cm.become_leader(TERM + 1, follower.now)
    batch = cm.take_log_batch()
    assert batch is not None
    start, data = batch
    cm.on_archive_position(start + len(data), follower.now)
    follower.container.apply(data, start)
    cm.on_applied(start + len(data))
    cm.consensus_work(follower.now)
    assert cm.is_ready_leader
    assert cm.sessions[sid].last_sequence == 2
    # its client resumes there: what it sends again of the log's is dropped
    cm.sessions[sid].source = follower.source
    batch = [follower.source, header(sid, 2, TERM + 1), header(sid, 3, TERM + 1)]
    cm.on_batch(batch, follower.now)
    assert cm.counters.duplicate_messages == 1
    assert cm.sessions[sid].last_sequence == 3


def test_a_snapshot_keeps_the_last_sequence_applied() -> None:
    leader = Node()
    sid = leader.open()
    leader.cm.on_batch([leader.source, header(sid, 1), header(sid, 2)], leader.now)
    leader.apply_all()
    records = take_snapshot(leader.cm, leader.container, leader.applied, TERM)
    restored = Node(Role.FOLLOWER)
    load_snapshot(parse_snapshot(records), restored.cm, restored.container, restored.now)
    assert restored.container.sessions[sid].applied_sequence == 2


def test_closed_says_the_last_applied_once_the_close_is_committed() -> None:
    node = Node()
    sid = node.open()
    node.cm.on_batch([node.source, header(sid, 1), header(sid, 2)], node.now)
    node.cm.session_manager.on_close_request(SessionCloseRequest(TERM, sid), node.source, node.now)
    assert not [e for e in node.egress.session_events() if e.code is EventCode.CLOSED]
    node.apply_all()  # committed (a cluster of one) and applied
    (closed,) = [e for e in node.egress.session_events() if e.code is EventCode.CLOSED]
    assert isinstance(closed, SessionEvent)
    assert closed.last_applied == 2
    assert applied_payloads(node, sid) == [b"m1", b"m2"]


def test_hostile_sequences_from_the_session_s_own_connection_change_nothing() -> None:
    """A client that sends a negative sequence, or the largest an Int64 holds, gets
    nothing appended and the session goes on from where its log stands."""
    node = Node()
    sid = node.open()
    cm = node.cm
    cm.on_batch([node.source, header(sid, 1)], node.now)
    before = cm.log.published_position
    cm.on_batch([node.source, header(sid, -5), header(sid, 2**63 - 1)], node.now)
    assert cm.log.published_position == before  # neither reached the log
    assert cm.sessions[sid].last_sequence == 1
    assert cm.counters.duplicate_messages == 1  # the negative one: below the log's last
    assert cm.counters.sequence_gaps == 1  # the huge one: the client is asked to resend
    cm.on_batch([node.source, header(sid, 2)], node.now)
    node.apply_all()
    assert applied_payloads(node, sid) == [b"m1", b"m2"]
