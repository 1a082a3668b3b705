"""The client's sans-IO Session: what a REDIRECT or a NewLeaderEvent on an open session
does to it (the own-connection egress path, after a break); the service's errors in the
place of replies, dropped replies, close reasons."""

from __future__ import annotations

import pytest

from client._connect import ConnectResult
from client._endpoints import Endpoint, parse_endpoints
from client._session import Closed, Dropped, Reconnect, Redial, Session
from client.errors import ClusterClientError, ServiceError, SessionClosedError
from cluster.protocol import INGRESS, FrameDecoder
from cluster.protocol.egress import NewLeaderEvent, RepliesDropped, ServiceErrorEvent, SessionEvent
from cluster.protocol.enums import CloseReason, EventCode
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.version import PROTOCOL_VERSION

ENDPOINTS = "0=127.0.0.1:9010,1=127.0.0.1:9011,2=127.0.0.1:9012"


def open_session() -> Session:
    endpoints = parse_endpoints(ENDPOINTS)
    session = Session(
        endpoints,
        max_frame_size=1 << 20,
        max_egress_backlog=100,
        wake_writer=lambda: None,
        wake_receivers=lambda: None,
    )
    session.on_granted(ConnectResult(7, 3, 2, 2, endpoints, b"s" * 16), endpoints[2])
    return session


def redirect(term: int, leader: int) -> SessionEvent:
    return SessionEvent(7, 1, term, leader, EventCode.REDIRECT, PROTOCOL_VERSION, ENDPOINTS)


def queued_terms(session: Session) -> list[int]:
    frames = FrameDecoder().feed(session.pending)
    return [INGRESS.decode(body).leadership_term_id for body in frames]  # type: ignore[union-attr]


def test_a_redirect_to_a_new_leader_moves_the_session_and_its_queued_messages() -> None:
    session = open_session()
    session.enqueue(SessionMessageHeader(3, 7, 0, b"queued while cut off"))
    action = session.on_egress(redirect(4, 1))
    assert action == Reconnect(1, Endpoint("127.0.0.1", 9011))
    assert (session.leadership_term_id, session.leader_member_id) == (4, 1)
    assert queued_terms(session) == [4]  # the new leader takes them


def test_a_redirect_naming_no_leader_means_wait() -> None:
    session = open_session()
    assert session.on_egress(redirect(3, -1)) is None  # an election is on
    assert session.on_egress(redirect(2, 0)) is None  # stale
    assert (session.leadership_term_id, session.leader_member_id) == (3, 2)


def test_a_redirect_to_the_leader_we_could_not_reach_means_dial_it_again() -> None:
    """It was paused, or cut off from us only: the cluster says it still leads, so the
    session goes back to it (waiting at a follower let the session time out there)."""
    session = open_session()
    session.enqueue(SessionMessageHeader(3, 7, 0, b"queued"))
    assert session.on_egress(redirect(3, 2)) == Redial(2, Endpoint("127.0.0.1", 9012))
    assert (session.leadership_term_id, session.leader_member_id) == (3, 2)
    assert queued_terms(session) == [3]  # unchanged


def service_error(payload: bytes = b"boom") -> ServiceErrorEvent:
    return ServiceErrorEvent(7, 3, 4096, 123, "ValueError", "bad payload", payload)


def reply(payload: bytes) -> SessionMessageHeader:
    return SessionMessageHeader(3, 7, 1, payload)


def test_a_service_error_is_raised_in_the_place_of_its_reply_once() -> None:
    session = open_session()
    for message in (reply(b"a"), service_error(), reply(b"b")):
        assert session.on_egress(message) is None
    assert session.take().payload == b"a"
    with pytest.raises(ServiceError) as caught:
        session.take()
    error = caught.value
    assert isinstance(error, ClusterClientError)
    assert (error.error_type, error.message) == ("ValueError", "bad payload")
    assert error.log_position == 4096
    assert error.request == b"boom"
    assert "ValueError" in str(error)
    assert "bad payload" in str(error)
    assert session.take().payload == b"b"  # the session goes on
    assert session.errors_waiting == 0


def test_many_at_once_stop_before_a_service_error_which_comes_next() -> None:
    session = open_session()
    for message in (reply(b"a"), reply(b"b"), service_error(), reply(b"c")):
        session.on_egress(message)
    assert session.take_payloads(10) == [b"a", b"b"]
    with pytest.raises(ServiceError):
        session.take_payloads(10)
    assert session.take_payloads(10) == [b"c"]
    assert not session.backlog


def test_another_sessions_service_error_is_ignored() -> None:
    session = open_session()
    session.on_egress(ServiceErrorEvent(8, 3, 1, 1, "ValueError", "not yours"))
    assert not session.backlog
    assert session.errors_waiting == 0


def test_dropped_replies_are_counted_and_reported() -> None:
    session = open_session()
    assert session.on_egress(RepliesDropped(7, 3, 5)) == Dropped(5)
    assert session.on_egress(RepliesDropped(7, 3, 2)) == Dropped(2)
    assert session.on_egress(RepliesDropped(8, 3, 9)) is None  # another session's
    assert session.replies_dropped == 7


def test_closed_with_a_close_reason_names_it() -> None:
    session = open_session()
    closed = SessionEvent(7, 1, 3, 2, EventCode.CLOSED, PROTOCOL_VERSION, "SHUTDOWN")
    assert session.on_egress(closed) == Closed("SHUTDOWN")
    session.mark_closed("SHUTDOWN")
    error = session.closed_error()
    assert error.reason == "SHUTDOWN"
    assert error.close_reason is CloseReason.SHUTDOWN
    assert SessionClosedError("resumed on another connection").close_reason is None


def test_the_leaders_heartbeat_changes_nothing() -> None:
    session = open_session()
    heartbeat = NewLeaderEvent(3, 7, 2, ENDPOINTS)
    assert session.on_egress(heartbeat) is None
    assert session.on_egress(NewLeaderEvent(4, 7, 0, ENDPOINTS)) == Reconnect(
        0, Endpoint("127.0.0.1", 9010)
    )


def test_the_same_member_leading_a_newer_term_is_a_new_leader() -> None:
    """It stepped down and was elected again: go back to it (waiting here for a
    leader change would wait for ever, and the session would time out)."""
    session = open_session()
    assert session.on_egress(redirect(5, 2)) == Reconnect(2, Endpoint("127.0.0.1", 9012))
    assert session.leadership_term_id == 5
