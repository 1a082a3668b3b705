"""Connection counts taken at accept, before any byte is trusted (issues 33 and 41).

Every port a node serves (ingress, admin, metrics, consensus) counts its connections in a
:class:`ConnectionGate`: a cap on the connections open at once and a share of it per
source address (an IPv6 address's /64), so that one host cannot take every slot
(loopback counts like any address).  The count is taken when the kernel hands over the
socket, *before* a TLS handshake: a connection over its address's share is closed at
once and counted (``refused``), having cost one accept and no handshake.

**What is proven keeps its room.**  A connection is a stranger until its handler says
what it has proven (:meth:`ConnectionGate.prove`): a client past its TLS handshake with
a certificate of the cluster's CA, a session opened on a plaintext ingress connection,
an admin principal, a complete request on the metrics port.  A proven connection still
holds its slot (a descriptor) but no longer counts against its address's share, and is
never closed to make room.  When the port is full, a newcomer from an address that holds
fewer strangers than the address holding the most takes the place of that address's
oldest stranger (``evicted``); only when its own address holds as many as any (or every
slot is proven) is it refused.  So a flood from four or more addresses, each holding its
share, fills the port but keeps nobody out: an operator's tool, a health check or a
client from any other address still gets a slot, and the flood's own new connections
only push out the flood's old ones.  (The pending sessions' slots are shared alike:
:mod:`cluster.core.admission`.)

A connection refused or evicted is **reset** (``SO_LINGER`` 0: an RST, no FIN), before
any byte: the other end reads ECONNRESET, which nothing else a member does at a TLS hello
causes (a member without TLS reads the hello and closes in order), so a client can tell
"refused, at its cap" from "does not speak TLS" (:func:`~cluster.transport.tls.why_hello_closed`).

A handler joins its port's gate with :func:`gated`; :meth:`TcpNetwork.serve
<cluster.transport.tcp.TcpNetwork.serve>` sees the gate and counts at accept; any other
network (the simulator's) calls the wrapper, which counts when it is called.  A handler
that no longer needs its slot counted (a member link once its hello named a member) hands
it back early with :meth:`ConnectionGate.release`.

A gate made with ``evict_oldest`` (the consensus port's, which counts only links that
have not said who they are, with no share per address: members may share a host) closes
the oldest stranger of any address for a newcomer when it is full.  A member's link says
hello within a round trip of its connect (or of its TLS handshake), so strangers holding
every slot open and dialling again as soon as one is closed no longer keep a restarted
member out: they would have to open a whole cap of new connections within that round
trip, each time.
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..core.session import address_key

log = logging.getLogger("cluster.transport")

MIN_SHARE = 4
"""The per-address share is never below this (a few clients behind one NAT)."""

_LINGER_ABORT = struct.pack("ii", 1, 0)


def default_share(limit: int) -> int:
    """The per-address share of a cap when none is configured: a quarter, at least
    :data:`MIN_SHARE` (and never above the cap)."""
    return min(limit, max(MIN_SHARE, limit // 4))


def reset_on_close(stream: object) -> None:
    """Make the close of ``stream`` (a socket, a socket stream or a TLS stream over one)
    a reset: an RST at once, no FIN (see the module docstring).  Nothing for a stream
    without a socket (the simulator's)."""
    inner = getattr(stream, "transport_stream", stream)
    sock = getattr(inner, "socket", inner)
    setsockopt = getattr(sock, "setsockopt", None)
    if setsockopt is None:
        return
    try:
        setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
    except (OSError, ValueError, TypeError):  # closed already, or not a TCP socket
        pass


class _Slot:
    """One counted connection."""

    __slots__ = ("address", "proven", "scope", "seq", "stream")

    def __init__(self, seq: int, address: str, stream: object) -> None:
        self.seq = seq
        self.address = address
        self.stream = stream
        self.proven = False
        self.scope: trio.CancelScope | None = None


class ConnectionGate:
    """A cap on a port's open connections and a share of it per source address; what is
    proven keeps its room (see the module docstring)."""

    def __init__(
        self, name: str, limit: int, per_address: int = 0, *, evict_oldest: bool = False
    ) -> None:
        """``per_address``: 0 means :func:`default_share` of ``limit``; ``evict_oldest``:
        when full, close the oldest stranger of any address for the newcomer."""
        self.name = name
        self.evict_oldest = evict_oldest
        self.evicted = 0
        """Connections closed to make room for a newer one."""
        self._evict_logged_at = -math.inf
        self.limit = max(1, limit)
        self.per_address = min(self.limit, per_address) if per_address > 0 else 0
        self.open = 0
        """Connections counted now, strangers and proven."""
        self.proven = 0
        """Of :attr:`open`, those proven (:meth:`prove`)."""
        self.accepted = 0
        self.refused = 0
        """Closed at accept: over an address's share, or the port full of what could
        not make room."""
        self.refused_per_address = 0
        """Of :attr:`refused`, those over their address's share."""
        self.by_address: dict[str, int] = {}
        """Strangers (not proven) per address."""
        self._held: dict[int, _Slot] = {}
        """Every counted connection, by its stream's id."""
        self._strangers: dict[str, dict[int, _Slot]] = {}
        """Each address's strangers with a stream, oldest first (by ``seq``)."""
        self._oldest: dict[int, _Slot] = {}
        """Every stranger with a stream, oldest first (``evict_oldest``)."""
        self._levels: dict[int, dict[str, None]] = {}
        """The addresses holding each number of strangers (n > 0)."""
        self._top = 0
        """The most strangers one address holds."""
        self._seq = itertools.count()
        self._logged_at = -math.inf

    @property
    def share(self) -> int:
        return self.per_address or default_share(self.limit)

    # ------------------------------------------------------------------ counting

    def admit(self, address: str) -> bool:
        """Take a stranger's slot for a connection from ``address``; False (counted,
        logged at most every 10 s) when the port is full or the address has its share.
        (:meth:`hold` also makes room when the port is full.)"""
        held = self.by_address.get(address, 0)
        if self.open >= self.limit or held >= self.share:
            self.refused += 1
            per_address = held >= self.share
            self.refused_per_address += per_address
            self._log_refusal(address, per_address)
            return False
        self.open += 1
        self.accepted += 1
        self._count(address, +1)
        return True

    def leave(self, address: str) -> None:
        """Give back a stranger's slot taken with :meth:`admit`."""
        self.open -= 1
        self._count(address, -1)

    def _count(self, address: str, step: int) -> None:
        held = self.by_address.get(address, 0)
        now = max(0, held + step)
        if held:
            level = self._levels[held]
            level.pop(address, None)
            if not level:
                del self._levels[held]
        if now:
            self.by_address[address] = now
            self._levels.setdefault(now, {})[address] = None
        else:
            self.by_address.pop(address, None)
        if now > self._top:
            self._top = now
        while self._top and self._top not in self._levels:
            self._top -= 1

    # ------------------------------------------------------------------ streams

    def hold(self, stream: object, address: str) -> bool:
        """:meth:`admit`, the slot remembered for ``stream`` (see :meth:`release`),
        making room when the port is full (see the module docstring).  An IPv6 address
        counts by its /64, as the pending sessions' shares do
        (:func:`~cluster.core.session.address_key`)."""
        key = address_key(address)
        if self.open >= self.limit and (
            self.evict_oldest or self.by_address.get(key, 0) < self.share
        ):
            victim = self._victim(key)
            if victim is not None:
                self._evict(victim)
        if not self.admit(key):
            return False
        slot = _Slot(next(self._seq), key, stream)
        self._held[id(stream)] = slot
        self._strangers.setdefault(key, {})[slot.seq] = slot
        self._oldest[slot.seq] = slot
        return True

    def _victim(self, newcomer: str) -> _Slot | None:
        """The stranger to close for a newcomer from ``newcomer`` when the port is full:
        the oldest of the address holding the most, if that is more than the newcomer's
        holds (``evict_oldest``: the oldest of any address)."""
        if self.evict_oldest:
            return next(iter(self._oldest.values()), None)
        if self._top <= self.by_address.get(newcomer, 0):
            return None
        for address in self._levels[self._top]:
            strangers = self._strangers.get(address)
            if strangers:
                return next(iter(strangers.values()))
        return None

    def guard(self, stream: object) -> trio.CancelScope:
        """The cancel scope a connection's handler runs in: an eviction cancels it
        (already cancelled if ``stream`` was evicted before its handler began)."""
        scope = trio.CancelScope()
        slot = self._held.get(id(stream))
        if slot is not None:
            slot.scope = scope
        else:
            scope.cancel()
        return scope

    def prove(self, stream: object) -> None:
        """``stream`` has proven itself (see the module docstring): it keeps its slot,
        counts no more against its address's share and is never evicted."""
        slot = self._held.get(id(stream))
        if slot is None or slot.proven:
            return
        self._forget_stranger(slot)
        self._count(slot.address, -1)
        slot.proven = True
        self.proven += 1

    def is_proven(self, stream: object) -> bool:
        slot = self._held.get(id(stream))
        return slot is not None and slot.proven

    def _forget_stranger(self, slot: _Slot) -> None:
        strangers = self._strangers.get(slot.address)
        if strangers is not None:
            strangers.pop(slot.seq, None)
            if not strangers:
                del self._strangers[slot.address]
        self._oldest.pop(slot.seq, None)

    def _evict(self, slot: _Slot) -> None:
        self._held.pop(id(slot.stream), None)
        self._forget_stranger(slot)
        self.leave(slot.address)
        reset_on_close(slot.stream)
        if slot.scope is not None:
            slot.scope.cancel()
        self.evicted += 1
        now = _now()
        if now - self._evict_logged_at >= 10.0:
            self._evict_logged_at = now
            if self.evict_oldest:
                what = f"{self.limit} connections that have not said who they are (the cap)"
            else:
                what = (
                    f"{self.open + 1} connections open (the cap, {self.proven} of them "
                    f"proven); {slot.address} holds the most not proven"
                )
            log.warning(
                "%s: %s: closing its oldest for each newcomer from another address "
                "(%d closed so far)",
                self.name,
                what,
                self.evicted,
            )

    def move(self, old: object, new: object) -> None:
        """``old``'s slot is now ``new``'s (a TLS stream over the accepted socket)."""
        slot = self._held.pop(id(old), None)
        if slot is not None:
            slot.stream = new
            self._held[id(new)] = slot

    def release(self, stream: object) -> None:
        """Give back ``stream``'s slot; nothing if it holds none (or gave it back, or
        was evicted)."""
        slot = self._held.pop(id(stream), None)
        if slot is None:
            return
        if slot.proven:
            self.proven -= 1
            self.open -= 1
        else:
            self._forget_stranger(slot)
            self.leave(slot.address)

    def _log_refusal(self, address: str, per_address: bool) -> None:
        now = _now()
        if now - self._logged_at < 10.0:
            return
        self._logged_at = now
        if per_address:
            log.warning(
                "%s: %s holds %d connections not proven (its share of %d): closing its new "
                "ones at accept (%d refused so far)",
                self.name,
                address,
                self.by_address.get(address, 0),
                self.limit,
                self.refused,
            )
        else:
            log.warning(
                "%s: %d connections open (the cap, %d of them proven) and none to close "
                "for a newcomer from %s: closing new ones at accept (%d refused so far)",
                self.name,
                self.open,
                self.proven,
                address,
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
