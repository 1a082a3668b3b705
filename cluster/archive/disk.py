"""The node's one disk state: whether its writes succeed, and if not, since when and why.

Every write path of a node (log appends, the recording log, ``node-state.json``,
snapshots) reports here: :meth:`DiskHealth.failed` when a write raised an
:class:`OSError`, :meth:`DiskHealth.succeeded` when one went through.  The first failure
is one ERROR record ("disk full: ...; writes are retried; nothing is acknowledged
meanwhile"), not one per retry; the state clears, with one WARNING ("disk has space
again: writes resumed after N s"), once every failing write path has written again.

Most paths retry by themselves (the archive agent, the node-state saver, the recording
log's writes, which the archive agent retries before the log bytes that need them).
A snapshot is not retried (the next one is a new request): its failure is settled by
any later write that succeeds, or by :meth:`DiskHealth.probe` finding room for it.

ENOSPC and EDQUOT make the state "disk full"; EMFILE and ENFILE are "out of file
descriptors" (the process's or the system's table is full: not the disk, whatever the
write was; :mod:`cluster.descriptors` keeps a reserve so that it should not happen); any
other write error (EIO, ...) is a "disk error", handled the same way.  Not thread-safe:
the node reports from its event loop (writes in worker threads raise there).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..protocol.admin import DiskStatus

log = logging.getLogger("cluster.disk")

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errors that mean the disk (or the member's quota) is full."""

DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
"""Errors that mean no file descriptor was free: not a disk problem."""


def failure_kind(exc: OSError) -> str:
    """What a failed write's error means, in words: ``disk full``, ``out of file
    descriptors`` or ``disk error``."""
    if exc.errno in FULL_ERRNOS:
        return "disk full"
    if exc.errno in DESCRIPTOR_ERRNOS:
        return "out of file descriptors"
    return "disk error"


@dataclass(slots=True)
class _Failure:
    error: str
    retried: bool
    needed: int


class DiskHealth:
    """One node's disk state (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        self.clock = clock
        self.problem = ""
        """Empty while writes succeed; else what fails and why ("disk full: ...")."""
        self.full = False
        """The failing writes are out of space (ENOSPC, EDQUOT)."""
        self.since: float | None = None
        self.write_failures = 0
        """Failed writes since start, every retry counted."""
        self.full_events = 0
        """Times writes started failing."""
        self.failed_seconds = 0.0
        """Seconds with failing writes in past episodes (see :attr:`failing_for`)."""
        self.listeners: list[Callable[[str], None]] = []
        """Called with :attr:`problem` each time it changes."""
        self._failing: dict[str, _Failure] = {}

    @property
    def failing(self) -> list[str]:
        """The write paths failing now."""
        return sorted(self._failing)

    @property
    def failing_for(self) -> float | None:
        """Seconds since writes started failing (None while they succeed)."""
        return None if self.since is None else self.clock() - self.since

    def failed(
        self, path: str, exc: OSError, detail: str = "", *, retried: bool = True, needed: int = 0
    ) -> str:
        """A write of ``path`` (archive, recording log, node state, snapshot) raised
        ``exc``; ``retried``: the path tries again by itself; ``needed``: the bytes it
        needed.  Returns the reason, as an ERROR reply would say it."""
        self.write_failures += 1
        full = exc.errno in FULL_ERRNOS
        cause = os.strerror(exc.errno) if exc.errno else str(exc)
        what = f"{path} {detail}".strip()
        reason = f"{failure_kind(exc)}: {what} failed ({cause})"
        known = path in self._failing
        self._failing[path] = _Failure(reason, retried, needed)
        if self.since is None:
            self.since = self.clock()
            self.full_events += 1
            self.full = full
            self._set_problem(reason)
            log.error(
                "%s; writes are retried; nothing is acknowledged meanwhile (data directory %s)",
                reason,
                self.directory,
            )
        elif not known:
            if full and not self.full:
                self.full = True
                self._set_problem(reason)
            log.warning("%s as well", reason)
        return reason

    def succeeded(self, path: str) -> None:
        """A write of ``path`` went through: the path is no longer failing, nor are
        the one-shot writes (a snapshot) that failed before it."""
        failing = self._failing
        if not failing:
            return
        failing.pop(path, None)
        for name in [name for name, f in failing.items() if not f.retried]:
            del failing[name]
        if not failing:
            self._recovered()

    def probe(self) -> None:
        """While only one-shot writes failed (nothing retries), clear the state once the
        file system has room for the largest of them again (and at least 1 MiB)."""
        failing = self._failing
        if not failing or any(f.retried for f in failing.values()):
            return
        need = max(max(f.needed for f in failing.values()), 1 << 20)
        if self.free_bytes() >= need:
            failing.clear()
            self._recovered()

    def status(self) -> DiskStatus:
        """This state as ``describe`` reports it."""
        failing_for = self.failing_for
        return DiskStatus(
            full=self.full,
            problem=self.problem,
            failing_for_s=None if failing_for is None else round(failing_for, 3),
            failing=self.failing,
            free_bytes=self.free_bytes(),
            write_failures=self.write_failures,
            full_events=self.full_events,
            failed_seconds=round(self.failed_seconds + (failing_for or 0.0), 3),
        )

    def free_bytes(self) -> int:
        """Free bytes for this node on its data directory's file system (-1: unknown)."""
        try:
            stat = os.statvfs(self.directory)
        except OSError:
            return -1
        return stat.f_bavail * stat.f_frsize

    def _recovered(self) -> None:
        elapsed = self.failing_for or 0.0
        self.failed_seconds += elapsed
        self.since = None
        was_full, self.full = self.full, False
        descriptors = self.problem.startswith("out of file descriptors")
        self._set_problem("")
        log.warning(
            "%s: writes resumed after %.1f s",
            "disk has space again"
            if was_full
            else "descriptors free again"
            if descriptors
            else "disk writes succeed again",
            elapsed,
        )

    def _set_problem(self, problem: str) -> None:
        self.problem = problem
        for listener in self.listeners:
            listener(problem)
