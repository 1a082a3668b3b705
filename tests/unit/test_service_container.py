"""ServiceContainer: committed log -> ClusteredService callbacks, egress replies (seed 002)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from cluster.archive.record import RECORD_HEADER_LENGTH, RecordError, encode_record, iter_records
from cluster.core.base import ConsensusConfig, IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.core.service_container import ServiceContainer
from cluster.core.session import State
from cluster.protocol import LOG, ProtocolError, encode
from cluster.protocol import version as pv
from cluster.protocol.egress import SessionEvent
from cluster.protocol.enums import CloseReason, EventCode, Role
from cluster.protocol.ingress import (
    SessionCloseRequest,
    SessionConnectRequest,
    SessionMessageHeader,
)
from cluster.protocol.log import NewLeadershipTermEvent, SessionCloseEvent, SessionOpenEvent
from cluster.service import ClientSession, Cluster, ClusteredService

MS = 1_000_000
SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
TERM = 5
CHANNEL = "127.0.0.1:30000"


@dataclass
class RecordingEgress:
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    accept: bool = True

    def connect(self, egress_id: int, channel: str) -> None:
        self.calls.append(("connect", egress_id, channel))

    def send(self, egress_id: int, message: Any) -> bool:
        self.calls.append(("send", egress_id, message))
        return self.accept

    def close(self, egress_id: int) -> None:
        self.calls.append(("close", egress_id))

    def attach(self, egress_id: int, source: IngressSource) -> None:
        self.calls.append(("attach", egress_id, source))

    def reply(self, source: IngressSource, message: Any) -> bool:
        self.calls.append(("send", message.cluster_session_id, message))
        return self.accept

    def replies(self) -> list[tuple[int, SessionMessageHeader]]:
        return [
            (c[1], c[2])
            for c in self.calls
            if c[0] == "send" and isinstance(c[2], SessionMessageHeader)
        ]

    def session_events(self) -> list[SessionEvent]:
        return [c[2] for c in self.calls if c[0] == "send" and isinstance(c[2], SessionEvent)]


class RecordingService(ClusteredService):
    """Records every callback; echoes messages; obeys a few payload commands."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.cluster: Cluster | None = None
        self.offers: list[bool] = []

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster
        self.events.append(("start", snapshot))

    def on_take_snapshot(self) -> bytes:
        return b""  # the recorded events are the test's, not state to recover

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        assert self.cluster is not None
        assert self.cluster.time == timestamp
        self.events.append(("open", session.id, timestamp, session.response_channel))

    def on_session_close(
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        self.events.append(("close", session.id, timestamp, close_reason))
        self.offers.append(session.offer(b"too late"))

    def on_session_message(self, session: ClientSession, timestamp: int, payload: bytes) -> None:
        assert self.cluster is not None
        assert self.cluster.time == timestamp
        self.events.append(("message", session.id, timestamp, payload))
        if payload == b"close me":
            assert session.close()
            assert session.is_closing
            assert not session.close()  # idempotent
        elif payload.startswith(b"timer "):
            self.cluster.schedule_timer(int(payload[6:]), timestamp)
        else:
            self.offers.append(session.offer(b"re:" + payload))
            self.offers.append(session.offer(b"again:" + payload))

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        self.events.append(("timer", correlation_id, timestamp))

    def on_role_change(self, new_role: Role) -> None:
        self.events.append(("role", new_role))

    def on_new_leadership_term_event(self, event: NewLeadershipTermEvent) -> None:
        self.events.append(("term", event.leadership_term_id))


class Node:
    """A single member: real consensus module + container, a fake clock and egress."""

    def __init__(self, role: Role = Role.LEADER) -> None:
        self.now = T0
        self.egress = RecordingEgress()
        self.source = IngressSource(1, "127.0.0.1")
        # session secrets from a seed: two runs of the same inputs send the same bytes
        self.cm = ConsensusModule(ConsensusConfig(), self.egress, token=random.Random(7).randbytes)
        self.service = RecordingService()
        self.container = ServiceContainer(
            self.service, self.cm, self.egress, member_id=0, clock_ns=lambda: self.now
        )
        self.container.start(None)
        self.applied = 0
        if role is Role.LEADER:
            self.cm.become_leader(TERM, self.now)
            # complete the election: the term's first entry durable, committed, applied
            end = self.cm.log.published_position
            self.cm.on_archive_position(end, self.now)
            self.cm.on_applied(end)
            self.cm.consensus_work(self.now)
            assert self.cm.is_ready_leader
        self.container.set_role(role)

    def tick(self, dt: int = 10 * MS) -> None:
        self.now += dt
        self.cm.consensus_work(self.now)
        self.cm.on_slow_tick(self.now)

    def open(self, correlation_id: int = 1) -> int:
        sid = self.cm.session_manager.next_session_id
        self.cm.on_message(self.source, self.now)  # the client's connection
        self.cm.on_message(
            SessionConnectRequest(correlation_id, 3, pv.PROTOCOL_VERSION, CHANNEL), self.now
        )
        self.cm.session_manager.on_egress_connected(sid)
        self.tick()
        assert self.cm.sessions[sid].state is State.OPEN
        return sid

    def send(self, sid: int, payload: bytes, dt: int = MS, reply: int = 0) -> None:
        """A message of session ``sid`` (unsequenced), saying its client received the
        replies up to ``reply``."""
        self.now += dt
        assert self.cm.on_ingress_message(
            SessionMessageHeader(TERM, sid, 0, payload, 0, reply), self.now
        )

    def log_bytes(self) -> bytes:
        batch = self.cm.take_log_batch()
        if batch is None:
            return b""
        start, data = batch
        assert start == self.applied
        return bytes(data)

    def apply_all(self) -> list[Any]:
        """Commit and apply everything published so far; return the applied messages."""
        applied: list[Any] = []
        while True:
            data = self.log_bytes()
            if not data:
                return applied
            self.cm.on_archive_position(self.applied + len(data))
            consumed = self.container.apply(data, self.applied)
            assert consumed == len(data)
            applied.extend(LOG.decode(body) for _, body in iter_records(data))
            self.applied += consumed


# ---------------------------------------------------------------------- tests


def test_callbacks_in_log_order() -> None:
    node = Node()
    a = node.open(1)
    b = node.open(2)
    node.send(a, b"a1")
    node.send(b, b"b1")
    node.send(a, b"a2")
    node.cm.timers.schedule(77, node.cm.log.timestamp)
    node.tick()
    node.cm.session_manager.on_close_request(SessionCloseRequest(TERM, a), node.source, node.now)
    applied = node.apply_all()

    # the callbacks follow the log exactly
    expected: list[tuple[Any, ...]] = []
    for m in applied:
        kind = type(m).__name__
        if kind == "NewLeadershipTermEvent":
            expected.append(("term", m.leadership_term_id))
        elif kind == "SessionOpenEvent":
            expected.append(("open", m.cluster_session_id, m.timestamp, CHANNEL))
        elif kind == "SessionMessageHeader":
            expected.append(("message", m.cluster_session_id, m.timestamp, m.payload))
        elif kind == "TimerEvent":
            expected.append(("timer", m.correlation_id, m.timestamp))
        elif kind == "SessionCloseEvent":
            expected.append(("close", m.cluster_session_id, m.timestamp, m.close_reason))
    events = node.service.events
    assert events[:2] == [("start", None), ("role", Role.LEADER)]
    assert events[2:] == expected
    assert [e[0] for e in expected] == [
        "term",
        "open",
        "open",
        "message",
        "message",
        "message",
        "timer",
        "close",
    ]
    assert expected[-1][3] is CloseReason.CLIENT_ACTION
    assert node.container.log_position == node.applied == node.cm.log.published_position
    assert node.container.applied_messages == 3
    assert node.container.leadership_term_id == TERM
    assert set(node.container.sessions) == {b}
    assert node.service.offers[-1] is False  # offer during on_session_close: closed


def test_replies_carry_the_log_entry_timestamp_and_go_to_egress() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"x", dt=7 * MS)
    node.send(sid, b"y", dt=13 * MS)
    stamps = [
        m.timestamp
        for m in (LOG.decode(body) for _, body in iter_records(node.cm.log.buffer))
        if isinstance(m, SessionMessageHeader)
    ]
    assert stamps[0] < stamps[1]
    node.now += 5 * SECOND  # processing happens later: the replies must not see this
    node.apply_all()
    replies = node.egress.replies()
    assert [(eid, r.payload) for eid, r in replies] == [
        (sid, b"re:x"),
        (sid, b"again:x"),
        (sid, b"re:y"),
        (sid, b"again:y"),
    ]
    assert [r.timestamp for _, r in replies] == [stamps[0], stamps[0], stamps[1], stamps[1]]
    for _, r in replies:
        assert r.cluster_session_id == sid
        assert r.leadership_term_id == TERM
    assert all(node.service.offers)


