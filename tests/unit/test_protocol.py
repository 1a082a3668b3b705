"""Property tests for the wire protocol: codecs, framing, robustness, versions.

Strategies are derived from each message's msgspec type information, so a message
added to a channel union later is covered without touching this file.
"""

from __future__ import annotations

import enum
import tracemalloc
import typing

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.protocol import (
    CONSENSUS,
    DEFAULT_MAX_FRAME_SIZE,
    EGRESS,
    INGRESS,
    LOG,
    SERVICE,
    SNAPSHOT,
    Codec,
    FrameDecoder,
    ProtocolError,
    encode,
    encode_frame,
    encode_frames_into,
)
from cluster.protocol import version as pv
from cluster.protocol._base import Message
from cluster.protocol.consensus import ConsensusMessage
from cluster.protocol.egress import EgressMessage
from cluster.protocol.framing import HEADER_LENGTH, LENGTH, frame
from cluster.protocol.ingress import IngressMessage, SessionMessageHeader
from cluster.protocol.log import LogMessage
from cluster.protocol.service import ServiceMessage
from cluster.protocol.snapshot import SnapshotRecord

CHANNELS: dict[str, tuple[Codec[typing.Any], typing.Any]] = {
    "ingress": (INGRESS, IngressMessage),
    "egress": (EGRESS, EgressMessage),
    "log": (LOG, LogMessage),
    "consensus": (CONSENSUS, ConsensusMessage),
    "service": (SERVICE, ServiceMessage),
    "snapshot": (SNAPSHOT, SnapshotRecord),
}
ALL_CODECS = [codec for codec, _ in CHANNELS.values()]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def members(union: typing.Any) -> tuple[type[Message], ...]:
    return typing.get_args(union)


CHANNEL_MESSAGES = [
    (name, codec, cls) for name, (codec, union) in CHANNELS.items() for cls in members(union)
]


def _interesting_ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [
        v for v in (lo, lo + 1, -1, 0, 1, 127, 128, 255, 256, 65535, hi - 1, hi) if lo <= v <= hi
    ]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def strategy_for_type(t: mi.Type) -> st.SearchStrategy[typing.Any]:
    if isinstance(t, mi.IntType):
        assert t.ge is not None, "every wire int must be Int32/Int64"
        assert t.le is not None, "every wire int must be Int32/Int64"
        return _interesting_ints(t.ge, t.le)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.StrType):
        return st.text(max_size=40)
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=64)
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.ListType):
        return st.lists(strategy_for_type(t.item_type), max_size=3)
    raise AssertionError(f"no strategy for field type {t!r}; extend the test")


def strategy_for(cls: type[Message]) -> st.SearchStrategy[Message]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    kwargs = {f.name: strategy_for_type(f.type) for f in info.fields}
    return st.builds(cls, **kwargs)


def _plain_value(t: mi.Type) -> typing.Any:
    if isinstance(t, mi.IntType):
        return 7
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.StrType):
        return "s"
    if isinstance(t, mi.BytesType):
        return b"b"
    if isinstance(t, mi.EnumType):
        return next(iter(t.cls))
    if isinstance(t, mi.ListType):
        return [_plain_value(t.item_type)]
    raise AssertionError(f"no plain value for field type {t!r}; extend the test")


