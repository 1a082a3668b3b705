"""The client's sans-IO connect state machine, endpoint parsing and credentials (no sockets)."""

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
from client._connect import AsyncConnect, ConnectIngress, Done, Fail, SendMessage
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
    m = machine()
    first = sent_request(m, member_id=0)
    detail = "0=10.0.0.1:9010,1=10.0.0.2:9011,2=h3:9"
    actions = m.on_egress_message(event(first.correlation_id, EventCode.REDIRECT, detail=detail))
    assert actions == [ConnectIngress({1: Endpoint("10.0.0.2", 9011)})]
    assert m.state is ConnectState.AWAIT_PUBLICATION_CONNECTED
    assert m.endpoints == parse_endpoints(detail)
    assert m.targets == {1: Endpoint("10.0.0.2", 9011)}
    assert m.on_ingress_connected(0) == []  # a late connection to a follower

    second = sent_request(m, member_id=1)
    assert second.correlation_id != first.correlation_id
    # Late answers to the first request are ignored.
    assert m.on_egress_message(event(first.correlation_id, EventCode.OK)) == []
    assert m.on_egress_message(event(first.correlation_id, EventCode.REDIRECT)) == []
    (done,) = m.on_egress_message(event(second.correlation_id, EventCode.OK, leader=1))
    assert isinstance(done, Done)
    assert done.result.member_id == 1
    assert done.result.endpoints[1] == Endpoint("10.0.0.2", 9011)


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
