"""The client's side of exactly once out (issue 42): the service's replies come
numbered; the sans-IO Session hands each number to the application once, in order, counts
a gap as dropped, and says how far it got in every message it sends and in its resume
(the members forget what it confirmed; a new leader sends what follows).  A new leader
may send again what the client has not confirmed, so a duplicate is no fault.  These
are the only tests of the dropping: the real-process test (test_exactly_once_replies)
passed with it removed, since a resume usually says how far the client got before the
new leader sends anything."""

from __future__ import annotations

import pytest
from test_client_session import open_session

from client._session import Dropped, Session
from client.errors import ServiceError
from cluster.protocol import INGRESS, FrameDecoder
from cluster.protocol.egress import ServiceErrorEvent
from cluster.protocol.ingress import SessionMessageHeader, SessionResumeRequest


def reply(number: int, payload: bytes = b"") -> SessionMessageHeader:
    return SessionMessageHeader(3, 7, 1, payload or b"r%d" % number, 0, number)


def error(number: int) -> ServiceErrorEvent:
    return ServiceErrorEvent(7, 3, 4096, 1, "ValueError", "bad", b"req", number)


def received(session: Session) -> list[object]:
    out: list[object] = []
    while session.backlog:
        try:
            out.append(session.take().payload)
        except ServiceError as caught:
            out.append(caught.error_type)
    return out


def test_a_reply_sent_again_by_a_new_leader_reaches_the_application_once() -> None:
    session = open_session()
    for message in (reply(1), reply(2), error(3)):
        assert session.on_egress(message) is None
    # a new leader sends again what the client had not confirmed: 2 and 3, then 4
    for message in (reply(2), error(3), reply(4)):
        assert session.on_egress(message) is None
    assert received(session) == [b"r1", b"r2", "ValueError", b"r4"]
    assert session.received_reply == 4
    assert session.replies_dropped == 0
    assert session.errors_waiting == 0


def test_a_gap_in_the_numbers_is_counted_as_dropped_and_the_rest_goes_on() -> None:
    session = open_session()
    assert session.on_egress(reply(1)) is None
    assert session.on_egress(reply(5)) == Dropped(3)  # 2, 3, 4 are gone for good
    assert session.on_egress(error(8)) == Dropped(2)
    assert session.on_egress(reply(5)) is None  # and 5 again is a duplicate
    assert received(session) == [b"r1", b"r5", "ValueError"]
    assert session.replies_dropped == 5


def test_an_unnumbered_reply_is_never_taken_for_a_duplicate() -> None:
    """Replies given outside the log (``on_start``, ``on_role_change``) carry 0."""
    session = open_session()
    session.on_egress(reply(1))
    assert session.on_egress(SessionMessageHeader(3, 7, 1, b"outside the log")) is None
    assert received(session) == [b"r1", b"outside the log"]
    assert session.received_reply == 1


def test_its_messages_and_its_resume_say_how_far_it_received() -> None:
    session = open_session()
    session.on_egress(reply(1))
    session.on_egress(reply(2))
    session.offer_message(b"next")
    (sent,) = [INGRESS.decode(body) for body in FrameDecoder().feed(session.pending)]
    assert isinstance(sent, SessionMessageHeader)
    assert sent.reply == 2  # every member forgets replies 1 and 2 at this entry
    (resume,) = [INGRESS.decode(body) for body in FrameDecoder().feed(session.resume_frame(1))]
    assert isinstance(resume, SessionResumeRequest)
    assert resume.reply == 2  # the leader resumes after it
    session.resend(0)  # a leader asked for its messages again: they say so too
    (again,) = [INGRESS.decode(body) for body in FrameDecoder().feed(session.pending)]
    assert isinstance(again, SessionMessageHeader)
    assert (again.sequence, again.reply) == (1, 2)


@pytest.mark.parametrize("first", [reply(1), error(1)])
def test_the_first_reply_is_one(first: SessionMessageHeader | ServiceErrorEvent) -> None:
    session = open_session()
    assert session.on_egress(first) is None
    assert session.replies_dropped == 0
    assert session.received_reply == 1
