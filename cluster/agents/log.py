"""Archive and log agents: persist the log, then feed committed entries to the service.

The **archive agent** takes every record the consensus module has encoded since its last
write and appends them as one batch (group commit: whatever accumulates during one
write and fdatasync goes into the next).  Only after the archive returns does the
position count as appended.  A failed write (a full disk) is retried every
``retry_interval``; the commit position simply stops moving meanwhile, so nothing is
acknowledged that is not on disk.  Before any append or truncation, the recording-log
writes that failed before (a term's start, :class:`~cluster.archive.storage.NodeStorage`)
are written: the log never holds bytes of a term the recording log does not name.  The
node's :class:`~cluster.archive.disk.DiskHealth` hears of each failure and of the first
write that succeeds after them (one ERROR when the disk fills, not one per retry).

The **log agent** applies records up to the commit position, in order, through the
:class:`~cluster.core.service_container.ServiceContainer`.  When the service stops the
member (``--on-service-error stop``: a
:class:`~cluster.core.service_errors.ServiceFailure`), it ends the node
(:meth:`LogAgent.stop`): a leader first tells its followers the commit position, so
that they apply the same entry, raise alike and stop too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
import trio.lowlevel

from ..archive.disk import DiskHealth
from ..archive.errors import ArchiveWriteError
from ..archive.segments import Archive
from ..archive.storage import NodeStorage
from ..core.consensus import ConsensusModule
from ..core.service_container import ServiceContainer
from ..protocol.enums import Role
from .consensus import PeerLinks
from .worker import acquire

log = logging.getLogger("cluster.log")

COMPACT_BYTES = 4 << 20

INLINE_WHEN_IDLE_NS = 750_000
INLINE_MAX_RECORDS = 2
"""A leader in ``auto`` mode writes a batch inline when everything written before it is
committed, the batch came at least ``INLINE_WHEN_IDLE_NS`` after the previous one and
it holds at most ``INLINE_MAX_RECORDS`` records: messages that far apart (one in
flight, a trickle) rarely arrive during its own sync, and the writer thread's hand-off
costs more CPU than the sync blocks the loop.  Other batches go to the writer thread,
so the leader keeps sequencing and replicating while it syncs (a long gap under load is
the leader waiting for a CPU, and its batch is then a big one)."""

APPLY_CHUNK = 16 << 10
"""Log bytes a leader applies per step before the replies go out (a few hundred small
messages)."""

MIRROR_CHUNK = 256 << 10
"""Log bytes a follower applies per step: it has no replies to send, only the event loop
to keep turning."""

STOP_NOTICE_S = 1.0
"""How long a leader stopped by its service waits for its commit position to leave."""


class _NotYet(Exception):
    """An earlier recording-log write still fails: the log bytes wait for it."""


class LogBuffer:
    """The log's recent bytes in memory: ``[base, base + len(data))``.

    It holds everything not yet both applied and durable here, so replication and the
    log agent never need the disk for recent entries (a leader may apply an entry that
    followers have on disk before its own fdatasync has returned).
    """

    __slots__ = ("applied", "base", "data")

    def __init__(self, base: int) -> None:
        self.base = base
        self.applied = base
        self.data = bytearray()

    def release(self, durable: int) -> None:
        """Forget bytes that are both applied and at or below ``durable``.

        Amortised: the front of the buffer is cut only once it is a good part of it
        (cutting moves everything behind it)."""
        dead = min(self.applied, durable) - self.base
        if dead > 0 and (dead >= len(self.data) >> 1 or dead >= COMPACT_BYTES):
            del self.data[:dead]
            self.base += dead

    def copy(self, start: int, stop: int) -> bytes:
        """The bytes ``[start, stop)`` (one copy)."""
        base = self.base
        with memoryview(self.data) as view:
            return bytes(view[start - base : stop - base])

    @property
    def end(self) -> int:
        return self.base + len(self.data)


class ArchiveAgent:
    """Appends the log buffer to the archive: ``[written, log_buffer.end)`` is taken but
    not yet written.

    New records move from the consensus module into the log buffer as soon as they are
    encoded (:meth:`take`, which lets replication send them at once); the write, one
    ``append`` of everything pending, runs either right in the caller's task
    (:meth:`write_now`, ``inline``) or in this agent's task through ``run_blocking`` (a
    worker thread), one write at a time, so whatever arrives meanwhile forms the next
    batch (group commit).
    """

    def __init__(
        self,
        archive: Archive,
        cm: ConsensusModule,
        log_buffer: LogBuffer,
        on_appended: Callable[[], None],
        run_blocking: Callable[..., Awaitable[Any]],
        *,
        lock: trio.Lock,
        on_taken: Callable[[], None],
        on_truncated: Callable[[], None],
        clock_ns: Callable[[], int],
        retry_interval: float = 1.0,
        inline: bool = False,
        storage: NodeStorage | None = None,
    ) -> None:
        self.run_blocking = run_blocking
        self.inline = inline
        self.lock = lock
        self.on_taken = on_taken
        self.on_truncated = on_truncated
        self.clock_ns = clock_ns
        self.archive = archive
        self.cm = cm
        self.log_buffer = log_buffer
        self.on_appended = on_appended
        self.retry_interval = retry_interval
        self.storage = storage
        self.disk = storage.disk if storage is not None else DiskHealth(".")
        self.wake = trio.Event()
        self.batches = 0
        self.bytes_appended = 0
        self.write_errors = 0
        self.last_error = ""
        self.idle = trio.Event()
        self.written = log_buffer.end
        self._busy = False  # a write under way (or failed, to be retried by the task)
        #: not inline, but inline when idle (a leader in ``auto`` mode): see
        #: :data:`INLINE_WHEN_IDLE_NS`
        self.inline_when_idle = False
        self.inline_writes = 0  # writes done inline because of inline_when_idle
        self._last_take_ns = clock_ns()
        self._take_gap_ns = 0  # from the batch before the last one taken to the last one

    def kick(self) -> None:
        self.wake.set()

    @property
    def pending(self) -> bool:
        """Log not yet durably appended (taken or not), or a truncation to do."""
        return (
            self.written < self.log_buffer.end
            or bool(self.cm.log.buffer)
            or self.cm.log.pending_truncate is not None
        )

    def take(self) -> None:
        """Move newly encoded records from the consensus module into the log buffer and
        let replication send them (before they are written here)."""
        cm = self.cm
        if cm.log.pending_truncate is not None:
            return  # the task truncates first
        batch = cm.take_log_batch()
        if batch is None:
            return
        start, data = batch
        buf = self.log_buffer
        if start != buf.end:
            raise RuntimeError(f"log gap: batch at {start}, buffer ends {buf.end}")
        buf.data += data
        now = self.clock_ns()
        self._take_gap_ns = now - self._last_take_ns
        self._last_take_ns = now
        self.on_taken()

    def write_now(self) -> bool:
        """Write what is pending right here in the caller's task (``inline`` mode: no
        task switch, no thread hand-off).

        Returns False if the agent's task has to do it: not inline (nor idle, for
        :attr:`inline_when_idle`), a write or a truncation under way, or the archive busy
        (a catch-up read, a snapshot)."""
        if not self.inline and not (self.inline_when_idle and self._idle()):
            return False
        if self._busy or self.cm.log.pending_truncate is not None or self.lock.locked():
            return False
        data = self._pending_bytes()
        if not data:
            return True
        try:
            if not self._storage_flushed():
                raise _NotYet
            # whole records, as the consensus module encoded or checked them
            position = self.archive.append(data, checked=True)
        except (ArchiveWriteError, _NotYet) as exc:
            self._busy = True  # until the task's retry succeeds
            if isinstance(exc, ArchiveWriteError):
                self._write_failed(exc, f"append of {len(data)} bytes at {self.written}")
            self.kick()
            return True
        if not self.inline:
            self.inline_writes += 1
        self._appended(position, len(data))  # the caller (the driver) goes on from here
        return True

    def _idle(self) -> bool:
        """Everything written is committed and the new batch is small and came long
        after the one before: the log is quiet enough that a write blocking the event
        loop delays nothing."""
        rlog = self.cm.log
        return (
            self._take_gap_ns >= INLINE_WHEN_IDLE_NS
            and len(rlog.own_records) <= INLINE_MAX_RECORDS
            and rlog.commit_position >= self.written
        )

    def _pending_bytes(self) -> bytes:
        buf = self.log_buffer
        if self.written < buf.base:
            raise RuntimeError(f"log buffer starts at {buf.base}, past the archive {self.written}")
        return buf.copy(self.written, buf.end)

    def _storage_flushed(self) -> bool:
        """The recording-log writes that failed before are made now (False: not yet)."""
        return self.storage is None or self.storage.flush()

    def _appended(self, position: int, size: int) -> None:
        if self.disk.problem:  # this path, or another, failed before: it writes again
            self.disk.succeeded("log")
        self.written = position
        self.batches += 1
        self.bytes_appended += size
        cm = self.cm
        cm.on_archive_position(position, self.clock_ns())
        self.log_buffer.release(cm.log.archive_position)

    async def run(self) -> None:
        cm = self.cm
        while True:
            if not self.pending:
                self.idle.set()
                await self.wake.wait()
            self.wake = trio.Event()
            self.idle = trio.Event()
            if self._busy:
                await trio.sleep(self.retry_interval)  # after a failed inline write
            elif cm.log.pending_truncate is not None:
                await self._truncate(cm.log.pending_truncate)
            self.take()
            data = self._pending_bytes()
            if not data:
                self._busy = False
                await trio.lowlevel.checkpoint()
                continue
            self._busy = True
            try:
                position = await self._append(data)
            finally:
                self._busy = False
            self._appended(position, len(data))
            self.on_appended()  # the node drives the consensus module on from here

    async def _truncate(self, position: int) -> None:
        buf = self.log_buffer
        if position < buf.applied:
            raise RuntimeError(f"truncation to {position} below the applied position {buf.applied}")
        del buf.data[position - buf.base :]
        while True:
            if self._storage_flushed():  # the terms it removes go first
                if position >= self.written:
                    break
                async with self.lock:
                    try:
                        await self.run_blocking(self.archive.truncate, position)
                    except ArchiveWriteError as exc:
                        self._write_failed(exc, f"truncation at {position}")
                    else:
                        self.written = position
                        if self.disk.problem:
                            self.disk.succeeded("log")
                        break
            await trio.sleep(self.retry_interval)
        self.cm.on_truncated(position)
        self.on_truncated()

    async def _append(self, data: bytes) -> int:
        while True:
            if self._storage_flushed():
                await acquire(self.lock)
                try:
                    append = partial(self.archive.append, checked=True)  # as write_now's
                    return int(await self.run_blocking(append, data))
                except ArchiveWriteError as exc:
                    error = exc
                finally:
                    self.lock.release()
                self._write_failed(error, f"append of {len(data)} bytes at {self.written}")
            await trio.sleep(self.retry_interval)

    def _write_failed(self, exc: ArchiveWriteError, what: str) -> None:
        """One ERROR record when writes start failing (the disk health's), then one
        DEBUG line per retry."""
        self.write_errors += 1
        self.last_error = str(exc)
        self.disk.failed("log", exc, what)
        log.debug("archive %s failed (%s); retrying", what, exc)

    async def wait_idle(self) -> None:
        """Wait until everything encoded so far is durably appended."""
        while self.pending or not self.idle.is_set():
            self.kick()
            await self.idle.wait()
            await trio.lowlevel.checkpoint()


class LogAgent:
    """Applies the committed log to the service, a chunk per :meth:`apply_committed`
    (called by the node's driver loop, which reports each chunk to the consensus
    module); its task only runs the driver when kicked (a shutdown draining the log)."""

    def __init__(
        self,
        cm: ConsensusModule,
        container: ServiceContainer,
        log_buffer: LogBuffer,
        drive: Callable[[], None],
        links: PeerLinks | None = None,
    ) -> None:
        self.cm = cm
        self.container = container
        self.log_buffer = log_buffer
        self.drive = drive
        self.links = links
        self.wake = trio.Event()

    @property
    def applied_position(self) -> int:
        return self.log_buffer.applied

    def kick(self) -> None:
        self.wake.set()

    def apply_committed(self) -> int:
        buf = self.log_buffer
        cm = self.cm
        rlog = cm.log
        applied = buf.applied
        stop = min(rlog.commit_position, buf.end)
        if rlog.pending_truncate is not None:
            # bytes past a truncation the archive agent has not done yet are stale
            stop = min(stop, rlog.pending_truncate)
        # A leader's own entries of this term are already in its session table; entries
        # of earlier terms (and everything on a follower) are mirrored into it.
        mirror_end = (
            cm.replication.term_base_position if cm.role is Role.LEADER else rlog.commit_position
        )
        mirror = applied < mirror_end
        if mirror:
            stop = min(stop, mirror_end)
        if stop <= applied:
            return 0
        # A bounded chunk per call: the caller sends the replies of each chunk before
        # applying the next, so clients work on them in parallel (pipelining).
        limit = min(stop, applied + (MIRROR_CHUNK if mirror else APPLY_CHUNK))
        consumed = self._apply(applied, limit, mirror)
        if not consumed and limit < stop:
            consumed = self._apply(applied, stop, mirror)  # one record longer than a chunk
        if consumed:
            buf.applied += consumed
            buf.release(rlog.archive_position)
        return consumed

    def _apply(self, start: int, stop: int, mirror: bool) -> int:
        if not mirror:
            own = self.cm.log.take_own_records(start, stop)
            if own:  # a leader's own entries: applied from the messages it encoded
                return self.container.apply_records(own, start)
        buf = self.log_buffer
        with memoryview(buf.data) as view, view[start - buf.base : stop - buf.base] as chunk:
            # the log buffer holds checked records only (a follower checks what it
            # receives, the archive is checked when opened): no second CRC pass
            return self.container.apply(chunk, start, mirror_into_consensus=mirror, checked=True)

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            self.drive()

    async def stop(self, scope: trio.CancelScope) -> None:
        """The service stopped this member (a ``ServiceFailure``; the node applies
        nothing more): a leader first sends its followers the commit position, which
        covers the entry the service raised on, so that they apply it, raise alike and
        stop too (else they would elect a leader of their own that meets it in turn);
        then the node's agents end (``scope``)."""
        if self.cm.role is Role.LEADER and self.links is not None:
            self.cm.replication.send_commit_position(every=True)
            self.links.flush()
            with trio.move_on_after(STOP_NOTICE_S):
                await self.links.wait_sent()
        scope.cancel()
