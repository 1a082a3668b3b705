"""A TCP proxy on loopback for real-process tests: it forwards, and it can blackhole.

:class:`Forwarder` joins each connection accepted on its port to a new one to
``127.0.0.1:target`` (dialled from ``source`` if given, so the kernel's table shows who
went around it: ``test_client_proxy.py``).

:meth:`Forwarder.blackhole` cuts it as a partition cuts a network, both ways: nothing
is forwarded and nothing is closed.  A real partition drops packets; each sender's TCP
keeps what is unacknowledged and retransmits it on a timer that doubles at each try,
so after the heal a connection stays silent until its sender's next try.  The proxy
keeps what it reads during the cut and, after :meth:`Forwarder.heal`, forwards it only at
that next try (:func:`next_try`: the first try :data:`FIRST_RTO` after the first byte
held, then 2, 4, 8 ... times as long, as Linux does), and a FIN or reset held the same
way is passed on then.  A direction that held nothing flows at once after the heal.
While cut, the port is closed: a dial gets "connection refused" at once (a SYN dropped
would time out instead; either way the dialler tries again later).

What it does not model: a connection's kernel buffers (it reads whatever comes, up to
:data:`HOLD_LIMIT` per direction), keepalive probes, and a SYN retried across the heal.
"""

from __future__ import annotations

import socket
from contextlib import suppress

import trio

HOST = "127.0.0.1"
FIRST_RTO = 0.3
"""Seconds from a byte held to its sender's first retransmission: Linux's minimum RTO
(200 ms) plus the round-trip variance of a loaded machine.  In namespaces, after a 5 s
cut, links came back 2.4 to 7.0 s after the heal (issue 44); with 0.3 s the tries fall at
0.3, 0.9, 2.1, 4.5 and 9.3 s, so a link cut for 5 s is back 4.3 s after the heal."""
MAX_RTO = 120.0
HOLD_LIMIT = 8 << 20
"""Bytes a direction holds during a cut before it stops reading (the sender then
blocks, as on a full send buffer)."""
POLL = 0.02


def next_try(stuck: float, at: float, first: float = FIRST_RTO) -> float:
    """When a sender with bytes unacknowledged since ``stuck`` next retransmits, at or
    after ``at``."""
    rto = first
    when = stuck + rto
    while when < at:
        rto = min(2 * rto, MAX_RTO)
        when += rto
    return when


class Forwarder:
    """A TCP proxy in front of ``HOST:target`` that can blackhole (see the module)."""

    def __init__(
        self, target: int, *, source: str | None = None, port: int = 0, first_rto: float = FIRST_RTO
    ) -> None:
        self.target = target
        self.source = source
        self.port = port
        self.first_rto = first_rto
        self.accepted = 0
        self.bytes_in = 0
        """Bytes from the dialler to the target."""
        self.cut = False
        self.healed_at = float("-inf")
        self._accepting = trio.CancelScope()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._serve)
            task_status.started()

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind((HOST, self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        listener = trio.SocketListener(sock)
        assert self._nursery is not None
        with trio.CancelScope() as self._accepting:
            task_status.started()
            async with listener:
                while True:
                    stream = await listener.accept()
                    self._nursery.start_soon(self._join, stream)

    def blackhole(self) -> None:
        """Cut every connection, both ways, and close the port (see the module)."""
        self.cut = True
        self._accepting.cancel()

    def heal(self) -> None:
        """End the cut: the port opens again; what was held flows at its sender's next
        retransmission."""
        self.cut = False
        self.healed_at = trio.current_time()
        assert self._nursery is not None
        self._nursery.start_soon(self._serve)

    async def _join(self, downstream: trio.SocketStream) -> None:
        self.accepted += 1
        sock = trio.socket.socket()
        try:
            if self.source is not None:
                await sock.bind((self.source, 0))
            await sock.connect((HOST, self.target))
        except OSError:
            sock.close()
            await downstream.aclose()
            return
        except BaseException:  # cancelled in the middle of the dial
            sock.close()
            raise
        upstream = trio.SocketStream(sock)
        async with downstream, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, downstream, upstream, nursery.cancel_scope, True)
            nursery.start_soon(self._pump, upstream, downstream, nursery.cancel_scope, False)

    def _deliverable(self, stuck: float | None) -> bool:
        if self.cut:
            return False
        if stuck is None:
            return True
        return trio.current_time() >= next_try(stuck, self.healed_at, self.first_rto)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        done: trio.CancelScope,
        inbound: bool,
    ) -> None:
        held = bytearray()
        stuck: float | None = None  # when the oldest byte held arrived
        ended = False  # the sender closed (a FIN or a reset), perhaps held
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while True:
                if (held or ended) and self._deliverable(stuck):
                    if held:
                        await sink.send_all(held)
                        held, stuck = bytearray(), None
                    if ended:
                        break
                    continue
                waiting = bool(held) or self.cut
                if ended or len(held) >= HOLD_LIMIT:
                    await trio.sleep(POLL)
                    continue
                data = b""
                with trio.move_on_after(POLL if waiting else float("inf")):
                    try:
                        data = await source.receive_some(65536)
                    except (trio.BrokenResourceError, OSError):
                        data = b""
                    if not data:
                        ended = True
                        if self.cut and stuck is None:
                            stuck = trio.current_time()
                        continue
                if not data:
                    continue  # the poll timed out
                if inbound:
                    self.bytes_in += len(data)
                if self.cut or held:
                    if stuck is None:
                        stuck = trio.current_time()
                    held += data
                else:
                    await sink.send_all(data)
        done.cancel()  # either side closed: close both
