"""Log compaction and catch-up by snapshot install: the shell's side (issue #19).

**Compaction.** After start-up and after every snapshot this member records,
:meth:`CatchUp.compact` deletes the archive segments wholly below the
``--archive-retention``-th newest snapshot (:func:`cluster.archive.compaction.compact`:
the recording log says so first), under the archive lock so that no catch-up read runs
meanwhile, and tells the consensus module where the log now begins
(``cm.log.start_position``).

**Sending a snapshot** (the leader).  A replicator whose follower needs log below that
start (:meth:`~cluster.core.replication.LeaderReplication.needs_snapshot`) calls
:meth:`CatchUp.send_snapshot`: the latest snapshot file is opened once (a compaction
that deletes it meanwhile does not cut the transfer short) and sent chunk by chunk as
the consensus module says (a probe first, then at most a window unacknowledged); a
broken link or a follower silent for a few heartbeat intervals makes it probe again,
and the follower answers with what it holds, so the transfer resumes there.

**Receiving one** (a follower).  The consensus module's
:class:`~cluster.core.install.SnapshotReceiver` hands out chunks to write
(:meth:`CatchUp.persist`, called where the node persists the log): each is written to
``snapshots/install-<position>-<term>.tmp`` (the last one fsynced) and reported.  A
whole snapshot is checked (every record's CRC, its layout, the position and term it
claims), renamed into place and installed
(:func:`cluster.archive.compaction.install_snapshot`: the recording log says so, the
archive is replaced by an empty one beginning at its position), then loaded into the
service container and the consensus module as recovery loads one at start-up, and the
follower reports its position to the leader.  A follower that crashes in the middle
starts the transfer over (start-up removes the temporary file); one that only lost its
link resumes where it was.

**Bounded by the disk** (issue 33).  A follower takes a transfer only if its data
directory's free space holds the declared length and a reserve
(:func:`room_reserve`: 16 MiB, or a twentieth of the file system if less), and otherwise
answers that it has no room (a WARNING here; the leader logs an ERROR, which
``cluster-tool errors`` shows, and asks again every :data:`REFUSED_RETRY` seconds).  A
transfer that stops (a new term or leader, no chunk for the leader heartbeat timeout,
which covers a dead leader and a lost link) is dropped and its temporary file removed
at once, as is one that another transfer replaces (:meth:`CatchUp.watch_transfers`).

**Corruption below the snapshot** (issue 33).  A record a follower needs that is corrupt
in this leader's archive is never shipped; if the latest snapshot is above it, the
follower is sent that snapshot instead (:meth:`CatchUp.fall_back`: one WARNING per
follower and position, ``snapshot_fallbacks`` counted), so it catches up above it.

**Automatic snapshots.**  What compaction frees depends on snapshots being taken: the
consensus module's rule (:mod:`cluster.core.autosnapshot`) gets its settings here
(``--snapshot-log-bytes``, ``--snapshot-interval``), and an installed snapshot counts as
this member's last one.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import trio
import trio.lowlevel

from ..archive.compaction import compact, install_snapshot
from ..archive.errors import ArchiveCorruptionError, ArchiveError
from ..archive.reader import pread_full
from ..archive.recording_log import RecordingLog
from ..archive.segments import Archive
from ..archive.snapshots import read_snapshot, snapshot_path
from ..config import NodeConfig
from ..core.consensus import ConsensusModule
from ..core.install import ChunkWrite, Transfer
from ..core.service_container import ServiceContainer
from ..core.snapshot import LoadedSnapshot, SnapshotError, load_snapshot, parse_snapshot
from ..core.timers import TimerService
from ..fileio import fsync_directory, make_directory
from ..protocol.enums import ClusterAction
from .consensus import PeerLink, PeerLinks
from .log import ArchiveAgent, LogBuffer
from .replication import MAX_LINK_BACKLOG, Replicator
from .snapshot import SnapshotAgent

log = logging.getLogger("cluster.node")

POLL = 0.002
"""How often a snapshot sender looks for the follower's answer (seconds)."""
RETRY_HEARTBEATS = 5
"""A follower silent this many heartbeat intervals during a transfer is probed again."""
REFUSED_RETRY = 5.0
"""Seconds before a follower that had no room for a snapshot is asked again."""
WATCH_INTERVAL = 0.25
"""How often a follower looks for a transfer that stopped (seconds)."""
ROOM_RESERVE = 16 << 20
"""Free space a snapshot transfer leaves on a follower's disk, at most (log, state)."""


