"""The client's direct send of a burst (``offer_many`` under Trio): what the socket does
not take stays queued, and a frame cut in two finishes on the same connection."""

from __future__ import annotations

from typing import Any

import pytest

from client._client import ClusterClient
from client._credentials import as_credentials_supplier
from client._ingress import Ingress
from cluster.protocol import FrameDecoder
from cluster.protocol.codec import INGRESS
from cluster.protocol.ingress import SessionMessageHeader


class _Stream:
    def extra(self, *args: Any) -> Any:
        raise AssertionError("not used")


def _client(accept: list[int]) -> tuple[ClusterClient, Ingress, bytearray]:
    c = ClusterClient(
        {},
        credentials=as_credentials_supplier(None),
        egress_host="127.0.0.1",
        keepalive_interval=1.0,
        max_frame_size=1 << 20,
        max_egress_backlog=100,
    )
    wire = bytearray()

    def send(data: bytearray) -> int:
        n = min(len(data), accept.pop(0)) if accept else 0
        if n == 0:
            raise BlockingIOError
        wire.extend(data[:n])
        return n

    ingress = Ingress(0, ("127.0.0.1", 1), _Stream(), direct=False)  # type: ignore[arg-type]
    ingress.send_nowait = send
    c._writer.ingress = ingress
    c._backend.current_time = lambda: 0.0
    return c, ingress, wire


def _messages(wire: bytes) -> list[bytes]:
    out: list[Any] = []
    FrameDecoder().decode_into(wire, INGRESS.decode, out)
    return [m.payload for m in out]


def _queue(c: ClusterClient, n: int) -> list[bytes]:
    payloads = [b"p%03d" % i for i in range(n)]
    for p in payloads:
        c._session.enqueue(SessionMessageHeader(0, 1, 0, p))
    return payloads


async def test_everything_taken_leaves_nothing_queued() -> None:
    c, ingress, wire = _client([1 << 20])
    payloads = _queue(c, 10)
    c._writer.send_now()
    assert _messages(wire) == payloads
    assert not c._session.pending
    assert not ingress.tail


async def test_a_cut_frame_is_finished_first_on_the_same_connection() -> None:
    for cut in range(1, 60):
        c, ingress, wire = _client([cut])
        payloads = _queue(c, 5)
        c._writer.send_now()
        assert len(wire) == cut
        # the writer task would now send the tail, then the whole frames queued
        wire += ingress.tail + c._session.pending
        assert _messages(bytes(wire)) == payloads
        # what stays queued is whole frames only (it can be re-sent elsewhere)
        assert (
            _messages(bytes(c._session.pending))
            == payloads[len(payloads) - len(_messages(bytes(c._session.pending))) :]
        )


async def test_full_socket_sends_nothing_and_keeps_the_queue() -> None:
    c, ingress, wire = _client([])
    payloads = _queue(c, 3)
    c._writer.send_now()
    assert not wire
    assert not ingress.tail
    assert _messages(bytes(c._session.pending)) == payloads


async def test_no_direct_send_while_the_writer_is_sending() -> None:
    c, _, wire = _client([1 << 20])
    _queue(c, 3)
    c._writer.writing = True
    c._writer.send_now()
    assert not wire


async def test_offer_many_queues_the_same_frames_as_one_offer_each() -> None:
    c, _, wire = _client([])  # the socket takes nothing: everything stays queued
    c._session.open = True
    payloads = [b"x" * n for n in (0, 1, 31, 255, 256, 65535, 65536, 70000)]
    assert await c.offer_many(payloads) == len(payloads)
    one_by_one, _, _ = _client([])
    for p in payloads:
        one_by_one._session.offer_message(p)
    assert bytes(c._session.pending) == bytes(one_by_one._session.pending)
    # numbered 1, 2, 3... and kept until applied, as offer() keeps them
    assert list(c._session.outbox.kept) == list(one_by_one._session.outbox.kept)
    kept = list(c._session.outbox.after(0))
    assert [s for s, _ in kept] == list(range(1, len(payloads) + 1))
    assert [p for _, p in kept] == payloads
    assert _messages(bytes(c._session.pending)) == payloads
    assert not wire


async def test_offer_many_refuses_a_frame_too_big_and_keeps_the_ones_before() -> None:
    c, _, _ = _client([])
    c._session.open = True
    with pytest.raises(ValueError, match="exceeds max_frame_size"):
        await c.offer_many([b"a", b"b", b"x" * (2 << 20), b"c"])
    assert _messages(bytes(c._session.pending)) == [b"a", b"b"]
    assert c._session.outbox.sequence == 2  # the refused one took no number
