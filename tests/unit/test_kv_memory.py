"""The KV example's memory per session (issue #19: 2,000 reads of a 60 KB value held
156-175 MiB on every member, because every reply was remembered for retries)."""

from __future__ import annotations

from typing import Any

import msgspec

from cluster.examples.kv import (
    DEDUPE_BYTES,
    CompareAndSet,
    Get,
    KeyValueService,
    Put,
    Response,
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


def test_replies_to_reads_are_not_remembered() -> None:
    service = KeyValueService()
    session = Session(1)
    value = b"v" * 60_000
    send(service, session, Put(1, "big", value))
    for request_id in range(2, 2002):
        assert send(service, session, Get(request_id, "big")).value == value
    assert service.remembered_bytes() < 100  # only the put's small reply


def test_remembered_replies_are_bounded_in_bytes_and_still_dedupe() -> None:
    service = KeyValueService()
    session = Session(1)
    value = b"v" * 60_000
    send(service, session, Put(1, "k", b"x"))
    current = b"x"
    for request_id in range(2, 102):  # compare-and-set replies carry the value
        new = value[:-1] + bytes([request_id])
        assert send(service, session, CompareAndSet(request_id, "k", current, new)).ok
        current = new
    assert service.remembered_bytes() <= DEDUPE_BYTES
    # the latest are still remembered: a retry is answered, not applied again
    duplicates = service.duplicates
    retried = send(service, session, CompareAndSet(101, "k", b"stale", b"other"))
    assert retried.ok
    assert service.duplicates == duplicates + 1
    assert service.store["k"] == current


def test_the_bound_survives_a_snapshot() -> None:
    service = KeyValueService()
    session = Session(1)
    for request_id in range(1, 50):
        send(service, session, Put(request_id, f"k{request_id}", b"v"))
    restored = KeyValueService()
    restored.on_start(None, service.on_take_snapshot())  # type: ignore[arg-type]
    assert restored.remembered_bytes() == service.remembered_bytes() > 0
