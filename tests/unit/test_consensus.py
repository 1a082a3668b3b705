"""The sans-IO ConsensusModule: client sessions and log sequencing (seeds 000, 002).

The egress port is a recording test double (the core is sans-IO by design, the port is
its only collaborator); the log is read back from ``take_log_batch`` with the real
record reader and the real LOG codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cluster.archive.record import complete_length, iter_records
from cluster.core.auth import AdminPrincipals, Authenticator, AuthorisationService, SessionProxy
from cluster.core.base import ConsensusConfig, IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.core.session import State
from cluster.core.sessions import secret_hash
from cluster.examples.auth import SharedSecretAuthenticator
from cluster.protocol import LOG
from cluster.protocol import version as pv
from cluster.protocol.consensus import APPEND_POSITION_VERIFIED, AppendPosition, CommitPosition
from cluster.protocol.egress import AdminResponse, Challenge, NewLeaderEvent, SessionEvent
from cluster.protocol.enums import (
    AdminRequestType,
    AdminResponseCode,
    CloseReason,
    ClusterAction,
    ClusterTimeUnit,
    EventCode,
    Role,
)
from cluster.protocol.ingress import (
    AdminRequest,
    ChallengeResponse,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionKeepAlive,
    SessionMessageHeader,
    SessionResumeRequest,
)
from cluster.protocol.log import (
    ClusterActionRequest,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)

MS = 1_000_000
SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND  # a realistic monotonic-ish start so timestamps are non-zero
TERM = 3
CHANNEL = "127.0.0.1:20000"
CLIENT = IngressSource(1, "127.0.0.1")
"""The client connection every request in these tests comes on (a fresh one per test
would only add ceremony: tests that need a second connection make one)."""
ENDPOINTS = "0=127.0.0.1:9010,1=127.0.0.1:9011,2=127.0.0.1:9012"


# ---------------------------------------------------------------------- test doubles


@dataclass
class Sent:
    egress_id: int
    message: Any
    commit_position: int  # the module's commit position when the message was sent


@dataclass
class RecordingEgress:
    """EgressPort double: records connect/send/close, optionally refusing sends."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    accept: bool = True
    cm: ConsensusModule | None = None
    dropped: dict[int, int] = field(default_factory=dict)
    """Replies dropped per session, as the shell counts them (tests set them)."""

    def connect(self, egress_id: int, channel: str) -> None:
        self.calls.append(("connect", egress_id, channel))

    def attach(self, egress_id: int, source: IngressSource) -> None:
        self.calls.append(("attach", egress_id, source))

    def reply(self, source: IngressSource, message: Any) -> bool:
        """Answers on the client's connection, recorded under the session they name."""
        self.calls.append(("reply", source, message))
        if self.accept:
            commit = self.cm.commit_position if self.cm is not None else -1
            self.sent.append(Sent(message.cluster_session_id, message, commit))
        return self.accept

    def send(self, egress_id: int, message: Any) -> bool:
        self.calls.append(("send", egress_id, message))
        if self.accept:
            commit = self.cm.commit_position if self.cm is not None else -1
            self.sent.append(Sent(egress_id, message, commit))
        return self.accept

    def close(self, egress_id: int) -> None:
        self.calls.append(("close", egress_id))

    # helpers
    def messages(self, egress_id: int | None = None, kind: type | None = None) -> list[Any]:
        return [
            s.message
            for s in self.sent
            if (egress_id is None or s.egress_id == egress_id)
            and (kind is None or isinstance(s.message, kind))
        ]

    def events(self, egress_id: int | None = None) -> list[SessionEvent]:
        return self.messages(egress_id, SessionEvent)

    def connects(self) -> list[tuple[int, str]]:
        return [(c[1], c[2]) for c in self.calls if c[0] == "connect"]

    def closes(self) -> list[int]:
        return [c[1] for c in self.calls if c[0] == "close"]


class LogReader:
    """Takes batches from the module and decodes them, checking contiguity."""

    def __init__(self, cm: ConsensusModule) -> None:
        self.cm = cm
        self.end = cm.log.published_position
        self.entries: list[tuple[int, Any]] = []  # (position after the record, message)

    def pull(self) -> list[tuple[int, Any]]:
        batch = self.cm.take_log_batch()
        if batch is None:
            return []
        start, data = batch
        assert start == self.end, "log batches must be contiguous"
        assert complete_length(data) == len(data), "a batch holds whole records only"
        new = []
        for offset, body in iter_records(data):
            position = start + offset + 8 + len(body)
            new.append((position, LOG.decode(body)))
        assert new, "a non-empty batch has at least one record"
        self.end = start + len(data)
        assert self.end == new[-1][0]
        self.entries.extend(new)
        return new

    def messages(self, kind: type | None = None) -> list[Any]:
        self.pull()
        return [m for _, m in self.entries if kind is None or isinstance(m, kind)]


class ChallengeAuthenticator(Authenticator):
    """Challenges every client with a nonce and expects ``b"answer:" + nonce`` back."""

    enforces_identity = True

    def __init__(self) -> None:
        self.credentials: dict[int, bytes] = {}
        self.responses: dict[int, bytes] = {}
        self.calls: list[str] = []

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        self.calls.append("connect_request")
        self.credentials[session_id] = encoded_credentials

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        self.calls.append("connected")
        assert proxy.challenge(b"nonce-%d" % proxy.session_id)

    def on_challenge_response(
        self, session_id: int, encoded_credentials: bytes, now_ms: int
    ) -> None:
        self.calls.append("challenge_response")
        self.responses[session_id] = encoded_credentials

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        self.calls.append("challenged")
        response = self.responses.pop(proxy.session_id, None)
        if response is None:
            return
        if response == b"answer:nonce-%d" % proxy.session_id:
            proxy.authenticate(b"principal:" + self.credentials[proxy.session_id])
        else:
            proxy.reject()


class RecordingAuthenticator(Authenticator):
    """The default behaviour, recording the session state it sees."""

    def __init__(self, cm_ref: list[ConsensusModule]) -> None:
        self.cm_ref = cm_ref
        self.seen: list[tuple[str, State]] = []

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        (cm,) = self.cm_ref
        session = next(
            s
            for s in cm.session_manager.admission.pending_sessions
            if s.cluster_session_id == proxy.session_id
        )
        self.seen.append(("before", session.state))
        super().on_connected_session(proxy, now_ms)
        self.seen.append(("after", session.state))


# ---------------------------------------------------------------------- harness


def make(
    *,
    role: Role = Role.LEADER,
    authenticator: Authenticator | None = None,
    authorisation: AuthorisationService | None = None,
    member_count: int = 1,
    log_position: int = 0,
    **config: Any,
) -> tuple[ConsensusModule, RecordingEgress, LogReader]:
    egress = RecordingEgress()
    if role is Role.FOLLOWER and member_count == 1:
        member_count = 3  # a follower has a leader somewhere
    cfg = ConsensusConfig(
        ingress_endpoints=ENDPOINTS, member_ids=tuple(range(member_count)), **config
    )
    cm = ConsensusModule(
        cfg, egress, authenticator, log_position=log_position, authorisation=authorisation
    )
    egress.cm = cm
    reader = LogReader(cm)
    READERS[id(cm)] = reader
    if role is Role.LEADER:
        lead(cm, TERM, T0)
    return cm, egress, reader


READERS: dict[int, LogReader] = {}


