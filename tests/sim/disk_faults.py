"""Slow and lying disks in the simulator (issue 44, item 4).

**A slow disk** (a dying one): every sync under one member's data directory takes a
drawn time of *virtual* seconds (:meth:`~tests.sim.disk.DiskModel.set_slow`).  The model
cannot block, so the sync returns late through the node's own I/O structure:

* a sync made through the node's ``run_blocking`` seam (the archive's writer thread: a
  leader's appends in ``thread`` and ``auto`` modes, snapshots, compactions) makes that
  call return that much later in virtual time, while the member's event loop runs on;
* a sync made inline (a follower's appends in ``auto`` and ``inline`` modes, the state
  saves) blocks the member's event loop as a real one would: its network is held both
  ways (a clog) and its clock jumps ahead by the delay, standing still until the world
  catches up, so nothing comes in or goes out and no timer of its own fires meanwhile.

**A lying disk** (bit rot, a misdirected write): one to three bits of a durable record
of a member's log segment flip (:meth:`~tests.sim.disk.DiskModel.rot`), in a record the
checker has already read from it (the rot comes later), never the last record of the
last segment (that one is indistinguishable from a torn write: the start-up scan
truncates it, as it must). A rotted member counts as one that will lose its state (its
remedy is a new disk): no rot while a member is rebuilding, no wipe while a rot is
unrepaired, as no second wipe comes while one member rebuilds (more than a minority of
members without their state is a lost majority, not a fault to survive). The member must
never apply it nor ship it: its start-up scan refuses to start with an error naming the
segment file and position (the sim then does the runbook's remedy: a new, empty data
directory, rebuilt from the leader), a catch-up read gives a follower a snapshot
instead, the background check reports it. Invariant (10), checked at the end of the run:
every member that holds the log at a rotted position holds the committed bytes there,
except the rotted member while its rot is in place (never read, or read and refused); a
rotted entry applied would break (3).
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from cluster.archive.errors import ArchiveCorruptionError
from cluster.archive.reader import SegmentInfo, list_segments
from cluster.archive.record import RecordError, iter_records

from .disk import SECTOR, DiskModelError

if TYPE_CHECKING:
    from .harness import SimCluster, SimNode

SLOW_DISK = "slow-disk"
"""A member's syncs take 0.05 s to 2 s each for a few seconds (drawn for about a quarter
of the seeds, from an RNG of its own)."""
ROT = "rot"
"""Bits of a durable log record flip on one member's disk (about a quarter of the seeds)."""


@dataclass
class Rot:
    member: int
    path: Path
    position: int
    """The rotted record's log position (its header)."""
    length: int
    """The record's length, header included."""
    offset: int
    """Where in the file the flipped bytes are."""
    was: bytes
    refused: int = 0
    """Times the member refused to start on it."""


