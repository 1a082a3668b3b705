"""Strangers on the simulated network flooding what a member serves before any byte is
trusted (issue 33): the ingress, admin and consensus ports, from several hosts at once.

Each of :class:`IngressFlood`'s workers, on one of the flood's hosts, dials a member again
and again and does one of:

* ``idle``: connects to the ingress port and sends nothing (what a TLS port sees before a
  handshake: the slot is counted at accept, and ``--handshake-timeout`` closes it);
* ``half_frame``: sends all but the last byte of a frame as large as a stranger may send,
  and holds it (the node's budget for unfinished frames, :data:`PARTIAL_BUDGET
  <cluster.agents.ingress.PARTIAL_BUDGET>`, closes the ones beyond it);
* ``silent_connect``: a connect request that never answers its challenge (with an
  authenticator it holds a pending slot until it is evicted or times out);
* ``dropped_session``: a connect request to the leader, and once the session is open (no
  authenticator), the connection dropped without a close request: the session keeps its
  slot for a resume until another client needs it;
* ``garbage``: bytes that are not frames;
* ``admin_idle`` and ``consensus_idle``: a connection to the admin port, or to the
  consensus port, that never says anything (no command, no hello).

Each connection is held for a drawn time and read until the node closes it; a connect
request turned away (ERROR, REDIRECT) is sent again at once, on a new connection.  Everything
comes from the flood's own seeded ``rng``, so a seed replays exactly.  :attr:`stats`
says what happened: connects refused or cut, connections the node closed, sessions opened.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import trio

from cluster.agents.ingress import PRE_AUTH_FRAME_SIZE
from cluster.protocol import PROTOCOL_VERSION, encode_frame
from cluster.protocol.codec import EGRESS
from cluster.protocol.egress import Challenge, SessionEvent
from cluster.protocol.enums import EventCode
from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.ingress import SessionConnectRequest

from .harness import ADMIN_PORT, CONSENSUS_PORT, INGRESS_PORT

if TYPE_CHECKING:
    from .harness import SimCluster

KINDS = (
    "idle",
    "half_frame",
    "silent_connect",
    "dropped_session",
    "garbage",
    "admin_idle",
    "consensus_idle",
)

_PORTS = {"admin_idle": ADMIN_PORT, "consensus_idle": CONSENSUS_PORT}
_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class IngressFlood:
    """``workers`` connections at a time from each of ``hosts`` hosts (see the module)."""

    def __init__(
        self,
        sim: SimCluster,
        rng: random.Random,
        *,
        hosts: int = 3,
        workers: int = 8,
        kinds: tuple[str, ...] = KINDS,
        hold: tuple[float, float] = (0.5, 3.0),
        principal: bytes = b"app",
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown flood kinds {sorted(unknown)}")
        self.sim = sim
        self.rng = rng
        self.hosts = [f"x{i}" for i in range(hosts)]
        self.workers = workers
        self.kinds = kinds
        self.hold = hold
        self.principal = principal
        self._correlation = 0
        self.stats: dict[str, int] = {
            "connects": 0,
            "refused_connects": 0,
            "closed_by_node": 0,
            "sessions_opened": 0,
            "challenged": 0,
            "turned_away": 0,
            **{kind: 0 for kind in kinds},
        }

    # ---------------------------------------------------------------- what to send

    def _connect_request(self, credentials: bytes = b"") -> bytes:
        self._correlation += 1
        return encode_frame(
            SessionConnectRequest(
                correlation_id=self._correlation,
                response_stream_id=0,
                version=PROTOCOL_VERSION,
                response_channel="",
                encoded_credentials=credentials,
            )
        )

    def _half_frame(self) -> bytes:
        """A frame as large as a stranger may send, all but its last byte."""
        body = self.rng.randbytes(PRE_AUTH_FRAME_SIZE - self.rng.randint(4, 64))
        frame = len(body).to_bytes(4, "little") + body
        return frame[: -self.rng.randint(1, 16)]

    def _opening(self, kind: str) -> bytes:
        rng = self.rng
        if kind == "half_frame":
            return self._half_frame()
        if kind == "silent_connect":
            return self._connect_request(self.principal)
        if kind == "dropped_session":
            return self._connect_request()
        if kind == "garbage":
            return rng.randbytes(rng.randint(1, 300))
        return b""  # idle, admin_idle, consensus_idle

    def _target(self, kind: str) -> int:
        """The leader for a session (half the time for the other ingress kinds: where
        the clients are), else any member."""
        if kind == "dropped_session" or (kind not in _PORTS and self.rng.random() < 0.5):
            leader = self.sim.leader()
            if leader is not None:
                return leader
        return self.rng.randrange(len(self.sim.nodes))

    # ---------------------------------------------------------------- running

    async def run(self, duration: float) -> None:
        """Flood until ``duration`` virtual seconds have passed, then let every
        connection go."""
        end = trio.current_time() + duration
        async with trio.open_nursery() as nursery:
            for name in self.hosts:
                for worker in range(self.workers):
                    rng = random.Random(self.rng.getrandbits(64))
                    nursery.start_soon(self._worker, name, worker, rng, end)

    async def _worker(self, name: str, worker: int, rng: random.Random, end: float) -> None:
        host = self.sim.net.host(name)
        await trio.sleep(rng.uniform(0.0, 0.2))  # not all in one instant
        while trio.current_time() < end:
            kind = rng.choice(self.kinds)
            target = self._target(kind)
            port = _PORTS.get(kind, INGRESS_PORT)
            self.stats[kind] += 1
            self.sim.event(name, "flood", kind, target, worker)
            try:
                stream = await host.open_stream(self.sim.nodes[target].host, port)
            except OSError:
                self.stats["refused_connects"] += 1
                continue
            self.stats["connects"] += 1
            hold = min(rng.uniform(*self.hold), max(0.0, end - trio.current_time()))
            try:
                with trio.move_on_after(hold):
                    if await self._converse(stream, kind):
                        self.stats["closed_by_node"] += 1
            finally:
                await trio.aclose_forcefully(stream)  # no close request: dropped
            await trio.sleep(rng.uniform(0.01, 0.05))

    async def _converse(self, stream: trio.abc.Stream, kind: str) -> bool:
        """Send ``kind``'s opening and read until the node closes; True if it did."""
        decoder = FrameDecoder()
        try:
            opening = self._opening(kind)
            if opening:
                await stream.send_all(opening)
            while data := await stream.receive_some(4096):
                if kind not in ("dropped_session", "silent_connect"):
                    continue
                for body in decoder.feed(data):
                    if self._turned_away(body):
                        self.stats["turned_away"] += 1
                        return False  # at once again, as a flood would
        except (*_ERRORS, ProtocolError):
            pass
        return True

    def _turned_away(self, body: memoryview) -> bool:
        """Count an answer to a connect request; True if it refuses the session."""
        try:
            message = EGRESS.decode(body)
        except ProtocolError:
            return False
        if isinstance(message, Challenge):
            self.stats["challenged"] += 1  # never answered
        elif isinstance(message, SessionEvent):
            if message.code == EventCode.OK:
                self.stats["sessions_opened"] += 1
            else:
                return True
        return False
