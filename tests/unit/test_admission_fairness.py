"""Fair admission (issue 33, points 3 and 4), in virtual time.

* Pending slots are shared fairly between client addresses: when every one is taken, a
  request takes the place of the longest-waiting session of the address holding the
  most, if that holds more than the newcomer's.  A flood of connect requests that never
  answer their challenge, from a few addresses, keeps out nobody who comes from another
  (it used to: 14 rejections of 14 with the right secret).
* Open slots are given back by sessions whose connection dropped: when every slot is
  taken and a session needs one, the one without a connection longest (at least
  ``resume_grace_ns``) is closed (TIMEOUT, on the log).  It can be resumed until then,
  and a session whose client is connected is never closed for another.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_consensus import (
    MS,
    SECOND,
    T0,
    ChallengeAuthenticator,
    LogReader,
    RecordingEgress,
    commit_all,
    make,
)

from cluster.core.base import IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.core.session import State, address_key
from cluster.protocol import version as pv
from cluster.protocol.egress import Challenge, SessionEvent
from cluster.protocol.enums import CloseReason, EventCode
from cluster.protocol.ingress import (
    ChallengeResponse,
    SessionConnectRequest,
    SessionResumeRequest,
)
from cluster.protocol.log import SessionCloseEvent

GRACE = 250 * MS


class Conn:
    """Connections from one address, numbered for the test."""

    next_id = 1000

    @classmethod
    def make(cls, address: str) -> IngressSource:
        cls.next_id += 1
        return IngressSource(cls.next_id, address)


def request(cm: ConsensusModule, source: IngressSource, now: int, correlation_id: int = 7) -> int:
    """A connect request (egress on its own connection) from ``source``; the id it got."""
    sid = cm.session_manager.next_session_id
    cm.on_message(source, now)
    cm.on_message(SessionConnectRequest(correlation_id, 7, pv.PROTOCOL_VERSION, "", b"c"), now)
    return sid


def replies(egress: RecordingEgress, source: IngressSource) -> list[object]:
    return [c[2] for c in egress.calls if c[0] == "reply" and c[1] is source]


def events(egress: RecordingEgress, source: IngressSource) -> list[SessionEvent]:
    return [m for m in replies(egress, source) if isinstance(m, SessionEvent)]


def pending_ids(cm: ConsensusModule) -> set[int]:
    return {s.cluster_session_id for s in cm.session_manager.admission.pending_sessions}


# ---------------------------------------------------------------------- pending slots


def test_a_flood_from_four_addresses_cannot_keep_out_a_client_from_a_fifth() -> None:
    """The report's attack: four addresses fill all 16 pending slots with requests that
    never answer the challenge, and keep sending; a client with the right answer
    connects from a fifth address, and gets in every time."""
    auth = ChallengeAuthenticator()
    cm, egress, reader = make(authenticator=auth)
    flooders = [f"127.0.0.{i}" for i in (2, 3, 4, 5)]
    now = T0
    for _ in range(4):
        for address in flooders:
            request(cm, Conn.make(address), now)
    assert len(cm.session_manager.admission.pending_sessions) == 16
    cm.on_slow_tick(now)  # all challenged; none will answer
    admitted = 0
    for attempt in range(14):
        now += 20 * MS
        client = Conn.make("127.0.0.1")
        sid = request(cm, client, now, correlation_id=attempt)
        assert sid in pending_ids(cm)  # a flooder's oldest gave its place
        # the flood goes on while the client's challenge travels
        for address in flooders * 3:
            request(cm, Conn.make(address), now + MS)
        cm.on_slow_tick(now + 2 * MS)
        (challenge,) = [m for m in replies(egress, client) if isinstance(m, Challenge)]
        for address in flooders * 3:
            request(cm, Conn.make(address), now + 3 * MS)
        cm.on_message(client, now + 4 * MS)
        cm.on_message(
            ChallengeResponse(attempt, sid, b"answer:" + bytes(challenge.encoded_challenge)),
            now + 4 * MS,
        )
        cm.on_slow_tick(now + 5 * MS)
        assert cm.sessions[sid].state is State.OPEN
        commit_all(cm, reader)
        assert [e.code for e in events(egress, client)] == [EventCode.OK]
        admitted += 1
        assert len(cm.session_manager.admission.pending_sessions) <= 16
        assert cm.session_manager.on_service_close(sid, now + 6 * MS)  # room for the next
    assert admitted == 14
    counters = cm.counters
    assert counters.evicted_pending_sessions >= 14
    # no flooder address ever held more than its share
    held: dict[str, int] = {}
    for s in cm.session_manager.admission.pending_sessions:
        assert s.source is not None
        held[s.source.address] = held.get(s.source.address, 0) + 1
    assert max(held.values()) <= 4


def test_the_evicted_hears_error() -> None:
    auth = ChallengeAuthenticator()
    cm, egress, _ = make(authenticator=auth, max_pending_sessions=2)
    first = Conn.make("127.0.0.2")
    a = request(cm, first, T0)
    request(cm, Conn.make("127.0.0.2"), T0 + MS)
    newcomer = Conn.make("127.0.0.3")
    c = request(cm, newcomer, T0 + 2 * MS)
    assert pending_ids(cm) == {a + 1, c}  # the longest-waiting of 127.0.0.2 gave way
    (event,) = events(egress, first)
    assert event.code is EventCode.ERROR
    assert "gave its place" in event.detail
    assert ("close", a) in egress.calls
    assert cm.counters.evicted_pending_sessions == 1


def test_equal_shares_are_kept() -> None:
    """An address evicts only from one holding more than itself: no address can push
    another below its own share."""
    cm, egress, _ = make(authenticator=ChallengeAuthenticator(), max_pending_sessions=4)
    for i in range(4):
        request(cm, Conn.make("127.0.0.2"), T0 + i * MS)
    for i in range(2):  # 4:0 -> 3:1 -> 2:2
        request(cm, Conn.make("127.0.0.3"), T0 + (10 + i) * MS)
    assert cm.counters.evicted_pending_sessions == 2
    for address in ("127.0.0.3", "127.0.0.2"):  # 2:2 -> refused, either way
        late = Conn.make(address)
        request(cm, late, T0 + 20 * MS)
        cm.on_slow_tick(T0 + 21 * MS)
        (event,) = events(egress, late)
        assert event.detail == "too many sessions connecting, try again"
    assert cm.counters.evicted_pending_sessions == 2
    by = [s.source.address for s in cm.session_manager.admission.pending_sessions if s.source]
    assert sorted(by) == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2


def test_an_address_holding_as_many_as_any_is_refused_without_evicting_anyone() -> None:
    cm, egress, _ = make(authenticator=ChallengeAuthenticator(), max_pending_sessions=4)
    for i in range(4):
        request(cm, Conn.make(f"127.0.0.{2 + i % 2}"), T0 + i * MS)
    extra = Conn.make("127.0.0.2")  # it holds 2, as many as any: nobody gives way
    request(cm, extra, T0 + 10 * MS)
    cm.on_slow_tick(T0 + 11 * MS)
    assert events(egress, extra)[0].detail == "too many sessions connecting, try again"
    assert cm.counters.evicted_pending_sessions == 0


def test_an_ipv6_host_counts_by_its_64() -> None:
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:2")
    assert address_key("2001:db8:0:1::1") != address_key("2001:db8::1")
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert address_key("127.0.0.2") == "127.0.0.2"
    cm, egress, _ = make(authenticator=ChallengeAuthenticator(), max_pending_per_address=2)
    for i in range(2):
        request(cm, Conn.make(f"2001:db8::{i + 1}"), T0)
    third = Conn.make("2001:db8::99")
    request(cm, third, T0)
    cm.on_slow_tick(T0 + MS)
    (event,) = events(egress, third)
    assert event.detail == "too many sessions connecting from 2001:db8::99, try again"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flooders=st.integers(1, 14),
    flood=st.lists(st.tuples(st.integers(0, 13), st.booleans()), max_size=120),
)
def test_a_client_is_never_evicted_by_fewer_addresses_than_slots(
    flooders: int, flood: list[tuple[int, bool]]
) -> None:
    """Property: while fewer addresses than ``max_pending_sessions - 1`` flood (here
    with 16 slots, up to 14), whatever they send and whenever the leader ticks, a client
    from another address gets a pending slot and keeps it until it answers."""
    cm, _, _ = make(authenticator=ChallengeAuthenticator())
    now = T0
    addresses = [f"127.0.1.{i}" for i in range(flooders)]
    for i in range(16):  # the slots are full before the client comes
        request(cm, Conn.make(addresses[i % flooders]), now)
    client = Conn.make("127.0.0.1")
    sid = request(cm, client, now)
    assert sid in pending_ids(cm)
    for which, tick in flood:
        now += MS
        request(cm, Conn.make(addresses[which % flooders]), now)
        if tick:
            cm.on_slow_tick(now)
        assert sid in pending_ids(cm)
        assert len(cm.session_manager.admission.pending_sessions) <= 16


# ---------------------------------------------------------------------- open slots


def own(cm: ConsensusModule, reader: LogReader, source: IngressSource, now: int) -> int:
    """Open a session on ``source`` (no authenticator); its id."""
    sid = request(cm, source, now)
    cm.on_slow_tick(now)
    commit_all(cm, reader)
    assert cm.sessions[sid].state is State.OPEN
    return sid


def closes(reader: LogReader) -> list[tuple[int, CloseReason]]:
    return [(m.cluster_session_id, m.close_reason) for m in reader.messages(SessionCloseEvent)]


def test_a_dropped_session_gives_its_slot_to_a_new_one_when_every_slot_is_taken() -> None:
    cm, egress, reader = make(max_concurrent_sessions=2)
    first, second = Conn.make("127.0.0.1"), Conn.make("127.0.0.1")
    a = own(cm, reader, first, T0)
    b = own(cm, reader, second, T0)
    cm.session_manager.on_source_closed(first)  # dropped, no close
    cm.on_slow_tick(T0 + 10 * MS)  # noted
    # within the grace: the dropped session keeps its slot
    early = Conn.make("127.0.0.1")
    request(cm, early, T0 + 100 * MS)
    cm.on_slow_tick(T0 + 110 * MS)
    assert events(egress, early)[0].detail == "concurrent session limit"
    assert set(cm.sessions) == {a, b}
    # past it: the newcomer gets the slot; the dropped one is closed through the log
    late = Conn.make("127.0.0.1")
    c = request(cm, late, T0 + 10 * MS + GRACE)
    cm.on_slow_tick(T0 + 20 * MS + GRACE)
    assert set(cm.sessions) == {b, c}
    assert closes(reader) == [(a, CloseReason.TIMEOUT)]
    assert cm.counters.sessions_given_back == 1
    commit_all(cm, reader)
    assert [e.code for e in events(egress, late)] == [EventCode.OK]
    # its client, coming back, hears why
    cm.on_message(Conn.make("127.0.0.1"), T0 + SECOND)
    cm.on_message(SessionResumeRequest(9, a, pv.PROTOCOL_VERSION, b"wrong"), T0 + SECOND)
    assert egress.events(a)[-1].code is EventCode.CLOSED


def test_slots_not_short_a_dropped_session_waits_the_whole_timeout_and_can_resume() -> None:
    cm, egress, reader = make(max_concurrent_sessions=3)
    first = Conn.make("127.0.0.1")
    a = own(cm, reader, first, T0)
    (ok,) = [e for e in events(egress, first) if e.code is EventCode.OK]
    own(cm, reader, Conn.make("127.0.0.1"), T0)
    cm.session_manager.on_source_closed(first)
    cm.on_slow_tick(T0 + 10 * MS)
    # one slot free: a new session takes that, the dropped one stays
    own(cm, reader, Conn.make("127.0.0.1"), T0 + 2 * SECOND)
    assert a in cm.sessions
    # and is resumed long after the grace
    back = Conn.make("127.0.0.1")
    cm.on_message(back, T0 + 3 * SECOND)
    cm.on_message(
        SessionResumeRequest(9, a, pv.PROTOCOL_VERSION, ok.session_secret), T0 + 3 * SECOND
    )
    assert cm.sessions[a].source is back
    cm.on_slow_tick(T0 + 3 * SECOND)
    assert cm.sessions[a].detached_since_ns is None
    # now every slot is taken by a connected client: a newcomer is refused, nobody closed
    newcomer = Conn.make("127.0.0.1")
    request(cm, newcomer, T0 + 5 * SECOND)
    cm.on_slow_tick(T0 + 5 * SECOND)
    assert events(egress, newcomer)[0].detail == "concurrent session limit"
    assert closes(reader) == []
    assert cm.counters.sessions_given_back == 0


def test_the_session_without_a_connection_longest_goes_first() -> None:
    cm, egress, reader = make(max_concurrent_sessions=3)
    conns = [Conn.make("127.0.0.1") for _ in range(3)]
    ids = [own(cm, reader, c, T0) for c in conns]
    cm.session_manager.on_source_closed(conns[2])
    cm.on_slow_tick(T0 + 10 * MS)
    cm.session_manager.on_source_closed(conns[0])
    cm.on_slow_tick(T0 + 50 * MS)
    now = T0 + SECOND
    for _ in range(2):
        request(cm, Conn.make("127.0.0.1"), now)
        cm.on_slow_tick(now)
        now += 10 * MS
    assert closes(reader) == [(ids[2], CloseReason.TIMEOUT), (ids[0], CloseReason.TIMEOUT)]
    assert ids[1] in cm.sessions  # connected: never closed for another
    third = Conn.make("127.0.0.1")
    request(cm, third, now)
    cm.on_slow_tick(now)
    assert events(egress, third)[0].detail == "concurrent session limit"


def test_with_an_authenticator_the_slot_is_given_back_once_the_newcomer_is_authenticated() -> None:
    auth = ChallengeAuthenticator()
    cm, egress, reader = make(authenticator=auth, max_concurrent_sessions=1)
    first = Conn.make("127.0.0.1")
    a = request(cm, first, T0)
    cm.on_slow_tick(T0)
    (challenge,) = [m for m in replies(egress, first) if isinstance(m, Challenge)]
    cm.on_message(first, T0 + MS)
    cm.on_message(ChallengeResponse(7, a, b"answer:" + bytes(challenge.encoded_challenge)), T0)
    cm.on_slow_tick(T0 + 2 * MS)
    commit_all(cm, reader)
    cm.session_manager.on_source_closed(first)
    cm.on_slow_tick(T0 + 10 * MS)
    # a stranger that never answers takes nothing from it
    stranger = Conn.make("127.0.0.9")
    request(cm, stranger, T0 + SECOND)
    for t in range(10):
        cm.on_slow_tick(T0 + SECOND + t * 10 * MS)
    assert a in cm.sessions
    assert closes(reader) == []


def test_a_new_leader_gives_every_session_a_whole_timeout() -> None:
    cm, egress, reader = make(max_concurrent_sessions=1)
    first = Conn.make("127.0.0.1")
    a = own(cm, reader, first, T0)
    cm.session_manager.on_source_closed(first)
    cm.on_slow_tick(T0 + 10 * MS)
    cm.session_manager.lead(T0 + 20 * MS)  # (as a new leader does for every session)
    late = Conn.make("127.0.0.1")
    request(cm, late, T0 + 5 * SECOND)
    cm.on_slow_tick(T0 + 5 * SECOND)
    assert events(egress, late)[0].detail == "concurrent session limit"
    assert a in cm.sessions


def test_a_leader_stall_is_not_counted_against_the_grace() -> None:
    cm, egress, reader = make(max_concurrent_sessions=1)
    first = Conn.make("127.0.0.1")
    a = own(cm, reader, first, T0)
    cm.session_manager.on_source_closed(first)
    cm.on_slow_tick(T0 + 10 * MS)
    cm.session_manager.forgive_stall(2 * SECOND)
    late = Conn.make("127.0.0.1")
    request(cm, late, T0 + 2 * SECOND)
    cm.on_slow_tick(T0 + 2 * SECOND)
    assert events(egress, late)[0].detail == "concurrent session limit"
    assert a in cm.sessions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["open", "drop", "resume", "tick"]), st.integers(0, 9)),
        max_size=80,
    )
)
def test_a_connected_session_is_never_closed_for_another(ops: list[tuple[str, int]]) -> None:
    """Property: whatever opens, drops, resumes and ticks in whatever order, a session
    closed to give its slot up had no connection for at least the grace, and every
    session closed is closed through the log (TIMEOUT)."""
    cm, egress, reader = make(max_concurrent_sessions=4)
    now = T0
    secrets: dict[int, bytes] = {}
    conns: dict[int, IngressSource] = {}
    for op, n in ops:
        now += 37 * MS
        live = sorted(cm.sessions)
        if op == "open":
            src = Conn.make("127.0.0.1")
            sid = request(cm, src, now)
            conns[sid] = src
        elif op == "drop" and live:
            sid = live[n % len(live)]
            source = cm.sessions[sid].source
            if source is not None:
                cm.session_manager.on_source_closed(source)
        elif op == "resume" and live:
            sid = live[n % len(live)]
            if sid in secrets and cm.sessions[sid].source is None:
                src = Conn.make("127.0.0.1")
                cm.on_message(src, now)
                cm.on_message(SessionResumeRequest(9, sid, pv.PROTOCOL_VERSION, secrets[sid]), now)
        before = {
            sid: (s.source is not None and not s.source.closed, s.detached_since_ns)
            for sid, s in cm.sessions.items()
        }
        cm.on_slow_tick(now)
        commit_all(cm, reader)
        for sid, source in conns.items():
            for e in events(egress, source):
                if e.code is EventCode.OK:
                    secrets[sid] = bytes(e.session_secret)
        for sid, (connected, since) in before.items():
            if sid not in cm.sessions:
                assert not connected
                assert since is not None
                assert 0 <= since <= now - GRACE
        assert len(cm.sessions) <= 4
    assert all(reason is CloseReason.TIMEOUT for _, reason in closes(reader))
