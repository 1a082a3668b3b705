"""The KV example's service keeps nothing per session (issue 42): the cluster applies a
session's request once and keeps its response until the client has it, so the service
no longer remembers responses to answer resends (issue 19 bounded that memory; it is
gone).  A snapshot written while it did still restores."""

from __future__ import annotations

from typing import Any

import msgspec

from cluster.examples.kv import (
    CompareAndSet,
    Get,
    KeyValueService,
    Put,
    Response,
    _SnapshotV1,
)

encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder(Response).decode


class Session:
    def __init__(self, session_id: int) -> None:
        self.id = session_id
        self.replies: list[Response] = []

    def offer(self, payload: bytes) -> bool:
        self.replies.append(decode(payload))
        return True


def send(service: KeyValueService, session: Session, request: Any) -> Response:
    service.on_session_message(session, 0, encode(request))  # type: ignore[arg-type]
    return session.replies[-1]


def test_a_request_sent_again_is_applied_again_and_nothing_is_remembered() -> None:
    service = KeyValueService()
    session = Session(1)
    assert send(service, session, Put(1, "k", b"0")).ok
    assert send(service, session, CompareAndSet(2, "k", b"0", b"1")).ok
    # the same request id again is a new request: applying it is the cluster's to prevent
    assert not send(service, session, CompareAndSet(2, "k", b"0", b"1")).ok
    assert send(service, session, Get(3, "k")).value == b"1"
    snapshot = service.on_take_snapshot()
    assert len(snapshot) < 32  # the store, no responses
    restored = KeyValueService()
    restored.on_start(None, snapshot)  # type: ignore[arg-type]
    assert restored.store == {"k": b"1"}


def test_a_snapshot_of_the_first_layout_restores_without_its_responses() -> None:
    old = encode(
        _SnapshotV1(
            store={"a": b"1", "b": b"2"},
            recent={7: {1: encode(Response(1, True)), 2: encode(Response(2, True))}},
            expiries={5: "b"},
            next_timer_id=6,
        )
    )
    service = KeyValueService()
    service.on_start(None, old)  # type: ignore[arg-type]
    assert service.store == {"a": b"1", "b": b"2"}
    service.on_timer_event(5, 0)  # the key's expiry survived
    assert service.store == {"a": b"1"}
    assert service.expired == 1
    session = Session(7)
    assert send(service, session, Put(9, "c", b"3")).ok  # and timer ids go on from 6
    again = KeyValueService()
    again.on_start(None, service.on_take_snapshot())  # type: ignore[arg-type]
    assert again.store == {"a": b"1", "c": b"3"}
    assert again._next_timer_id == 6
