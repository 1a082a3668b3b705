"""Wake-up helpers for the client's tasks, looked up once per client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import sniffio

__all__ = ["Backend", "Broadcast"]


class Backend:
    """The async primitives the hot paths use, looked up once per client.

    ``anyio``'s generic functions find the running backend on every call, which costs
    more than the rest of an ``offer``; under Trio the client calls Trio's own."""

    __slots__ = ("checkpoint", "checkpoint_if_cancelled", "current_time", "event", "is_trio")

    def __init__(self) -> None:
        self.checkpoint: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint
        self.checkpoint_if_cancelled: Callable[[], Awaitable[None]] = (
            anyio.lowlevel.checkpoint_if_cancelled
        )
        self.event: Callable[[], Any] = anyio.Event
        self.current_time: Callable[[], float] = anyio.current_time
        self.is_trio = False
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return
        if library == "trio":
            import trio
            import trio.lowlevel

            self.checkpoint = trio.lowlevel.checkpoint
            self.checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
            self.event = trio.Event
            self.current_time = trio.current_time
            self.is_trio = True


class Broadcast:
    """Wake every task waiting for a change (a condition variable without the lock).

    Waiters check their condition, then ``await wait()``; nothing can change in between
    because there is no checkpoint, so no wake-up is lost.  The event is created lazily,
    so ``notify()`` with nobody waiting costs next to nothing (it runs once per offer).
    """

    __slots__ = ("_event", "_new_event")

    def __init__(self, backend: Backend) -> None:
        self._new_event = backend.event
        self._event: Any = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = self._new_event()
        await self._event.wait()

    def notify(self) -> None:
        event = self._event
        if event is not None:
            self._event = None
            event.set()