def test_offers_that_find_no_room_are_kept_numbered_and_sent_later() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"x")
    node.egress.accept = False
    node.apply_all()
    assert node.service.offers == [True, True]  # kept (exactly once out): not refused
    session = node.container.sessions[sid]
    assert [r.reply for r in session.replies.kept] == [1, 2]
    assert session.replies.sent == 0
    node.egress.accept = True
    cm_session = node.cm.sessions[sid]
    cm_session.egress_connected = True
    assert node.cm.session_manager.notify.replies(cm_session, session.replies) == 2
    assert [(r.reply, r.payload) for _, r in node.egress.replies()[-2:]] == [
        (1, b"re:x"),
        (2, b"again:x"),
    ]
    assert node.cm.session_manager.notify.replies(cm_session, session.replies) == 0


def test_a_follower_keeps_the_replies_the_leader_gives_numbered_alike() -> None:
    leader = Node()
    sid = leader.open()
    leader.send(sid, b"hello")
    data = leader.log_bytes()

    follower = Node(role=Role.FOLLOWER)
    assert follower.container.role is Role.FOLLOWER
    consumed = follower.container.apply(data, 0, mirror_into_consensus=True)
    assert consumed == len(data)
    assert follower.service.offers == [True, True]
    assert follower.egress.calls == []  # followers send nothing (seed 002)...
    kept = follower.container.sessions[sid].replies.kept
    leader.container.apply(data, 0)
    # ...but keep what the leader sent, numbered alike (exactly once out)
    assert [(r.reply, r.payload) for r in kept] == [
        (r.reply, r.payload) for _, r in leader.egress.replies()
    ]
    assert [r.reply for r in kept] == [1, 2]
    assert [e[0] for e in follower.service.events] == ["start", "term", "open", "message"]
    # the follower's consensus module mirrored the session (seed 000)
    assert follower.cm.sessions[sid].state is State.OPEN
    assert follower.cm.leadership_term_id == TERM

    # once it leads, the very same service code's replies go, after the kept ones
    follower.container.set_role(Role.LEADER)
    assert follower.service.events[-1] == ("role", Role.LEADER)
    session = follower.container.get_client_session(sid)
    assert session is not None
    assert session.offer(b"now real")
    replies = follower.container.sessions[sid].replies
    replies.restart()  # a new leader: the client lacks what it has not confirmed
    cm_session = follower.cm.sessions[sid]
    cm_session.egress_connected = True
    follower.cm.session_manager.notify.replies(cm_session, replies)
    assert [(r.reply, r.payload) for _, r in follower.egress.replies()] == [
        (1, b"re:hello"),
        (2, b"again:hello"),
        (3, b"now real"),
    ]