def lead(cm: ConsensusModule, term: int, now: int) -> None:
    """Win an election and complete it: the new term's first entry committed and applied."""
    reader = READERS.get(id(cm)) or LogReader(cm)
    READERS[id(cm)] = reader
    cm.become_leader(term, now)
    reader.pull()
    cm.on_archive_position(reader.end, now)
    for progress in cm.followers:
        cm.on_consensus_message(
            AppendPosition(term, reader.end, progress.member_id, APPEND_POSITION_VERIFIED), now
        )
    cm.on_applied(reader.end, now)
    assert cm.is_ready_leader


def connect(
    cm: ConsensusModule,
    now: int,
    *,
    correlation_id: int = 100,
    version: int = pv.PROTOCOL_VERSION,
    credentials: bytes = b"",
    source: IngressSource = CLIENT,
) -> int:
    """Send a SessionConnectRequest on the ``source`` connection; return the session id
    (the leader dials CHANNEL only once the session opens)."""
    egress: RecordingEgress = cm.egress  # type: ignore[assignment]
    before = len(egress.connects())
    manager = cm.session_manager
    next_id = manager.next_session_id
    cm.on_message(source, now)  # the connection the messages below come on
    cm.on_message(SessionConnectRequest(correlation_id, 7, version, CHANNEL, credentials), now)
    assert len(egress.connects()) == before  # nobody dialled for a stranger
    if manager.next_session_id == next_id + 1:
        return next_id
    return manager.admission.redirect_sessions[-1].egress_id


def commit_all(cm: ConsensusModule, reader: LogReader) -> None:
    reader.pull()
    cm.on_archive_position(reader.end)


def open_session(
    cm: ConsensusModule, reader: LogReader, now: int, *, correlation_id: int = 100
) -> int:
    sid = connect(cm, now, correlation_id=correlation_id)
    cm.session_manager.on_egress_connected(sid)
    cm.on_slow_tick(now)
    assert cm.sessions[sid].state is State.OPEN
    commit_all(cm, reader)
    return sid


def msg(cm: ConsensusModule, sid: int, payload: bytes = b"p", term: int | None = None) -> Any:
    return SessionMessageHeader(cm.leadership_term_id if term is None else term, sid, 0, payload)


# ---------------------------------------------------------------------- seed 000 flow


def test_connect_flow_step_by_step() -> None:
    ref: list[ConsensusModule] = []
    auth = RecordingAuthenticator(ref)
    cm, egress, reader = make(authenticator=auth)
    ref.append(cm)
    assert [type(m) for m in reader.messages()] == [NewLeadershipTermEvent]

    sid = connect(cm, T0, correlation_id=42)
    assert sid == 1
    (pending,) = cm.session_manager.admission.pending_sessions
    assert pending.cluster_session_id == sid
    assert pending.state is State.CONNECTED  # on the connection it came on
    assert pending.source is CLIENT
    assert sid not in cm.sessions
    assert egress.sent == []
    assert egress.connects() == []  # nobody is dialled before authentication
    assert auth.seen == []
    assert reader.pull() == []

    cm.on_slow_tick(T0 + 20 * MS)  # only the slow tick moves it on
    assert auth.seen == [("before", State.CONNECTED), ("after", State.AUTHENTICATED)]
    assert pending.state is State.OPEN
    assert cm.session_manager.admission.pending_sessions == []
    assert cm.sessions[sid] is pending

    new = reader.pull()
    assert len(new) == 1
    position, open_event = new[0]
    assert open_event == SessionOpenEvent(
        leadership_term_id=TERM,
        correlation_id=42,
        cluster_session_id=sid,
        timestamp=(T0 + 20 * MS) // MS,
        response_stream_id=7,
        response_channel=CHANNEL,
        encoded_principal=b"",
        secret_hash=open_event.secret_hash,
    )
    assert len(open_event.secret_hash) == 32
    assert pending.opened_log_position == position
    assert egress.connects() == [(sid, CHANNEL)]  # dialled once authenticated

    # OK only once the open event is committed (the archive covers its position)
    assert egress.events(sid) == []
    cm.on_archive_position(position - 1)
    assert egress.events(sid) == []
    cm.on_slow_tick(T0 + 30 * MS)
    assert egress.events(sid) == []
    cm.on_archive_position(position)
    (ok,) = egress.events(sid)
    assert ok.code is EventCode.OK
    assert ok.cluster_session_id == sid
    assert ok.leadership_term_id == TERM
    assert ok.correlation_id == 42
    assert ok.leader_member_id == cm.config.member_id
    assert secret_hash(ok.session_secret) == open_event.secret_hash
    assert ok.version == pv.PROTOCOL_VERSION
    assert cm.commit_position == position

    # never sent twice
    cm.on_archive_position(position + 100)
    cm.on_slow_tick(T0 + 40 * MS)
    assert len(egress.events(sid)) == 1


def test_ok_waits_for_quorum_in_a_three_member_cluster() -> None:
    cm, egress, reader = make(member_count=3)
    sid = connect(cm, T0)
    cm.session_manager.on_egress_connected(sid)
    cm.on_slow_tick(T0)
    reader.pull()
    cm.on_archive_position(reader.end)
    assert cm.commit_position < cm.sessions[sid].opened_log_position
    assert egress.events(sid) == []


def test_ok_retried_on_slow_tick_when_egress_full() -> None:
    cm, egress, reader = make()
    sid = connect(cm, T0)
    cm.session_manager.on_egress_connected(sid)
    cm.on_slow_tick(T0)
    egress.accept = False
    commit_all(cm, reader)
    assert egress.events(sid) == []
    assert cm.sessions[sid].has_open_event_pending
    egress.accept = True
    cm.on_slow_tick(T0 + 10 * MS)
    assert [e.code for e in egress.events(sid)] == [EventCode.OK]
    cm.on_slow_tick(T0 + 20 * MS)
    assert [e.code for e in egress.events(sid)] == [EventCode.OK]


def test_version_mismatch_is_rejected_with_error() -> None:
    cm, egress, reader = make()
    major = pv.major(pv.PROTOCOL_VERSION)
    sid = connect(cm, T0, version=pv.compose((major + 1) % 256, 0, 0))
    assert cm.session_manager.admission.pending_sessions == []
    assert len(cm.session_manager.admission.rejected_sessions) == 1
    cm.on_slow_tick(T0 + 10 * MS)
    (event,) = egress.events(sid)  # on the connection: nobody dialled
    assert event.code is EventCode.ERROR
    assert "invalid client version" in event.detail
    assert egress.closes() == [sid]
    assert cm.session_manager.admission.rejected_sessions == []
    assert cm.sessions == {}
    assert cm.counters.rejected_sessions == 1
    assert [type(m) for m in reader.messages()] == [NewLeadershipTermEvent]


def test_compatible_minor_version_is_accepted() -> None:
    cm, _egress, _reader = make()
    major = pv.major(pv.PROTOCOL_VERSION)
    sid = connect(cm, T0, version=pv.compose(major, 200, 9))
    cm.session_manager.on_egress_connected(sid)
    cm.on_slow_tick(T0)
    assert cm.sessions[sid].state is State.OPEN


