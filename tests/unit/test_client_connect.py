"""The client's sans-IO connect state machine, endpoint parsing and credentials (no sockets).

With a clock the machine does not wait on a member that does not answer (issue 36): the
tests of that drive it with :class:`Clock`, a clock they set by hand."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client import (
    AuthenticationRejectedError,
    ClusterClientError,
    ConnectState,
    ConnectTimeoutError,
    CredentialsSupplier,
    SessionClosedError,
    SessionRejectedError,
    StaticCredentials,
)
from client._connect import (
    ANSWER_TIMEOUT,
    ASK_AGAIN_CAP,
    AsyncConnect,
    ConnectEach,
    ConnectIngress,
    Done,
    DropIngress,
    Fail,
    SendMessage,
)
from client._credentials import as_credentials_supplier
from client._endpoints import Endpoint, format_endpoints, parse_endpoints, parse_host_port
from cluster.protocol import EventCode
from cluster.protocol.egress import AdminResponse, Challenge, NewLeaderEvent, SessionEvent
from cluster.protocol.enums import AdminRequestType, AdminResponseCode
from cluster.protocol.ingress import ChallengeResponse, SessionConnectRequest, SessionMessageHeader
from cluster.protocol.version import PROTOCOL_VERSION

CHANNEL = "127.0.0.1:40000"
ENDPOINTS = {0: Endpoint("10.0.0.1", 9010), 1: Endpoint("10.0.0.2", 9010), 2: Endpoint("h3", 9)}


class Supplier(CredentialsSupplier):
    def __init__(self) -> None:
        self.challenges: list[bytes] = []

    def encoded_credentials(self) -> bytes:
        return b"creds"

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        self.challenges.append(encoded_challenge)
        return b"answer:" + encoded_challenge


def event(
    correlation_id: int,
    code: EventCode,
    *,
    session: int = 5,
    term: int = 2,
    leader: int = 1,
    detail: str = "",
) -> SessionEvent:
    return SessionEvent(session, correlation_id, term, leader, code, PROTOCOL_VERSION, detail)


def machine(supplier: CredentialsSupplier | None = None) -> AsyncConnect:
    return AsyncConnect(
        ENDPOINTS, supplier or Supplier(), itertools.count(100).__next__, response_channel=None
    )


def sent_request(m: AsyncConnect, member_id: int = 1) -> SessionConnectRequest:
    """Drive ``m`` up to a sent connect request to ``member_id``; return the request."""
    if m.state is ConnectState.CREATE_EGRESS_SUBSCRIPTION:
        m.on_egress_bound(CHANNEL)
    (action,) = m.on_ingress_connected(member_id)
    assert isinstance(action, SendMessage)
    assert action.member_id == member_id
    assert isinstance(action.message, SessionConnectRequest)
    assert m.on_sent() == []
    assert m.state is ConnectState.POLL_RESPONSE
    return action.message


# ---------------------------------------------------------------------------- happy path


def test_happy_path() -> None:
    m = machine()
    assert m.state is ConnectState.CREATE_EGRESS_SUBSCRIPTION
    assert m.on_egress_bound(CHANNEL) == [ConnectIngress(ENDPOINTS)]
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED

    actions = m.on_ingress_connected(1)
    assert actions == [
        SendMessage(
            1,
            SessionConnectRequest(
                correlation_id=100,
                response_stream_id=0,
                version=PROTOCOL_VERSION,
                response_channel=CHANNEL,
                encoded_credentials=b"creds",
            ),
        )
    ]
    assert m.state is ConnectState.SEND_MESSAGE
    assert m.correlation_id == 100
    assert m.member_id == 1
    assert m.on_sent() == []
    assert m.state is ConnectState.POLL_RESPONSE

    (done,) = m.on_egress_message(event(100, EventCode.OK, session=5, term=2, leader=1))
    assert isinstance(done, Done)
    assert done.result.cluster_session_id == 5
    assert done.result.leadership_term_id == 2
    assert done.result.leader_member_id == 1
    assert done.result.member_id == 1
    assert done.result.endpoints == ENDPOINTS
    assert m.result == done.result
    assert m.state is ConnectState.CONCLUDE_CONNECT
    m.on_concluded()
    assert m.state is ConnectState.DONE


def test_response_channel_from_constructor() -> None:
    m = AsyncConnect(ENDPOINTS, StaticCredentials(), itertools.count(1).__next__, CHANNEL)
    m.on_egress_bound()
    (action,) = m.on_ingress_connected(0)
    assert isinstance(action, SendMessage)
    assert isinstance(action.message, SessionConnectRequest)
    assert action.message.response_channel == CHANNEL
    assert action.message.encoded_credentials == b""


def test_egress_bound_twice_is_a_programming_error() -> None:
    m = machine()
    m.on_egress_bound(CHANNEL)
    with pytest.raises(RuntimeError, match="on_egress_bound"):
        m.on_egress_bound(CHANNEL)


def test_needs_endpoints_and_a_channel() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        AsyncConnect({}, Supplier(), itertools.count().__next__)
    with pytest.raises(ValueError, match="response channel"):
        machine().on_egress_bound()


def test_only_the_first_ingress_connection_is_used() -> None:
    m = machine()
    sent_request(m, member_id=2)
    assert m.on_ingress_connected(0) == []
    assert m.on_ingress_connected(1) == []
    assert m.member_id == 2


def test_connection_to_a_member_not_targeted_is_ignored() -> None:
    m = machine()
    m.on_egress_bound(CHANNEL)
    assert m.on_ingress_connected(7) == []
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED


def test_response_before_on_sent_is_accepted() -> None:
    m = machine()
    m.on_egress_bound(CHANNEL)
    m.on_ingress_connected(0)
    assert m.state is ConnectState.SEND_MESSAGE
    (done,) = m.on_egress_message(event(100, EventCode.OK))
    assert isinstance(done, Done)


# ---------------------------------------------------------------------------- challenge


def test_challenge_then_ok() -> None:
    supplier = Supplier()
    m = machine(supplier)
    request = sent_request(m)
    actions = m.on_egress_message(Challenge(request.correlation_id, 5, b"nonce"))
    assert actions == [
        SendMessage(1, ChallengeResponse(request.correlation_id, 5, b"answer:nonce"))
    ]
    assert supplier.challenges == [b"nonce"]
    assert m.state is ConnectState.SEND_MESSAGE
    m.on_sent()
    assert m.state is ConnectState.POLL_RESPONSE
    # A second round of challenge is answered too.
    (again,) = m.on_egress_message(Challenge(request.correlation_id, 5, b"more"))
    assert isinstance(again, SendMessage)
    m.on_sent()
    (done,) = m.on_egress_message(event(request.correlation_id, EventCode.OK))
    assert isinstance(done, Done)


def test_challenge_with_foreign_correlation_id_is_ignored() -> None:
    supplier = Supplier()
    m = machine(supplier)
    request = sent_request(m)
    assert m.on_egress_message(Challenge(request.correlation_id + 1, 5, b"x")) == []
    assert supplier.challenges == []
    assert m.state is ConnectState.POLL_RESPONSE


# ---------------------------------------------------------------------------- redirect


def test_redirect_to_leader() -> None:
    """The REDIRECT names the leader; the client dials it where the application said it
    is (a proxy's port, say), not where the members advertise it (issue 41)."""
    m = machine()
    first = sent_request(m, member_id=0)
    detail = "0=10.0.0.1:9010,1=10.0.0.2:9011,2=h3:9"
    actions = m.on_egress_message(event(first.correlation_id, EventCode.REDIRECT, detail=detail))
    assert actions == [ConnectIngress({1: Endpoint("10.0.0.2", 9010)})]
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED
    assert m.endpoints == ENDPOINTS
    assert m.targets == {1: Endpoint("10.0.0.2", 9010)}
    assert m.on_ingress_connected(0) == []  # a late connection to a follower

    second = sent_request(m, member_id=1)
    assert second.correlation_id != first.correlation_id
    # Late answers to the first request are ignored.
    assert m.on_egress_message(event(first.correlation_id, EventCode.OK)) == []
    assert m.on_egress_message(event(first.correlation_id, EventCode.REDIRECT)) == []
    (done,) = m.on_egress_message(event(second.correlation_id, EventCode.OK, leader=1))
    assert isinstance(done, Done)
    assert done.result.member_id == 1
    assert done.result.endpoints[1] == Endpoint("10.0.0.2", 9010)


def test_a_redirect_fills_in_the_members_the_application_did_not_give() -> None:
    m = AsyncConnect({0: Endpoint("proxy", 7000)}, Supplier(), itertools.count(100).__next__)
    first = sent_request(m, member_id=0)
    detail = "0=10.0.0.1:9010,1=10.0.0.2:9011"
    actions = m.on_egress_message(event(first.correlation_id, EventCode.REDIRECT, detail=detail))
    assert actions == [ConnectIngress({1: Endpoint("10.0.0.2", 9011)})]
    assert m.endpoints == {0: Endpoint("proxy", 7000), 1: Endpoint("10.0.0.2", 9011)}


@pytest.mark.parametrize("detail", ["", "garbage", "0=nohost"])
def test_redirect_without_usable_detail_keeps_known_endpoints(detail: str) -> None:
    m = machine()
    request = sent_request(m, member_id=0)
    actions = m.on_egress_message(event(request.correlation_id, EventCode.REDIRECT, detail=detail))
    assert actions == [ConnectIngress({1: ENDPOINTS[1]})]
    assert m.endpoints == ENDPOINTS


def test_redirect_to_unknown_leader_tries_everyone() -> None:
    m = machine()
    request = sent_request(m, member_id=0)
    actions = m.on_egress_message(event(request.correlation_id, EventCode.REDIRECT, leader=9))
    assert actions == [ConnectIngress(ENDPOINTS)]


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        (EventCode.ERROR, SessionRejectedError),
        (EventCode.AUTHENTICATION_REJECTED, AuthenticationRejectedError),
        (EventCode.CLOSED, SessionClosedError),
    ],
)
def test_refusals(code: EventCode, error_type: type[ClusterClientError]) -> None:
    m = machine()
    request = sent_request(m)
    (fail,) = m.on_egress_message(event(request.correlation_id, code, detail="why"))
    assert isinstance(fail, Fail)
    assert type(fail.error) is error_type
    assert m.error is fail.error
    assert m.state is ConnectState.DONE
    assert "why" in str(fail.error)
    # Nothing more happens after the end.
    assert m.on_egress_message(event(request.correlation_id, EventCode.OK)) == []
    assert m.on_ingress_connected(1) == []


