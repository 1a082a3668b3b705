"""Triarch's wire protocol: msgspec Structs for every Aeron Cluster message.

One module per channel (ingress, egress, log, consensus, service, snapshot), tagged
unions decoded by one :class:`~cluster.protocol.codec.Codec` per channel, and
length-prefixed framing with a maximum frame size.  Bad bytes raise
:class:`ProtocolError` and nothing else.
"""

from __future__ import annotations

from . import codec, consensus, egress, enums, framing, ingress, log, service, snapshot
from .codec import CONSENSUS, EGRESS, INGRESS, LOG, SERVICE, SNAPSHOT, Codec, encode
from .enums import (
    AdminRequestType,
    AdminResponseCode,
    ChangeType,
    CloseReason,
    ClusterAction,
    ClusterTimeUnit,
    EventCode,
    QueryStatus,
    Role,
    SnapshotMark,
)
from .errors import ProtocolError
from .framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_frame, encode_frames_into
from .version import PROTOCOL_VERSION

__all__ = [
    "CONSENSUS",
    "DEFAULT_MAX_FRAME_SIZE",
    "EGRESS",
    "INGRESS",
    "LOG",
    "PROTOCOL_VERSION",
    "SERVICE",
    "SNAPSHOT",
    "AdminRequestType",
    "AdminResponseCode",
    "ChangeType",
    "CloseReason",
    "ClusterAction",
    "ClusterTimeUnit",
    "Codec",
    "EventCode",
    "FrameDecoder",
    "ProtocolError",
    "QueryStatus",
    "Role",
    "SnapshotMark",
    "codec",
    "consensus",
    "egress",
    "encode",
    "encode_frame",
    "encode_frames_into",
    "enums",
    "framing",
    "ingress",
    "log",
    "service",
    "snapshot",
]