def room_reserve(total_bytes: int) -> int:
    """What a transfer must leave free on a file system of ``total_bytes``."""
    return min(ROOM_RESERVE, total_bytes // 20)


class Host(Protocol):
    """What catch-up needs of the node."""

    config: NodeConfig
    cm: ConsensusModule
    container: ServiceContainer
    archive: Archive
    recording_log: RecordingLog
    log_buffer: LogBuffer
    archive_agent: ArchiveAgent
    archive_lock: trio.Lock
    links: PeerLinks
    snapshots: SnapshotAgent
    run_blocking: Callable[..., Awaitable[Any]]

    @property
    def data_dir(self) -> Path: ...

    def now_ns(self) -> int: ...

    async def request_action(
        self, action: ClusterAction, *, terminate: bool = False
    ) -> tuple[bool, str]: ...


def install_path(data_dir: Path, transfer: Transfer) -> Path:
    return (
        data_dir
        / "snapshots"
        / f"install-{transfer.log_position:020d}-{transfer.snapshot_term_id}.tmp"
    )


class CatchUp:
    """Compaction, and snapshots sent to and received from other members."""

    def __init__(self, node: Host, kick: Callable[[], None]) -> None:
        self.node = node
        self.kick = kick
        """Drive the consensus module (after reporting to it)."""
        self.compactions = 0
        self.freed_bytes = 0
        self.snapshots_sent = 0
        self.installs = 0
        self._installing = False
        self.nursery: trio.Nursery | None = None
        """The node's (set when it runs): a snapshot asked for, above a corrupt record."""
        self._snapshot_asked: set[tuple[int, int]] = set()
        """(Term, corrupt position) a snapshot was asked for, to send instead."""
        self._nursery: trio.Nursery | None = None
        self.refused_installs = 0
        self.abandoned_installs = 0
        node.cm.replica.snapshot.room = self._has_room
        config = node.config
        node.cm.control.auto.configure(
            config.snapshot_log_bytes, config.snapshot_interval // 1_000_000
        )

    # ------------------------------------------------------------------ compaction

    async def run(self) -> None:
        """Compact now and after every snapshot; hold the nursery receiving runs in."""
        node = self.node
        node.cm.log.start_position = node.archive.start_position
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.watch_transfers)
            while True:
                taken = node.snapshots.taken
                await self.compact()
                await node.snapshots.wait_taken(taken)

    async def compact(self) -> None:
        node = self.node
        retention = node.config.archive_retention
        if retention <= 0 or self._installing:
            return
        timestamp = node.cm.log.cluster_time(node.now_ns())
        async with node.archive_lock:
            try:
                done = await node.run_blocking(
                    compact, node.archive, node.recording_log, node.data_dir, retention, timestamp
                )
            except (OSError, ArchiveError, ValueError) as exc:
                log.error("log compaction failed (%s): the log is kept for now", exc)
                return
            finally:
                node.cm.log.start_position = node.archive.start_position
        if done is not None:
            self.compactions += 1
            self.freed_bytes += done.freed_bytes
            log.info(
                "log compacted: it begins at %d now (%d bytes and %d snapshot files deleted)",
                done.log_start,
                done.freed_bytes,
                done.snapshots_removed,
            )

    # ------------------------------------------------------------------ sending

    def fall_back(self, member_id: int, position: int) -> bool:
        """``member_id``'s next record, at ``position``, is corrupt here: send it the
        latest snapshot instead if that is above it (True)."""
        node = self.node
        entries = node.recording_log.snapshots()
        snapshot = entries[-1].log_position if entries else -1
        replication = node.cm.replication
        if replication.bad_positions.get(member_id) == position:
            return True
        if not replication.fall_back_to_snapshot(member_id, position, snapshot):
            asked = (node.cm.leadership_term_id, position)
            if asked in self._snapshot_asked:
                return False  # asked already: the replicator tries again meanwhile
            nursery = self.nursery
            asking = nursery is not None and node.cm.is_ready_leader
            if asking:  # not yet ready: asked at a later try (seed 1011 was stuck)
                self._snapshot_asked.add(asked)
            log.error(
                "member %d needs the corrupt record at %d and no snapshot is above it: %s",
                member_id,
                position,
                "taking one to send it instead"
                if asking
                else "it cannot catch up from this member",
            )
            if asking and nursery is not None:
                nursery.start_soon(self._snapshot_above, asked)
            return False
        node.cm.counters.snapshot_fallbacks += 1
        log.warning(
            "member %d needs the corrupt record at %d: sending it the snapshot at %d instead",
            member_id,
            position,
            snapshot,
        )
        return True

    async def _snapshot_above(self, asked: tuple[int, int]) -> None:
        """Put a SNAPSHOT on the log so that a snapshot above the corrupt record at
        ``asked`` (term, position) exists to send instead (the replicator tries again
        meanwhile; a leader of a later term asks again: this one may never commit)."""
        position = asked[1]
        ok, message = await self.node.request_action(ClusterAction.SNAPSHOT)
        if not ok:
            self._snapshot_asked.discard(asked)  # asked again at the next try
            log.warning("no snapshot above the corrupt record at %d: %s", position, message)

    def replicators(
        self,
        heartbeat_interval: float,
        read_log: Callable[[int, int], Awaitable[bytes]],
        wait_for_log: Callable[[], Awaitable[None]],
        on_corrupt: Callable[[ArchiveCorruptionError], None],
    ) -> dict[int, Replicator]:
        """One replicator per member link, each able to send a snapshot."""
        node = self.node
        return {
            member_id: Replicator(
                node.cm,
                member_id,
                link,
                read_log,
                node.log_buffer,
                wait_for_log,
                heartbeat_interval,
                on_corrupt,
                send_snapshot=self.send_snapshot,
                fall_back=self.fall_back,
            )
            for member_id, link in node.links.links.items()
        }

    async def send_snapshot(self, member_id: int, link: PeerLink, interval: float) -> None:
        """Send ``member_id`` this member's latest snapshot, for as long as it needs one
        and this member leads the same term."""
        node = self.node
        cm = node.cm
        replication = cm.replication
        entries = node.recording_log.snapshots()
        if not entries:
            log.error("member %d needs log that was purged, and no snapshot is here", member_id)
            await trio.sleep(interval)
            return
        entry = entries[-1]
        path = snapshot_path(node.data_dir, entry.log_position, entry.leadership_term_id)
        try:
            fd, length = await node.run_blocking(_open, path)
        except OSError as exc:
            log.error("cannot send snapshot %s to member %d: %s", path, member_id, exc)
            await trio.sleep(interval)
            return
        log.info(
            "member %d needs log below %d: sending it snapshot %s (%d bytes)",
            member_id,
            cm.log.start_position,
            path.name,
            length,
        )
        term = cm.leadership_term_id
        connects = link.connects
        acked = replication.snapshot_acked(member_id)
        heard = trio.current_time()
        refusals = 0
        try:
            while replication.needs_snapshot(member_id) and cm.leadership_term_id == term:
                if replication.holds(member_id, entry.log_position):
                    # it installed this snapshot, yet needs log below the start still: a
                    # compaction purged past it meanwhile (a later snapshot was taken):
                    # the replicator's next call sends that one
                    log.info(
                        "member %d has snapshot %s, but the log now begins at %d: "
                        "sending it the latest",
                        member_id,
                        path.name,
                        cm.log.start_position,
                    )
                    return
                if not link.is_connected:
                    await link.connected.wait()
                    continue
                if replication.take_refusal(member_id):
                    refusals += 1
                    (log.error if refusals == 1 else log.debug)(
                        "member %d refused snapshot %s (%d bytes): its disk has no room "
                        "for it; asking again every %.0f s",
                        member_id,
                        path.name,
                        length,
                        REFUSED_RETRY,
                    )
                    await trio.sleep(REFUSED_RETRY)
                    replication.rewind_snapshot(member_id)
                    heard = trio.current_time()
                    continue
                now = trio.current_time()
                if replication.snapshot_acked(member_id) != acked:
                    acked, heard = replication.snapshot_acked(member_id), now
                elif link.connects != connects or now - heard > RETRY_HEARTBEATS * interval:
                    connects, heard = link.connects, now
                    replication.rewind_snapshot(member_id)  # what was sent may be lost
                step = replication.snapshot_next(member_id, entry.log_position, length)
                if step is None or link.backlog >= MAX_LINK_BACKLOG:
                    await trio.sleep(POLL)
                    continue
                offset, size = step
                data = await node.run_blocking(pread_full, fd, size, offset) if size else b""
                if len(data) != size:
                    log.error("snapshot %s is shorter than it was: not sent", path)
                    return
                if cm.leadership_term_id != term or not replication.needs_snapshot(member_id):
                    break
                chunk = replication.snapshot_chunk(
                    member_id,
                    position=entry.log_position,
                    term=entry.leadership_term_id,
                    term_base=entry.term_base_log_position,
                    length=length,
                    offset=offset,
                    data=data,
                )
                link.send(chunk)
                link.flush()
                await trio.lowlevel.checkpoint()
            else:
                if cm.leadership_term_id == term:
                    self.snapshots_sent += 1
                    log.info("member %d has snapshot %s: the log follows", member_id, path.name)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ receiving

    def persist(self) -> None:
        """Start writing what the consensus module received (chunks of a snapshot), and
        installing a snapshot received whole."""
        nursery = self._nursery
        if nursery is None:
            return
        receiver = self.node.cm.replica.snapshot
        self._remove_dropped()
        for write in receiver.take_writes():
            nursery.start_soon(self._write, write)
        if receiver.complete is not None and not self._installing:
            self._installing = True
            nursery.start_soon(self._install, receiver.complete)

    def _has_room(self, transfer: Transfer) -> bool:
        """Does the data directory's file system hold ``transfer`` and the reserve?"""
        node = self.node
        try:
            stat = os.statvfs(node.data_dir)
        except OSError:
            return True  # nothing known: the writes say
        free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
        reserve = room_reserve(total)
        if transfer.length + reserve <= free:
            return True
        if node.cm.replica.snapshot.refused != transfer:
            self.refused_installs += 1
            log.warning(
                "snapshot of %d bytes from member %d refused: %d bytes free here, "
                "%d of them kept in reserve",
                transfer.length,
                transfer.leader_member_id,
                free,
                reserve,
            )
        return False

    async def watch_transfers(self) -> None:
        """Drop a transfer that stopped (its leader gone, a new term, no chunk for the
        leader heartbeat timeout), its file removed at once."""
        node = self.node
        receiver = node.cm.replica.snapshot
        timeout_ns = node.cm.config.leader_heartbeat_timeout_ns
        while True:
            await trio.sleep(WATCH_INTERVAL)
            receiver.expire(node.now_ns(), timeout_ns)
            self._remove_dropped()

    def _remove_dropped(self) -> None:
        node = self.node
        for transfer in node.cm.replica.snapshot.take_dropped():
            path = install_path(node.data_dir, transfer)
            try:
                size = path.stat().st_size
            except OSError:
                continue  # nothing written
            try:
                path.unlink()
            except OSError as exc:
                log.error("cannot remove %s (%s)", path, exc)
                continue
            self.abandoned_installs += 1
            log.warning(
                "snapshot transfer from member %d stopped at %d of %d bytes: %s removed",
                transfer.leader_member_id,
                size,
                transfer.length,
                path.name,
            )

    async def _write(self, write: ChunkWrite) -> None:
        node = self.node
        receiver = node.cm.replica.snapshot
        transfer = write.transfer
        path = install_path(node.data_dir, transfer)
        try:
            end = await node.run_blocking(_write_chunk, path, write, transfer.length)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                log.error(
                    "cannot write snapshot chunk to %s (%s): the transfer is dropped and the "
                    "file removed",
                    path,
                    exc,
                )
                receiver.on_write_failed(transfer, no_room=True)
                self._remove_dropped()
            else:
                log.error(
                    "cannot write snapshot chunk to %s (%s): the leader resends it", path, exc
                )
                receiver.on_write_failed(transfer)
        else:
            receiver.on_written(transfer, end)
        self.kick()

    async def _install(self, transfer: Transfer) -> None:
        node = self.node
        receiver = node.cm.replica.snapshot
        path = install_path(node.data_dir, transfer)
        try:
            snapshot = await node.run_blocking(_check, path, transfer)
        except (ArchiveError, SnapshotError, OSError) as exc:
            log.error("snapshot from member %d refused: %s", transfer.leader_member_id, exc)
            path.unlink(missing_ok=True)
            receiver.on_install_failed(transfer)
            self._installing = False
            self.kick()
            return
        await node.archive_agent.wait_idle()  # nothing of the old log is being written
        async with node.archive_lock:
            timestamp = node.cm.log.cluster_time(node.now_ns())
            # A failure from here on (the recording log says the log was reset) stops
            # the node: start-up finishes the install (compaction.reconcile).
            await node.run_blocking(_install, path, node, transfer, timestamp)
            self._load(transfer, snapshot)
        node.cm.control.auto.restore(transfer.log_position, timestamp, transfer.length)
        self.installs += 1
        self._installing = False
        log.info(
            "installed snapshot at log position %d (term %d) from member %d: the log begins there",
            transfer.log_position,
            transfer.snapshot_term_id,
            transfer.leader_member_id,
        )
        self.kick()

    @trio.lowlevel.enable_ki_protection  # the service's on_start runs: see DutyCycle.kick
    def _load(self, transfer: Transfer, snapshot: LoadedSnapshot) -> None:
        """The log and the state now begin at the snapshot (no await in between)."""
        node = self.node
        cm, container, buf = node.cm, node.container, node.log_buffer
        position = transfer.log_position
        now = node.now_ns()
        buf.data = bytearray()
        buf.base = buf.applied = position
        node.archive_agent.written = position
        cm.replica.on_snapshot_installed(transfer, now)  # the log is reset, reported
        cm.session_manager.reset((), now)
        cm.timers = TimerService()
        container.sessions.clear()
        load_snapshot(snapshot, cm, container, now)
        container.start(snapshot.service_state)


