"""Triarch cluster client (Aeron's ``AeronCluster``), on anyio: runs under Trio and asyncio.

::

    async with client.connect("0=127.0.0.1:9010,1=127.0.0.1:9011") as c:
        await c.offer(b"hello")
        reply = await c.receive()
"""

from __future__ import annotations

from ._client import MAX_PENDING_BYTES, ClusterClient, connect
from ._connect import ConnectState
from ._credentials import CredentialsSupplier, StaticCredentials
from .errors import (
    AuthenticationRejectedError,
    ClusterClientError,
    ConnectTimeoutError,
    EgressBacklogExceededError,
    NotConnectedError,
    SessionClosedError,
    SessionLostError,
    SessionRejectedError,
)

__all__ = [
    "MAX_PENDING_BYTES",
    "AuthenticationRejectedError",
    "ClusterClient",
    "ClusterClientError",
    "ConnectState",
    "ConnectTimeoutError",
    "CredentialsSupplier",
    "EgressBacklogExceededError",
    "NotConnectedError",
    "SessionClosedError",
    "SessionLostError",
    "SessionRejectedError",
    "StaticCredentials",
    "connect",
]