def test_a_reply_given_while_the_egress_is_dialled_again_goes_after_those_lost() -> None:
    """Was (sim seed 1022): replies sent on a dialled egress that then broke were lost
    with it; the next reply, given while the leader dialled the client again, followed
    the last one sent and so was queued at once for the new connection: it reached the
    client before the lost ones went again (a gap, then those dropped as duplicates)."""
    node = Node()
    sid = node.open()
    node.send(sid, b"a")
    node.apply_all()
    assert [r.reply for _, r in node.egress.replies()] == [1, 2]
    node.cm.session_manager.on_egress_failed(sid)  # 1 and 2 were lost with it
    node.send(sid, b"b")
    node.apply_all()  # 3 and 4 given while the client is dialled again
    assert [r.reply for _, r in node.egress.replies()] == [1, 2]
    node.tick()
    assert ("connect", sid, CHANNEL) in node.egress.calls
    node.cm.session_manager.on_egress_connected(sid)
    node.tick()  # what the client has not confirmed goes again, in order
    assert [r.reply for _, r in node.egress.replies()] == [1, 2, 1, 2, 3, 4]


def test_a_reply_given_outside_the_log_is_not_numbered_nor_kept() -> None:
    node = Node()
    sid = node.open()
    node.apply_all()
    session = node.container.sessions[sid]
    node.container.outside_log = True  # as in on_role_change
    assert session.offer(b"hello, leader here")
    node.container.outside_log = False
    ((_, reply),) = node.egress.replies()
    assert reply.reply == 0
    assert not session.replies.kept


def test_the_client_confirms_replies_in_its_messages_and_every_member_forgets_them() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"a")
    node.apply_all()
    replies = node.container.sessions[sid].replies
    assert [r.reply for r in replies.kept] == [1, 2]
    node.send(sid, b"b", reply=1)  # it received reply 1
    node.apply_all()
    assert [r.reply for r in replies.kept] == [2, 3, 4]
    assert replies.confirmed == 1
    node.send(sid, b"c", reply=99)  # a claim past the last: confirms what there is
    node.apply_all()
    assert replies.confirmed == 4
    assert [r.reply for r in replies.kept] == [5, 6]