def test_concurrent_session_limit() -> None:
    cm, egress, reader = make(max_concurrent_sessions=2)
    a = open_session(cm, reader, T0, correlation_id=1)
    # connecting sessions have limits of their own (max_pending_sessions, per address):
    # the open-session limit is checked as each one opens
    b = connect(cm, T0, correlation_id=2)
    c = connect(cm, T0, correlation_id=3)
    assert cm.session_manager.admission.rejected_sessions == []
    assert len(cm.session_manager.admission.pending_sessions) == 2
    for egress_id in (b, c):
        cm.session_manager.on_egress_connected(egress_id)
    cm.on_slow_tick(T0 + 10 * MS)
    (event,) = egress.events(c)
    assert event.code is EventCode.ERROR
    assert event.detail == "concurrent session limit"
    assert event.correlation_id == 3
    assert set(cm.sessions) == {a, b}
    assert c in egress.closes()
    # closing one makes room again
    cm.session_manager.on_close_request(SessionCloseRequest(TERM, a), CLIENT, T0 + 20 * MS)
    d = connect(cm, T0 + 20 * MS, correlation_id=4, source=IngressSource(3, "127.0.0.1"))
    assert cm.session_manager.admission.rejected_sessions == []
    cm.session_manager.on_egress_connected(d)
    cm.on_slow_tick(T0 + 30 * MS)
    assert set(cm.sessions) == {b, d}


# ---------------------------------------------------------------------- authentication


def _challenged(
    credentials: bytes = b"alice",
) -> tuple[ConsensusModule, RecordingEgress, LogReader, ChallengeAuthenticator, int]:
    auth = ChallengeAuthenticator()
    cm, egress, reader = make(authenticator=auth)
    sid = connect(cm, T0, correlation_id=55, credentials=credentials)
    assert auth.credentials == {sid: credentials}
    cm.session_manager.on_egress_connected(sid)
    cm.on_slow_tick(T0 + 10 * MS)
    (challenge,) = egress.messages(sid, Challenge)
    assert challenge == Challenge(55, sid, b"nonce-%d" % sid)
    assert cm.session_manager.admission.pending_sessions[0].state is State.CHALLENGED
    # no answer yet: stays challenged, nothing on the log
    cm.on_slow_tick(T0 + 20 * MS)
    assert cm.session_manager.admission.pending_sessions[0].state is State.CHALLENGED
    assert [type(m) for m in reader.messages()] == [NewLeadershipTermEvent]
    return cm, egress, reader, auth, sid


def test_challenge_right_response_opens_session() -> None:
    cm, egress, reader, auth, sid = _challenged()
    cm.session_manager.admission.on_challenge_response(
        ChallengeResponse(55, sid, b"answer:nonce-%d" % sid), CLIENT, T0 + 30 * MS
    )
    assert "challenge_response" in auth.calls
    cm.on_slow_tick(T0 + 40 * MS)
    assert cm.sessions[sid].state is State.OPEN
    opens = reader.messages(SessionOpenEvent)
    assert [o.encoded_principal for o in opens] == [b"principal:alice"]
    commit_all(cm, reader)
    assert [e.code for e in egress.events(sid)] == [EventCode.OK]


def test_challenge_wrong_response_rejects() -> None:
    cm, egress, reader, _auth, sid = _challenged()
    cm.session_manager.admission.on_challenge_response(
        ChallengeResponse(55, sid, b"wrong"), CLIENT, T0 + 30 * MS
    )
    cm.on_slow_tick(T0 + 40 * MS)
    assert sid not in cm.sessions
    assert cm.session_manager.admission.pending_sessions == []
    (event,) = egress.events(sid)
    assert event.code is EventCode.AUTHENTICATION_REJECTED
    assert egress.closes() == [sid]
    assert reader.messages(SessionOpenEvent) == []
    assert cm.counters.rejected_sessions == 1


def test_challenge_response_with_wrong_ids_is_ignored_and_counted() -> None:
    cm, _egress, _reader, auth, sid = _challenged()
    cm.session_manager.admission.on_challenge_response(
        ChallengeResponse(56, sid, b"answer:nonce-%d" % sid), CLIENT, T0
    )
    cm.session_manager.admission.on_challenge_response(
        ChallengeResponse(55, sid + 1, b"answer:nonce-%d" % sid), CLIENT, T0
    )
    assert cm.counters.unknown_session_messages == 2
    assert "challenge_response" not in auth.calls
    cm.on_slow_tick(T0 + 40 * MS)
    assert cm.session_manager.admission.pending_sessions[0].state is State.CHALLENGED


def test_challenged_session_without_answer_times_out() -> None:
    cm, egress, reader, _auth, sid = _challenged()
    timeout = cm.config.session_timeout_ns
    cm.on_slow_tick(T0 + timeout)
    assert cm.session_manager.admission.pending_sessions != []
    cm.on_slow_tick(T0 + timeout + 1)
    assert cm.session_manager.admission.pending_sessions == []
    assert sid in egress.closes()
    assert reader.messages(SessionOpenEvent) == []


# ---------------------------------------------------------------------- ingress


