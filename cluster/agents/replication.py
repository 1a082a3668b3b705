"""Leader-side replication: one task per follower ships the log as it is on disk.

A replicator sends ``AppendRequest`` chunks of the leader's log (byte ranges, unchanged,
never crossing a term boundary) from where the consensus module says the follower's next
append starts (:meth:`~cluster.core.replication.LeaderReplication.next_append`; the
module records what each request carries, the replicator never changes its state): from the
in-memory log buffer when the follower is close behind, from the archive when it is
catching up.  It sends whatever is new in one chunk per wake-up (batching); the archive
agent calls :meth:`Replicator.pump` before each write so a follower close behind gets
the new bytes without a task switch and appends them while the leader syncs its own
copy.  It keeps the link's backlog bounded, and probes with an empty request every
heartbeat interval so a follower that lost data or diverged reports where it really is.

Reads from the archive are checked (every record's length and CRC) before anything is
shipped: a corrupt record is reported by this member (``on_corrupt``: an ERROR record
and a counter) and never sent.  The follower is then sent the latest snapshot instead,
if it is above the bad record (``fall_back``, :meth:`CatchUp.fall_back
<cluster.agents.catchup.CatchUp.fall_back>`: a WARNING and a counter), and catches up
above it; otherwise it gets heartbeats only, from where its log ends, for as long as this
member leads.

A follower that needs log below this leader's log start (purged by compaction) is sent
the latest snapshot instead (``send_snapshot``, :mod:`cluster.agents.catchup`), then the
log after it; a read that a compaction overtook is simply retried.

All replicators of a term run inside the leadership cancel scope: an election cancels
them together.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable

import trio

from ..archive.errors import ArchiveCorruptionError
from ..archive.record import RECORD_HEADER_LENGTH, complete_length
from ..core.consensus import ConsensusModule
from .consensus import PeerLink
from .log import LogBuffer

MAX_CHUNK = 1 << 20
MAX_LINK_BACKLOG = 4 << 20
MAX_UNACKNOWLEDGED = 8 << 20
"""Log bytes a follower may have been sent and not yet reported durable: a follower
whose disk is slow or full holds at most this much of the leader's log in memory."""
WINDOW_POLL = 0.005  # seconds between looks at a full window (acknowledgements come in)


def whole_records_end(start: int, data: bytes) -> int:
    """Where the last whole record in ``data`` (log bytes from ``start``) ends, or if not
    even the first is whole, where that one ends (past the data)."""
    n = complete_length(data)
    if n or len(data) < RECORD_HEADER_LENGTH:
        return start + n
    length: int = _unpack_length(data)[0]
    return start + RECORD_HEADER_LENGTH + length


_unpack_length = struct.Struct("<I").unpack_from

CORRUPT_RETRY_S = 1.0
"""How long a replicator waits before it reads a corrupt record again, when no snapshot
above it was there to send instead (the leader takes one)."""