def plain_instance(cls: type[Message]) -> Message:
    """A deterministic valid instance (every field set, defaults included)."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return cls(**{f.name: _plain_value(f.type) for f in info.fields})


def any_message(union: typing.Any) -> st.SearchStrategy[Message]:
    return st.one_of([strategy_for(cls) for cls in members(union)])


ANY_MESSAGE = st.one_of([any_message(union) for _, union in CHANNELS.values()])


# ---------------------------------------------------------------------- the unions


@pytest.mark.parametrize("name", list(CHANNELS))
def test_channel_union_tags_are_unique_integers(name: str) -> None:
    _, union = CHANNELS[name]
    classes = members(union)
    assert len(classes) >= 1
    tags = []
    for cls in classes:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        assert info.array_like, f"{cls.__name__} must be array_like"
        assert isinstance(info.tag, int), f"{cls.__name__} needs an integer tag"
        tags.append(info.tag)
    assert len(set(tags)) == len(tags), f"duplicate tags in {name}: {sorted(tags)}"


def test_unions_cover_known_messages() -> None:
    # a sanity anchor so an accidentally emptied union fails loudly
    names = {name: {c.__name__ for c in members(u)} for name, (_, u) in CHANNELS.items()}
    assert {"SessionConnectRequest", "SessionMessageHeader", "SessionKeepAlive"} <= names["ingress"]
    assert {"SessionEvent", "Challenge", "NewLeaderEvent"} <= names["egress"]
    assert {"SessionOpenEvent", "SessionCloseEvent", "TimerEvent"} <= names["log"]
    assert {"AppendRequest", "CommitPosition", "RequestVote"} <= names["consensus"]
    assert {"ScheduleTimer", "CloseSession"} <= names["service"]
    assert {"SnapshotMarker", "ServiceState"} <= names["snapshot"]


def test_tag_is_first_array_element() -> None:
    msg = SessionMessageHeader(1, 2, 3, b"x", 4)
    assert msgspec.msgpack.decode(encode(msg)) == [1, 1, 2, 3, b"x", 4, 0]


def test_records_written_before_sequences_still_decode() -> None:
    """Protocol 2 added trailing fields with defaults (issue 42): a log entry, a
    keepalive and a snapshot's session written before them decode, unsequenced."""
    from cluster.protocol.codec import INGRESS, LOG, SNAPSHOT
    from cluster.protocol.ingress import SessionKeepAlive
    from cluster.protocol.snapshot import ClientSession

    old_entry = msgspec.msgpack.encode([1, 7, 2, 3, b"x"])
    assert LOG.decode(old_entry) == SessionMessageHeader(7, 2, 3, b"x", 0)
    assert INGRESS.decode(msgspec.msgpack.encode([5, 7, 2])) == SessionKeepAlive(7, 2, 0)
    old_session = msgspec.msgpack.encode([102, 9, 1, "", b"p", b"h"])
    assert SNAPSHOT.decode(old_session) == ClientSession(9, 1, "", b"p", b"h", 0)


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    ("channel", "codec", "cls"),
    CHANNEL_MESSAGES,
    ids=[f"{n}-{c.__name__}" for n, _, c in CHANNEL_MESSAGES],
)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip_every_message(
    channel: str, codec: Codec[typing.Any], cls: type[Message], data: st.DataObject
) -> None:
    msg = data.draw(strategy_for(cls))
    body = encode(msg)
    decoded = codec.decode(body)
    assert type(decoded) is cls
    assert decoded == msg
    # enums come back as enum members, not bare ints
    for field in msgspec.structs.fields(cls):
        value = getattr(decoded, field.name)
        if isinstance(getattr(msg, field.name), enum.Enum):
            assert isinstance(value, enum.Enum)
    # through a frame and the frame decoder
    decoder = FrameDecoder()
    (frame_body,) = decoder.feed(encode_frame(msg))
    assert codec.decode(frame_body) == msg
    assert decoder.buffered == 0