def test_message_is_sequenced_with_cluster_timestamp() -> None:
    cm, _egress, reader = make()
    sid = open_session(cm, reader, T0)
    assert cm.on_ingress_message(msg(cm, sid, b"hello"), T0 + 5 * MS)
    (m,) = reader.messages(SessionMessageHeader)
    assert m == SessionMessageHeader(TERM, sid, (T0 + 5 * MS) // MS, b"hello")


def test_unknown_session_and_wrong_term_are_ignored_and_counted() -> None:
    cm, _egress, reader = make()
    sid = open_session(cm, reader, T0)
    assert not cm.on_ingress_message(msg(cm, sid + 99), T0)
    assert cm.counters.unknown_session_messages == 1
    assert not cm.on_ingress_message(msg(cm, sid, term=TERM - 1), T0)
    assert not cm.on_ingress_message(msg(cm, sid, term=TERM + 1), T0)
    assert cm.counters.wrong_term_messages == 2
    cm.session_manager.on_keepalive(SessionKeepAlive(TERM, sid + 99), CLIENT, T0)
    cm.session_manager.on_keepalive(SessionKeepAlive(TERM + 1, sid), CLIENT, T0)
    cm.session_manager.on_close_request(SessionCloseRequest(TERM, sid + 99), CLIENT, T0)
    cm.session_manager.on_close_request(SessionCloseRequest(TERM - 1, sid), CLIENT, T0)
    assert cm.counters.unknown_session_messages == 3
    assert cm.counters.wrong_term_messages == 4
    assert reader.messages(SessionMessageHeader) == []
    assert reader.messages(SessionCloseEvent) == []
    assert cm.sessions[sid].state is State.OPEN


def test_message_for_pending_session_is_ignored() -> None:
    cm, _egress, reader = make()
    sid = connect(cm, T0)
    assert not cm.on_ingress_message(msg(cm, sid), T0)
    assert cm.counters.unknown_session_messages == 1
    assert reader.messages(SessionMessageHeader) == []


@pytest.mark.parametrize("kind", ["keepalive", "message"])
def test_activity_prevents_timeout(kind: str) -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    timeout = cm.config.session_timeout_ns
    now = T0
    for _ in range(5):
        now += timeout // 2
        cm.on_slow_tick(now)
        if kind == "keepalive":
            cm.session_manager.on_keepalive(SessionKeepAlive(TERM, sid), CLIENT, now)
        else:
            assert cm.on_ingress_message(msg(cm, sid), now)
    assert now - T0 > 2 * timeout
    cm.on_slow_tick(now + timeout)  # exactly the timeout: not yet
    assert cm.sessions[sid].state is State.OPEN
    assert reader.messages(SessionCloseEvent) == []
    assert cm.counters.timed_out_sessions == 0
    assert EventCode.CLOSED not in [e.code for e in egress.events(sid)]


def test_idle_session_times_out() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    timeout = cm.config.session_timeout_ns
    cm.on_slow_tick(T0 + timeout)
    assert sid in cm.sessions
    now = T0 + timeout + 1
    cm.on_slow_tick(now)
    assert sid not in cm.sessions
    (close,) = reader.messages(SessionCloseEvent)
    assert close == SessionCloseEvent(TERM, sid, now // MS, CloseReason.TIMEOUT)
    # told only once the close is committed: what it hears is what every member applies
    assert all(e.code is not EventCode.CLOSED for e in egress.events(sid))
    cm.on_archive_position(reader.end)
    closed = egress.events(sid)[-1]
    assert closed.code is EventCode.CLOSED
    assert closed.cluster_session_id == sid
    assert egress.calls[-1] == ("close", sid)
    assert cm.counters.timed_out_sessions == 1
    # later traffic for it is unknown
    assert not cm.on_ingress_message(msg(cm, sid), now)
    assert cm.counters.unknown_session_messages == 1


def test_a_response_channel_elsewhere_than_the_requesting_host_is_never_dialled() -> None:
    cm, egress, reader = make()
    for channel, why in (
        ("10.9.9.9:4000", "not at the address"),
        ("evil.example:80", "not at the address"),
        ("127.0.0.1:notaport", "bad response channel"),
        ("127.0.0.1:0", "bad response channel"),
    ):
        cm.on_message(CLIENT, T0)
        cm.on_message(SessionConnectRequest(5, 7, pv.PROTOCOL_VERSION, channel, b""), T0)
        cm.on_slow_tick(T0 + MS)
        assert why in egress.events()[-1].detail
    assert egress.connects() == []
    assert reader.messages(SessionOpenEvent) == []
    # a loopback client may name any loopback address
    sid = connect(cm, T0, source=IngressSource(2, "127.0.0.2"))
    cm.on_slow_tick(T0 + 2 * MS)
    assert egress.connects() == [(sid, CHANNEL)]


def test_close_request_is_client_action() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    cm.session_manager.on_close_request(SessionCloseRequest(TERM, sid), CLIENT, T0 + MS)
    (close,) = reader.messages(SessionCloseEvent)
    assert close.close_reason is CloseReason.CLIENT_ACTION
    assert close.cluster_session_id == sid
    cm.on_archive_position(reader.end)
    assert egress.events(sid)[-1].code is EventCode.CLOSED
    assert egress.closes() == [sid]
    assert sid not in cm.sessions


def test_service_close_is_service_action() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    assert not cm.session_manager.on_service_close(sid + 1, T0)
    assert cm.session_manager.on_service_close(sid, T0 + MS)
    (close,) = reader.messages(SessionCloseEvent)
    assert close.close_reason is CloseReason.SERVICE_ACTION
    cm.on_archive_position(reader.end)
    assert egress.events(sid)[-1].code is EventCode.CLOSED
    assert not cm.session_manager.on_service_close(sid, T0 + 2 * MS)  # already closed


def test_service_close_on_follower_is_applied_when_it_leads() -> None:
    leader, _e, leader_log = make()
    sid = open_session(leader, leader_log, T0)
    follower, _f_egress, f_reader = make(role=Role.FOLLOWER)
    for position, m in leader_log.entries:
        follower.on_replay_log_message(m, position, T0)
    assert follower.session_manager.on_service_close(sid, T0)
    assert follower.sessions[sid].state is State.CLOSING
    assert f_reader.messages() == []  # followers never append
    lead(follower, TERM + 1, T0 + SECOND)
    follower.on_slow_tick(T0 + SECOND)
    closes = f_reader.messages(SessionCloseEvent)
    assert [(c.cluster_session_id, c.close_reason) for c in closes] == [
        (sid, CloseReason.SERVICE_ACTION)
    ]


def test_admin_snapshot_request_is_answered_once_the_snapshot_is_written() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    cm.on_admin_request(AdminRequest(TERM, sid, 9, AdminRequestType.SNAPSHOT), T0)
    (action,) = reader.messages(ClusterActionRequest)
    assert action.action is ClusterAction.SNAPSHOT
    position = cm.log.published_position  # where the action ends
    assert egress.messages(sid, AdminResponse) == []  # not at append: at write
    cm.control.on_snapshot(position - 1)  # another snapshot: not this request's
    assert egress.messages(sid, AdminResponse) == []
    cm.control.on_snapshot(position)
    (response,) = egress.messages(sid, AdminResponse)
    assert response.correlation_id == 9
    assert response.response_code is AdminResponseCode.OK
    assert str(position) in response.message
    cm.control.on_snapshot(position)  # answered once
    assert len(egress.messages(sid, AdminResponse)) == 1
    # unknown session: ignored, no response
    cm.on_admin_request(AdminRequest(TERM, sid + 5, 9, AdminRequestType.SNAPSHOT), T0)
    assert len(egress.messages(None, AdminResponse)) == 1
    assert cm.control.snapshot_waiters == []


def test_admin_snapshot_that_cannot_be_written_is_an_error_response() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    cm.on_admin_request(AdminRequest(TERM, sid, 3, AdminRequestType.SNAPSHOT), T0)
    why = "disk full: snapshot at log position 99 failed (No space left on device)"
    cm.control.on_snapshot(cm.log.published_position, why)
    (response,) = egress.messages(sid, AdminResponse)
    assert (response.correlation_id, response.response_code) == (3, AdminResponseCode.ERROR)
    assert response.message == why


def test_admin_snapshot_waiting_when_leadership_is_lost_is_not_answered() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    cm.on_admin_request(AdminRequest(TERM, sid, 6, AdminRequestType.SNAPSHOT), T0)
    position = cm.log.published_position
    cm.enter_election(T0 + MS, "test")  # steps down: it no longer answers for the term
    cm.control.on_snapshot(position)
    assert egress.messages(sid, AdminResponse) == []
    assert cm.control.snapshot_waiters == []


def test_admin_snapshot_is_refused_at_once_while_the_disk_is_full() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    cm.control.on_disk("disk full: archive failed (No space left on device)")
    cm.on_admin_request(AdminRequest(TERM, sid, 4, AdminRequestType.SNAPSHOT), T0)
    (response,) = egress.messages(sid, AdminResponse)
    assert response.response_code is AdminResponseCode.ERROR
    assert "disk full: archive failed" in response.message
    assert reader.messages(ClusterActionRequest) == []  # nothing on the log
    ok, message = cm.control.request(ClusterAction.SNAPSHOT, T0)  # the admin port's way
    assert not ok
    assert "disk full" in message
    cm.control.on_disk("")  # space again
    cm.on_admin_request(AdminRequest(TERM, sid, 5, AdminRequestType.SNAPSHOT), T0)
    assert len(reader.messages(ClusterActionRequest)) == 1


def test_admin_request_refused_without_authorisation_or_when_suspended() -> None:
    cm, egress, reader = make(authorisation=AdminPrincipals({b"root"}))
    sid = open_session(cm, reader, T0)
    cm.on_admin_request(AdminRequest(TERM, sid, 1, AdminRequestType.SNAPSHOT), T0)
    assert egress.messages(sid, AdminResponse)[-1].response_code is (
        AdminResponseCode.UNAUTHORISED_ACCESS
    )
    cm.sessions[sid].encoded_principal = b"root"
    ok, _ = cm.control.request(ClusterAction.SUSPEND, T0)
    assert ok
    cm.on_admin_request(AdminRequest(TERM, sid, 2, AdminRequestType.SNAPSHOT), T0)
    refused = egress.messages(sid, AdminResponse)[-1]
    assert refused.response_code is AdminResponseCode.ERROR
    assert "SUSPENDED, but needs to be ACTIVE" in refused.message
    # while suspended, client messages are held and sequenced on RESUME
    assert cm.on_ingress_message(msg(cm, sid, b"held"), T0)
    assert b"held" not in [m.payload for m in reader.messages(SessionMessageHeader)]
    ok, _ = cm.control.request(ClusterAction.RESUME, T0)
    assert ok
    assert [m.payload for m in reader.messages(SessionMessageHeader)] == [b"held"]
    assert [a.action for a in reader.messages(ClusterActionRequest)] == [
        ClusterAction.SUSPEND,
        ClusterAction.RESUME,
    ]


# ---------------------------------------------------------------------- followers, egress


def test_follower_redirects_on_the_connection_without_dialling() -> None:
    cm, egress, reader = make(role=Role.FOLLOWER)
    cm.on_replay_log_message(
        NewLeadershipTermEvent(TERM, 0, 5, 0, 2, 0, ClusterTimeUnit.MILLIS, 1), 40, T0
    )  # learn the leader
    egress_id = connect(cm, T0, correlation_id=77)
    assert egress_id < 0  # a local id, not a cluster session id
    assert cm.session_manager.admission.pending_sessions == []
    cm.on_slow_tick(T0 + 10 * MS)
    assert egress.connects() == []
    (event,) = egress.events(egress_id)
    assert event.code is EventCode.REDIRECT
    assert event.detail == ENDPOINTS
    assert event.correlation_id == 77
    assert event.leader_member_id == 2
    assert event.leadership_term_id == TERM
    assert egress.closes() == [egress_id]
    assert cm.sessions == {}
    assert cm.session_manager.admission.redirect_sessions == []
    assert cm.counters.redirected_sessions == 1
    assert reader.pull() == []
    # two redirects get distinct egress ids
    other = connect(cm, T0, correlation_id=78)
    assert other != egress_id


def test_follower_ignores_ingress() -> None:
    cm, _egress, reader = make(role=Role.FOLLOWER)
    assert not cm.on_ingress_message(SessionMessageHeader(TERM, 1, 0, b"x"), T0)
    cm.session_manager.on_keepalive(SessionKeepAlive(TERM, 1), CLIENT, T0)
    cm.session_manager.on_close_request(SessionCloseRequest(TERM, 1), CLIENT, T0)
    assert reader.pull() == []


def test_a_closed_connection_drops_its_pending_session() -> None:
    cm, egress, reader = make()
    source = IngressSource(7, "127.0.0.1")
    connect(cm, T0, source=source)
    cm.session_manager.on_source_closed(source)
    assert cm.session_manager.admission.pending_sessions == []
    cm.on_slow_tick(T0 + 10 * MS)
    assert cm.sessions == {}
    assert reader.messages(SessionOpenEvent) == []
    assert egress.sent == []
    # and the freed slot counts towards the limit again
    assert len(cm.sessions) + len(cm.session_manager.admission.pending_sessions) == 0


def test_a_closed_connection_drops_its_redirect_and_rejected_sessions() -> None:
    follower, f_egress, _ = make(role=Role.FOLLOWER)
    source = IngressSource(7, "127.0.0.1")
    connect(follower, T0, source=source)
    follower.session_manager.on_source_closed(source)
    assert follower.session_manager.admission.redirect_sessions == []
    follower.on_slow_tick(T0)
    assert f_egress.sent == []

    cm, _egress, _ = make()
    other = IngressSource(8, "127.0.0.1")
    version = pv.compose((pv.major(pv.PROTOCOL_VERSION) + 1) % 256, 0, 0)
    connect(cm, T0, version=version, source=other)
    cm.session_manager.on_source_closed(other)
    assert cm.session_manager.admission.rejected_sessions == []


def test_egress_failure_of_open_session_keeps_it_until_timeout() -> None:
    cm, _egress, reader = make()
    sid = open_session(cm, reader, T0)
    cm.session_manager.on_egress_failed(sid)
    assert cm.sessions[sid].state is State.OPEN
    assert not cm.sessions[sid].egress_connected


# ---------------------------------------------------------------------- leadership, replay


def test_become_leader_restores_sessions_and_sends_new_leader_event() -> None:
    old, old_egress, old_log = make()
    s1 = open_session(old, old_log, T0, correlation_id=1)
    s2 = open_session(old, old_log, T0, correlation_id=2)
    s3 = open_session(old, old_log, T0, correlation_id=3)
    old.session_manager.on_close_request(SessionCloseRequest(TERM, s2), CLIENT, T0 + MS)
    old_log.pull()

    cm, egress, reader = make(role=Role.FOLLOWER, log_position=old_log.end)
    for position, m in old_log.entries:
        cm.on_replay_log_message(m, position, T0 + 2 * MS)
    assert set(cm.sessions) == {s1, s3}
    assert all(s.state is State.OPEN for s in cm.sessions.values())
    assert cm.session_manager.next_session_id == s3 + 1
    assert cm.leadership_term_id == TERM
    assert egress.calls == []  # followers do not connect the egress

    lead(cm, TERM + 1, T0 + SECOND)
    (nlt,) = reader.messages(NewLeadershipTermEvent)
    assert nlt.leadership_term_id == TERM + 1
    assert nlt.log_position == old_log.end
    assert nlt.leader_member_id == cm.config.member_id
    assert sorted(egress.connects()) == [(s1, CHANNEL), (s3, CHANNEL)]

    cm.on_slow_tick(T0 + SECOND + 10 * MS)
    assert egress.messages(None, NewLeaderEvent) == []  # waits for the egress
    cm.session_manager.on_egress_connected(s1)
    cm.session_manager.on_egress_connected(s3)
    cm.on_slow_tick(T0 + SECOND + 20 * MS)
    events = egress.messages(None, NewLeaderEvent)
    assert sorted(e.cluster_session_id for e in events) == [s1, s3]
    for e in events:
        assert e.leadership_term_id == TERM + 1
        assert e.leader_member_id == cm.config.member_id
        assert e.ingress_endpoints == ENDPOINTS
    cm.on_slow_tick(T0 + SECOND + 30 * MS)
    assert len(egress.messages(None, NewLeaderEvent)) == 2  # once each

    # new sessions never reuse a replayed id; old sessions keep working in the new term,
    # once their new connection has proved it holds them
    s4 = open_session(cm, reader, T0 + SECOND + 40 * MS, correlation_id=4)
    assert s4 > s3
    assert not cm.on_ingress_message(SessionMessageHeader(TERM + 1, s1, 0, b"x"), T0 + SECOND)
    assert cm.counters.foreign_session_messages == 1
    secret = old_egress.events(s1)[-1].session_secret
    assert len(secret) == 16
    cm.on_message(IngressSource(9, "127.0.0.1"), T0 + SECOND)
    cm.on_message(SessionResumeRequest(5, s1, pv.PROTOCOL_VERSION, secret), T0 + SECOND)
    assert cm.on_ingress_message(SessionMessageHeader(TERM + 1, s1, 0, b"x"), T0 + SECOND)
    assert not cm.on_ingress_message(SessionMessageHeader(TERM, s1, 0, b"x"), T0 + SECOND)


def test_restored_sessions_time_out_from_election_time() -> None:
    old, _e, old_log = make()
    sid = open_session(old, old_log, T0)
    cm, _egress, reader = make(role=Role.FOLLOWER)
    for position, m in old_log.entries:
        cm.on_replay_log_message(m, position, T0)
    later = T0 + 100 * SECOND
    lead(cm, TERM + 1, later)
    cm.on_slow_tick(later + cm.config.session_timeout_ns)
    assert sid in cm.sessions
    cm.on_slow_tick(later + cm.config.session_timeout_ns + 1)
    assert sid not in cm.sessions
    (close,) = reader.messages(SessionCloseEvent)
    assert close.close_reason is CloseReason.TIMEOUT


def test_timestamps_never_go_backwards_when_clock_does() -> None:
    cm, _egress, reader = make()
    sid = open_session(cm, reader, T0 + 50 * SECOND)
    cm.on_ingress_message(msg(cm, sid), T0 + 10 * SECOND)  # clock jumped back
    cm.on_ingress_message(msg(cm, sid), T0 + 60 * SECOND)
    cm.on_ingress_message(msg(cm, sid), T0)
    cm.timers.schedule(1, 0)
    cm.consensus_work(T0 - SECOND)
    cm.session_manager.on_close_request(SessionCloseRequest(TERM, sid), CLIENT, T0 - 2 * SECOND)
    lead(cm, TERM + 1, T0 - 3 * SECOND)
    stamps = [m.timestamp for m in reader.messages()]
    assert len(stamps) == 8
    assert stamps == sorted(stamps)
    assert stamps[-1] == (T0 + 60 * SECOND) // MS


def test_timestamps_never_go_backwards_after_replayed_messages() -> None:
    # A new leader's first entries must not be stamped before entries it replayed,
    # including application messages (cluster_time: "never behind the last timestamp
    # put on the log").
    cm, _egress, reader = make(role=Role.FOLLOWER)
    late = (T0 + 100 * SECOND) // MS
    cm.on_replay_log_message(SessionOpenEvent(TERM, 1, 1, late - 5, 7, CHANNEL), 50, T0)
    cm.on_replay_log_message(SessionMessageHeader(TERM, 1, late, b"x"), 100, T0)
    lead(cm, TERM + 1, T0)  # this member's clock is 100 s behind
    (nlt,) = reader.messages(NewLeadershipTermEvent)
    assert nlt.timestamp >= late


def test_epoch_offset_converts_monotonic_to_epoch_ms() -> None:
    egress = RecordingEgress()
    cm = ConsensusModule(ConsensusConfig(), egress, epoch_offset_ns=5 * SECOND)
    lead(cm, 1, 2 * SECOND)
    assert cm.log.timestamp == 7_000
    assert cm.log.cluster_time(SECOND) == 7_000  # never behind the last timestamp
    assert cm.log.cluster_time(10 * SECOND) == 15_000


# ---------------------------------------------------------------------- timers


def test_timer_fires_into_the_log_when_due() -> None:
    cm, _egress, reader = make()
    deadline = (T0 + 100 * MS) // MS
    cm.timers.schedule(7, deadline)
    assert cm.consensus_work(T0 + 99 * MS) == 0
    assert reader.messages(TimerEvent) == []
    assert cm.consensus_work(T0 + 100 * MS) == 1
    (timer,) = reader.messages(TimerEvent)
    assert timer == TimerEvent(TERM, 7, deadline)
    assert cm.consensus_work(T0 + 200 * MS) == 0  # fires once
    assert len(reader.messages(TimerEvent)) == 1


def test_cancelled_timer_does_not_fire() -> None:
    cm, _egress, reader = make()
    cm.timers.schedule(7, T0 // MS)
    cm.timers.schedule(8, T0 // MS)
    assert cm.timers.cancel(7)
    assert not cm.timers.cancel(7)
    assert cm.consensus_work(T0 + SECOND) == 1
    assert [t.correlation_id for t in reader.messages(TimerEvent)] == [8]


def test_replayed_timer_event_cancels_timer() -> None:
    cm, _egress, reader = make(role=Role.FOLLOWER)
    cm.timers.schedule(7, 10)
    cm.timers.schedule(8, 10)
    assert cm.consensus_work(T0) == 0  # followers never fire timers
    cm.timers.cancel(7)  # what applying TimerEvent(7) from the log does (ServiceContainer)
    lead(cm, TERM + 1, T0)
    assert cm.consensus_work(T0) == 1
    assert [t.correlation_id for t in reader.messages(TimerEvent)] == [8]


def test_rescheduled_timer_uses_new_deadline() -> None:
    cm, _egress, reader = make()
    base = T0 // MS
    cm.timers.schedule(1, base + 10)
    cm.timers.schedule(1, base + 50)
    assert cm.consensus_work(T0 + 20 * MS) == 0
    assert cm.consensus_work(T0 + 50 * MS) == 1
    (timer,) = reader.messages(TimerEvent)
    assert timer.timestamp == base + 50


# ---------------------------------------------------------------------- state machine


class SessionMachine(RuleBasedStateMachine):
    """Random interleavings of client and archive events against the module's invariants."""

    @initialize(max_sessions=st.integers(1, 4))
    def setup(self, max_sessions: int) -> None:
        self.cm, self.egress, self.reader = make(
            max_concurrent_sessions=max_sessions, session_timeout_ns=SECOND
        )
        self.max_sessions = max_sessions
        self.now = T0
        self.connected: set[int] = set()
        self.egress_ids: list[int] = []
        self.correlation = 0
        self.last_timestamp = 0
        self.checked = 0  # log entries already checked
        self.opened: dict[int, int] = {}  # session id -> open event end position
        self.closed: set[int] = set()
        self.ok_sent: set[int] = set()
        self.sent_checked = 0

    # ---- rules

    @rule()
    def connect(self) -> None:
        self.correlation += 1
        egress_id = connect(self.cm, self.now, correlation_id=self.correlation)
        if self.egress_ids:
            assert egress_id > max(self.egress_ids), "session ids unique and increasing"
        self.egress_ids.append(egress_id)

    @rule()
    def connect_and_tick(self) -> None:
        """The common path in one step: connect, egress up, slow tick."""
        self.connect()
        egress_id = self.egress_ids[-1]
        self.connected.add(egress_id)
        self.cm.session_manager.on_egress_connected(egress_id)
        self.cm.on_slow_tick(self.now)

    @precondition(lambda self: bool(self.egress_ids))
    @rule(data=st.data())
    def egress_connected(self, data: st.DataObject) -> None:
        waiting = [
            s.egress_id
            for s in self.cm.session_manager.admission.pending_sessions
            + self.cm.session_manager.admission.rejected_sessions
        ] or self.egress_ids
        egress_id = data.draw(st.sampled_from(waiting))
        self.connected.add(egress_id)
        self.cm.session_manager.on_egress_connected(egress_id)

    @precondition(lambda self: bool(self.egress_ids))
    @rule(data=st.data())
    def egress_failed(self, data: st.DataObject) -> None:
        egress_id = data.draw(st.sampled_from(self.egress_ids))
        self.cm.session_manager.on_egress_failed(egress_id)

    @rule(
        dt=st.one_of(
            st.sampled_from([10 * MS, SECOND // 2, SECOND, SECOND + 1, 2 * SECOND, -SECOND // 3]),
            st.integers(-SECOND // 2, 3 * SECOND // 2),
        )
    )
    def slow_tick(self, dt: int) -> None:
        self.now += dt
        self.cm.on_slow_tick(self.now)

    def _session_id(self, data: st.DataObject) -> int:
        live = sorted(self.cm.sessions)
        known = self.egress_ids or [1]
        choices = [st.sampled_from(known), st.integers(-2, 50)]
        if live:
            choices.insert(0, st.sampled_from(live))
        return data.draw(st.one_of(choices))

    @rule(data=st.data(), wrong_term=st.booleans())
    def message(self, data: st.DataObject, wrong_term: bool) -> None:
        sid = self._session_id(data)
        term = TERM + 1 if wrong_term else TERM
        accepted = self.cm.on_ingress_message(SessionMessageHeader(term, sid, 0, b"m"), self.now)
        if accepted:
            assert not wrong_term
            assert self.cm.sessions[sid].state is State.OPEN

    @rule(data=st.data())
    def keepalive(self, data: st.DataObject) -> None:
        self.cm.session_manager.on_keepalive(
            SessionKeepAlive(TERM, self._session_id(data)), CLIENT, self.now
        )

    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        self.cm.session_manager.on_close_request(
            SessionCloseRequest(TERM, self._session_id(data)), CLIENT, self.now
        )

    @rule(data=st.data())
    def service_close(self, data: st.DataObject) -> None:
        self.cm.session_manager.on_service_close(self._session_id(data), self.now)

    @rule(data=st.data())
    def archive_position(self, data: st.DataObject) -> None:
        self.reader.pull()
        boundaries = [p for p, _ in self.reader.entries if p > self.cm.log.archive_position]
        if boundaries:
            self.cm.on_archive_position(data.draw(st.sampled_from(boundaries)))

    # ---- invariants

    @invariant()
    def log_is_consistent(self) -> None:
        if not hasattr(self, "cm"):
            return
        self.reader.pull()  # contiguity, whole records, decodable
        entries = self.reader.entries
        previous = -1
        for position, m in entries[self.checked :]:
            assert position > previous
            previous = position
            assert m.timestamp >= self.last_timestamp, "log time never goes backwards"
            self.last_timestamp = m.timestamp
            if isinstance(m, SessionOpenEvent):
                assert m.cluster_session_id not in self.opened, "one open event per session"
                assert m.cluster_session_id in self.egress_ids
                self.opened[m.cluster_session_id] = position
            elif isinstance(m, SessionMessageHeader):
                sid = m.cluster_session_id
                assert sid in self.opened, "message before the session's open event"
                assert sid not in self.closed, "message after the session's close event"
                assert m.leadership_term_id == TERM
            elif isinstance(m, SessionCloseEvent):
                assert m.cluster_session_id in self.opened
                assert m.cluster_session_id not in self.closed
                self.closed.add(m.cluster_session_id)
        self.checked = len(entries)

    @invariant()
    def sessions_match_log(self) -> None:
        if not hasattr(self, "cm"):
            return
        self.log_is_consistent()
        for sid, session in self.cm.sessions.items():
            assert session.cluster_session_id == sid
            if session.state is State.OPEN:
                assert sid in self.opened
                assert sid not in self.closed
        assert set(self.cm.sessions) == set(self.opened) - self.closed
        config = self.cm.config
        assert len(self.cm.sessions) <= self.max_sessions
        assert (
            len(self.cm.session_manager.admission.pending_sessions) <= config.max_pending_sessions
        )
        assert (
            self.cm.commit_position
            <= self.cm.log.archive_position
            <= self.cm.log.published_position
        )

    @invariant()
    def ok_only_after_commit(self) -> None:
        if not hasattr(self, "cm"):
            return
        self.log_is_consistent()
        for sent in self.egress.sent[self.sent_checked :]:
            m = sent.message
            if isinstance(m, SessionEvent) and m.code is EventCode.OK:
                sid = m.cluster_session_id
                assert sid not in self.ok_sent, "OK sent twice"
                self.ok_sent.add(sid)
                assert sid in self.opened
                assert sent.commit_position >= self.opened[sid], "OK before commit"
                assert m.leadership_term_id == TERM
            if isinstance(m, SessionEvent):  # answers go on the connection, to a known id
                assert sent.egress_id in self.egress_ids
        self.sent_checked = len(self.egress.sent)


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_fired_timer_survives_a_step_down_before_its_event_commits() -> None:
    cm, _egress, reader = make(member_count=3)
    cm.timers.schedule(5, 10)
    assert cm.consensus_work(T0) == 1  # TimerEvent appended, not yet committed
    assert [t.correlation_id for t in reader.messages(TimerEvent)] == [5]
    assert len(cm.timers) == 0
    assert cm.timers.snapshot() == [(5, 10)]  # fired-pending still counts
    cm.enter_election(T0 + MS, "test")  # deposed before the event committed
    assert cm.role is Role.FOLLOWER
    assert len(cm.timers) == 1  # live again: the next leader fires it


def test_a_lost_egress_is_redialled_with_a_growing_jittered_back_off() -> None:
    """Was: a failed re-dial reset the wait to nothing, so a client whose egress port
    refused (or accepted and closed) was dialled about a hundred times a second."""
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    now = T0

    def dials() -> int:
        return sum(1 for e, _ in egress.connects() if e == sid)

    gaps = []
    last = now
    cm.session_manager.on_egress_failed(sid)  # the connection is lost
    for _ in range(2000):  # 20 s of slow ticks, every re-dial failing at once
        now += 10 * MS
        cm.session_manager.on_keepalive(SessionKeepAlive(TERM, sid), CLIENT, now)  # client alive
        n = dials()
        cm.on_slow_tick(now)
        if dials() > n:
            gaps.append(now - last)
            last = now
            cm.session_manager.on_egress_failed(sid)
    assert 10 <= len(gaps) <= 25  # not 2,000
    assert max(gaps) <= 2 * SECOND + 10 * MS
    assert gaps[-1] >= SECOND  # the wait grew to the upper half of its 2 s cap
    # a connection that stays up resets the back-off: the next loss re-dials soon
    cm.session_manager.on_egress_connected(sid)
    for _ in range(300):
        now += 10 * MS
        cm.session_manager.on_keepalive(SessionKeepAlive(TERM, sid), CLIENT, now)
        cm.on_slow_tick(now)
    assert cm.sessions[sid].egress_backoff_ns == 0
    cm.session_manager.on_egress_failed(sid)
    n = dials()
    for _ in range(3):
        now += 10 * MS
        cm.on_slow_tick(now)
    assert dials() == n + 1


def test_the_authenticator_forgets_a_pending_session_however_it_ends() -> None:
    auth = SharedSecretAuthenticator({b"app": b"s"})
    cm, _egress, _reader = make(authenticator=auth)
    source = IngressSource(5, "127.0.0.1")
    connect(cm, T0, credentials=b"app", source=source)
    cm.on_slow_tick(T0 + MS)  # challenged, never answered
    assert auth.pending_state == 1
    cm.session_manager.on_source_closed(source)  # its connection closed
    assert auth.pending_state == 0
    connect(cm, T0, credentials=b"app", source=IngressSource(6, "127.0.0.1"))
    cm.on_slow_tick(T0 + MS)
    assert auth.pending_state == 1
    cm.on_slow_tick(T0 + cm.config.session_timeout_ns + 2 * MS)  # it timed out
    assert cm.session_manager.admission.pending_sessions == []
    assert auth.pending_state == 0


def own_connection_session(cm: ConsensusModule, reader: LogReader, now: int) -> int:
    """A session whose egress rides its ingress connection (empty response channel)."""
    sid = cm.session_manager.next_session_id
    cm.on_message(CLIENT, now)
    cm.on_message(SessionConnectRequest(50, 7, pv.PROTOCOL_VERSION, "", b""), now)
    cm.on_slow_tick(now + MS)
    commit_all(cm, reader)
    assert cm.sessions[sid].state is State.OPEN
    return sid


def test_a_session_on_its_own_connection_hears_from_its_leader_every_second() -> None:
    cm, egress, reader = make()
    sid = own_connection_session(cm, reader, T0)
    egress_calls = [c for c in egress.calls if c[0] in ("attach", "connect")]
    assert egress_calls == [("attach", sid, CLIENT)]  # nobody dialled
    heartbeats = []
    for second in range(1, 6):
        cm.on_slow_tick(T0 + second * SECOND)
        cm.session_manager.on_keepalive(SessionKeepAlive(TERM, sid), CLIENT, T0 + second * SECOND)
        heartbeats = egress.messages(sid, NewLeaderEvent)
    assert 4 <= len(heartbeats) <= 6
    assert {h.leader_member_id for h in heartbeats} == {cm.config.member_id}


def test_a_member_that_stops_leading_redirects_the_clients_connected_to_it() -> None:
    cm, egress, reader = make(member_count=3)
    sid = own_connection_session(cm, reader, T0)
    # another member leads a later term: this one steps down and follows it
    cm.on_consensus_message(CommitPosition(TERM + 1, 0, 2), T0 + SECOND)
    assert cm.role is Role.FOLLOWER
    (redirect,) = [e for e in egress.events(sid) if e.code is EventCode.REDIRECT]
    assert redirect.leader_member_id == 2
    assert redirect.leadership_term_id == TERM + 1
    assert redirect.detail == ENDPOINTS
    assert cm.sessions[sid].source is None  # released: the client resumes at member 2


def test_a_stranger_cannot_resume_a_session_it_does_not_hold() -> None:
    cm, egress, reader = make()
    sid = open_session(cm, reader, T0)
    stranger = IngressSource(66, "127.0.0.9")
    for secret in (b"", b"x" * 16, b"y" * 10_000):  # none, guessed, huge
        cm.on_message(stranger, T0 + MS)
        cm.on_message(SessionResumeRequest(9, sid, pv.PROTOCOL_VERSION, secret), T0 + MS)
        event = egress.events(sid)[-1]
        assert event.code is EventCode.ERROR
        assert event.detail == "session secret rejected"
    assert cm.counters.rejected_resumes == 3
    # still not its session: its messages are refused, the holder's are not
    assert not cm.on_ingress_message(msg(cm, sid), T0 + 2 * MS)
    assert cm.sessions[sid].source is CLIENT
    # a session that does not exist (or is closed) is CLOSED, whoever asks
    cm.on_message(SessionResumeRequest(10, sid + 50, pv.PROTOCOL_VERSION, b"x"), T0 + 3 * MS)
    (closed,) = egress.events(sid + 50)
    assert closed.code is EventCode.CLOSED
    cm.on_message(CLIENT, T0 + 4 * MS)
    assert cm.on_ingress_message(msg(cm, sid), T0 + 4 * MS)


def test_an_ok_that_could_not_be_queued_is_retried_on_the_sessions_own_connection() -> None:
    """The OK found no room when its open event committed; the slow tick sends it again,
    also for a session whose egress rides its ingress connection (the once-a-second
    NewLeaderEvent used to shadow the retry there: the client never got its OK)."""
    cm, egress, reader = make()
    sid = cm.session_manager.next_session_id
    cm.on_message(CLIENT, T0)
    cm.on_message(SessionConnectRequest(50, 7, pv.PROTOCOL_VERSION, "", b""), T0)
    cm.on_slow_tick(T0 + MS)
    egress.accept = False  # the connection's backlog is full
    commit_all(cm, reader)
    assert not [e for e in egress.events(sid) if e.code is EventCode.OK]
    assert cm.sessions[sid].has_open_event_pending
    egress.accept = True
    for tick in range(1, 30):
        cm.on_slow_tick(T0 + tick * 100 * MS)
    (ok,) = [e for e in egress.events(sid) if e.code is EventCode.OK]
    assert ok.cluster_session_id == sid
    assert not cm.sessions[sid].has_open_event_pending


def test_suspended_leader_appends_nothing_until_resumed() -> None:
    """SUSPEND quiesces, as Aeron gates on ACTIVE (issue 32): session opens, session
    timeouts, timers and service messages all wait; RESUME releases them."""
    cm, _, reader = make(session_timeout_ns=2 * SECOND)
    idle = open_session(cm, reader, T0)
    ok, _ = cm.control.request(ClusterAction.SUSPEND, T0)
    assert ok
    commit_all(cm, reader)
    suspended_at = cm.log.published_position
    newcomer = connect(cm, T0 + MS, correlation_id=102, source=IngressSource(9, "127.0.0.1"))
    cm.timers.schedule(7, cm.log.cluster_time(T0) + 10)
    cm.service_messages.enqueue(b"from the service")
    for tick in range(1, 60):  # 6 s: three session timeouts, every timer due
        cm.on_slow_tick(T0 + tick * 100 * MS)
    assert cm.log.published_position == suspended_at  # not one entry of any kind
    assert cm.sessions[idle].state is State.OPEN
    assert newcomer not in cm.sessions
    ok, _ = cm.control.request(ClusterAction.RESUME, T0 + 6 * SECOND)
    assert ok
    cm.on_slow_tick(T0 + 6 * SECOND + 10 * MS)
    commit_all(cm, reader)
    kinds = {type(m) for m in reader.messages()}
    assert {SessionOpenEvent, SessionCloseEvent, TimerEvent, SessionMessageHeader} <= kinds
    closes = {m.cluster_session_id: m.close_reason for m in reader.messages(SessionCloseEvent)}
    assert closes == {idle: CloseReason.TIMEOUT}
    assert newcomer in cm.sessions


# ---------------------------------------------------------------------- SHUTDOWN, ABORT met later


@pytest.mark.parametrize("terminating", ["shutdown", "abort"])
def test_a_terminating_action_stops_a_member_only_live_and_in_its_own_term(
    terminating: str,
) -> None:
    """An admin action acts on the cluster it was given to, once (issue 41): met again at
    start-up, catching up in a later term, or after a restart elected a new term, it
    does not stop the member."""
    cm, _, reader = make()
    if terminating == "shutdown":
        ok, _ = cm.control.request(ClusterAction.SNAPSHOT, T0, terminate=True)
    else:
        ok, _ = cm.control.request(ClusterAction.ABORT, T0)
    assert ok
    commit_all(cm, reader)
    (action,) = reader.messages(ClusterActionRequest)
    position = cm.log.published_position
    assert action.leadership_term_id == TERM
    control = cm.control
    # live, in the term it was appended in: it stops this member
    assert control.terminates(action, position, replayed_to=0) == ""
    # replayed at start-up: it happened before this start
    assert "before this start" in control.terminates(action, position, replayed_to=position)
    # a member in a later term (caught up after the cluster restarted, a replaced disk)
    follower, _, _ = make(role=Role.FOLLOWER)
    follower.leadership_term_id = TERM + 1
    why = follower.control.terminates(action, position, replayed_to=0)
    assert f"put on the log in term {TERM} and this member is in term {TERM + 1}" in why
    # the same term on a follower that hears it live: it stops too
    follower.leadership_term_id = TERM
    assert follower.control.terminates(action, position, replayed_to=0) == ""
