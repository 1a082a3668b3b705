"""Exactly once out (issue 42): every member keeps a session's replies, numbered, until
its client confirms them; a new leader sends what the client lacks.  The core, with no
I/O (the client's side: ``test_client_replies.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_exactly_once_core import header
from test_service_container import TERM, Node

from cluster.core.base import IngressSource
from cluster.core.replies import REPLY_OVERHEAD, KeptReplies
from cluster.core.snapshot import load_snapshot, parse_snapshot, take_snapshot
from cluster.protocol.egress import NewLeaderEvent, SessionAck
from cluster.protocol.enums import EventCode, Role
from cluster.protocol.ingress import SessionMessageHeader, SessionResumeRequest
from cluster.protocol.version import PROTOCOL_VERSION
from cluster.status import session_statuses


def reply(number: int, payload: bytes = b"r") -> SessionMessageHeader:
    return SessionMessageHeader(TERM, 7, 0, payload, 0, number)


# ---------------------------------------------------------------------- KeptReplies

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("keep"), st.binary(max_size=40)),
        st.tuples(st.just("confirm"), st.integers(-3, 60)),
        st.tuples(st.just("restart"), st.integers(-3, 60)),
        st.tuples(st.just("send"), st.integers(0, 5)),
    ),
    max_size=80,
)


@given(STEPS, st.integers(1, 400))
def test_kept_replies_stay_numbered_bounded_and_after_the_confirmed(
    steps: list[tuple[str, object]], limit: int
) -> None:
    kept = KeptReplies(limit)
    for op, arg in steps:
        if op == "keep":
            assert isinstance(arg, bytes)
            kept.keep(reply(kept.last + 1, arg))
        elif op == "confirm":
            assert isinstance(arg, int)
            kept.confirm(arg)
        elif op == "restart":
            assert isinstance(arg, int)
            kept.restart(arg)
        else:
            assert isinstance(arg, int)
            for r in list(kept.unsent())[:arg]:
                kept.sent = r.reply
        numbers = [r.reply for r in kept.kept]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) if numbers else True
        assert all(n > kept.confirmed for n in numbers)
        assert not numbers or numbers[-1] == kept.last
        assert 0 <= kept.confirmed <= kept.last
        assert kept.size == sum(len(r.payload) + REPLY_OVERHEAD for r in kept.kept)
        assert kept.size <= limit or len(kept.kept) == 1  # the newest always stays
        unsent = [r.reply for r in kept.unsent()]
        assert unsent == [n for n in numbers if n > kept.sent]
        assert kept.sent >= kept.confirmed


def test_the_oldest_go_past_the_bound_and_a_leader_counts_what_it_never_sent() -> None:
    kept = KeptReplies(3 * (REPLY_OVERHEAD + 1))
    for n in range(1, 6):
        kept.keep(reply(n))
    assert [r.reply for r in kept.kept] == [3, 4, 5]
    node = Node()
    sid = node.open()
    node.egress.accept = False  # no room: nothing goes, all kept
    node.container.max_kept_replies = 0
    node.apply_all()
    session = node.container.sessions[sid]
    session.replies.limit = 2 * (REPLY_OVERHEAD + 2)
    for _ in range(5):
        session.offer(b"xy")
    assert [r.reply for r in session.replies.kept] == [4, 5]
    assert node.cm.counters.replies_dropped == 3  # never sent, now gone


# ---------------------------------------------------------------------- a new leader


def follower_that_leads(log: bytes) -> Node:
    """A member that applied ``log`` as a follower, then won an election."""
    follower = Node(Role.FOLLOWER)
    follower.container.apply(log, 0, mirror_into_consensus=True)
    cm = follower.cm
    cm.restore(len(log))
    cm.become_leader(TERM + 1, follower.now)
    batch = cm.take_log_batch()
    assert batch is not None
    start, data = batch
    cm.on_archive_position(start + len(data), follower.now)
    follower.container.apply(data, start)
    cm.on_applied(start + len(data), follower.now)
    cm.consensus_work(follower.now)
    assert cm.is_ready_leader
    return follower


def test_a_new_leader_sends_the_replies_its_client_did_not_confirm_after_its_word() -> None:
    leader = Node()
    sid = leader.open()
    leader.cm.on_batch([leader.source, header(sid, 1)], leader.now)
    log = leader.log_bytes()  # the leader dies before applying it: no reply was sent
    new = follower_that_leads(log)
    new.cm.sessions[sid].source = new.source  # its client resumed here
    new.cm.session_manager.on_egress_connected(sid)
    new.egress.calls.clear()
    new.tick()
    sent = [c[2] for c in new.egress.calls if c[0] == "send" and c[1] == sid]
    kinds = [type(m) for m in sent]
    assert kinds[:2] == [NewLeaderEvent, SessionAck]
    assert [(m.reply, m.payload) for m in sent if type(m) is SessionMessageHeader] == [
        (1, b"re:m1"),
        (2, b"again:m1"),
    ]
    new.egress.calls.clear()
    new.tick()  # sent once
    assert not [c for c in new.egress.calls if type(c[-1]) is SessionMessageHeader]


def test_a_resume_gets_only_what_follows_the_last_reply_it_received() -> None:
    node = Node()
    sid = node.open()
    node.cm.on_batch([node.source, header(sid, 1), header(sid, 2)], node.now)
    node.apply_all()
    (ok,) = [e for e in node.egress.session_events() if e.code is EventCode.OK]
    assert [r.reply for r in node.container.sessions[sid].replies.kept] == [1, 2, 3, 4]
    # the client lost its connection having received replies 1 and 2; it resumes
    node.cm.session_manager.on_source_closed(node.source)
    node.egress.calls.clear()
    back = IngressSource(2, "127.0.0.1")
    node.cm.on_message(back, node.now)
    node.cm.on_message(
        SessionResumeRequest(9, sid, PROTOCOL_VERSION, ok.session_secret, 2), node.now
    )
    node.tick()
    assert [r.reply for _, r in node.egress.replies()] == [3, 4]


def test_a_snapshot_keeps_the_replies_and_a_member_restored_from_it_sends_them() -> None:
    leader = Node()
    sid = leader.open()
    leader.cm.on_batch([leader.source, header(sid, 1)], leader.now)
    leader.apply_all()
    kept = leader.container.sessions[sid].replies
    assert (kept.last, [r.reply for r in kept.kept]) == (2, [1, 2])
    records = take_snapshot(leader.cm, leader.container, leader.applied, TERM)
    restored = Node(Role.FOLLOWER)
    load_snapshot(parse_snapshot(records), restored.cm, restored.container, restored.now)
    again = restored.container.sessions[sid].replies
    assert (again.last, again.confirmed) == (2, 0)
    assert [(r.reply, r.payload) for r in again.kept] == [(1, b"re:m1"), (2, b"again:m1")]
    # and it numbers on from there, as every other member does
    session = restored.container.sessions[sid]
    session.offer(b"next")
    assert session.replies.last == 3


def test_an_operator_sees_each_sessions_replies_in_its_status() -> None:
    node = Node()
    sid = node.open()
    node.cm.on_batch([node.source, header(sid, 1)], node.now)
    node.apply_all()
    (status,) = session_statuses(node.cm, node.now)
    assert (status.applied_sequence, status.last_reply, status.kept_replies) == (1, 2, 2)
    assert status.kept_reply_bytes == node.container.sessions[sid].replies.size > 0
