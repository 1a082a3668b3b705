"""The admin channel (``cluster-tool`` <-> a member's admin port): codec, framing, helpers."""

from __future__ import annotations

import logging
from functools import partial

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from cluster.agents.admin import MUTATING, RecentErrors, peer_is_local
from cluster.protocol import ProtocolError, encode, encode_frame
from cluster.protocol.admin import AdminCommand, AdminReply, decode_body, encode_body
from cluster.protocol.codec import ADMIN
from cluster.protocol.framing import LENGTH, FrameDecoder
from cluster.tool import COMMANDS, main

INT64 = st.integers(-(2**63), 2**63 - 1)


@given(INT64, st.text(), st.dictionaries(st.text(), st.text()))
def test_command_round_trip(correlation_id: int, command: str, args: dict[str, str]) -> None:
    message = AdminCommand(correlation_id, command, args)
    assert ADMIN.decode(encode(message)) == message


@given(INT64, st.booleans(), st.text(), st.binary())
def test_reply_round_trip(correlation_id: int, ok: bool, text: str, body: bytes) -> None:
    message = AdminReply(correlation_id, ok, text, body)
    assert ADMIN.decode(encode(message)) == message


def test_defaults_and_tags() -> None:
    assert AdminCommand(1, "describe").args == {}
    assert AdminReply(1, True, "").body == b""
    assert msgspec.msgpack.decode(encode(AdminCommand(7, "x")))[0] == 200
    assert msgspec.msgpack.decode(encode(AdminReply(7, True, "")))[0] == 201


def test_frames_round_trip_through_the_frame_decoder() -> None:
    messages = [
        AdminCommand(1, "describe", {}),
        AdminReply(1, True, "", encode_body({"role": "LEADER", "sessions": []})),
        AdminCommand(2, "snapshot", {"timeout": "30"}),
    ]
    data = b"".join(encode_frame(m) for m in messages)
    decoder = FrameDecoder()
    bodies = [body for i in range(len(data)) for body in decoder.feed(data[i : i + 1])]
    assert [ADMIN.decode(b) for b in bodies] == messages
    assert decode_body(ADMIN.decode(bodies[1]).body) == {"role": "LEADER", "sessions": []}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",  # never used in MessagePack
        b"garbage that is not msgpack",
        encode([200, 1]),  # missing fields
        encode([200, 1, "describe", {"a": 1}]),  # args values must be strings
        encode([200, 2**63, "describe", {}]),  # correlation id out of range
        encode([201, 1, "yes", "message", b""]),  # ok must be a bool
        encode([999, 1, "describe", {}]),  # unknown tag
        encode([1, 0, 0, 0, b""]),  # an ingress message is not an admin message
        encode({"correlation_id": 1}),  # a map, not an array
    ],
)
def test_bad_bytes_raise_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        ADMIN.decode(raw)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_protocol_error(raw: bytes) -> None:
    try:
        ADMIN.decode(raw)
    except ProtocolError:
        pass


def test_oversized_and_empty_frames_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder(1024).feed(LENGTH.pack(1025) + b"x")
    with pytest.raises(ProtocolError):
        FrameDecoder(1024).feed(LENGTH.pack(0))


def test_reply_body_is_json() -> None:
    assert decode_body(b"") is None
    assert decode_body(encode_body([{"invalidated": True}])) == [{"invalidated": True}]
    with pytest.raises(ProtocolError):
        decode_body(b"{not json")


def test_recent_errors_keeps_the_last_warnings_only() -> None:
    handler = RecentErrors(capacity=3)
    logger = logging.getLogger("cluster.test-admin")
    logger.addHandler(handler)
    try:
        logger.info("not kept")
        for i in range(5):
            logger.warning("warning %d", i)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    records = list(handler.records)
    assert [r["message"].splitlines()[0] for r in records] == ["warning 3", "warning 4", "failed"]
    assert records[-1]["level"] == "ERROR"
    assert records[-1]["logger"] == "cluster.test-admin"
    assert "ValueError: boom" in records[-1]["message"]


async def test_loopback_peers_and_non_socket_streams_are_local() -> None:
    left, _right = trio.testing.memory_stream_pair()
    assert peer_is_local(left)
    seen: list[bool] = []

    async def handler(stream: trio.SocketStream) -> None:
        seen.append(peer_is_local(stream))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert await stream.receive_some(10) == b""
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert seen == [True]


def test_tool_knows_every_mutating_command() -> None:
    assert set(COMMANDS) >= MUTATING


def test_tool_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLUSTER_MEMBERS", raising=False)
    for argv in (
        ["describe"],  # no --members and no CLUSTER_MEMBERS
        ["--members", "0=h:1:2", "describe"],
        ["--members", "0=127.0.0.1:1:2:3", "frobnicate"],
        ["--members", "0=127.0.0.1:1:2:3", "--timeout", "soon", "describe"],
        ["--members", "0=127.0.0.1:1:2:3", "--member", "5", "describe"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
    assert "error" in capsys.readouterr().err


def test_tool_unreachable_member_is_down_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    members = f"0=127.0.0.1:{port}:{port}:{port}"
    assert main(["--members", members, "--timeout", "1s", "describe"]) == 1
    out = capsys.readouterr().out
    assert "down" in out
    assert main(["--members", members, "--timeout", "1s", "snapshot"]) == 1
    assert "no leader found" in capsys.readouterr().err
