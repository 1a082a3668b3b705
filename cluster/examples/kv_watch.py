"""The client's side of a KV watch: :class:`Watcher` (what ``KeyValueClient.watch``
returns), :class:`KeyChange` (what it yields) and the errors that end it.

The service sends a session one ``Change`` per change under its watches' prefixes, as
replies: numbered, kept on every member until the client confirms them, sent again by a
new leader and deduplicated by the client, so a watch sees every change once, in log
order, across leader changes.  The ``KeyValueClient``'s receive loop puts each one in the
buffer of the watch it names (:class:`WatchState`) and never waits for a consumer: a
watch whose consumer falls ``max_buffered`` changes behind fails
(:class:`WatchOverflowError`) instead of holding up the responses to other requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import anyio

__all__ = [
    "DEFAULT_MAX_BUFFERED",
    "KeyChange",
    "WatchError",
    "WatchLostError",
    "WatchOverflowError",
    "Watcher",
]

DEFAULT_MAX_BUFFERED = 10_000
"""Changes a watch holds for a consumer that has not taken them yet, by default."""

_UNWATCH_TIMEOUT = 1.0  # seconds a closing watch waits to queue its Unwatch


class WatchError(Exception):
    """A watch ended before its consumer stopped it: it yields no more changes."""


class WatchOverflowError(WatchError):
    """The consumer fell more than ``max_buffered`` changes behind; the changes after
    ``position`` were not kept (the ones before it were all yielded)."""

    def __init__(self, prefix: str, max_buffered: int, position: int) -> None:
        super().__init__(
            f"watch of {prefix!r} overflowed: its consumer fell more than {max_buffered} "
            f"changes behind; changes after log position {position} were not kept "
            "(watch again, and read what you need with get)"
        )
        self.prefix = prefix
        self.max_buffered = max_buffered
        self.position = position


class WatchLostError(WatchError):
    """The cluster dropped replies to this session (more than ``--max-kept-replies``
    of them were given while the client was away): changes may be missing after
    ``position``, so the watch stops rather than go on with a gap."""

    def __init__(self, prefix: str, dropped: int, position: int) -> None:
        super().__init__(
            f"watch of {prefix!r} lost changes: the cluster dropped {dropped} replies to this "
            f"session (more than --max-kept-replies while it was away) after log position "
            f"{position}"
        )
        self.prefix = prefix
        self.dropped = dropped
        self.position = position


@dataclass(frozen=True, slots=True)
class KeyChange:
    """One change under a watched prefix: ``key`` now holds ``value`` (None: it was
    deleted, or its TTL expired), as of the log entry that ends at ``position``
    (increasing, one entry per change), applied at cluster time ``timestamp`` (epoch
    ms)."""

    key: str
    value: bytes | None
    position: int
    timestamp: int

    @property
    def deleted(self) -> bool:
        return self.value is None


class WatchState:
    """One watch's buffer, filled by the receive loop (never blocking) and emptied by
    its :class:`Watcher`; ``error`` ends it once the buffer is drained."""

    __slots__ = ("_wake", "buffer", "error", "last_position", "max_buffered", "prefix")

    def __init__(self, prefix: str, max_buffered: int) -> None:
        self.prefix = prefix
        self.max_buffered = max_buffered
        self.buffer: deque[KeyChange] = deque()
        self.error: BaseException | None = None
        self.last_position = 0  # of the last change taken in
        self._wake: anyio.Event | None = None

    def push(self, change: KeyChange) -> None:
        if self.error is not None:
            return
        if len(self.buffer) >= self.max_buffered:
            self.fail(WatchOverflowError(self.prefix, self.max_buffered, self.last_position))
            return
        self.buffer.append(change)
        self.last_position = change.position
        self._notify()

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def next(self) -> KeyChange:
        while not self.buffer:
            if self.error is not None:
                raise self.error
            self._wake = wake = anyio.Event()
            await wake.wait()
        return self.buffer.popleft()


class _Registry(Protocol):
    """What a :class:`Watcher` needs of its ``KeyValueClient``."""

    async def _start_watch(self, state: WatchState) -> int: ...

    async def _stop_watch(self, watch_id: int) -> None: ...


class Watcher:
    """Every change under ``prefix`` from the moment the watch is registered, in log
    order, each once, across leader changes.  Use it as::

        async with kv.watch("config/") as changes:
            async for change in changes:
                print(change.key, change.value, change.position)

    Entering sends a ``Watch`` request through the log and returns once the service
    applied it: every change applied after it is yielded, none before.  Leaving the
    block sends an ``Unwatch`` (closing the session ends the watch too).  The iteration
    raises :class:`WatchOverflowError` when the consumer fell ``max_buffered`` changes
    behind, :class:`WatchLostError` when the cluster dropped replies to the session,
    and the session's error when it closes, each after every change kept before it
    was yielded.
    """

    def __init__(self, kv: _Registry, prefix: str, max_buffered: int) -> None:
        """Internal: ``KeyValueClient.watch`` makes one (``kv`` is that client)."""
        if type(prefix) is not str:
            raise TypeError(f"a watch prefix is a str, not {type(prefix).__name__}")
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be positive, got {max_buffered!r}")
        self._kv: _Registry = kv
        self.prefix = prefix
        self.state = WatchState(prefix, max_buffered)
        self.watch_id = 0  # the id the service knows it by, once entered
        self._entered = False
        self._left = False

    async def __aenter__(self) -> Watcher:
        if self._entered:
            raise RuntimeError("a Watcher is entered once: call kv.watch() again")
        self._entered = True
        self.watch_id = await self._kv._start_watch(self.state)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._left = True
        self.state.fail(WatchError(f"watch of {self.prefix!r} was closed"))
        with anyio.CancelScope(shield=True), anyio.move_on_after(_UNWATCH_TIMEOUT):
            await self._kv._stop_watch(self.watch_id)

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> KeyChange:
        if not self._entered or self._left:
            raise RuntimeError(
                "iterate a watch inside its block: `async with kv.watch(prefix) as changes: "
                "async for change in changes: ...`"
            )
        return await self.state.next()
