"""The admin channel (``cluster-tool`` <-> a member's admin port): codec, framing, helpers."""

from __future__ import annotations

import json
import logging
from functools import partial

import msgspec
import pytest
import trio
import trio.testing
from fake_admin import admin_ports, reply_with
from hypothesis import given
from hypothesis import strategies as st

from cluster.agents.admin import MUTATING, peer_is_local
from cluster.config import parse_members
from cluster.errorlog import DistinctErrorLog
from cluster.protocol import ProtocolError, encode, encode_frame
from cluster.protocol.admin import (
    AdminCommand,
    AdminReply,
    FollowerStatus,
    IngressStatus,
    LinkStatus,
    MemberAddress,
    MemberStatus,
    SessionStatus,
    decode_body,
    decode_status,
    encode_body,
)
from cluster.protocol.codec import ADMIN
from cluster.protocol.framing import LENGTH, FrameDecoder
from cluster.tool import COMMANDS, Result, describe_document, describe_table, find_leader, main

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


def test_the_errors_log_keeps_distinct_warnings_only() -> None:
    handler = DistinctErrorLog(max_entries=3)
    logger = logging.getLogger("cluster.test-admin")
    logger.addHandler(handler)
    try:
        logger.info("not kept")
        for i in range(5):
            logger.warning("warning %d", i)  # one distinct warning, 5 times
            logger.warning("other warning %s", "abcdefghijkl"[i])  # 5 distinct ones
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    records = handler.records()
    lines = [r["message"].splitlines()[0] for r in records]
    assert lines == ["warning 4", "other warning e", "failed"]
    assert [r["count"] for r in records] == [5, 1, 1]
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


# ---------------------------------------------------------------------- describe


def leader_status(member_id: int = 0) -> MemberStatus:
    return MemberStatus(
        member_id=member_id,
        role="LEADER",
        leadership_term_id=3,
        leader_member_id=member_id,
        commit_position=640,
        append_position=700,
        election_state="CLOSED",
        sessions=[SessionStatus(cluster_session_id=5, response_channel="127.0.0.1:9000")],
        counters={"elections": 2, "redirected_sessions": 0},
        ingress=IngressStatus(connections=1, frames=9, last_error="bad frame"),
        followers=[
            FollowerStatus(
                member_id=1,
                next_position=700,
                match_position=640,
                lag_bytes=60,
                last_heard_ms_ago=4,
            ),
        ],
        links=[LinkStatus(member_id=1, connected=True, sent=10)],
        members=[
            MemberAddress(
                member_id=i, host="127.0.0.1", ingress_port=1, consensus_port=2, admin_port=3
            )
            for i in range(3)
        ],
        uptime_s=1.5,
        pid=1234,
    )


def test_member_status_round_trips_through_a_reply_body() -> None:
    status = leader_status()
    body = encode_body(status)
    assert decode_status(body) == status
    # the JSON is the plain object the tool prints, field for field and in order
    assert list(decode_body(body)) == list(MemberStatus.__struct_fields__)
    assert decode_body(body) == msgspec.to_builtins(status)


def test_a_status_without_links_and_members_decodes_with_defaults() -> None:
    old = msgspec.to_builtins(leader_status())
    del old["links"], old["members"]  # an older member, or tests/tui/recorded_cluster.json
    status = decode_status(encode_body(old))
    assert status.links == []
    assert status.members == []
    assert status.followers[0].lag_bytes == 60
    assert status.ingress.frames == 9
    assert msgspec.convert(old, MemberStatus) == status
    assert decode_status(b'{"member_id": 2}') == MemberStatus(member_id=2)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{not json",
        b"[1,2]",
        b"null",
        b'{"member_id": "x"}',
        b'{"role": "LEADER"}',  # no member_id
        b'{"member_id": 0, "followers": [{"lag_bytes": 1}]}',
        b'{"member_id": 0, "sessions": {}}',
        b'{"member_id": 0, "counters": {"elections": "1"}}',
    ],
)
def test_a_describe_body_of_the_wrong_shape_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_status(raw)


def test_tool_describe_document_and_table_from_decoded_statuses() -> None:
    members = parse_members("0=h:1:2:3,1=h:4:5:6,2=h:7:8:9")
    follower = MemberStatus(member_id=1, leadership_term_id=3, leader_member_id=0)
    described = [
        Result(members[0], AdminReply(1, True, "", encode_body(leader_status()))),
        Result(members[1], AdminReply(2, True, "", encode_body(follower))),
        Result(members[2], AdminReply(3, True, "", b"[1,2]")),
    ]
    for r in described:
        r.decode_describe()
    assert find_leader(described) == 0
    document = describe_document(described)
    assert document["leader_member_id"] == 0
    # a decoded member is its describe body as JSON, plus "reachable"
    assert document["members"][0] == {
        **decode_body(encode_body(leader_status())),
        "reachable": True,
        "error": None,
    }
    # a member without an answer has the same keys
    assert document["members"][2].keys() == document["members"][0].keys()
    assert document["members"][1]["role"] == "FOLLOWER"
    bad = document["members"][2]
    assert bad["reachable"] is False
    assert bad["error"].startswith("bad describe body")
    json.dumps(document)  # plain JSON
    lines = describe_table(described).splitlines()
    assert " ".join(lines[1].split()) == "0 LEADER 3 640 700 - CLOSED ACTIVE 1 0 1s 1234 0 - up"
    assert lines[2].split()[-6:] == ["60", "0s", "-", "0", "-", "up"]
    assert lines[3].startswith("2")
    assert "down (bad describe body" in lines[3]
    assert lines[-1] == "leader: 0"


def test_tool_reports_a_bad_describe_body_as_that_members_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with admin_ports(reply_with(encode_body(leader_status())), reply_with(b"[1,2]")) as ports:
        good, bad = ports
        members = f"0=127.0.0.1:1:2:{good},1=127.0.0.1:1:2:{bad}"
        assert main(["--members", members, "--timeout", "5s", "--json", "describe"]) == 1
        document = json.loads(capsys.readouterr().out)
        assert document["leader_member_id"] == 0
        expected = {**msgspec.to_builtins(leader_status()), "reachable": True, "error": None}
        assert document["members"][0] == expected
        assert document["members"][1]["reachable"] is False
        assert "bad describe body" in document["members"][1]["error"]

        assert main(["--members", members, "--timeout", "5s", "describe"]) == 1  # one down
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        assert "down (bad describe body" in out.splitlines()[2]

        assert main(["--members", members, "--member", "1", "list-members"]) == 1
        assert "Member [1]: bad describe body" in capsys.readouterr().err
        assert main(["--members", members, "list-members"]) == 0
        listed = capsys.readouterr().out
        assert listed.splitlines()[0].split() == [
            "member", "host", "ingress", "consensus", "admin", "role", "status",
        ]  # fmt: skip
        assert listed.splitlines()[1].split() == ["0", "127.0.0.1", "1", "2", "3", "LEADER", "up"]
        assert listed.splitlines()[-1] == "leader: 0 (as member 0 sees it)"
