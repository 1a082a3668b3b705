"""The node's upkeep agents: a follower's wait for its leader, saving its state now and
then, and checking its archive once in the background."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from ..archive.errors import ArchiveCorruptionError
from ..archive.record import RECORD_HEADER_LENGTH
from ..archive.segments import Archive
from ..archive.storage import NodeStorage
from ..core.consensus import ConsensusModule

log = logging.getLogger("cluster.node")

STATE_SAVE_INTERVAL = 1.0
"""Seconds between saves of the applied position to ``node-state.json``."""

VERIFY_PROGRESS_BYTES = 256 << 20
"""How often (in bytes checked) the background archive check logs its progress."""


class LeaderWatchdog:
    """A follower's wait for its leader: a cancel scope whose deadline every message from
    the leader pushes back (:meth:`push`, after each drive of the consensus module); when
    it expires, an election."""

    def __init__(
        self, cm: ConsensusModule, now_ns: Callable[[], int], kick: Callable[[], None]
    ) -> None:
        self.cm = cm
        self.now_ns = now_ns
        self.kick = kick
        self.scope: trio.CancelScope | None = None

    def deadline(self) -> float:
        """The follower's leader deadline on Trio's clock (inf when not following)."""
        deadline_ns = self.cm.leader_deadline_ns
        if deadline_ns is None:
            return math.inf
        return trio.current_time() + (deadline_ns - self.now_ns()) / 1e9

    def push(self) -> None:
        """After each drive: bring the scope's deadline forward if the leader's moved
        earlier (a new leader, a new term).  A later one is not pushed each time (each push
        is a new entry in Trio's deadline heap, on every message): the scope then wakes at
        the older deadline, :meth:`ConsensusModule.on_leader_timeout` sees the leader was
        heard since and does nothing, and the scope is set again from the fresh one."""
        scope = self.scope
        if scope is not None:
            deadline = self.deadline()
            if deadline < scope.deadline:
                scope.deadline = deadline

    async def run(self) -> None:
        while True:
            with trio.CancelScope(deadline=self.deadline()) as scope:
                self.scope = scope
                await trio.sleep_forever()
            self.scope = None
            self.cm.on_leader_timeout(self.now_ns())
            self.kick()


async def save_node_state(
    storage: NodeStorage,
    applied_position: Callable[[], int],
    run_blocking: Callable[..., Awaitable[Any]],
) -> None:
    """Persist the applied position about once a second: a lower bound of the commit
    position for the next start.  The save (a write, two fsyncs and a rename) takes
    1.5-9 ms under load, so it runs through ``run_blocking`` (a thread) instead of
    stalling the event loop; a failure (a full disk) goes to the node's disk health (one
    ERROR for the node, not one per retry) and is retried.  At the same pace, while only writes
    that are not retried (a snapshot) failed, it sees whether the disk has room again
    (:meth:`DiskHealth.probe`)."""
    node_state, disk = storage.node_state, storage.disk
    while True:
        await trio.sleep(STATE_SAVE_INTERVAL)
        if disk.problem:
            disk.probe()
        applied = applied_position()
        if applied <= node_state.commit_position:
            continue
        try:
            await run_blocking(partial(node_state.save, commit_position=applied))
        except OSError as exc:
            disk.failed("node state", exc, f"(commit position {applied})")
            continue
        disk.succeeded("node state")


class ArchiveVerifier:
    """Checks every record below where start-up began checking (the latest snapshot),
    once, in a thread: corruption there is never needed by this member but would be
    shipped to a member catching up.  Progress goes to the log and to :attr:`verified`;
    a corrupt record goes to ``on_corrupt`` (an ERROR record and a counter)."""

    def __init__(
        self,
        archive: Archive,
        run_blocking: Callable[..., Awaitable[Any]],
        on_corrupt: Callable[[ArchiveCorruptionError], None],
    ) -> None:
        self.archive = archive
        self.run_blocking = run_blocking
        self.on_corrupt = on_corrupt
        self.verified = 0
        """How far the check has got (a log position)."""

    async def run(self, start: int, stop: int) -> None:
        self.verified = start
        if stop <= start:
            self.verified = stop
            return
        log.info("verifying the archive below the snapshot in the background: %d..%d", start, stop)
        began = time.perf_counter()
        try:
            await self.run_blocking(self._verify, start, stop)
        except ArchiveCorruptionError as exc:
            self.on_corrupt(exc)
            return
        except (FileNotFoundError, ValueError):  # compacted or reset meanwhile
            log.info("archive verification stopped: the log below it was purged")
            return
        log.info("archive verified: %d..%d in %.1fs", start, stop, time.perf_counter() - began)

    def _verify(self, start: int, stop: int) -> None:
        report = start + VERIFY_PROGRESS_BYTES
        for position, body in self.archive.records(start, stop):
            self.verified = position + RECORD_HEADER_LENGTH + len(body)
            if self.verified >= report:
                log.info("archive verified up to %d of %d", self.verified, stop)
                report += VERIFY_PROGRESS_BYTES
