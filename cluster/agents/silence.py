"""Links that notice silence (issue 44): a member link that has heard nothing for a while
is closed and redialled, instead of waiting on the kernel.

A partition drops packets; it resets nothing.  A TCP connection across it stays open at
both ends, each end's unacknowledged data waiting on the kernel's retransmission timer,
which doubles at every try (200 ms, 400 ms, ... 6.4 s): after a 5 s cut a link can stay
silent for seconds after the heal, and once for more than 20 s (measured in namespaces,
issue 44).  Keepalive probes do not help: the kernel sends them only on a connection with
nothing unacknowledged.

So both ends of every member link send something at least every ``interval`` (the leader
heartbeat interval): the dialler its hello again when it wrote nothing else meanwhile,
the accepting end its own hello (members of protocol 2.1 and later; see
:mod:`cluster.agents.consensus`).  An end that has received no byte for ``bound`` seconds,
and finds none waiting in its socket either, closes the link; the dialler dials again,
and a new connection is through as soon as the network is (its first SYN, at most a
dial back-off after the heal).

The bound (:func:`silence_bound`) is generous on purpose: silence means no byte at all,
not a slow peer.  A follower writing a big snapshot, a leader whose disk is slow, a busy
2-core machine all keep sending at least their keepalives; what our own event loop has
not read yet is counted as heard (``FIONREAD``: the bytes waiting in the socket), so a
stall here, a reader held up by back-pressure or an inline fdatasync, is never taken for
the peer's silence.
"""

from __future__ import annotations

import array
import fcntl
import termios
from collections.abc import Callable
from contextlib import suppress

import trio

from ..transport.framed import FrameWriter

SILENCE_FLOOR = 2.0
"""Seconds: the shortest silence that closes a member link, whatever the heartbeat
interval.  A live peer's keepalive can be late by its event loop's stall (a full garbage
collection, an inline fdatasync, a busy 2-core machine: up to about a second was seen);
a link closed by mistake costs a redial, and the leader resends from the follower's
position."""
STALE_INTERVALS = 3
"""A link that has heard nothing for this many keepalive intervals is stale: a new hello
from its member replaces it (a live link hears its member every interval)."""
SILENCE_INTERVALS = 10
"""A link is silent after this many heartbeat intervals without a byte (when that is
more than :data:`SILENCE_FLOOR`)."""


def silence_bound(heartbeat_interval: float, heartbeat_timeout: float) -> float:
    """How long a member link may hear nothing before it is closed: ten heartbeat
    intervals, at least :data:`SILENCE_FLOOR`, and no more than the leader heartbeat
    timeout (after which a follower elects anyway), but never under four intervals.

    With the defaults (200 ms, 10 s): 2 s.  A member cut off for longer is back within
    a dial back-off (at most 1 s) of the heal; a shorter cut heals on its own."""
    bound = max(SILENCE_INTERVALS * heartbeat_interval, SILENCE_FLOOR)
    return max(min(bound, heartbeat_timeout), 4 * heartbeat_interval)


def unread_bytes(stream: trio.abc.Stream) -> int:
    """Bytes that arrived on ``stream``'s socket and were not read yet (0 for a stream
    with no socket under it, as the simulator's)."""
    inner: object = stream
    for _ in range(3):  # an SSLStream over a SocketStream, or a wrapper of either
        sock = getattr(inner, "socket", None)
        if sock is not None:
            try:
                count = array.array("i", [0])
                fcntl.ioctl(sock.fileno(), termios.FIONREAD, count, True)
            except (OSError, ValueError):  # closed meanwhile
                return 0
            return count[0]
        inner = getattr(inner, "transport_stream", None)
        if inner is None:
            return 0
    return 0


class LinkSilence:
    """One link's ear: its reader calls :meth:`heard` on every receive; :meth:`watch`
    returns once the link has been silent for ``bound`` seconds, meanwhile calling
    ``keepalive`` every ``interval`` in which ``sent()`` did not change (nothing else
    went out)."""

    __slots__ = ("armed", "bound", "count", "interval", "quiet_since", "spoke")

    def __init__(self, interval: float, bound: float, *, armed: bool = True) -> None:
        self.interval = interval
        self.bound = bound
        self.armed = armed
        """Whether silence closes the link: only where the peer is known to send
        keepalives (a member of protocol 2.1 or later)."""
        self.spoke = False
        """Whether the peer said so on this link (keepalives may be sent to it)."""
        self.count = 0
        """Receives so far (the reader bumps it: cheaper than reading the clock)."""
        self.quiet_since = trio.current_time()

    def heard(self) -> None:
        self.count += 1

    def quiet_for(self) -> float:
        """Seconds since :meth:`watch` last saw the count move (a look at most an
        interval old)."""
        return trio.current_time() - self.quiet_since

    async def watch(
        self,
        stream: trio.abc.Stream,
        *,
        keepalive: Callable[[], object] | None = None,
        sent: Callable[[], int] | None = None,
    ) -> float:
        """Keep the link alive (``keepalive`` when ``sent()`` stood still for an
        interval) and, while :attr:`armed`, return the seconds of silence once they
        reach ``bound``.  Never returns while not armed."""
        count = self.count
        last_sent = sent() if sent is not None else 0
        self.quiet_since = trio.current_time()
        while True:
            await trio.sleep(self.interval)
            now = trio.current_time()
            if keepalive is not None:
                now_sent = sent() if sent is not None else last_sent
                if now_sent == last_sent:
                    keepalive()
                    now_sent = sent() if sent is not None else now_sent
                last_sent = now_sent
            if self.count != count:
                count = self.count
                self.quiet_since = now
            elif self.armed and now - self.quiet_since >= self.bound:
                if unread_bytes(stream):  # our reader is behind, not the peer silent
                    self.quiet_since = now
                    continue
                return now - self.quiet_since


def stale(ear: LinkSilence | None, stream: trio.abc.Stream) -> float | None:
    """How long a link whose member dials again has heard nothing, if that makes it
    stale (:data:`STALE_INTERVALS`, nothing waiting in its socket); None if it is live,
    or not held to keepalives (a 2.0 member, or keepalives off)."""
    if ear is None or not ear.armed:
        return None
    quiet = ear.quiet_for()
    if quiet < STALE_INTERVALS * ear.interval or unread_bytes(stream):
        return None
    return quiet


async def serve_keepalives(
    stream: trio.abc.Stream, ear: LinkSilence, frame: bytes, on_silent: Callable[[float], None]
) -> None:
    """An accepting end's side of a link: send ``frame`` now and every interval while
    ``ear`` listens; once the link is silent, ``on_silent(seconds)`` is called at once
    (before the stream is closed under its reader).  Returns when sending broke."""
    writer = FrameWriter(1 << 16)
    writer.write_raw(frame)
    async with trio.open_nursery() as nursery:

        async def listen() -> None:
            on_silent(await ear.watch(stream, keepalive=lambda: writer.write_raw(frame)))
            nursery.cancel_scope.cancel()

        nursery.start_soon(listen)
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await writer.run(stream)
        nursery.cancel_scope.cancel()