def test_set_role_only_notifies_on_change() -> None:
    node = Node(role=Role.FOLLOWER)
    node.container.set_role(Role.FOLLOWER)
    assert [e for e in node.service.events if e[0] == "role"] == []
    node.container.set_role(Role.LEADER)
    node.container.set_role(Role.LEADER)
    assert [e for e in node.service.events if e[0] == "role"] == [("role", Role.LEADER)]


@pytest.mark.parametrize("cut", [1, RECORD_HEADER_LENGTH - 1, RECORD_HEADER_LENGTH, 3])
def test_partial_record_consumes_only_whole_records(cut: int) -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"one")
    node.send(sid, b"two-two")
    data = node.log_bytes()
    records = list(iter_records(data))
    last_offset, last_body = records[-1]
    assert last_offset + RECORD_HEADER_LENGTH + len(last_body) == len(data)
    # cut inside the last record (header or body)
    partial = data[: last_offset + min(cut, RECORD_HEADER_LENGTH + len(last_body) - 1)]
    consumed = node.container.apply(partial, 0)
    assert consumed == last_offset
    assert node.container.log_position == last_offset
    assert [e[3] for e in node.service.events if e[0] == "message"] == [b"one"]
    # the rest arrives: resume exactly where it stopped
    rest = data[consumed:]
    assert node.container.apply(rest, consumed) == len(rest)
    assert [e[3] for e in node.service.events if e[0] == "message"] == [b"one", b"two-two"]
    assert node.container.log_position == len(data)


def test_apply_of_nothing_or_a_header_fragment_consumes_nothing() -> None:
    node = Node()
    assert node.container.apply(b"", 0) == 0
    assert node.container.apply(b"\x05\x00", 0) == 0
    assert node.service.events == [("start", None), ("role", Role.LEADER)]


def test_apply_positions_are_relative_to_base() -> None:
    node = Node()
    body = encode(SessionOpenEvent(TERM, 1, 9, 123, 3, CHANNEL))
    record = encode_record(body)
    base = 1_000
    assert node.container.apply(record, base) == len(record)
    assert node.container.log_position == base + len(record)
    assert node.container.time == 123
    assert node.service.events[-1] == ("open", 9, 123, CHANNEL)


def test_a_record_failing_its_crc_is_a_record_error_and_nothing_is_applied() -> None:
    """Unchecked records (recovery reads them from the archive) are checked before any is
    applied: a bad CRC is a RecordError at its offset, which recovery reports as
    corruption; checked records (the log in memory) are not checked again."""
    node = Node()
    good = encode_record(encode(SessionOpenEvent(TERM, 1, 9, 123, 3, CHANNEL)))
    bad = bytearray(encode_record(encode(SessionOpenEvent(TERM, 2, 10, 124, 3, CHANNEL))))
    bad[-1] ^= 0xFF
    before = list(node.service.events)
    with pytest.raises(RecordError) as info:
        node.container.apply(good + bytes(bad), 0)
    assert info.value.offset == len(good)
    assert "crc" in info.value.reason
    assert node.service.events == before
    assert node.container.apply(good, 0, checked=True) == len(good)
    assert node.service.events[-1] == ("open", 9, 123, CHANNEL)


def test_undecodable_record_raises_protocol_error() -> None:
    node = Node()
    with pytest.raises(ProtocolError):
        node.container.apply(encode_record(b"\xc1"), 0)


def test_session_close_reaches_consensus_as_service_action() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"close me")
    node.apply_all()  # the service closes the session while handling the message
    assert sid not in node.cm.sessions
    closed_events = [e for e in node.egress.session_events() if e.code is EventCode.CLOSED]
    assert [e.cluster_session_id for e in closed_events] == [sid]
    assert ("close", sid) in node.egress.calls
    # the SessionCloseEvent is on the log and reaches the service as SERVICE_ACTION
    closes = [e for e in node.service.events if e[0] == "close"]
    assert [(e[1], e[3]) for e in closes] == [(sid, CloseReason.SERVICE_ACTION)]
    assert sid not in node.container.sessions
    # the session object now refuses everything
    assert node.container.get_client_session(sid) is None
    assert not node.container.close_client_session(sid)


