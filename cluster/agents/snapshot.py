"""The snapshot agent: every member takes a snapshot where the log says so.

A SNAPSHOT cluster action on the log reaches every member's service container at the
same log position; the container calls :meth:`SnapshotAgent.on_cluster_action` while
applying it, so the snapshot holds exactly the state at that position.  The records are
taken at once (the state must not move on first); writing them (a file, an fsync, a
rename) runs through ``run_blocking`` (a worker thread), then the recording log notes
the snapshot and :meth:`SnapshotAgent.wait_taken` waiters wake: completion is an event,
not a counter to poll.  The consensus module hears of it too
(:meth:`~cluster.core.control.ClusterControl.on_snapshot`), and answers the client
AdminRequests that asked for it: OK once written and recorded, ERROR with the reason
("disk full: ...") when either fails.  A failure is an ERROR record and goes to the
node's :class:`~cluster.archive.disk.DiskHealth`; nothing of the snapshot is left (its
temporary file, or its file if the recording log could not name it) and the node goes
on: the log keeps everything.  A SNAPSHOT with the terminate flag (SHUTDOWN), or an
ABORT, stops the node once it is done, if it acts on this member now
(:meth:`~cluster.core.control.ClusterControl.terminates`: not replayed at start-up, and
in the member's current term); met later, a SHUTDOWN still takes its snapshot.

The consensus module's automatic snapshot rule (:mod:`cluster.core.autosnapshot`) hears
of every snapshot here: each one begun (``auto.on_taking``), recorded or failed (through
:meth:`~cluster.core.control.ClusterControl.on_snapshot`), and, at start, the recording
log's latest, which its counting starts from.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from ..archive.recording_log import CM_SERVICE_ID, ENTRY_TYPE_SNAPSHOT
from ..archive.snapshots import (
    encode_snapshot,
    remove_stale_temporaries,
    snapshot_path,
    write_snapshot,
)
from ..archive.storage import NodeStorage
from ..core.consensus import ConsensusModule
from ..core.service_container import ServiceContainer
from ..core.snapshot import take_snapshot
from ..protocol.enums import CLUSTER_ACTION_FLAG_TERMINATE, CloseReason, ClusterAction
from ..protocol.log import ClusterActionRequest
from ..service import ServiceStateError

log = logging.getLogger("cluster.node")


class SnapshotAgent:
    """Takes, writes and records the snapshots the log asks for."""

    def __init__(
        self,
        data_dir: Path,
        storage: NodeStorage,
        cm: ConsensusModule,
        container: ServiceContainer,
        run_blocking: Callable[..., Awaitable[Any]],
        shutdown: Callable[[], Awaitable[None]],
    ) -> None:
        self.data_dir = data_dir
        self.recording_log = storage.recording_log
        self.cm = cm
        self.container = container
        self.run_blocking = run_blocking
        self.shutdown = shutdown
        self.disk = storage.disk
        # while writes fail, a SNAPSHOT could not be written: the leader refuses it
        self.disk.listeners.append(cm.control.on_disk)
        self.taken = 0
        """Snapshots taken (written and recorded) since the node started."""
        self.failed = 0
        """Snapshots that could not be written (a full disk): logged, the node goes on."""
        self.last_error = ""
        for stale in remove_stale_temporaries(data_dir):
            log.warning("removed %s: a snapshot cut short before this start", stale)
        self.recovered_position = 0
        """Actions at or below this position were replayed at start-up: not acted on."""
        self.stopped_by: tuple[int, ClusterActionRequest] | None = None
        """The SHUTDOWN or ABORT (its log position, the entry) that stops this member."""
        self._taken_event = trio.Event()
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery, recovered_position: int) -> None:
        """From now on snapshots are written in ``nursery``'s tasks (before: at once,
        during the start-up replay)."""
        self._nursery = nursery
        self.recovered_position = recovered_position
        entries = self.recording_log.snapshots()
        if entries:  # the automatic snapshots count from the latest one
            latest = entries[-1]
            path = snapshot_path(self.data_dir, latest.log_position, latest.leadership_term_id)
            try:
                size = path.stat().st_size
            except OSError:
                size = 0
            self.cm.control.auto.restore(latest.log_position, latest.timestamp, size)

    def on_cluster_action(self, position: int, action: ClusterActionRequest) -> None:
        """Every member applies cluster actions at the same log position.  A SHUTDOWN
        or ABORT stops this member only where the consensus module says it acts now
        (:meth:`~cluster.core.control.ClusterControl.terminates`); met later, a SHUTDOWN
        still takes its snapshot, and the member goes on."""
        shutdown = bool(action.flags & CLUSTER_ACTION_FLAG_TERMINATE)
        aborted = action.action is ClusterAction.ABORT
        terminating = aborted or (action.action is ClusterAction.SNAPSHOT and shutdown)
        stops = False
        if terminating:
            control = self.cm.control
            # before start(): the start-up replay, which applies what happened before
            replayed_to = position if self._nursery is None else self.recovered_position
            why_not = control.terminates(action, position, replayed_to)
            stops = not why_not
            name = "ABORT" if aborted else "SHUTDOWN"
            if stops:  # a leader tells every session's client why it ends
                self.stopped_by = (position, action)
                control.leave(reason=CloseReason.ABORT if aborted else CloseReason.SHUTDOWN)
            elif position > replayed_to:  # met live, but not this cluster's
                then = "it takes the snapshot and goes on" if not aborted else "it goes on"
                log.info(
                    "%s at log position %d does not stop this member: %s; %s",
                    name,
                    position,
                    why_not,
                    then,
                )
        if action.action is ClusterAction.SNAPSHOT:
            self._take(position, action, terminate=stops)
        elif stops:
            log.info("ABORT at log position %d: stopping without a snapshot", position)
            if self._nursery is not None:
                self._nursery.start_soon(self.shutdown)

    async def wait_taken(self, after: int, failed_after: int | None = None) -> None:
        """Return once more than ``after`` snapshots have been taken (or, given
        ``failed_after``, more than that many failed)."""
        while self.taken <= after and (failed_after is None or self.failed <= failed_after):
            await self._taken_event.wait()

    def _take(self, position: int, action: ClusterActionRequest, terminate: bool) -> None:
        for entry in self.recording_log.entries:
            if (
                entry.is_valid
                and entry.type == ENTRY_TYPE_SNAPSHOT
                and (entry.log_position == position and entry.service_id == CM_SERVICE_ID)
            ):
                return  # taken before a restart: the replay need not take it again
        self.cm.control.auto.on_taking(position)  # one in flight: none asked for meanwhile
        try:
            records = take_snapshot(self.cm, self.container, position, action.leadership_term_id)
        except ServiceStateError as exc:
            self._service_failed(position, exc)
            if terminate and self._nursery is not None:
                log.info("SHUTDOWN at log position %d: snapshot failed, stopping", position)
                self._nursery.start_soon(self.shutdown)
            return
        data = encode_snapshot(records)
        term = action.leadership_term_id
        path = snapshot_path(self.data_dir, position, term)
        if self._nursery is None:  # during start-up replay: write it now
            try:
                write_snapshot(path, data)
            except OSError as exc:
                self._failed(position, exc, len(data))
                return
            self._record(position, term, action.timestamp, path, len(data))
            return

        async def persist() -> None:
            outcome = "snapshot taken"
            try:
                await self.run_blocking(write_snapshot, path, data)
            except OSError as exc:
                self._failed(position, exc, len(data))
                outcome = "snapshot failed (the log keeps everything)"
            else:
                if not self._record(position, term, action.timestamp, path, len(data)):
                    outcome = "snapshot failed (the log keeps everything)"
            if terminate:
                log.info("SHUTDOWN at log position %d: %s, stopping", position, outcome)
                await self.shutdown()

        self._nursery.start_soon(persist)

    def _failed(self, position: int, exc: OSError, size: int) -> None:
        """The snapshot could not be written: nothing of it is left, and the log still
        holds everything it would have covered (recovery replays from the last one)."""
        self.failed += 1
        self.cm.counters.snapshot_failures += 1
        self.last_error = self.disk.failed(
            "snapshot", exc, f"at log position {position}", retried=False, needed=size
        )
        log.error("%s; the node goes on without it", self.last_error)
        self.cm.control.on_snapshot(position, self.last_error)
        self._taken_event.set()
        self._taken_event = trio.Event()

    def _service_failed(self, position: int, exc: ServiceStateError) -> None:
        """The service could not give its state: no snapshot is written (an empty one
        would lose the state on the next restart); the log keeps everything."""
        self.failed += 1
        self.cm.counters.snapshot_failures += 1
        self.last_error = f"snapshot at log position {position} failed: {exc}"
        log.error("%s; the node goes on without it", self.last_error, exc_info=exc.__cause__)
        self.cm.control.on_snapshot(position, self.last_error)
        self._taken_event.set()
        self._taken_event = trio.Event()

    def _record(self, position: int, term: int, timestamp: int, path: Path, size: int) -> bool:
        """Name the written snapshot in the recording log (services first, then the
        consensus module); if that fails, the file goes: a snapshot no entry names is
        never loaded, and would only take space."""
        base = self.cm.log.terms.base_of(term) or 0
        try:
            self.recording_log.append_snapshot(term, base, position, timestamp, 0)
            self.recording_log.append_snapshot(term, base, position, timestamp, CM_SERVICE_ID)
        except OSError as exc:
            path.unlink(missing_ok=True)
            self._failed(position, exc, size)
            return False
        self.disk.succeeded("snapshot")
        self.taken += 1
        self.cm.control.on_snapshot(position, timestamp=timestamp, size=size)
        self._taken_event.set()
        self._taken_event = trio.Event()
        log.info("snapshot at log position %d (term %d): %d bytes", position, term, size)
        return True
