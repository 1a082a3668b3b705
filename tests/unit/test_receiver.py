"""Reads into a connection's own buffer (issue 36): no allocation per read on a plain
socket, a view valid until the next read, the usual errors; and the allocator's tuning."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from cluster import memory
from cluster.protocol import FrameDecoder, encode_frame
from cluster.protocol.codec import INGRESS
from cluster.protocol.ingress import SessionKeepAlive
from cluster.transport.framed import OTHER_READ_SIZE, Receiver


async def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def test_a_socket_is_read_into_the_same_buffer_every_time() -> None:
    left, right = await socket_pair()
    async with left, right:
        receiver = Receiver(right, 4096)
        await left.send_all(b"hello")
        first = await receiver.receive()
        assert isinstance(first, memoryview)
        assert bytes(first) == b"hello"
        await left.send_all(b"world!")
        second = await receiver.receive()
        assert bytes(second) == b"world!"
        assert second.obj is first.obj  # one buffer, reused
        await left.send_all(b"x" * 10_000)
        assert len(await receiver.receive()) <= 4096  # never more than the buffer
        receiver.grow(64 * 1024)
        receiver.grow(1024)  # never shrinks
        assert receiver.size == 64 * 1024


async def test_frames_decoded_from_the_views_survive_the_next_reads() -> None:
    left, right = await socket_pair()
    async with left, right:
        receiver = Receiver(right, 64)
        decoder = FrameDecoder()
        frames = b"".join(encode_frame(SessionKeepAlive(7, i)) for i in range(50))
        await left.send_all(frames)
        got: list[SessionKeepAlive] = []
        while len(got) < 50:
            decoder.decode_into(await receiver.receive(), INGRESS, got)  # type: ignore[arg-type]
        assert [m.cluster_session_id for m in got] == list(range(50))


async def test_the_end_of_the_stream_and_a_reset() -> None:
    left, right = await socket_pair()
    receiver = Receiver(right)
    await left.aclose()
    assert not await receiver.receive()
    await right.aclose()
    left, right = await socket_pair()
    receiver = Receiver(right)
    left.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    await right.send_all(b"unread")  # so the close resets the connection
    await left.aclose()

    async def read_to_the_end() -> None:
        while await receiver.receive():
            pass

    with pytest.raises(trio.BrokenResourceError):
        await read_to_the_end()
    await right.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await receiver.receive()


async def test_a_stream_that_is_no_socket_is_read_as_before() -> None:
    sender, stream = trio.testing.memory_stream_one_way_pair()
    receiver = Receiver(stream, 1 << 20)
    await sender.send_all(b"y" * (OTHER_READ_SIZE + 10))
    data = await receiver.receive()
    assert isinstance(data, bytes | bytearray)
    assert len(data) <= OTHER_READ_SIZE


def test_the_allocator_is_tuned_and_trimmed_on_glibc() -> None:
    if memory._glibc() is None:
        pytest.skip("not glibc")
    assert memory.tune_allocator()
    junk = [bytes(200_000) for _ in range(50)]  # mapped, and unmapped when freed
    del junk
    memory.trim()  # whether or not there was anything to give back, it returns


async def test_the_trimming_agent_runs_until_cancelled() -> None:
    with trio.move_on_after(0.2):
        await memory.give_back_memory(0.05)