def test_close_client_session_through_cluster_handle() -> None:
    node = Node()
    sid = node.open()
    node.apply_all()
    cluster = node.service.cluster
    assert cluster is not None
    assert [s.id for s in cluster.client_sessions] == [sid]
    assert cluster.close_client_session(sid)
    applied = node.apply_all()
    assert [(type(m), m.close_reason) for m in applied] == [
        (SessionCloseEvent, CloseReason.SERVICE_ACTION)
    ]
    assert cluster.client_sessions == []
    assert not cluster.close_client_session(sid)
    assert not cluster.close_client_session(12345)


def test_timers_scheduled_by_service_fire_through_the_log() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"timer 42")
    node.apply_all()
    node.tick()  # consensus_work: the deadline (the message's time) has passed
    node.apply_all()
    assert next(e for e in node.service.events if e[0] == "timer")[1] == 42
    cluster = node.service.cluster
    assert cluster is not None
    assert cluster.schedule_timer(43, 0)
    assert cluster.cancel_timer(43)
    assert not cluster.cancel_timer(43)
    node.tick()
    node.apply_all()
    assert [e[1] for e in node.service.events if e[0] == "timer"] == [42]


def test_cluster_handle_exposes_log_state() -> None:
    node = Node()
    sid = node.open()
    node.apply_all()
    cluster = node.service.cluster
    assert cluster is not None
    assert cluster.member_id == 0
    assert cluster.role is Role.LEADER
    assert cluster.leadership_term_id == TERM
    assert cluster.log_position == node.applied
    session = cluster.get_client_session(sid)
    assert session is not None
    assert (session.id, session.response_stream_id, session.response_channel) == (sid, 3, CHANNEL)
    assert session.encoded_principal == b""
    assert not session.is_closing


def _scripted_run(node: Node, *, from_own_records: bool) -> None:
    """The same inputs each time; applied by decoding the log or from the leader's own
    records, in uneven chunks."""
    a = node.open(1)
    b = node.open(2)
    for i in range(40):
        node.send(a if i % 3 else b, b"m%d" % i)
        if i == 10:
            node.cm.timers.schedule(77, node.cm.log.timestamp)
            node.tick()
        if i % 7 == 0:
            node.tick()
    node.cm.session_manager.on_close_request(SessionCloseRequest(TERM, a), node.source, node.now)
    data = node.log_bytes()
    base = node.applied
    end = base + len(data)
    node.cm.on_archive_position(end)

    def apply(position: int, stop: int) -> int:
        if from_own_records:
            records = node.cm.log.take_own_records(position, stop)
            return node.container.apply_records(records, position)
        return node.container.apply(data[position - base : stop - base], position)

    position = base
    while position < end:
        # uneven chunks that cut records, as the log agent's are; a record longer than
        # the chunk is applied on its own (the log agent's second try)
        consumed = apply(position, min(end, position + 97)) or apply(position, end)
        assert consumed
        position += consumed
    node.applied = end


def test_leader_applies_its_own_records_exactly_as_decoding_them() -> None:
    decoded, own = Node(), Node()
    decoded.apply_all()
    own.cm.log.take_own_records(own.applied, own.applied)  # the term's first entry: applied
    own.apply_all()
    _scripted_run(decoded, from_own_records=False)
    _scripted_run(own, from_own_records=True)
    assert own.service.events == decoded.service.events
    assert own.egress.calls == decoded.egress.calls
    assert own.container.log_position == decoded.container.log_position
    assert own.container.applied_messages == decoded.container.applied_messages
    assert len(own.service.events) > 40
    assert not own.cm.log.own_records  # every record taken once


def test_own_records_start_where_asked_and_are_dropped_behind() -> None:
    node = Node()
    node.apply_all()
    sid = node.open()
    node.send(sid, b"x")
    node.send(sid, b"y")
    records = list(node.cm.log.own_records)
    assert [r[0] for r in records[1:]] == [r[1] for r in records[:-1]]  # contiguous
    start, end = records[-2][0], records[-1][1]
    assert node.cm.log.take_own_records(start, end - 1) == [records[-2]]  # whole records only
    assert node.cm.log.own_records[0] == records[-1]
    # asked from inside a record: nothing, and what lies before is dropped for good
    assert node.cm.log.take_own_records(records[-1][0] + 1, end) == []
    assert not node.cm.log.own_records


def test_own_records_forgotten_when_the_leader_steps_down() -> None:
    node = Node()
    sid = node.open()
    node.send(sid, b"x")
    assert node.cm.log.own_records
    node.cm.enter_election(node.now, "test")
    assert not node.cm.log.own_records