class DiskFaults:
    """The seed's slow disks and bit rot, and what the members did about them."""

    def __init__(self, sim: SimCluster, seed: int) -> None:
        self.sim = sim
        self.rng = random.Random(f"disk-faults-{seed}")
        self.rots: list[Rot] = []
        self.slow: int | None = None
        """The member whose disk is slow now."""
        self.repairing: set[int] = set()
        self.stats = {
            "slow_spells": 0,
            "rots": 0,
            "misdirected": 0,
            "rot_refusals": 0,
            "rot_repairs": 0,
        }

    # -- slow disks ------------------------------------------------------------------

    def node_of(self, path: str) -> SimNode | None:
        for sn in self.sim.nodes:
            if os.path.abspath(sn.dir) == path:
                return sn
        return None

    def on_slow_sync(self, path: str, delay: float) -> None:
        """A sync of ``path``'s member takes ``delay`` s: late from the writer thread,
        or a stall of the whole member when inline."""
        sn = self.node_of(path)
        if sn is None:
            return
        if sn.blocking:
            sn.sync_debt += delay
            return
        now = trio.current_time()
        sn.blocked_until = max(sn.blocked_until, now) + delay
        self.sim.net.clog(sn.host, sn.blocked_until - now)

    def start_slow(self, victim: int, per_sync: tuple[float, float], spell: float) -> None:
        sn = self.sim.nodes[victim]
        draw = random.Random(self.rng.getrandbits(64))
        self.sim.disk.set_slow(sn.dir, lambda: draw.uniform(*per_sync))
        self.slow = victim
        self.stats["slow_spells"] += 1
        self.sim.event(sn.host, "slow-disk", per_sync, round(spell, 3))

    def end_slow(self) -> None:
        if self.slow is None:
            return
        sn = self.sim.nodes[self.slow]
        self.sim.disk.set_slow(sn.dir, None)
        self.slow = None
        self.sim.event(sn.host, "disk-fast")

    async def slow_spell(self, rng: random.Random) -> None:
        """The nemesis's slow disk: the leader's more often than not."""
        if self.slow is not None:
            return
        n = len(self.sim.nodes)
        leader = self.sim.leader()
        victim = leader if leader is not None and rng.random() < 0.6 else rng.randrange(n)
        low = rng.choice([0.05, 0.3, 1.0])
        spell = rng.uniform(2.0, 6.0)
        self.start_slow(victim, (low, 2 * low), spell)
        await trio.sleep(spell)
        self.end_slow()

    # -- bit rot ---------------------------------------------------------------------

    def rot(
        self,
        i: int,
        rng: random.Random,
        within: tuple[int, int] = (0, -1),
        *,
        misdirected: bool = False,
    ) -> Rot | None:
        """Flip bits of a durable record of member ``i``'s log that the checker has
        read from it, not the last record of the last segment (``within``: a record in
        that range of log positions; -1: no upper bound).  ``misdirected``: instead, a
        512-byte sector of a segment before the last one, within such records, becomes
        another sector of the log (a write that landed in the wrong place)."""
        if self.rots or self.repairing:
            return None  # one rotted member at a time
        from .harness import _catching_up

        if any(_catching_up(sn) for sn in self.sim.nodes):
            # a member rebuilding (a wipe), running or down (seed 2437: a rebuilt member
            # cut by a power cut, then a second rot: two of three members without their
            # state), or one not yet started: a rotted one would be a second
            return None
        sn = self.sim.nodes[i]
        verified = self.sim.checker.verified.get(i, 0)
        if not (sn.dir / "archive").is_dir():
            return None  # its data directory is gone (a wipe, a power cut took it whole)
        segments = list_segments(sn.dir / "archive")
        candidates: list[tuple[Path, int, int, int]] = []
        disk = self.sim.disk
        for index, segment in enumerate(segments):
            try:
                extent = disk.durable_extent(segment.path)
            except DiskModelError:  # not in the model (being renamed): skip it
                continue
            with open(segment.path, "rb") as f:
                data = f.read(extent)
            try:
                records = [(o, 8 + len(b)) for o, b in iter_records(data)]
            except RecordError:  # a torn tail being written: whole ones only
                continue
            if index == len(segments) - 1:
                records = records[:-1]
            for offset, length in records:
                low, high = within
                start = segment.base + offset
                if (high >= 0 and start + length > high) or start < low:
                    continue
                if start + length <= verified:
                    candidates.append((segment.path, segment.base, offset, length))
        if not candidates:
            return None
        if misdirected:
            return self._misdirect(i, rng, candidates, segments[:-1])
        path, base, offset, length = rng.choice(candidates)
        flip_at = offset + rng.randrange(4, length)  # the CRC or the body
        with open(path, "rb") as f:
            f.seek(flip_at)
            byte = f.read(1)[0]
        mask = 0
        for _ in range(rng.randint(1, 3)):
            mask ^= 1 << rng.randrange(8)
        was = disk.rot(path, flip_at, bytes([byte ^ (mask or 1)]))
        found = Rot(i, path, base + offset, length, flip_at, was)
        self.rots.append(found)
        self.stats["rots"] += 1
        self.sim.event(sn.host, "rot", path.name, base + offset, length)
        return found

    def _misdirect(
        self,
        i: int,
        rng: random.Random,
        records: list[tuple[Path, int, int, int]],
        earlier: list[SegmentInfo],
    ) -> Rot | None:
        """A sector of a segment before the last, wholly within ``records``, becomes
        another sector of the same or another segment (other bytes)."""
        paths = {segment.path for segment in earlier}
        spans: dict[Path, list[tuple[int, int]]] = {}
        for path, _, offset, length in records:
            if path in paths:
                spans.setdefault(path, []).append((offset, offset + length))
        sectors: list[tuple[Path, int]] = []
        for path, ranges in spans.items():
            low, high = min(a for a, _ in ranges), max(b for _, b in ranges)
            first = -(-low // SECTOR) * SECTOR
            sectors += [(path, at) for at in range(first, high - SECTOR + 1, SECTOR)]
        if len(sectors) < 2:
            return None
        (path, at), (source, source_at) = rng.sample(sectors, 2)
        data = source.read_bytes()[source_at : source_at + SECTOR]
        if data == path.read_bytes()[at : at + SECTOR]:
            return None
        ranges = spans[path]
        begin = max(a for a, _ in ranges if a <= at)
        end = min(b for _, b in ranges if b >= at + SECTOR)
        base = next(s.base for s in earlier if s.path == path)
        was = self.sim.disk.rot(path, at, data)
        found = Rot(i, path, base + begin, end - begin, at, was)
        self.rots.append(found)
        self.stats["rots"] += 1
        self.stats["misdirected"] += 1
        self.sim.event(self.sim.nodes[i].host, "misdirected", path.name, at, source.name, source_at)
        return found

    def rots_of(self, i: int) -> list[Rot]:
        return [r for r in self.rots if r.member == i]

    def refused(self, sn: SimNode, exc: BaseException) -> bool:
        """Member ``sn`` stopped with ``exc``: True if it is its start-up refusing a
        rotted log, naming the file (or the archive) and a position in the rotted record
        (the remedy follows: a new data directory once the others can rebuild it)."""
        corruption = _corruption_in(exc)
        rots = self.rots_of(sn.index)
        if corruption is None or not rots:
            return False
        named = Path(corruption.path)
        for rot in rots:
            if named not in (rot.path, rot.path.parent):
                continue
            if not rot.position <= corruption.position < rot.position + rot.length:
                continue
            rot.refused += 1
            self.stats["rot_refusals"] += 1
            self.sim.event(sn.host, "refused", named.name, corruption.position)
            if sn.index not in self.repairing:
                self.repairing.add(sn.index)
                nursery = self.sim._nursery
                assert nursery is not None
                nursery.start_soon(self._repair, sn.index)
            return True
        return False

    async def _repair(self, i: int) -> None:
        """The runbook's remedy: once every other member runs and votes (they hold what
        was acknowledged), the member gets a new, empty data directory and starts: its
        leader rebuilds it."""
        from .harness import _catching_up

        sim = self.sim
        others = [sn for sn in sim.nodes if sn.index != i]
        while not all(sn.running and not _catching_up(sn) for sn in others):  # noqa: ASYNC110
            await trio.sleep(0.05)  # node state: nothing signals it
        sn = sim.nodes[i]
        if sn.running:  # started meanwhile (and refused again: it is stopped by then)
            await sim.crash(i)
        shutil.rmtree(sn.dir, ignore_errors=True)
        sim.checker.verified.pop(i, None)
        self.rots = [r for r in self.rots if r.member != i]
        self.repairing.discard(i)
        self.stats["rot_repairs"] += 1
        sim.event(sn.host, "rebuilt")
        await sim.restart(i)

    def wiped(self, i: int) -> None:
        """Member ``i``'s data directory is gone (a wipe): its rot with it."""
        self.rots = [r for r in self.rots if r.member != i]

    def check_final(self) -> None:
        """(10) no rotted record was served: every member other than the rotted one
        that holds the log at a rotted position holds the committed bytes there (the
        rotted member applying it would have broken (3))."""
        committed = self.sim.checker.committed
        for rot in self.rots:
            end = rot.position + rot.length
            if end > len(committed):
                continue
            for sn in self.sim.nodes:
                if sn.index == rot.member or not sn.running or sn.node is None:
                    continue
                archive = getattr(sn.node, "archive", None)
                if archive is None or not archive.start_position <= rot.position:
                    continue
                if archive.position < end:
                    continue
                if archive.read(rot.position, end) != committed[rot.position : end]:
                    self.sim.checker.fail(
                        f"n{sn.index} holds other bytes than the committed ones at "
                        f"{rot.position}, where n{rot.member}'s disk rotted (served?)"
                    )


def _corruption_in(exc: BaseException) -> ArchiveCorruptionError | None:
    if isinstance(exc, ArchiveCorruptionError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _corruption_in(inner)
            if found is not None:
                return found
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ArchiveCorruptionError):
        return cause
    return None
