"""An in-memory :class:`~cluster.transport.base.Network` with seeded faults.

The deterministic simulator (``tests/sim``) runs every node of a cluster, and its clients,
in one ``trio.run`` under ``trio.testing.MockClock``.  :class:`SimNetwork` is the wire
between them; :meth:`SimNetwork.host` gives each node its own :class:`SimHost`, which
implements the ``Network`` protocol (``open_stream``/``serve``), so the network knows
which host is on each end of every connection.  Addresses are plain names: a node at host
``"n0"`` serving port 9010 is reached with ``open_stream("n0", 9010)``.  Nothing touches a
real socket and nothing runs in a thread, so virtual time is the only time.

Streams are TCP-faithful:

* per connection and direction, bytes arrive in order, exactly once, while the connection
  lives; each ``send_all`` chunk arrives after a latency drawn from the link's
  distribution, never before an earlier chunk; ``receive_some`` returns whatever has
  arrived (chunks may coalesce);
* ``aclose`` sends a FIN behind the data already sent; the peer reads the data, then EOF;
* a broken connection (reset, partition, crash) loses whatever is in flight and raises
  ``trio.BrokenResourceError`` on both ends, including in a ``receive_some`` that is
  waiting at the time.

Faults (all from the seeded ``rng``, so a seed reproduces a run):

* :meth:`SimNetwork.partition` / :meth:`~SimNetwork.isolate`: hosts that cannot talk lose
  their connections and new connects between them time out with ``OSError``;
* :meth:`~SimNetwork.one_way`: a blackholed direction; bytes sent are accepted and held
  (never delivered while it lasts; TCP would retransmit them after a heal), connects in
  either direction time out;
* :meth:`~SimNetwork.clog`: hold every delivery to and from a host until a deadline;
* ``reset_probability``: each chunk sent resets its connection with this probability;
* :meth:`~SimNetwork.crash`: break every connection of a host and drop its listeners
  (connects are refused until it serves again);
* :meth:`~SimNetwork.heal` ends every partition, blackhole and clog.

Every event goes into a running SHA-256 (:attr:`SimNetwork.trace_hash`) and, with
``keep_trace=True``, into :attr:`SimNetwork.trace`, so two runs of one seed can be compared.
"""

from __future__ import annotations

import errno
import hashlib
import math
import random
from collections import deque
from collections.abc import Iterable
from typing import Any

import trio
import trio.lowlevel

from .base import StreamHandler

__all__ = ["SimHost", "SimNetwork", "SimStream"]

_ANY_ADDRESS = ("", "0.0.0.0", "::", "*")
_FIRST_EPHEMERAL_PORT = 49152


class _Pipe:
    """One direction of a connection: chunks from ``src`` in flight to ``dst``."""

    __slots__ = ("chunks", "dst", "eof", "last_at", "ready", "src", "wake")

    def __init__(self, src: str, dst: str) -> None:
        self.src = src
        self.dst = dst
        self.chunks: deque[tuple[float, bytes | None]] = deque()  # None is the FIN
        self.last_at = -math.inf
        self.ready = bytearray()  # arrived, not yet read
        self.eof = False  # the FIN arrived
        self.wake = trio.Event()

    def clear(self) -> None:
        self.chunks.clear()
        self.ready.clear()

    def kick(self) -> None:
        self.wake.set()


class _Connection:
    __slots__ = ("broken", "client", "conn_id", "ends", "port", "server", "to_client", "to_server")

    def __init__(self, conn_id: int, client: str, server: str, port: int) -> None:
        self.conn_id = conn_id
        self.client = client
        self.server = server
        self.port = port
        self.to_server = _Pipe(client, server)
        self.to_client = _Pipe(server, client)
        self.broken = ""
        self.ends: tuple[SimStream, SimStream] | None = None

    def involves(self, host: str) -> bool:
        return host in (self.client, self.server)


class _Listener:
    __slots__ = ("handler", "host", "nursery", "port")

    def __init__(self, host: str, port: int, handler: StreamHandler) -> None:
        self.host = host
        self.port = port
        self.handler = handler
        self.nursery: trio.Nursery | None = None


