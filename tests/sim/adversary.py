"""An adversary on the simulated network: a process that speaks the consensus protocol
to every member's consensus port with random, replayed, mutated and forged messages.

It dials a member's consensus port from its own host and sends one of:

* bytes that are not frames at all, a frame larger than any allowed, or a frame cut short;
* no MemberHello, or a hello as a member id that is not configured, or as a running
  member (whose own link to the target is normally live, so it is refused), or as a
  crashed member (which is accepted: nothing authenticates members yet);
* after the hello, messages from the forged classes the consensus hardening defends
  against without authentication: log bytes that are not whole CRC-valid records,
  terms and positions out of range, VERIFIED reports of positions beyond any log,
  messages naming another member than the sender, high (but valid) terms in
  canvasses, vote requests and commit positions, refused votes, and replays of what
  it sent before; and, in a crashed member's name, heartbeats of a later term lined up
  with the target's log (what a live leader's lease keeps out: ``cluster.core.lease``).

What it never sends is a plausible forgery in a crashed member's name (an
acknowledgement of log the member may not hold, a granted vote, valid log records with a
commit position): no protocol can tell those from the member's own without authenticating
members, which the next issue adds (its handshake then refuses the adversary outright).

Everything it does comes from its own seeded ``rng``, so a seed replays exactly.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import trio

from cluster.archive.record import append_record
from cluster.protocol import PROTOCOL_VERSION, encode_frame
from cluster.protocol.consensus import (
    APPEND_POSITION_VERIFIED,
    MAX_POSITION,
    MAX_TERM,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    MemberHello,
    RequestVote,
    Vote,
)

if TYPE_CHECKING:
    from .harness import SimCluster

BEYOND_ANY_LOG = 1 << 40
"""A simulated log never gets near a terabyte."""


class Adversary:
    def __init__(self, sim: SimCluster, rng: random.Random, consensus_port: int) -> None:
        self.sim = sim
        self.rng = rng
        self.port = consensus_port
        self.n = len(sim.nodes)
        self.sent: list[bytes] = []  # frames sent after a hello, for replays
        self.stats = {
            "connections": 0,
            "bytes": 0,
            "refused_connects": 0,
            "later_term_heartbeats": 0,
        }

    # ---------------------------------------------------------------- what to send

    def _term(self) -> int:
        """Around the cluster's current term: a little above, far above, or beyond."""
        terms = [
            sn.node.cm.candidate_term_id
            for sn in self.sim.nodes
            if sn.running and sn.node is not None and getattr(sn.node, "cm", None) is not None
        ]
        base = max(terms, default=0)
        return self.rng.choice([base, base + 1, base + self.rng.randint(2, 1000), MAX_TERM])

    def _bad_records(self) -> bytes:
        rng = self.rng
        kind = rng.randrange(4)
        if kind == 0:
            return rng.randbytes(rng.randint(1, 64))  # garbage
        buf = bytearray()
        for _ in range(rng.randint(1, 4)):
            append_record(buf, rng.randbytes(rng.randint(1, 40)))
        if kind == 1:  # a flipped bit: the CRC fails
            buf[rng.randrange(8, len(buf))] ^= 1 << rng.randrange(8)
            return bytes(buf)
        if kind == 2:  # cut short
            return bytes(buf[: rng.randrange(1, len(buf))])
        return bytes(8) + bytes(buf)  # an empty record (length 0, CRC 0) first

    def _forged(self, me: int, target: int) -> Any:
        """One message in ``me``'s name (the hello's id) to ``target``."""
        rng = self.rng
        other = rng.choice([m for m in range(self.n) if m != me] or [me])
        term = self._term()
        kind = rng.randrange(9)
        if kind == 0:  # log bytes that are not whole, CRC-valid records
            at = rng.choice([0, rng.randint(0, 4096), BEYOND_ANY_LOG])
            return AppendRequest(
                term, me, at, term, term, 0, rng.randint(0, 4096), self._bad_records()
            )
        if kind == 1:  # terms out of range
            big = MAX_TERM + rng.randint(1, 1 << 20)
            return rng.choice(
                [
                    CommitPosition(big, 0, me),
                    RequestVote(0, 0, big, me, PROTOCOL_VERSION),
                    AppendPosition(big, 0, me, 0),
                    AppendRequest(big, me, 0, -1, big, 0, 0, b""),
                ]
            )
        if kind == 2:  # positions out of range
            return AppendPosition(term, MAX_POSITION + rng.randint(1, 1000), me, 0)
        if kind == 3:  # a VERIFIED report of more log than anyone has
            return AppendPosition(
                term, BEYOND_ANY_LOG + rng.randint(0, 1 << 20), me, APPEND_POSITION_VERIFIED
            )
        if kind == 4:  # in another member's name than the link's
            return rng.choice(
                [
                    AppendPosition(term, rng.randint(0, 4096), other, APPEND_POSITION_VERIFIED),
                    AppendRequest(term, other, 0, -1, term, 0, 0, b""),
                    Vote(term, 0, 0, target, other, True),
                    RequestVote(0, 0, term, other, PROTOCOL_VERSION),
                ]
            )
        if kind == 5:  # a canvass with a high term
            return CanvassPosition(
                rng.randint(-1, term), rng.randint(0, 4096), term, me, PROTOCOL_VERSION
            )
        if kind == 6:  # a vote request with a high term
            return RequestVote(
                rng.randint(-1, term), rng.randint(0, 4096), term, me, PROTOCOL_VERSION
            )
        if kind == 7:  # a commit position with a high term
            return CommitPosition(term, rng.choice([0, BEYOND_ANY_LOG]), me)
        return Vote(term, -1, 0, target, me, False)  # a refused vote

    def _later_term_heartbeat(self, me: int, target: int) -> AppendRequest | None:
        """An empty append of a later term that the target's log checks pass: as the
        leader of that term, which ``me`` (crashed) is not."""
        sn = self.sim.nodes[target]
        cm = getattr(sn.node, "cm", None) if sn.running else None
        if cm is None:
            return None
        end = cm.log.published_position
        prev = cm.log.terms.term_at(end)
        term = cm.leadership_term_id + self.rng.choice([1, 2, 1000])
        return AppendRequest(term, me, end, prev, prev, 0, cm.commit_position, b"")

    def _connection(self, target: int) -> bytes:
        """The bytes of one connection to ``target``."""
        rng = self.rng
        running = [sn.index for sn in self.sim.nodes if sn.running and sn.index != target]
        crashed = [sn.index for sn in self.sim.nodes if not sn.running and sn.index != target]
        kind = rng.randrange(8)
        if kind == 0:
            return rng.randbytes(rng.randint(1, 200))  # not frames at all
        if kind == 1:
            return (1 << 30).to_bytes(4, "little") + rng.randbytes(16)  # a frame too large
        if kind == 2:  # no hello
            return encode_frame(self._forged(rng.randrange(self.n), target))
        if kind == 3:  # a member that is not configured
            me = self.n + rng.randint(0, 5)
        elif kind == 4 and running:  # a running member: its own link is (normally) live
            me = rng.choice(running)
        elif crashed:
            me = rng.choice(crashed)
            if rng.random() < 0.5 and (heartbeat := self._later_term_heartbeat(me, target)):
                self.stats["later_term_heartbeats"] += 1
                frames = [encode_frame(MemberHello(me, PROTOCOL_VERSION)), encode_frame(heartbeat)]
                return b"".join(frames)
        else:
            me = rng.choice(running or [target])
        frames = [encode_frame(MemberHello(me, PROTOCOL_VERSION))]
        if self.sent and rng.random() < 0.3:  # replay something sent before
            frames += rng.sample(self.sent, min(len(self.sent), rng.randint(1, 3)))
        for _ in range(rng.randint(1, 5)):
            frame = encode_frame(self._forged(me, target))
            self.sent.append(frame)
            frames.append(frame)
        if rng.random() < 0.2:  # cut the last frame short
            frames[-1] = frames[-1][: rng.randrange(1, len(frames[-1]))]
        del self.sent[:-50]
        return b"".join(frames)

    # ---------------------------------------------------------------- running

    async def run(self, duration: float) -> None:
        host = self.sim.net.host("adversary")
        end = trio.current_time() + duration
        rng = self.rng
        while trio.current_time() < end:
            await trio.sleep(rng.uniform(0.02, 0.4))
            target = rng.randrange(self.n)
            data = self._connection(target)
            self.sim.event("adversary", "attack", target, len(data))
            try:
                stream = await host.open_stream(self.sim.nodes[target].host, self.port)
            except OSError:
                self.stats["refused_connects"] += 1
                continue
            self.stats["connections"] += 1
            self.stats["bytes"] += len(data)
            try:
                await stream.send_all(data)
                with trio.move_on_after(rng.uniform(0.0, 0.3)):
                    while await stream.receive_some(4096):
                        pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                await trio.aclose_forcefully(stream)
