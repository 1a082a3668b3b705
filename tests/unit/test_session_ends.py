"""How a session's client learns what became of its session (issue 32): the old
connection of a session resumed elsewhere hears CLOSED; a resume after the session was
closed hears its reason; SHUTDOWN and ABORT tell every session before the cluster stops;
a leader that stalled does not blame its clients.  (Replies given while a client was away
are kept and sent once it is back: ``test_exactly_once_out.py``.)"""

from __future__ import annotations

from test_consensus import (
    CLIENT,
    MS,
    SECOND,
    T0,
    TERM,
    LogReader,
    RecordingEgress,
    commit_all,
    make,
)

from cluster.core.base import IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.core.resumption import MAX_CLOSED_REMEMBERED, MOVED
from cluster.core.session import State
from cluster.protocol import version as pv
from cluster.protocol.egress import SessionEvent
from cluster.protocol.enums import CloseReason, EventCode
from cluster.protocol.ingress import (
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionResumeRequest,
)
from cluster.protocol.log import SessionCloseEvent

OTHER = IngressSource(2, "127.0.0.1")


def own_session(cm: ConsensusModule, reader: LogReader, now: int) -> tuple[int, bytes]:
    """A session on its own connection (CLIENT); returns its id and secret."""
    egress: RecordingEgress = cm.egress  # type: ignore[assignment]
    sid = cm.session_manager.next_session_id
    cm.on_message(CLIENT, now)
    cm.on_message(SessionConnectRequest(50, 7, pv.PROTOCOL_VERSION, "", b""), now)
    cm.on_slow_tick(now + MS)
    commit_all(cm, reader)
    (ok,) = [e for e in egress.events(sid) if e.code is EventCode.OK]
    return sid, ok.session_secret


def resume(cm: ConsensusModule, source: IngressSource, sid: int, secret: bytes, now: int) -> None:
    cm.on_message(source, now)
    cm.on_message(SessionResumeRequest(9, sid, pv.PROTOCOL_VERSION, secret), now)


def replies_on(egress: RecordingEgress, source: IngressSource) -> list[SessionEvent]:
    return [c[2] for c in egress.calls if c[0] == "reply" and c[1] is source]


def test_the_old_connection_hears_closed_when_its_session_is_resumed_elsewhere() -> None:
    cm, egress, reader = make()
    sid, secret = own_session(cm, reader, T0)
    resume(cm, OTHER, sid, secret, T0 + SECOND)
    (moved,) = [e for e in replies_on(egress, CLIENT) if e.code is EventCode.CLOSED]
    assert moved.cluster_session_id == sid
    assert moved.detail == MOVED
    assert cm.sessions[sid].source is OTHER  # the session lives on, on the new one
    assert cm.sessions[sid].state is State.OPEN
    # an old connection already closed (the client left it) is not written to
    OTHER.closed = True
    third = IngressSource(3, "127.0.0.1")
    resume(cm, third, sid, secret, T0 + 2 * SECOND)
    assert not [e for e in replies_on(egress, OTHER) if e.code is EventCode.CLOSED]
    assert cm.sessions[sid].source is third


def test_a_resume_after_the_session_was_closed_hears_the_reason() -> None:
    cm, egress, reader = make()
    sid, secret = own_session(cm, reader, T0)
    cm.session_manager.on_source_closed(CLIENT)  # the client went away
    CLIENT.closed = False  # (the harness reuses the object)
    cm.on_slow_tick(T0 + 11 * SECOND)  # past the 10 s session timeout
    assert sid not in cm.sessions
    comeback = IngressSource(4, "127.0.0.1")
    resume(cm, comeback, sid, secret, T0 + 12 * SECOND)
    (closed,) = [e for e in replies_on(egress, comeback) if e.cluster_session_id == sid]
    assert closed.code is EventCode.CLOSED
    assert closed.detail == "TIMEOUT"
    # only the holder of the secret learns it
    stranger = IngressSource(5, "127.0.0.9")
    resume(cm, stranger, sid, b"x" * 16, T0 + 12 * SECOND)
    (told,) = replies_on(egress, stranger)
    assert told.detail == "no such open session"