def test_session_rejected_detail() -> None:
    m = machine()
    request = sent_request(m)
    detail = "concurrent session limit"
    (fail,) = m.on_egress_message(event(request.correlation_id, EventCode.ERROR, detail=detail))
    assert isinstance(fail, Fail)
    assert isinstance(fail.error, SessionRejectedError)
    assert fail.error.detail == detail


# ---------------------------------------------------------------------------- ignored input


@pytest.mark.parametrize(
    "message",
    [
        SessionMessageHeader(2, 5, 0, b"app"),
        NewLeaderEvent(3, 5, 2, "0=a:1"),
        AdminResponse(5, 100, AdminRequestType.SNAPSHOT, AdminResponseCode.OK),
        object(),
    ],
)
def test_other_messages_are_ignored(message: Any) -> None:
    m = machine()
    sent_request(m)
    assert m.on_egress_message(message) == []
    assert m.state is ConnectState.POLL_RESPONSE


def test_messages_before_a_request_is_sent_are_ignored() -> None:
    m = machine()
    assert m.on_egress_message(event(100, EventCode.OK)) == []
    m.on_egress_bound(CHANNEL)
    assert m.on_egress_message(event(100, EventCode.OK)) == []
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED


@given(
    correlation_id=st.integers(-(2**63), 2**63 - 1).filter(lambda c: c != 100),
    code=st.sampled_from(EventCode),
    challenge=st.booleans(),
)
def test_foreign_correlation_ids_never_change_the_state(
    correlation_id: int, code: EventCode, challenge: bool
) -> None:
    m = machine()
    request = sent_request(m)
    assert request.correlation_id == 100
    message: Any = Challenge(correlation_id, 5, b"c") if challenge else event(correlation_id, code)
    assert m.on_egress_message(message) == []
    assert m.state is ConnectState.POLL_RESPONSE
    assert m.correlation_id == 100