def _open(path: Path) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    return fd, os.fstat(fd).st_size


def _write_chunk(path: Path, write: ChunkWrite, length: int) -> int:
    """Write ``write`` at its offset of ``path`` (offset 0: a new file, other transfers'
    files removed); the last chunk is fsynced.  Returns the end written."""
    if write.offset == 0:
        make_directory(path.parent)
        for stale in path.parent.glob("install-*.tmp"):
            stale.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        if os.fstat(fd).st_size < write.offset:
            raise OSError(f"{path} holds less than the {write.offset} bytes received")
        os.ftruncate(fd, write.offset)
        view = memoryview(write.data)
        at = write.offset
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n
        if at == length:
            os.fsync(fd)
    finally:
        os.close(fd)
    return at


def _check(path: Path, transfer: Transfer) -> LoadedSnapshot:
    """The received snapshot, parsed: it must be one, of the position and term sent."""
    snapshot = parse_snapshot(read_snapshot(path))
    if (snapshot.log_position, snapshot.leadership_term_id) != (
        transfer.log_position,
        transfer.snapshot_term_id,
    ):
        raise SnapshotError(
            f"it is of log position {snapshot.log_position} (term "
            f"{snapshot.leadership_term_id}), not {transfer.log_position} "
            f"(term {transfer.snapshot_term_id})"
        )
    return snapshot


def _install(path: Path, node: Host, transfer: Transfer, timestamp: int) -> None:
    final = snapshot_path(node.data_dir, transfer.log_position, transfer.snapshot_term_id)
    os.replace(path, final)
    fsync_directory(final.parent)
    install_snapshot(
        node.archive,
        node.recording_log,
        node.data_dir,
        log_position=transfer.log_position,
        leadership_term_id=transfer.snapshot_term_id,
        term_base_log_position=transfer.term_base_log_position,
        timestamp=timestamp,
    )
