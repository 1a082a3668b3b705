"""``ConsensusModule.on_batch`` (the leader's hot path) against one :meth:`on_message`
call per message: for any batches, the same log, the same counters, the same sessions
and the same replies, whatever a batch changes part-way (the connection, a session
closed, a later term that ends the leadership) and whatever happens between batches (a
suspension, a resume, time moving on)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_consensus import CLIENT, MS, T0, TERM, make, open_session

from cluster.core.base import IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.protocol.consensus import APPEND_POSITION_VERIFIED, AppendPosition
from cluster.protocol.enums import ClusterAction, Role
from cluster.protocol.ingress import SessionCloseRequest, SessionKeepAlive, SessionMessageHeader

STRANGER = IngressSource(2, "127.0.0.2")
SHUT = IngressSource(3, "127.0.0.3")
SHUT.closed = True

STEPS = st.sampled_from(
    [
        "client",  # the connection the first session is on
        "stranger",  # another connection (the second session's)
        "shut",  # a connection closed meanwhile
        "message",  # the first session's
        "message",
        "message",
        "second",  # the second session's (foreign on the client's connection)
        "unknown",  # no such session
        "old term",
        "later term",
        "keepalive",
        "close",  # the first session closes part-way
        "suspend",  # an operator suspends part-way (messages are held)
        "resume",
        "deposed",  # a member reports a later term: this leader steps down
        "tick",  # time moves on (a batch has one now; the stamp may move between)
    ]
)


def _build() -> tuple[ConsensusModule, Any, Any, int, int]:
    cm, egress, reader = make(member_count=3)
    cm.session_manager.token = bytes  # the same secrets in both runs
    first = open_session(cm, reader, T0)
    second = open_session(cm, reader, T0, correlation_id=101)
    # move the second session onto another connection, as a resume would
    cm.sessions[second].source = STRANGER
    return cm, egress, reader, first, second


def _message(step: str, first: int, second: int) -> Any:
    sid = {"second": second, "unknown": first + 99}.get(step, first)
    term = {"old term": TERM - 1, "later term": TERM + 1}.get(step, TERM)
    return SessionMessageHeader(term, sid, 0, step.encode())


def _run(steps: list[str], *, batched: bool) -> dict[str, Any]:
    cm, egress, reader, first, second = _build()
    now = T0 + MS
    batch: list[Any] = []

    def flush() -> None:
        if batched:
            cm.on_batch(batch, now)
        else:
            for message in batch:
                cm.on_message(message, now)
            cm._source = None  # what a batch's end does
        batch.clear()

    for step in steps:
        if step == "client":
            batch.append(CLIENT)
        elif step == "stranger":
            batch.append(STRANGER)
        elif step == "shut":
            batch.append(SHUT)
        elif step == "keepalive":
            batch.append(SessionKeepAlive(TERM, first))
        elif step == "close":
            batch.append(SessionCloseRequest(TERM, first))
        elif step == "deposed":
            batch.append(AppendPosition(TERM + 1, 0, 1, APPEND_POSITION_VERIFIED))
        elif step in ("suspend", "resume"):
            flush()  # an operator's request arrives between batches
            action = ClusterAction.SUSPEND if step == "suspend" else ClusterAction.RESUME
            cm.control.apply(action)  # as the committed request is applied
        elif step == "tick":
            flush()
            now += 7 * MS
        else:
            batch.append(_message(step, first, second))
    flush()
    reader.pull()
    return {
        "log": reader.entries,
        "counters": dataclasses.asdict(cm.counters),
        "activity": {s: v.time_of_last_activity_ns for s, v in cm.sessions.items()},
        "states": {s: v.state for s, v in cm.sessions.items()},
        "replies": [c for c in egress.calls if c[0] != "attach"],
        "role": cm.role,
        "held": list(cm.control.held_messages),
        "timestamp": cm.log.timestamp,
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(STEPS, max_size=30))
def test_a_batch_does_what_one_call_a_message_does(steps: list[str]) -> None:
    assert _run(steps, batched=True) == _run(steps, batched=False)


def test_the_hot_path_sequences_and_refuses_what_the_slow_path_would() -> None:
    steps = ["client", "message", "second", "unknown", "message", "stranger", "second"]
    result = _run(steps, batched=True)
    payloads = [m.payload for _, m in result["log"] if type(m) is SessionMessageHeader]
    assert payloads == [b"message", b"message", b"second"]
    assert result["counters"]["foreign_session_messages"] == 1
    assert result["counters"]["unknown_session_messages"] == 1
    stamps = {m.timestamp for _, m in result["log"] if type(m) is SessionMessageHeader}
    assert stamps == {(T0 + MS) // MS}
    # a batch that steps the leader down sequences nothing after that
    result = _run(["client", "message", "deposed", "message"], batched=True)
    assert result["role"] is not Role.LEADER
    payloads = [m.payload for _, m in result["log"] if type(m) is SessionMessageHeader]
    assert payloads == [b"message"]