# ---------------------------------------------------------------------------- lost ingress


def test_lost_ingress_starts_over_with_a_new_request() -> None:
    m = machine()
    first = sent_request(m, member_id=0)
    assert m.on_ingress_lost(2) == []  # not the one in use
    assert m.on_ingress_lost(0) == [ConnectIngress(ENDPOINTS)]
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED
    assert m.on_egress_message(event(first.correlation_id, EventCode.OK)) == []
    second = sent_request(m, member_id=2)
    assert second.correlation_id != first.correlation_id


def test_lost_ingress_after_redirect_retries_the_leader_only() -> None:
    m = machine()
    request = sent_request(m, member_id=0)
    m.on_egress_message(event(request.correlation_id, EventCode.REDIRECT, leader=2))
    sent_request(m, member_id=2)
    assert m.on_ingress_lost(2) == [ConnectIngress({2: ENDPOINTS[2]})]


# ---------------------------------------------------------------------------- a silent member


class Clock:
    """A clock the test sets: ``clock.now = 1.5``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(clock: Clock, supplier: CredentialsSupplier | None = None) -> AsyncConnect:
    """A machine that asks the other members when one does not answer."""
    return AsyncConnect(
        ENDPOINTS, supplier or Supplier(), itertools.count(100).__next__, CHANNEL, clock=clock
    )


def ask(m: AsyncConnect, member_id: int) -> SessionConnectRequest:
    """Report a connection to ``member_id``; its request goes out; return the request."""
    (action,) = m.on_ingress_connected(member_id)
    assert isinstance(action, SendMessage)
    assert action.member_id == member_id
    assert isinstance(action.message, SessionConnectRequest)
    assert m.on_sent(member_id) == []
    return action.message


def silent_first(clock: Clock, member_id: int = 0) -> tuple[AsyncConnect, SessionConnectRequest]:
    """``member_id`` won the race and has not answered for ``ANSWER_TIMEOUT``: the machine
    has just asked the others for a connection each."""
    m = timed(clock)
    m.on_egress_bound()
    first = ask(m, member_id)
    assert m.deadline == ANSWER_TIMEOUT
    clock.now = ANSWER_TIMEOUT
    others = {i: e for i, e in ENDPOINTS.items() if i != member_id}
    assert m.on_timer() == [ConnectEach(others)]
    assert m.dialling == others
    return m, first


def test_without_a_clock_the_machine_waits_on_its_one_request() -> None:
    m = machine()
    sent_request(m, member_id=0)
    assert m.deadline is None
    assert m.on_timer() == []
    assert m.on_ingress_connected(1) == []


def test_a_prompt_answer_asks_nobody_else() -> None:
    clock = Clock()
    m = timed(clock)
    m.on_egress_bound()
    assert m.deadline is None  # nothing sent yet
    assert len(m.on_ingress_connected(0)) == 1  # the request
    assert m.deadline is None  # not written yet: the clock starts at on_sent
    clock.now = 0.2
    m.on_sent(0)
    assert m.deadline == pytest.approx(0.2 + ANSWER_TIMEOUT)
    clock.now = 0.6
    assert m.on_timer() == []  # early: nothing to do
    (done,) = m.on_egress_message(event(100, EventCode.OK, leader=0))
    assert isinstance(done, Done)
    assert done.result.member_id == 0
    assert m.deadline is None
    clock.now = 10.0
    assert m.on_timer() == []


def test_a_silent_member_gets_the_others_asked_each_with_a_request_of_its_own() -> None:
    clock = Clock()
    m, first = silent_first(clock, member_id=0)
    assert m.state is ConnectState.POLL_RESPONSE
    assert m.on_timer() == []  # asked already: not again
    second = ask(m, 2)
    third = ask(m, 1)
    ids = {first.correlation_id, second.correlation_id, third.correlation_id}
    assert len(ids) == 3
    assert m.attempts == {0: 100, 2: 101, 1: 102}
    assert m.dialling == {}
    assert m.on_ingress_connected(1) == []  # one request per member
    # The follower says: member 1 leads.  It has a request already: only drop the follower.
    assert m.on_egress_message(event(second.correlation_id, EventCode.REDIRECT, leader=1)) == [
        DropIngress(2)
    ]
    (done,) = m.on_egress_message(event(third.correlation_id, EventCode.OK, leader=1))
    assert isinstance(done, Done)
    assert done.result.member_id == 1
    assert m.member_id == 1
    assert m.state is ConnectState.CONCLUDE_CONNECT
    # The silent member wakes up: whatever it says now is ignored.
    for late in (
        event(first.correlation_id, EventCode.OK, session=9, leader=0),
        event(first.correlation_id, EventCode.REDIRECT, leader=1),
        event(first.correlation_id, EventCode.ERROR, detail="late"),
        Challenge(first.correlation_id, 9, b"late"),
    ):
        assert m.on_egress_message(late) == []
    assert m.on_ingress_lost(0) == []
    assert m.on_ingress_connected(0) == []
    assert m.on_timer() == []
    assert m.result is done.result
    m.on_concluded()
    assert m.state is ConnectState.DONE


def test_the_silent_member_answering_first_wins() -> None:
    clock = Clock()
    m, first = silent_first(clock, member_id=1)
    other = ask(m, 0)
    (done,) = m.on_egress_message(event(first.correlation_id, EventCode.OK, leader=1))
    assert isinstance(done, Done)
    assert done.result.member_id == 1
    assert m.on_egress_message(event(other.correlation_id, EventCode.OK, session=6)) == []


def test_a_late_redirect_from_the_silent_member_ends_its_attempt_only() -> None:
    supplier = Supplier()
    clock = Clock()
    m = timed(clock, supplier)
    m.on_egress_bound()
    first = ask(m, 0)
    clock.now = 1.0
    m.on_timer()
    leader = ask(m, 1)
    (answer,) = m.on_egress_message(Challenge(leader.correlation_id, 5, b"nonce"))
    assert answer == SendMessage(1, ChallengeResponse(leader.correlation_id, 5, b"answer:nonce"))
    assert m.state is ConnectState.SEND_MESSAGE
    # The paused member wakes and redirects to the leader, which is in the middle of it.
    assert m.on_egress_message(event(first.correlation_id, EventCode.REDIRECT, leader=1)) == [
        DropIngress(0)
    ]
    assert m.attempts == {1: leader.correlation_id}
    assert m.dialling == {2: ENDPOINTS[2]}  # still wanted: it was asked too
    assert m.targets == {1: ENDPOINTS[1]}
    m.on_sent(1)
    assert m.state is ConnectState.POLL_RESPONSE
    (done,) = m.on_egress_message(event(leader.correlation_id, EventCode.OK))
    assert isinstance(done, Done)
    assert m.dialling == {}


def test_a_challenge_answered_restarts_the_answer_clock() -> None:
    clock = Clock()
    m = timed(clock)
    m.on_egress_bound()
    request = ask(m, 1)
    clock.now = 0.4
    m.on_egress_message(Challenge(request.correlation_id, 5, b"n"))
    assert m.deadline is None  # the response is not written yet
    m.on_sent(1)
    assert m.deadline == pytest.approx(0.4 + ANSWER_TIMEOUT)
    clock.now = 0.8
    assert m.on_timer() == []
    clock.now = 0.4 + ANSWER_TIMEOUT
    assert m.on_timer() == [ConnectEach({0: ENDPOINTS[0], 2: ENDPOINTS[2]})]


def test_a_redirect_to_a_leader_not_asked_yet_asks_it_too() -> None:
    clock = Clock()
    m, _ = silent_first(clock, member_id=0)
    follower = ask(m, 2)
    # member 1 is still being dialled: no second connector to it
    assert m.on_egress_message(event(follower.correlation_id, EventCode.REDIRECT, leader=1)) == [
        DropIngress(2)
    ]
    assert m.dialling == {1: ENDPOINTS[1]}
    m.on_ingress_connected(1)
    m.on_sent(1)
    assert m.on_ingress_connected(2) == []  # no longer wanted
    request = m.attempts[1]
    # member 1 does not lead either: it names one the client did not know of
    detail = "0=10.0.0.1:9010,1=10.0.0.2:9010,2=h3:9,3=h4:9"
    actions = m.on_egress_message(event(request, EventCode.REDIRECT, leader=3, detail=detail))
    assert actions == [DropIngress(1), ConnectEach({3: Endpoint("h4", 9)})]
    assert m.endpoints[3] == Endpoint("h4", 9)
    third = ask(m, 3)
    (done,) = m.on_egress_message(event(third.correlation_id, EventCode.OK, leader=3))
    assert isinstance(done, Done)
    assert done.result.member_id == 3


def test_a_redirect_to_an_unknown_leader_with_others_in_flight_waits_for_the_timer() -> None:
    clock = Clock()
    m, _ = silent_first(clock, member_id=0)
    follower = ask(m, 2)
    actions = m.on_egress_message(event(follower.correlation_id, EventCode.REDIRECT, leader=9))
    assert actions == [DropIngress(2)]
    assert m.targets == ENDPOINTS


def test_a_lost_attempt_with_others_in_flight_just_ends() -> None:
    clock = Clock()
    m, _ = silent_first(clock, member_id=0)
    ask(m, 1)
    ask(m, 2)
    assert m.on_ingress_lost(1) == []
    assert m.on_ingress_lost(0) == []
    assert m.attempts == {2: 102}
    assert m.on_ingress_lost(2) == [ConnectIngress(ENDPOINTS)]  # the last one: start over
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED
    assert m.deadline is None


def test_an_error_from_any_attempt_ends_the_connect() -> None:
    clock = Clock()
    m, first = silent_first(clock, member_id=0)
    leader = ask(m, 1)
    (fail,) = m.on_egress_message(event(leader.correlation_id, EventCode.ERROR, detail="limit"))
    assert isinstance(fail, Fail)
    assert m.state is ConnectState.DONE
    assert m.dialling == {}
    assert m.attempts == {}
    assert m.on_egress_message(event(first.correlation_id, EventCode.OK)) == []
    assert m.on_ingress_connected(2) == []


def test_a_silent_leader_gets_the_followers_asked_again_less_and_less_often() -> None:
    clock = Clock()
    m = timed(clock)
    m.on_egress_bound()
    follower = ask(m, 0)
    assert m.on_egress_message(event(follower.correlation_id, EventCode.REDIRECT, leader=1)) == [
        ConnectIngress({1: ENDPOINTS[1]})
    ]
    clock.now = 0.01
    ask(m, 1)  # the leader is paused: it never answers
    asked_at: dict[int, list[float]] = {0: [0.0], 2: []}
    for _ in range(40):  # the followers keep naming the paused leader
        deadline = m.deadline
        assert deadline is not None
        clock.now = deadline
        for action in m.on_timer():
            assert isinstance(action, ConnectEach)
            for member_id in action.members:
                asked_at[member_id].append(clock.now)
                request = ask(m, member_id)
                redirect = event(request.correlation_id, EventCode.REDIRECT, leader=1)
                assert m.on_egress_message(redirect) == [DropIngress(member_id)]
        assert m.attempts == {1: m.correlation_id}
    assert asked_at[2][0] == pytest.approx(0.01 + ANSWER_TIMEOUT)
    for member_id, times in asked_at.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        expected = [min(ASK_AGAIN_CAP, ANSWER_TIMEOUT * 2**i) for i in range(len(gaps))]
        if member_id == 0:  # asked once at the start, then after its REDIRECT's timeout
            assert gaps[0] == pytest.approx(0.01 + ANSWER_TIMEOUT)
            gaps, expected = gaps[1:], expected[1:]
        assert gaps == pytest.approx(expected)
        assert max(gaps) == pytest.approx(ASK_AGAIN_CAP)
    # The election is over: a follower names the new leader, which grants the session.
    clock.now = m.deadline or 0.0
    (each,) = m.on_timer()
    assert isinstance(each, ConnectEach)
    member_id = next(iter(each.members))
    request = ask(m, member_id)
    new_leader = 2 if member_id == 0 else 0
    actions = m.on_egress_message(
        event(request.correlation_id, EventCode.REDIRECT, leader=new_leader, term=3)
    )
    assert actions == [DropIngress(member_id), ConnectEach({new_leader: ENDPOINTS[new_leader]})]
    granted = ask(m, new_leader)
    (done,) = m.on_egress_message(event(granted.correlation_id, EventCode.OK, leader=new_leader))
    assert isinstance(done, Done)
    assert done.result.member_id == new_leader


def test_with_every_member_asked_and_silent_nothing_more_is_done() -> None:
    clock = Clock()
    m, _ = silent_first(clock, member_id=0)
    ask(m, 1)
    ask(m, 2)
    clock.now = 5.0
    assert m.on_timer() == []
    assert m.deadline is None  # until one of them answers, or its connection breaks


def test_answer_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="answer_timeout"):
        AsyncConnect(
            ENDPOINTS, Supplier(), itertools.count().__next__, clock=Clock(), answer_timeout=0
        )


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[str, int, Any]]:
    steps = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["connect", "sent", "lost", "answer", "tick"]))
        member = draw(st.integers(0, 3))
        if kind == "answer":
            extra: Any = draw(
                st.sampled_from(
                    [EventCode.OK, EventCode.REDIRECT, EventCode.ERROR, "challenge", "stale"]
                )
            )
        elif kind == "tick":
            extra = draw(st.floats(0, 3))
        else:
            extra = None
        steps.append((kind, member, extra))
    return steps


@given(scripts(), st.integers(0, 3))
def test_any_order_of_events_keeps_one_request_per_member_and_one_session(
    script: list[tuple[str, int, Any]], leader: int
) -> None:
    """Whatever happens in whatever order: a member never has two requests in flight,
    every request has a correlation id of its own, only a request in flight is answered,
    and the handshake ends once, with the session of the first OK."""
    clock = Clock()
    m = timed(clock)
    m.on_egress_bound()
    in_flight: dict[int, int] = {}  # as the actions tell it
    used: set[int] = set()
    ended: list[Any] = []
    for kind, member, extra in script:
        if kind == "connect":
            actions = m.on_ingress_connected(member)
        elif kind == "sent":
            actions = m.on_sent(member)
        elif kind == "lost":
            actions = m.on_ingress_lost(member)
            in_flight.pop(member, None)
        elif kind == "tick":
            clock.now += extra
            actions = m.on_timer()
        else:
            correlation_id = in_flight.get(member, 10**6)
            if extra == "challenge":
                message: Any = Challenge(correlation_id, 5, b"c")
            elif extra == "stale":
                message = event(min(used, default=1) - 1, EventCode.OK)
            else:
                message = event(correlation_id, extra, session=member, leader=leader)
            actions = m.on_egress_message(message)
            if extra is EventCode.REDIRECT and member in in_flight and not ended:
                in_flight.pop(member)
        for action in actions:
            assert not ended, "nothing after the end"
            if isinstance(action, SendMessage) and isinstance(
                action.message, SessionConnectRequest
            ):
                assert action.member_id not in in_flight
                assert action.message.correlation_id not in used
                used.add(action.message.correlation_id)
                in_flight[action.member_id] = action.message.correlation_id
            elif isinstance(action, SendMessage):
                assert in_flight.get(action.member_id) == action.message.correlation_id
            elif isinstance(action, DropIngress):
                assert action.member_id not in in_flight  # its REDIRECT ended it
            elif isinstance(action, ConnectIngress):
                in_flight.clear()
            elif isinstance(action, Done | Fail):
                ended.append(action)
        assert m.attempts == (in_flight if not ended else m.attempts)
        assert set(m.dialling).isdisjoint(m.attempts)
    if ended and isinstance(ended[0], Done):
        assert ended[0].result.cluster_session_id == ended[0].result.member_id
        assert m.state is ConnectState.CONCLUDE_CONNECT


# ---------------------------------------------------------------------------- endpoints


def test_parse_endpoints() -> None:
    assert parse_endpoints(" 0=a:1 , 2=[::1]:9010,1=b.example:65535") == {
        0: Endpoint("a", 1),
        2: Endpoint("::1", 9010),
        1: Endpoint("b.example", 65535),
    }
    assert format_endpoints(parse_endpoints("0=a:1,2=[::1]:9")) == "0=a:1,2=[::1]:9"
    assert str(Endpoint("::1", 5)) == "[::1]:5"
    assert parse_host_port("h:0", allow_port_zero=True) == Endpoint("h", 0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("0=a:1,", "entry 1 is empty"),
        ("a:1", "member_id=host:port"),
        ("x=a:1", "member id 'x'"),
        ("-1=a:1", "member id '-1'"),
        ("0=a:1,0=b:2", "appears twice"),
        ("0=a", "expected host:port"),
        ("0=:9", "empty host"),
        ("0=a:port", "not a number"),
        ("0=a:0", "outside 1..65535"),
        ("0=a:70000", "outside 1..65535"),
        ("0=::1:9", "brackets"),
        ("0=[::1:9", "missing ']'"),
        ("0=[::1]9", "':port'"),
    ],
)
def test_parse_endpoints_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_endpoints(text)


def test_parse_endpoints_type_error() -> None:
    with pytest.raises(TypeError):
        parse_endpoints(b"0=a:1")  # type: ignore[arg-type]


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(
    st.dictionaries(
        st.integers(0, 1000),
        st.builds(Endpoint, hosts, st.integers(1, 65535)),
        min_size=1,
        max_size=7,
    )
)
def test_endpoints_round_trip(endpoints: dict[int, Endpoint]) -> None:
    text = format_endpoints(endpoints)
    assert parse_endpoints(text) == endpoints
    assert list(parse_endpoints(text)) == list(endpoints)  # order kept


# ---------------------------------------------------------------------------- credentials, errors


def test_credentials_suppliers() -> None:
    default = as_credentials_supplier(None)
    assert default.encoded_credentials() == b""
    assert default.on_challenge(b"x") == b""
    static = as_credentials_supplier(b"secret")
    assert static.encoded_credentials() == b"secret"
    custom = Supplier()
    assert as_credentials_supplier(custom) is custom
    assert StaticCredentials(b"a", b"b").on_challenge(b"?") == b"b"

    class Duck:  # structural: no need to inherit
        def encoded_credentials(self) -> bytes:
            return b"duck"

        def on_challenge(self, encoded_challenge: bytes) -> bytes:
            return b"quack"

    duck = Duck()
    assert as_credentials_supplier(duck) is duck
    with pytest.raises(TypeError, match="credentials"):
        as_credentials_supplier("text")  # type: ignore[arg-type]


def test_error_hierarchy() -> None:
    assert issubclass(ConnectTimeoutError, TimeoutError)
    assert issubclass(ConnectTimeoutError, ClusterClientError)
    assert SessionClosedError("TIMEOUT").reason == "TIMEOUT"
    assert SessionRejectedError("limit").detail == "limit"
