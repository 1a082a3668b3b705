"""The network interface the agents see, so a simulated network can replace TCP.

A :class:`Network` opens outbound byte streams and serves inbound ones; streams are
``trio.abc.Stream`` objects.  :class:`~cluster.transport.tcp.TcpNetwork` is the real
thing; tests substitute an in-memory network with seeded faults.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class Network(Protocol):
    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        """Connect to ``host:port``; raise ``OSError`` if it cannot."""
        ...

    async def serve(
        self,
        host: str,
        port: int,
        handler: StreamHandler,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections forever, running ``handler`` for each in its own task.

        Reports the bound port through ``task_status`` once listening.
        """
        ...