class Replicator:
    def __init__(
        self,
        cm: ConsensusModule,
        member_id: int,
        link: PeerLink,
        read_log: Callable[[int, int], Awaitable[bytes]],
        log_buffer: LogBuffer,
        wait_for_log: Callable[[], Awaitable[None]],
        heartbeat_interval: float,
        on_corrupt: Callable[[ArchiveCorruptionError], None] = lambda exc: None,
        *,
        send_snapshot: Callable[[int, PeerLink, float], Awaitable[None]] | None = None,
        fall_back: Callable[[int, int], bool] | None = None,
    ) -> None:
        self.cm = cm
        self.member_id = member_id
        self.link = link
        self.read_log = read_log
        self.log_buffer = log_buffer
        self.wait_for_log = wait_for_log
        self.heartbeat_interval = heartbeat_interval
        self.on_corrupt = on_corrupt
        self.send_snapshot = send_snapshot
        self.fall_back = fall_back
        """Called with the follower and a position that cannot be shipped: True if it
        is sent a snapshot above it instead."""
        self.corrupt_at = -1
        """A position the archive could not give back intact: not shipped from."""
        self.corrupt_retry = math.inf
        """When to read at :attr:`corrupt_at` again (no snapshot above it was there to
        send instead: one is being taken)."""
        self.connects = link.connects
        # one number for both the test and the wait: no FP drift
        self.next_heartbeat = -1e18

    def _next_append(self) -> int | None:
        """Where the next append to the follower starts (None: no longer leading it)."""
        link = self.link
        reconnected = link.connects != self.connects
        # data sent on a broken connection may be lost: the module resends from what the
        # follower has confirmed
        self.connects = link.connects
        return self.cm.replication.next_append(self.member_id, reconnected)

    def pump(self) -> bool:
        """Send what is new in the in-memory log now, from the caller's task (the archive
        agent, before its write: followers append while the leader syncs).

        Returns False if the replicator's own task has to do the work (a follower
        catching up from the archive, a full or broken link)."""
        replication = self.cm.replication
        link = self.link
        if (
            not link.is_connected
            or link.backlog >= MAX_LINK_BACKLOG
            or replication.unacknowledged(self.member_id) >= MAX_UNACKNOWLEDGED
        ):
            return False
        start = self._next_append()
        if start is None or replication.needs_snapshot(self.member_id):
            return False
        buf = self.log_buffer
        end = buf.end
        if start >= end:
            return True
        if start < buf.base:
            return False
        limit = start + MAX_CHUNK
        stop = replication.replication_stop(start, min(end, limit))
        data = buf.copy(start, stop)
        if stop == limit < end:  # cut by the size limit: end at a record boundary
            stop = whole_records_end(start, data)
            data = data[: stop - start] if stop < limit else buf.copy(start, stop)
        link.send(replication.append_request(self.member_id, start, data))
        self.next_heartbeat = trio.current_time() + self.heartbeat_interval
        return True

    async def run(self) -> None:
        cm = self.cm
        replication = cm.replication
        link = self.link
        while True:
            if replication.next_append(self.member_id) is None:
                return
            if not link.is_connected:
                await link.connected.wait()
                continue
            start = self._next_append()
            if start is None:
                return
            if replication.needs_snapshot(self.member_id):
                if self.send_snapshot is None:
                    await trio.sleep(self.heartbeat_interval)
                else:
                    await self.send_snapshot(self.member_id, link, self.heartbeat_interval)
                continue
            end = self.log_buffer.end
            window_full = replication.unacknowledged(self.member_id) >= MAX_UNACKNOWLEDGED
            if (
                start < end
                and link.backlog < MAX_LINK_BACKLOG
                and (start != self.corrupt_at or trio.current_time() >= self.corrupt_retry)
                and not window_full
            ):
                term = cm.leadership_term_id
                limit = start + MAX_CHUNK
                try:
                    data = await self.read_log(
                        start, replication.replication_stop(start, min(end, limit))
                    )
                    # (a read may stop early, at a record boundary: where memory begins)
                    stop = start + len(data)
                    if stop == limit < end:  # cut by the size limit: at a record boundary
                        stop = whole_records_end(start, data)
                        if stop < limit:
                            data = data[: stop - start]
                        else:  # one record longer than a chunk
                            data = await self.read_log(start, stop)
                        stop = start + len(data)
                except ArchiveCorruptionError as exc:
                    if start != self.corrupt_at:
                        self.on_corrupt(exc)
                    self.corrupt_at, self.corrupt_retry = start, math.inf
                    # True: it needs the snapshot above it now; False: none is there yet
                    # (one is being taken): read again in a while
                    if self.fall_back is not None and not self.fall_back(self.member_id, start):
                        self.corrupt_retry = trio.current_time() + CORRUPT_RETRY_S
                    continue
                except (ValueError, FileNotFoundError):
                    # compacted meanwhile: the log below the new start is gone
                    await trio.sleep(0.001)
                    continue
                if (
                    cm.leadership_term_id != term
                    or replication.next_append(self.member_id) != start
                ):
                    continue  # sent meanwhile, or no longer this leader's follower
                link.send(replication.append_request(self.member_id, start, data))
                link.flush()
                self.next_heartbeat = trio.current_time() + self.heartbeat_interval
                await trio.lowlevel.checkpoint()
                continue
            now = trio.current_time()
            if now >= self.next_heartbeat:
                link.send(replication.append_request(self.member_id, start, b""))
                link.flush()
                self.next_heartbeat = now + self.heartbeat_interval
            with trio.move_on_at(self.next_heartbeat):
                if window_full:
                    await trio.sleep(WINDOW_POLL)
                elif link.backlog >= MAX_LINK_BACKLOG:
                    await trio.sleep(0.001)
                else:
                    await self.wait_for_log()


class Leadership:
    """A leader's replicators, one per follower, in one cancel scope that an election
    cancels (:meth:`run` while this member leads, :meth:`cancel` once it does not), and
    the event that wakes those waiting for new log."""

    def __init__(
        self,
        flush_links: Callable[[], None],
        replicators: Callable[[Callable[[], Awaitable[None]]], dict[int, Replicator]],
    ) -> None:
        """``flush_links`` sends what the member links hold; ``replicators`` makes a
        term's replicators, given how they wait for new log."""
        self._flush_links = flush_links
        self._make = replicators
        self.replicators: dict[int, Replicator] = {}
        self._scope: trio.CancelScope | None = None
        self._log_taken = trio.Event()

    def on_log_taken(self) -> None:
        """New bytes in the log buffer, about to be written: replicate them first."""
        wake = False
        for replicator in self.replicators.values():
            if not replicator.pump():
                wake = True
        self._flush_links()
        if wake:
            self.wake()

    def wake(self) -> None:
        """Wake every replicator waiting for new log (or a truncated one)."""
        self._log_taken.set()
        self._log_taken = trio.Event()

    async def wait_for_log(self) -> None:
        await self._log_taken.wait()

    async def run(self) -> None:
        """This term's replicators, until an election cancels them (or a newer term's
        leadership starts)."""
        with trio.CancelScope() as scope:
            if self._scope is not None:
                self._scope.cancel()
            self._scope = scope
            replicators = self._make(self.wait_for_log)
            self.replicators = replicators
            try:
                async with trio.open_nursery() as nursery:
                    for member_id, replicator in replicators.items():
                        nursery.start_soon(replicator.run, name=f"replicate-{member_id}")
            finally:
                if self.replicators is replicators:
                    self.replicators = {}

    def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
