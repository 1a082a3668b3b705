"""Encoders and decoders, built once per channel and reused.

Messages are encoded as MessagePack arrays (``array_like``) whose first element is the
message's tag (its Aeron template id).  :func:`encode` is shared by every channel; each
channel has its own :class:`Codec` that decodes only that channel's union and turns any
bad input into :class:`~cluster.protocol.errors.ProtocolError`.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from .admin import AdminMessage
from .consensus import ConsensusMessage
from .egress import EgressMessage
from .errors import ProtocolError
from .ingress import IngressMessage
from .log import LogMessage
from .service import ServiceMessage
from .snapshot import SnapshotRecord

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()

encode = _encoder.encode
"""Encode any message to bytes (a MessagePack array, tag first)."""

encode_into = _encoder.encode_into
"""Encode a message into a ``bytearray`` at an offset (no intermediate copy)."""


DECODE_ERRORS = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    ValueError,
    TypeError,
    OverflowError,
    RecursionError,
)
"""What msgspec's decoding of malformed input may raise (the last four defensively)."""


class Codec(Generic[T]):
    """Decoder for one channel's tagged union of messages."""

    __slots__ = ("_decoder", "name")

    def __init__(self, name: str, message_type: Any) -> None:
        self.name = name
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(message_type)

    def decode(self, body: bytes | bytearray | memoryview) -> T:
        """Decode one message; any malformed input raises :class:`ProtocolError`."""
        try:
            return self._decoder.decode(body)
        except DECODE_ERRORS as exc:
            raise self.error(exc) from None

    @property
    def raw_decode(self) -> Any:
        """msgspec's own decode: it raises one of :data:`DECODE_ERRORS`, which
        :meth:`error` turns into the :class:`ProtocolError` :meth:`decode` raises (for
        loops over many frames, one Python call a frame fewer)."""
        return self._decoder.decode

    def error(self, exc: Exception) -> ProtocolError:
        if isinstance(exc, (msgspec.DecodeError, msgspec.ValidationError)):
            return ProtocolError(f"bad {self.name} message: {exc}")
        return ProtocolError(f"bad {self.name} message: {exc!r}")  # defensive


INGRESS: Codec[IngressMessage] = Codec("ingress", IngressMessage)
EGRESS: Codec[EgressMessage] = Codec("egress", EgressMessage)
LOG: Codec[LogMessage] = Codec("log", LogMessage)
CONSENSUS: Codec[ConsensusMessage] = Codec("consensus", ConsensusMessage)
SERVICE: Codec[ServiceMessage] = Codec("service", ServiceMessage)
SNAPSHOT: Codec[SnapshotRecord] = Codec("snapshot", SnapshotRecord)
ADMIN: Codec[AdminMessage] = Codec("admin", AdminMessage)
