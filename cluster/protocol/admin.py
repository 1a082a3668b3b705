"""Admin channel: ``cluster-tool`` <-> a member's admin port (Triarch's own, tags 200+).

Aeron's ClusterTool reads mark files and toggles counters in the driver's shared memory;
Triarch members have no shared memory to poke, so each member serves its admin port
(the fourth port of ``--members``) with a request/response protocol: the tool sends an
:class:`AdminCommand`, the member answers with an :class:`AdminReply` carrying the same
``correlation_id``.  Query commands put their result in ``body`` as JSON
(:func:`encode_body` / :func:`decode_body`).  Frames are the usual length-prefixed
MessagePack arrays (:mod:`cluster.protocol.framing`); bad bytes raise
:class:`~cluster.protocol.errors.ProtocolError`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._typing import Int64
from ._base import Message
from .errors import ProtocolError


class AdminCommand(Message, tag=200):
    """A request to one member: ``command`` (e.g. ``describe``) with string ``args``."""

    correlation_id: Int64
    command: str
    args: dict[str, str] = msgspec.field(default_factory=dict)


class AdminReply(Message, tag=201):
    """The answer to an :class:`AdminCommand`; ``body`` is JSON for query commands."""

    correlation_id: Int64
    ok: bool
    message: str
    body: bytes = b""


AdminMessage = AdminCommand | AdminReply

_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def encode_body(value: Any) -> bytes:
    """JSON for an :attr:`AdminReply.body`."""
    return _json_encoder.encode(value)


def decode_body(body: bytes) -> Any:
    """Parse an :attr:`AdminReply.body` (``None`` when empty); bad JSON is a ProtocolError."""
    if not body:
        return None
    try:
        return _json_decoder.decode(body)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ProtocolError(f"bad admin reply body: {exc}") from None
