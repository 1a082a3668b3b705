"""Connection counts taken at accept, before any byte is trusted (issue 33).

Every port a node serves (ingress, admin, metrics, consensus) counts its connections in a
:class:`ConnectionGate`: a cap on the connections open at once and a share of it per
source address (an IPv6 address's /64), so that one host cannot take every slot
(loopback counts like any address).  The count is taken when the kernel hands over the
socket, *before* a TLS handshake: a connection over the cap, or over its address's
share, is closed at once and counted (``refused``), having cost one accept and no
handshake.

A handler joins its port's gate with :func:`gated`; :meth:`TcpNetwork.serve
<cluster.transport.tcp.TcpNetwork.serve>` sees the gate and counts at accept; any other
network (the simulator's) calls the wrapper, which counts when it is called.  A handler
that no longer needs its slot counted (a member link once its hello named a member) hands
it back early with :meth:`ConnectionGate.release`.

A gate made with ``evict_oldest`` (the consensus port's, which counts only links that
have not said who they are) does not refuse a connection when it is full: it closes the
oldest connection it counts instead.  A member's link says hello within a round trip of
its connect (or of its TLS handshake), so strangers holding every slot open and dialling
again as soon as one is closed no longer keep a restarted member out: they would have to
open a whole cap of new connections within that round trip, each time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..core.session import address_key

log = logging.getLogger("cluster.transport")

MIN_SHARE = 4
"""The per-address share is never below this (a few clients behind one NAT)."""


def default_share(limit: int) -> int:
    """The per-address share of a cap when none is configured: a quarter, at least
    :data:`MIN_SHARE` (and never above the cap)."""
    return min(limit, max(MIN_SHARE, limit // 4))


class ConnectionGate:
    """A cap on a port's open connections and a share of it per source address."""

    def __init__(
        self, name: str, limit: int, per_address: int = 0, *, evict_oldest: bool = False
    ) -> None:
        """``per_address``: 0 means :func:`default_share` of ``limit``; ``evict_oldest``:
        when full, close the oldest connection counted rather than refuse the new one."""
        self.name = name
        self.evict_oldest = evict_oldest
        self.evicted = 0
        """Connections closed to make room for a newer one (``evict_oldest``)."""
        self._scopes: dict[int, trio.CancelScope] = {}
        self._evict_logged_at = -math.inf
        self.limit = max(1, limit)
        self.per_address = min(self.limit, per_address) if per_address > 0 else 0
        self.open = 0
        self.accepted = 0
        self.refused = 0
        """Closed at accept: over the cap or over an address's share."""
        self.refused_per_address = 0
        """Of :attr:`refused`, those over their address's share."""
        self.by_address: dict[str, int] = {}
        self._held: dict[int, str] = {}
        self._logged_at = -math.inf

    @property
    def share(self) -> int:
        return self.per_address or default_share(self.limit)

    def admit(self, address: str) -> bool:
        """Take a slot for a connection from ``address``; False (counted, logged at most
        every 10 s) when the port is full or the address has its share."""
        held = self.by_address.get(address, 0)
        if self.open >= self.limit or held >= self.share:
            self.refused += 1
            per_address = self.open < self.limit
            self.refused_per_address += per_address
            self._log_refusal(address, per_address)
            return False
        self.open += 1
        self.accepted += 1
        self.by_address[address] = held + 1
        return True

    def hold(self, stream: object, address: str) -> bool:
        """:meth:`admit`, the slot remembered for ``stream`` (see :meth:`release`).  An
        IPv6 address counts by its /64, as the pending sessions' shares do
        (:func:`~cluster.core.session.address_key`)."""
        key = address_key(address)
        if self.evict_oldest and self.open >= self.limit and self._held:
            self._evict(next(iter(self._held)))
        if not self.admit(key):
            return False
        self._held[id(stream)] = key
        return True

    def guard(self, stream: object) -> trio.CancelScope:
        """The cancel scope a connection's handler runs in: :meth:`hold`'s eviction
        cancels it (already cancelled if ``stream`` was evicted before its handler
        began)."""
        scope = trio.CancelScope()
        if id(stream) in self._held:
            self._scopes[id(stream)] = scope
        elif self.evict_oldest:
            scope.cancel()
        return scope

    def _evict(self, oldest: int) -> None:
        self.leave(self._held.pop(oldest))
        scope = self._scopes.pop(oldest, None)
        if scope is not None:
            scope.cancel()
        self.evicted += 1
        now = _now()
        if now - self._evict_logged_at >= 10.0:
            self._evict_logged_at = now
            log.warning(
                "%s: %d connections that have not said who they are (the cap): closing "
                "the oldest for each new one (%d closed so far)",
                self.name,
                self.limit,
                self.evicted,
            )

    def move(self, old: object, new: object) -> None:
        """``old``'s slot is now ``new``'s (a TLS stream over the accepted socket)."""
        address = self._held.pop(id(old), None)
        if address is not None:
            self._held[id(new)] = address
            scope = self._scopes.pop(id(old), None)
            if scope is not None:
                self._scopes[id(new)] = scope

    def release(self, stream: object) -> None:
        """Give back ``stream``'s slot; nothing if it holds none (or gave it back)."""
        address = self._held.pop(id(stream), None)
        self._scopes.pop(id(stream), None)
        if address is not None:
            self.leave(address)

    def leave(self, address: str) -> None:
        """Give back a slot taken with :meth:`admit`."""
        self.open -= 1
        left = self.by_address.get(address, 1) - 1
        if left > 0:
            self.by_address[address] = left
        else:
            self.by_address.pop(address, None)

    def _log_refusal(self, address: str, per_address: bool) -> None:
        now = _now()
        if now - self._logged_at < 10.0:
            return
        self._logged_at = now
        if per_address:
            log.warning(
                "%s: %s holds %d connections (its share of %d): closing its new ones at "
                "accept (%d refused so far)",
                self.name,
                address,
                self.by_address.get(address, 0),
                self.limit,
                self.refused,
            )
        else:
            log.warning(
                "%s: %d connections open (the cap): closing new ones at accept (%d refused so far)",
                self.name,
                self.open,
                self.refused,
            )


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # pragma: no cover - outside trio (unit tests)
        return 0.0


def stream_address(stream: object) -> str:
    """The peer's address of a socket stream (or a stream over one; the simulator's
    ``remote_host``), ``""`` when it has none."""
    inner = getattr(stream, "transport_stream", stream)
    remote = getattr(inner, "remote_host", None)
    if isinstance(remote, str):
        return remote
    sock = getattr(inner, "socket", None)
    try:
        peer = sock.getpeername() if sock is not None else ""
    except OSError:
        return ""
    return str(peer[0]) if isinstance(peer, tuple) else str(peer or "")


class Gated:
    """A stream handler with its port's :class:`ConnectionGate` (:func:`gated`)."""

    def __init__(self, handler: Callable[[Any], Awaitable[None]], gate: ConnectionGate) -> None:
        self.inner = handler
        self.gate = gate

    async def __call__(self, stream: trio.abc.Stream) -> None:
        """Count, run the handler, give the slot back: for a network that does not
        count at accept itself."""
        gate = self.gate
        if not gate.hold(stream, stream_address(stream)):
            await trio.aclose_forcefully(stream)
            return
        try:
            with gate.guard(stream):
                await self.inner(stream)
        finally:
            gate.release(stream)
            await trio.aclose_forcefully(stream)  # evicted: the handler had no say


def gated(handler: Callable[[Any], Awaitable[None]], gate: ConnectionGate) -> Gated:
    """``handler``, counted by ``gate`` at accept."""
    return Gated(handler, gate)