def test_a_follower_remembers_close_reasons_from_the_log_for_when_it_leads() -> None:
    cm, _egress, reader = make()
    sid, _secret = own_session(cm, reader, T0)
    cm.session_manager.mirror(SessionCloseEvent(TERM, sid, T0, CloseReason.SERVICE_ACTION), 0, T0)
    resumption = cm.session_manager.resumption
    assert resumption.closed_reasons[sid][0] is CloseReason.SERVICE_ACTION
    # and forgets the oldest beyond the bound
    for other in range(MAX_CLOSED_REMEMBERED):
        resumption.remember_closed(10_000 + other, CloseReason.TIMEOUT, b"")
    assert sid not in resumption.closed_reasons
    assert len(resumption.closed_reasons) == MAX_CLOSED_REMEMBERED


def test_a_client_close_is_remembered_too() -> None:
    cm, _egress, reader = make()
    sid, _secret = own_session(cm, reader, T0)
    cm.on_message(CLIENT, T0 + SECOND)
    cm.on_message(SessionCloseRequest(TERM, sid), T0 + SECOND)
    assert cm.session_manager.resumption.closed_reasons[sid][0] is CloseReason.CLIENT_ACTION


def test_shutdown_and_abort_tell_every_session_before_the_cluster_stops() -> None:
    for reason in (CloseReason.SHUTDOWN, CloseReason.ABORT):
        cm, egress, reader = make()
        sid, _secret = own_session(cm, reader, T0)
        cm.control.leave(reason=reason)
        (closed,) = [e for e in egress.events(sid) if e.code is EventCode.CLOSED]
        assert closed.detail == reason.name
        cm.control.leave(reason=reason)  # told once
        assert len([e for e in egress.events(sid) if e.code is EventCode.CLOSED]) == 1
        # and a resume after the restart's timeout would hear it too
        assert cm.session_manager.resumption.closed_reasons[sid][0] is reason


def test_a_follower_tells_nobody_when_the_cluster_stops() -> None:
    cm, egress, _reader = make(member_count=3)
    cm.on_message(CLIENT, T0)
    cm.enter_election(T0, "test")
    cm.control.leave(reason=CloseReason.SHUTDOWN)
    assert not [m for m in egress.messages() if isinstance(m, SessionEvent)]


def test_a_member_that_stalled_does_not_time_out_its_sessions_for_it() -> None:
    """The shell saw its slow tick come 9.5 s late (the process was stopped): the
    session's client, quiet since 2 s, is not blamed for those 9.5 s."""
    cm, _egress, reader = make()
    sid, _secret = own_session(cm, reader, T0)
    cm.session_manager.on_keepalive(SessionKeepAlive(TERM, sid), CLIENT, T0 + 2 * SECOND)
    cm.on_slow_tick(T0 + 3 * SECOND)
    resumed = T0 + 12_500 * MS  # stopped from 3 s to 12.5 s
    cm.session_manager.forgive_stall(9_500 * MS)
    cm.on_slow_tick(resumed)
    assert sid in cm.sessions
    assert cm.counters.leader_stalls == 1
    # a client that is really gone still times out: 10 s after its last sign (at
    # 2 s), the 9.5 s stall not counted, so at 21.5 s of the leader's clock
    cm.on_slow_tick(T0 + 21_400 * MS)
    assert sid in cm.sessions
    cm.on_slow_tick(T0 + 21_600 * MS)
    assert sid not in cm.sessions


def test_without_a_stall_the_timeout_is_as_before() -> None:
    cm, _egress, reader = make()
    sid, _secret = own_session(cm, reader, T0)
    cm.on_slow_tick(T0 + 10 * SECOND)
    assert sid in cm.sessions
    cm.on_slow_tick(T0 + 10_100 * MS)
    assert sid not in cm.sessions
    assert cm.counters.leader_stalls == 0


def test_stalls_and_dropped_replies_are_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cluster.agents.exporter import StatusCollector
    from cluster.protocol.admin import MemberStatus

    status = MemberStatus(member_id=1, counters={"leader_stalls": 2, "replies_dropped": 7})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    assert 'triarch_leader_stalls_total{member="1"} 2.0' in text
    assert 'triarch_replies_dropped_total{member="1"} 7.0' in text
