"""Triarch cluster client (Aeron's ``AeronCluster``), on anyio: runs under Trio and asyncio.

::

    async with client.connect("0=127.0.0.1:9010,1=127.0.0.1:9011") as c:
        await c.offer(b"hello")
        reply = await c.receive()
"""

from __future__ import annotations

from ._client import MAX_PENDING_BYTES, ClusterClient
from ._connect import ConnectState
from ._credentials import CredentialsSupplier, StaticCredentials
from ._open import connect
from .errors import (
    AuthenticationRejectedError,
    CertsDirError,
    ClusterClientError,
    ConnectTimeoutError,
    EgressBacklogExceededError,
    NotConnectedError,
    QueryRefusedError,
    ServiceError,
    SessionClosedError,
    SessionLostError,
    SessionRejectedError,
    TlsRequiredError,
)
from .events import (
    AdminResponseReceived,
    ClientEvent,
    Connected,
    Disconnected,
    EventsMissed,
    NewLeader,
    RepliesDropped,
    SessionClosed,
    SessionEventReceived,
)

__all__ = [
    "MAX_PENDING_BYTES",
    "AdminResponseReceived",
    "AuthenticationRejectedError",
    "CertsDirError",
    "ClientEvent",
    "ClusterClient",
    "ClusterClientError",
    "ConnectState",
    "ConnectTimeoutError",
    "Connected",
    "CredentialsSupplier",
    "Disconnected",
    "EgressBacklogExceededError",
    "EventsMissed",
    "NewLeader",
    "NotConnectedError",
    "QueryRefusedError",
    "RepliesDropped",
    "ServiceError",
    "SessionClosed",
    "SessionClosedError",
    "SessionEventReceived",
    "SessionLostError",
    "SessionRejectedError",
    "StaticCredentials",
    "TlsRequiredError",
    "connect",
]