@pytest.mark.parametrize("name", list(CHANNELS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_batches_per_channel(name: str, data: st.DataObject) -> None:
    codec, union = CHANNELS[name]
    msgs = data.draw(st.lists(any_message(union), max_size=6))
    buf = bytearray()
    encode_frames_into(buf, msgs)
    decoder = FrameDecoder()
    assert [codec.decode(b) for b in decoder.feed(buf)] == msgs


# ---------------------------------------------------------------------- framing


@settings(max_examples=300, deadline=None)
@given(
    msgs=st.lists(ANY_MESSAGE, min_size=1, max_size=10),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_random_split_points_give_same_frames(msgs: list[Message], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(m) for m in msgs)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert b"".join(chunks) == stream
    decoder = FrameDecoder()
    bodies: list[bytes] = []
    for chunk in chunks:
        bodies.extend(decoder.feed(chunk))
    assert bodies == [encode(m) for m in msgs]
    assert decoder.buffered == 0


@settings(max_examples=300, deadline=None)
@given(
    msgs=st.lists(ANY_MESSAGE, min_size=1, max_size=10),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    as_bytearray=st.booleans(),
)
def test_decode_into_equals_feed_then_decode(
    msgs: list[Message], cuts: list[int], as_bytearray: bool
) -> None:
    stream = b"".join(encode_frame(m) for m in msgs)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    decoder = FrameDecoder()
    out: list[object] = []
    counts = 0
    for chunk in chunks:
        counts += decoder.decode_into(bytearray(chunk) if as_bytearray else chunk, bytes, out)
    assert out == [encode(m) for m in msgs]
    assert counts == len(msgs)
    assert decoder.buffered == 0


def test_decode_into_keeps_frames_before_a_bad_one() -> None:
    good = [SessionMessageHeader(1, 2, 3, b"a"), SessionMessageHeader(1, 2, 3, b"b")]
    data = b"".join(encode_frame(m) for m in good) + b"\x00\x00\x00\x00"
    decoder = FrameDecoder()
    out: list[object] = []
    with pytest.raises(ProtocolError, match="frame length 0"):
        decoder.decode_into(data, INGRESS.decode, out)
    assert out == good
    assert decoder.buffered == 0


@pytest.mark.parametrize(
    "body",
    [b"\xc1", b"\x93\x01\x02", b"\xff" * 9, b"\x95" + b"\x01" * 5],
    ids=["reserved byte", "short array", "bad tag", "wrong types"],
)
def test_decode_into_a_codec_a_frame_that_does_not_decode_is_a_protocol_error(
    body: bytes,
) -> None:
    """With a Codec, msgspec's own errors become the ProtocolError Codec.decode raises
    (naming the channel), the frames before it are kept and the buffer is dropped."""
    good = [SessionMessageHeader(1, 2, 3, b"a")]
    data = encode_frame(good[0]) + frame(body) + encode_frame(good[0])[:3]
    with pytest.raises(ProtocolError) as one:
        INGRESS.decode(body)
    decoder = FrameDecoder()
    out: list[object] = []
    with pytest.raises(ProtocolError) as many:
        decoder.decode_into(data, INGRESS, out)
    assert str(many.value) == str(one.value)
    assert str(many.value).startswith("bad ingress message")
    assert out == good
    assert decoder.buffered == 0


@settings(max_examples=200, deadline=None)
@given(msgs=st.lists(ANY_MESSAGE, max_size=10), prefix=st.binary(max_size=8))
def test_encode_frames_into_equals_concatenated_encode_frame(
    msgs: list[Message], prefix: bytes
) -> None:
    buf = bytearray(prefix)
    encode_frames_into(buf, msgs)
    assert bytes(buf) == prefix + b"".join(encode_frame(m) for m in msgs)
    assert bytes(buf[len(prefix) :]) == b"".join(frame(encode(m)) for m in msgs)


def test_frame_header_is_u32_little_endian_body_length() -> None:
    msg = SessionMessageHeader(1, 2, 3, b"payload")
    data = encode_frame(msg)
    assert data[:HEADER_LENGTH] == len(encode(msg)).to_bytes(4, "little")
    assert data[HEADER_LENGTH:] == encode(msg)


def test_zero_length_frame_is_protocol_error() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(LENGTH.pack(0))
    assert decoder.buffered == 0


@pytest.mark.parametrize("max_size", [1, 16, 4096, DEFAULT_MAX_FRAME_SIZE])
def test_frame_longer_than_max_is_protocol_error(max_size: int) -> None:
    decoder = FrameDecoder(max_frame_size=max_size)
    # exactly the maximum is fine
    assert decoder.feed(LENGTH.pack(max_size) + b"\x01" * max_size) == [b"\x01" * max_size]
    with pytest.raises(ProtocolError, match="max frame size"):
        decoder.feed(LENGTH.pack(max_size + 1))
    assert decoder.buffered == 0


def test_huge_length_raises_without_allocating_the_body() -> None:
    decoder = FrameDecoder(max_frame_size=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            decoder.feed(LENGTH.pack(0xFFFFFFFF))  # claims a 4 GiB body
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert decoder.buffered == 0


def test_partial_frame_waits_and_buffers_only_what_arrived() -> None:
    decoder = FrameDecoder(max_frame_size=1 << 20)
    assert decoder.feed(LENGTH.pack(1 << 20) + b"abc") == []
    assert decoder.buffered == HEADER_LENGTH + 3
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\0" * ((1 << 20) - 3)) == [b"abc" + b"\0" * ((1 << 20) - 3)]
    assert decoder.buffered == 0


def test_decoder_rejects_nonpositive_max_frame_size() -> None:
    with pytest.raises(ValueError, match="positive"):
        FrameDecoder(0)


def test_decoder_usable_after_error_on_a_new_stream() -> None:
    decoder = FrameDecoder(max_frame_size=64)
    with pytest.raises(ProtocolError):
        decoder.feed(LENGTH.pack(65) + b"junk")
    msg = SessionMessageHeader(1, 2, 3, b"ok")
    assert decoder.feed(encode_frame(msg)) == [encode(msg)]


# ---------------------------------------------------------------------- robustness


def _decode_everything(data: bytes, max_frame_size: int = 4096) -> None:
    """Feed ``data`` (in two pieces) and decode each frame with every codec.

    Anything but ProtocolError escaping is a test failure.
    """
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    bodies: list[bytes] = []
    try:
        half = len(data) // 2
        bodies.extend(decoder.feed(data[:half]))
        bodies.extend(decoder.feed(data[half:]))
    except ProtocolError:
        pass
    except Exception as exc:  # pragma: no cover - a failure
        pytest.fail(f"FrameDecoder raised {type(exc).__name__}: {exc!r} for {data!r}")
    for body in [*bodies, data]:
        for codec in ALL_CODECS:
            try:
                codec.decode(body)
            except ProtocolError:
                pass
            except Exception as exc:  # pragma: no cover - a failure
                pytest.fail(f"{codec.name} raised {type(exc).__name__}: {exc!r} for {body!r}")


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_only_raise_protocol_error(data: bytes) -> None:
    _decode_everything(data)


@st.composite
def mutated_stream(draw: st.DrawFn) -> bytes:
    msgs = draw(st.lists(ANY_MESSAGE, min_size=1, max_size=4))
    data = bytearray(b"".join(encode_frame(m) for m in msgs))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "length"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xC0, 0xC1, 0xCF, 0xD3, 0xFF]))
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        else:  # rewrite the first frame's length field
            if len(data) >= HEADER_LENGTH:
                LENGTH.pack_into(data, 0, draw(st.integers(0, 2**32 - 1)))
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated_stream())
def test_mutated_frames_only_raise_protocol_error(data: bytes) -> None:
    _decode_everything(data)