class SimStream(trio.abc.Stream):
    """One end of a simulated TCP connection."""

    def __init__(
        self, net: SimNetwork, conn: _Connection, outgoing: _Pipe, incoming: _Pipe
    ) -> None:
        self._net = net
        self._conn = conn
        self._out = outgoing
        self._in = incoming
        self._closed = False
        self._sending = False
        self._receiving = False

    @property
    def local_host(self) -> str:
        return self._out.src

    @property
    def remote_host(self) -> str:
        return self._out.dst

    @property
    def connection_id(self) -> int:
        return self._conn.conn_id

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream was closed")
        if self._conn.broken:
            raise trio.BrokenResourceError(f"connection {self._conn.conn_id}: {self._conn.broken}")

    def _peer(self) -> SimStream:
        ends = self._conn.ends
        assert ends is not None
        return ends[1] if ends[0] is self else ends[0]

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._send_now(data)
            await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._sending = False

    def send_nowait(self, data: bytearray) -> int:
        """Send all of ``data`` now (the simulated network never fills up)."""
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._send_now(data)
        return len(data)

    def _send_now(self, data: bytes | bytearray | memoryview) -> None:
        self._check()
        net = self._net
        if net.reset_probability and net.rng.random() < net.reset_probability:
            net._break(self._conn, "connection reset")
            self._check()
        if self._peer()._closed:
            net._break(self._conn, "connection reset by peer")
            self._check()
        if data:
            net._send(self._conn, self._out, bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()
        self._check()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            net = self._net
            pipe = self._in
            while True:
                self._check()
                net._deliver(self._conn, pipe)
                if pipe.ready:
                    n = len(pipe.ready) if max_bytes is None else min(max_bytes, len(pipe.ready))
                    data = bytes(pipe.ready[:n])
                    del pipe.ready[:n]
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    return data
                if pipe.eof:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    return b""
                wake_at = net._next_delivery(pipe)
                pipe.wake = trio.Event()
                with trio.move_on_at(wake_at):
                    await pipe.wake.wait()
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._net._close_end(self._conn, self)
        await trio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return (
            f"<SimStream {self.local_host}->{self.remote_host} conn={self._conn.conn_id}"
            f"{' closed' if self._closed else ''}{' broken' if self._conn.broken else ''}>"
        )


class SimHost:
    """The :class:`~cluster.transport.base.Network` seen by a node living at host ``name``."""

    def __init__(self, net: SimNetwork, name: str) -> None:
        self.net = net
        self.name = name
        self._next_port = _FIRST_EPHEMERAL_PORT

    def _ephemeral_port(self) -> int:
        while (self.name, self._next_port) in self.net._listeners:
            self._next_port += 1
        port = self._next_port
        self._next_port += 1
        return port

    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        """Connect to ``host:port`` after a round trip; ``OSError`` if refused or cut off."""
        net = self.net
        src = self.name
        start = trio.current_time()
        deadline = start + net.connect_timeout
        if host not in net._hosts:
            await trio.lowlevel.checkpoint()
            net._record("connect-unreachable", src, host, port)
            raise OSError(errno.EHOSTUNREACH, f"no route to host {host!r}")
        # SYN there and SYN-ACK back; a clog on either end holds the handshake.
        arrival = start + net._draw_latency(src, host) + net._draw_latency(host, src)
        arrival = max(arrival, net._clogged_until(src), net._clogged_until(host))
        if arrival > deadline or not net._connectable(src, host):
            await trio.sleep_until(deadline)
            net._record("connect-timeout", src, host, port)
            raise OSError(errno.ETIMEDOUT, f"timed out connecting to {host}:{port}")
        await trio.sleep_until(arrival)
        if not net._connectable(src, host):
            await trio.sleep_until(deadline)
            net._record("connect-timeout", src, host, port)
            raise OSError(errno.ETIMEDOUT, f"timed out connecting to {host}:{port}")
        listener = net._listeners.get((host, port))
        if listener is None or listener.nursery is None:
            net._record("connect-refused", src, host, port)
            raise OSError(errno.ECONNREFUSED, f"connection refused by {host}:{port}")
        client_end, server_end = net._connect(src, host, port)
        listener.nursery.start_soon(listener.handler, server_end)
        return client_end

    async def serve(
        self,
        host: str,
        port: int,
        handler: StreamHandler,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``port`` (0: an ephemeral port) at this host until cancelled."""
        if host not in _ANY_ADDRESS and host != self.name:
            raise OSError(errno.EADDRNOTAVAIL, f"host {self.name!r} cannot bind {host!r}")
        net = self.net
        bound = port or self._ephemeral_port()
        listener = _Listener(self.name, bound, handler)
        net._listen(listener)
        try:
            async with trio.open_nursery() as nursery:
                listener.nursery = nursery
                task_status.started(bound)
                await trio.sleep_forever()
        finally:
            net._unlisten(listener)

    def __repr__(self) -> str:
        return f"<SimHost {self.name}>"


class SimNetwork:
    """Hosts, listeners and connections, with faults drawn from one seeded ``rng``."""

    def __init__(
        self,
        rng: random.Random,
        *,
        latency: tuple[float, float] = (0.0005, 0.005),
        reset_probability: float = 0.0,
        connect_timeout: float = 1.0,
        keep_trace: bool = False,
    ) -> None:
        if not 0 <= latency[0] <= latency[1]:
            raise ValueError(f"bad latency range {latency!r}")
        self.rng = rng
        self.latency = latency
        self.reset_probability = reset_probability
        self.connect_timeout = connect_timeout
        self.keep_trace = keep_trace
        self.trace: list[tuple[Any, ...]] = []
        self._hash = hashlib.sha256()
        self.events = 0
        self._hosts: dict[str, SimHost] = {}
        self._listeners: dict[tuple[str, int], _Listener] = {}
        self._connections: dict[int, _Connection] = {}
        self._next_conn_id = 1
        self._link_latency: dict[tuple[str, str], tuple[float, float]] = {}
        self._cuts: dict[frozenset[str], None] = {}
        self._isolated: dict[str, None] = {}
        self._blackholes: dict[tuple[str, str], None] = {}
        self._clogs: dict[str, float] = {}
        self.stats = {"connections": 0, "bytes": 0, "chunks": 0, "resets": 0, "breaks": 0}

    # ------------------------------------------------------------------ hosts

    def host(self, name: str) -> SimHost:
        """The network interface of host ``name`` (created on first use)."""
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = SimHost(self, name)
        return host

    @property
    def hosts(self) -> list[str]:
        return list(self._hosts)

    def connections(self, host: str | None = None) -> int:
        """Live connections (of ``host``, or all)."""
        return sum(1 for c in self._connections.values() if host is None or c.involves(host))

    def listening(self, host: str, port: int) -> bool:
        return (host, port) in self._listeners

    def set_latency(self, src: str, dst: str, latency: tuple[float, float]) -> None:
        """Latency distribution (uniform, seconds) of the link ``src -> dst``."""
        self._link_latency[(src, dst)] = latency

    # ------------------------------------------------------------------ faults

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut every pair of hosts that sit in different groups.

        Hosts named in no group keep talking to everyone.  Cuts add up until :meth:`heal`.
        """
        sets = [list(dict.fromkeys(g)) for g in groups]
        for i, group in enumerate(sets):
            for other in sets[i + 1 :]:
                for a in group:
                    for b in other:
                        if a != b:
                            self._cuts[frozenset((a, b))] = None
        self._record("partition", *(tuple(g) for g in sets))
        self._break_unreachable("partitioned")

    def isolate(self, host: str) -> None:
        """Cut ``host`` off from every other host."""
        self._isolated[host] = None
        self._record("isolate", host)
        self._break_unreachable("isolated")

    def one_way(self, src: str, dst: str) -> None:
        """Blackhole ``src -> dst``: bytes are accepted and held, never delivered."""
        self._blackholes[(src, dst)] = None
        self._record("one-way", src, dst)

    def clog(self, host: str, duration: float) -> None:
        """Hold every delivery to and from ``host`` for ``duration`` seconds."""
        until = trio.current_time() + duration
        if until > self._clogs.get(host, -math.inf):
            self._clogs[host] = until
        self._record("clog", host, duration)
        self._kick_all()

    def heal(self) -> None:
        """End every partition, isolation, blackhole and clog."""
        self._cuts.clear()
        self._isolated.clear()
        self._blackholes.clear()
        self._clogs.clear()
        self._record("heal")
        self._kick_all()

    def crash(self, host: str) -> None:
        """Break every connection of ``host`` and drop its listeners."""
        for key in [k for k in self._listeners if k[0] == host]:
            del self._listeners[key]
        for conn in [c for c in self._connections.values() if c.involves(host)]:
            self._break(conn, f"host {host} crashed")
        self._record("crash", host)

    def reset(self, host_a: str, host_b: str | None = None) -> int:
        """Reset the connections between two hosts (or all of one host); returns how many."""
        hit = [
            c
            for c in self._connections.values()
            if c.involves(host_a) and (host_b is None or c.involves(host_b))
        ]
        for conn in hit:
            self._break(conn, "connection reset")
        return len(hit)

    def can_talk(self, a: str, b: str) -> bool:
        """No partition or isolation separates ``a`` and ``b`` (blackholes aside)."""
        if a == b:
            return True
        if a in self._isolated or b in self._isolated:
            return False
        return frozenset((a, b)) not in self._cuts

    # ------------------------------------------------------------------ tracing

    @property
    def trace_hash(self) -> str:
        return self._hash.hexdigest()

    def _record(self, kind: str, *detail: Any) -> None:
        event = (round(trio.current_time(), 9), kind, *detail)
        self.events += 1
        self._hash.update(repr(event).encode())
        if self.keep_trace:
            self.trace.append(event)

    # ------------------------------------------------------------------ internals

    def _draw_latency(self, src: str, dst: str) -> float:
        lo, hi = self._link_latency.get((src, dst), self.latency)
        return lo if lo == hi else self.rng.uniform(lo, hi)

    def _clogged_until(self, host: str) -> float:
        return self._clogs.get(host, -math.inf)

    def _connectable(self, a: str, b: str) -> bool:
        return (
            self.can_talk(a, b)
            and (a, b) not in self._blackholes
            and (
                b,
                a,
            )
            not in self._blackholes
        )

    def _listen(self, listener: _Listener) -> None:
        key = (listener.host, listener.port)
        if key in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{listener.host}:{listener.port} is in use")
        self._listeners[key] = listener
        self._record("listen", *key)

    def _unlisten(self, listener: _Listener) -> None:
        key = (listener.host, listener.port)
        if self._listeners.get(key) is listener:
            del self._listeners[key]
            self._record("unlisten", *key)

    def _connect(self, client: str, server: str, port: int) -> tuple[SimStream, SimStream]:
        conn = _Connection(self._next_conn_id, client, server, port)
        self._next_conn_id += 1
        client_end = SimStream(self, conn, conn.to_server, conn.to_client)
        server_end = SimStream(self, conn, conn.to_client, conn.to_server)
        conn.ends = (client_end, server_end)
        self._connections[conn.conn_id] = conn
        self.stats["connections"] += 1
        self._record("connect", conn.conn_id, client, server, port)
        return client_end, server_end

    def _send(self, conn: _Connection, pipe: _Pipe, data: bytes | None) -> None:
        at = trio.current_time() + self._draw_latency(pipe.src, pipe.dst)
        if at < pipe.last_at:
            at = pipe.last_at  # FIFO: never overtake an earlier chunk
        pipe.last_at = at
        pipe.chunks.append((at, data))
        if data is not None:
            self.stats["chunks"] += 1
            self.stats["bytes"] += len(data)
        pipe.kick()

    def _deliverable_at(self, pipe: _Pipe, at: float) -> float:
        if (pipe.src, pipe.dst) in self._blackholes:
            return math.inf
        return max(at, self._clogged_until(pipe.src), self._clogged_until(pipe.dst))

    def _next_delivery(self, pipe: _Pipe) -> float:
        if not pipe.chunks:
            return math.inf
        return self._deliverable_at(pipe, pipe.chunks[0][0])

    def _deliver(self, conn: _Connection, pipe: _Pipe) -> None:
        now = trio.current_time()
        chunks = pipe.chunks
        while chunks and self._deliverable_at(pipe, chunks[0][0]) <= now:
            _, data = chunks.popleft()
            if data is None:
                pipe.eof = True
                self._record("eof", conn.conn_id, pipe.src, pipe.dst)
            else:
                pipe.ready += data
                self._record("deliver", conn.conn_id, pipe.src, pipe.dst, len(data))

    def _close_end(self, conn: _Connection, end: SimStream) -> None:
        self._record("close", conn.conn_id, end.local_host)
        end._in.clear()  # nobody will read it
        end._in.kick()
        if not conn.broken:
            self._send(conn, end._out, None)
        assert conn.ends is not None
        if all(e._closed for e in conn.ends):
            self._connections.pop(conn.conn_id, None)

    def _break(self, conn: _Connection, reason: str) -> None:
        if conn.broken:
            return
        conn.broken = reason
        self.stats["breaks"] += 1
        if reason == "connection reset":
            self.stats["resets"] += 1
        for pipe in (conn.to_server, conn.to_client):
            pipe.clear()
            pipe.kick()
        self._connections.pop(conn.conn_id, None)
        self._record("break", conn.conn_id, reason)

    def _break_unreachable(self, reason: str) -> None:
        for conn in list(self._connections.values()):
            if not self.can_talk(conn.client, conn.server):
                self._break(conn, reason)

    def _kick_all(self) -> None:
        for conn in self._connections.values():
            conn.to_server.kick()
            conn.to_client.kick()
