"""The client's sans-IO Session: what a REDIRECT or a NewLeaderEvent on an open session
does to it (the own-connection egress path, after a break)."""

from __future__ import annotations

from client._connect import ConnectResult
from client._endpoints import Endpoint, parse_endpoints
from client._session import Reconnect, Session
from cluster.protocol import INGRESS, FrameDecoder
from cluster.protocol.egress import NewLeaderEvent, SessionEvent
from cluster.protocol.enums import EventCode
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


def test_a_redirect_naming_no_leader_or_the_same_one_means_wait() -> None:
    session = open_session()
    assert session.on_egress(redirect(3, -1)) is None  # an election is on
    assert session.on_egress(redirect(3, 2)) is None  # the leader we could not reach
    assert session.on_egress(redirect(2, 0)) is None  # stale
    assert (session.leadership_term_id, session.leader_member_id) == (3, 2)


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