@settings(max_examples=300, deadline=None)
@given(msg=ANY_MESSAGE, data=st.data())
def test_mutated_bodies_only_raise_protocol_error(msg: Message, data: st.DataObject) -> None:
    body = bytearray(encode(msg))
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    for candidate in (bytes(body), bytes(body[:cut])):
        for codec in ALL_CODECS:
            try:
                codec.decode(candidate)
            except ProtocolError:
                pass
            except Exception as exc:  # pragma: no cover - a failure
                pytest.fail(f"{codec.name} raised {type(exc).__name__}: {exc!r}")


def test_hostile_msgpack_shapes_only_raise_protocol_error() -> None:
    hostile = [
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4 billion elements
        b"\xdf\xff\xff\xff\xff",  # map32 claiming 4 billion pairs
        b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
        b"\x91" * 10_000 + b"\x01",  # deeply nested arrays
        b"\x95\x01\x01\x02\x03\xd4\x01\x00",  # ext where bytes are expected
        b"\x95\x01\x01\x02\x03\xa2\xff\xfe",  # str where bytes are expected
        b"\xc1",  # never-used byte
        b"",
    ]
    for body in hostile:
        for codec in ALL_CODECS:
            with pytest.raises(ProtocolError):
                codec.decode(body)


def _raw_fields(msg: Message) -> list[typing.Any]:
    raw = msgspec.msgpack.decode(encode(msg))
    assert isinstance(raw, list)
    return raw


def _field_kinds() -> list[tuple[str, Codec[typing.Any], type[Message], int, mi.Type]]:
    out = []
    for name, codec, cls in CHANNEL_MESSAGES:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for index, field in enumerate(info.fields):
            out.append((name, codec, cls, index, field.type))
    return out


FIELD_KINDS = _field_kinds()
INT_FIELDS = [k for k in FIELD_KINDS if isinstance(k[4], mi.IntType)]
ENUM_FIELDS = [k for k in FIELD_KINDS if isinstance(k[4], mi.EnumType)]


@pytest.mark.parametrize(
    ("channel", "codec", "cls", "index", "ftype"),
    INT_FIELDS,
    ids=[f"{n}-{c.__name__}-{i}" for n, _, c, i, _ in INT_FIELDS],
)
def test_out_of_range_ints_are_protocol_errors(
    channel: str, codec: Codec[typing.Any], cls: type[Message], index: int, ftype: mi.IntType
) -> None:
    base = _raw_fields(plain_instance(cls))
    assert ftype.ge is not None
    assert ftype.le is not None
    for bad in (ftype.le + 1, ftype.ge - 1, 2**63, 2**64 - 1, -(2**63)):
        if ftype.ge <= bad <= ftype.le or not INT64_MIN <= bad <= 2**64 - 1:
            continue  # in range, or not representable in MessagePack at all
        raw = list(base)
        raw[index + 1] = bad  # +1: the tag comes first
        with pytest.raises(ProtocolError):
            codec.decode(msgspec.msgpack.encode(raw))
    # wrong type in an int field
    raw = list(base)
    raw[index + 1] = "1"
    with pytest.raises(ProtocolError):
        codec.decode(msgspec.msgpack.encode(raw))


@pytest.mark.parametrize(
    ("channel", "codec", "cls", "index", "ftype"),
    ENUM_FIELDS,
    ids=[f"{n}-{c.__name__}-{i}" for n, _, c, i, _ in ENUM_FIELDS],
)
def test_unknown_enum_values_are_protocol_errors(
    channel: str, codec: Codec[typing.Any], cls: type[Message], index: int, ftype: mi.EnumType
) -> None:
    base = _raw_fields(plain_instance(cls))
    known = {int(v) for v in ftype.cls}
    for bad in (max(known) + 1, -1, 255, 2**40):
        assert bad not in known
        raw = list(base)
        raw[index + 1] = bad
        with pytest.raises(ProtocolError):
            codec.decode(msgspec.msgpack.encode(raw))


@pytest.mark.parametrize(
    ("channel", "codec", "cls"),
    CHANNEL_MESSAGES,
    ids=[f"{n}-{c.__name__}" for n, _, c in CHANNEL_MESSAGES],
)
def test_unknown_tag_missing_and_extra_fields(
    channel: str, codec: Codec[typing.Any], cls: type[Message]
) -> None:
    raw = _raw_fields(plain_instance(cls))
    tags = {mi.type_info(c).tag for c in members(CHANNELS[channel][1])}  # type: ignore[attr-defined]
    unknown = next(t for t in range(200, 10_000) if t not in tags)
    with pytest.raises(ProtocolError):
        codec.decode(msgspec.msgpack.encode([unknown, *raw[1:]]))
    required = sum(1 for f in msgspec.structs.fields(cls) if f.required)
    with pytest.raises(ProtocolError):
        codec.decode(msgspec.msgpack.encode(raw[: 1 + required - 1]))
    with pytest.raises(ProtocolError):
        codec.decode(msgspec.msgpack.encode({"type": raw[0]}))  # a map, not an array


def test_message_of_another_channel_is_rejected() -> None:
    from cluster.protocol.consensus import CommitPosition
    from cluster.protocol.egress import SessionEvent
    from cluster.protocol.enums import EventCode

    with pytest.raises(ProtocolError, match="ingress"):
        INGRESS.decode(encode(SessionEvent(1, 2, 3, 4, EventCode.OK, 5)))
    with pytest.raises(ProtocolError, match="log"):
        LOG.decode(encode(CommitPosition(1, 2, 3)))


# ---------------------------------------------------------------------- version


@given(
    major=st.integers(0, 255),
    minor=st.integers(0, 255),
    patch=st.integers(0, 255),
)
@settings(max_examples=300)
def test_compose_packs_parts(major: int, minor: int, patch: int) -> None:
    v = pv.compose(major, minor, patch)
    assert v == (major << 16) | (minor << 8) | patch
    assert pv.major(v) == major
    assert pv.to_string(v) == f"{major}.{minor}.{patch}"
    assert INT32_MIN <= v <= INT32_MAX  # fits the Int32 version fields


@given(
    a=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)),
    b=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)),
)
@settings(max_examples=300)
def test_is_compatible_iff_same_major(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    va, vb = pv.compose(*a), pv.compose(*b)
    assert pv.is_compatible(va, vb) is (a[0] == b[0])
    assert pv.is_compatible(va, vb) == pv.is_compatible(vb, va)


def test_is_compatible_default_is_protocol_version() -> None:
    assert pv.is_compatible(pv.PROTOCOL_VERSION)
    m = pv.major(pv.PROTOCOL_VERSION)
    assert pv.is_compatible(pv.compose(m, 99, 7))
    assert not pv.is_compatible(pv.compose((m + 1) % 256, 0, 0))


@pytest.mark.parametrize(
    "parts", [(256, 0, 0), (0, 256, 0), (0, 0, 256), (-1, 0, 0), (0, -1, 0), (0, 0, -1)]
)
def test_compose_out_of_range_raises(parts: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        pv.compose(*parts)
