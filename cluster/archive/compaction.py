"""Log compaction and snapshot installs, on disk (no trio: the shell runs these through
``run_blocking``, one at a time, under the archive lock).

**Compaction** (:func:`compact`): once more than ``retention`` snapshots are recorded,
the segment files wholly below the ``retention``-th newest snapshot are deleted.  In
order, each step safe to be cut short by a crash:

1. the recording log gets a ``LOG_START`` entry at the new start (a segment base at or
   below that snapshot's position): from here on start-up deletes the segments below it
   (:meth:`~cluster.archive.segments.Archive.open` with ``start_position``);
2. the segment files below it are deleted, oldest first;
3. snapshot files below it are deleted (no log follows them any more).

A member never deletes log its own recovery needs: recovery loads a snapshot at or
after the log start (the newest of the retained ones that loads) and replays from
there.  A follower that needs log its leader has purged is sent the leader's latest
snapshot instead (``cluster.agents.catchup``).

**Install** (:func:`install_snapshot`): a follower that received its leader's snapshot
(already written whole at its place in ``snapshots/``) makes it the start of its log:

1. a ``LOG_RESET`` entry at the snapshot's position: the commit point;
2. the archive is replaced by an empty one beginning there (its old log is not the
   leader's: none of it is kept);
3. the term history becomes the snapshot's term alone, and the snapshot is recorded;
4. snapshot files below it are deleted.

:func:`reconcile` runs at start-up before the archive is opened: after a ``LOG_RESET``
whose snapshot is not recorded yet (a crash between 1 and 3) it redoes 2 and 3.  It
returns the log start to open the archive with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .errors import ArchiveError
from .layout import reset_directory
from .recording_log import (
    CM_SERVICE_ID,
    ENTRY_TYPE_LOG_RESET,
    ENTRY_TYPE_SNAPSHOT,
    Entry,
    RecordingLog,
)
from .segments import Archive
from .snapshots import snapshot_path

log = logging.getLogger("cluster.archive")


@dataclass(frozen=True, slots=True)
class Compaction:
    """What :func:`compact` did."""

    log_start: int
    """Where the log now begins."""
    freed_bytes: int
    """Archive bytes deleted."""
    snapshots_removed: int


def compact(
    archive: Archive, recording_log: RecordingLog, data_dir: Path, retention: int, timestamp: int
) -> Compaction | None:
    """Delete the log wholly below the ``retention``-th newest snapshot (0: keep
    everything); None if there is nothing to delete."""
    if retention <= 0:
        return None
    snapshots = recording_log.snapshots(CM_SERVICE_ID)
    if len(snapshots) < retention:
        return None
    keep = snapshots[-retention]
    start = archive.purge_point(keep.log_position)
    if start <= archive.start_position:
        return None
    recording_log.append_log_start(
        start, keep.leadership_term_id, keep.term_base_log_position, timestamp
    )
    freed = archive.purge(start)
    removed = remove_snapshots_below(data_dir, recording_log, start)
    return Compaction(start, freed, removed)


def remove_snapshots_below(data_dir: Path, recording_log: RecordingLog, position: int) -> int:
    """Delete the files of recorded snapshots below ``position``; return how many."""
    removed = 0
    for entry in recording_log.entries:
        if (
            entry.type == ENTRY_TYPE_SNAPSHOT
            and entry.service_id == CM_SERVICE_ID
            and entry.log_position < position
        ):
            path = snapshot_path(data_dir, entry.log_position, entry.leadership_term_id)
            if path.exists():
                path.unlink()
                removed += 1
    return removed


def install_snapshot(
    archive: Archive,
    recording_log: RecordingLog,
    data_dir: Path,
    *,
    log_position: int,
    leadership_term_id: int,
    term_base_log_position: int,
    timestamp: int,
) -> None:
    """Make the snapshot at ``log_position`` (its file already in place) the start of
    this member's log (see the module docstring)."""
    path = snapshot_path(data_dir, log_position, leadership_term_id)
    if not path.is_file():
        raise ArchiveError(f"cannot install snapshot {path}: no such file")
    reset = recording_log.append_log_start(
        log_position, leadership_term_id, term_base_log_position, timestamp, reset=True
    )
    archive.reset(log_position)
    _record_installed(recording_log, reset)
    remove_snapshots_below(data_dir, recording_log, log_position)


def _record_installed(recording_log: RecordingLog, reset: Entry) -> None:
    term, base, position = (
        reset.leadership_term_id,
        reset.term_base_log_position,
        reset.log_position,
    )
    recording_log.replace_terms(term, base, reset.timestamp)
    recording_log.append_snapshot(term, base, position, reset.timestamp, 0)
    recording_log.append_snapshot(term, base, position, reset.timestamp, CM_SERVICE_ID)


def _installed(recording_log: RecordingLog, reset: Entry) -> bool:
    return any(
        e.is_valid
        and e.type == ENTRY_TYPE_SNAPSHOT
        and e.service_id == CM_SERVICE_ID
        and e.index > reset.index
        and (e.log_position, e.leadership_term_id) == (reset.log_position, reset.leadership_term_id)
        for e in recording_log.entries
    )


def reconcile(data_dir: Path, recording_log: RecordingLog) -> int:
    """Finish a snapshot install a crash cut short; return where the log begins."""
    latest = recording_log.latest_log_start()
    if latest is None:
        return 0
    if latest.type == ENTRY_TYPE_LOG_RESET and not _installed(recording_log, latest):
        path = snapshot_path(data_dir, latest.log_position, latest.leadership_term_id)
        if not path.is_file():
            raise ArchiveError(f"the log was reset to snapshot {path}, which is missing")
        log.warning(
            "finishing the install of snapshot %s (cut short by a crash or a failure)", path
        )
        reset_directory(data_dir / "archive", latest.log_position)
        _record_installed(recording_log, latest)
        remove_snapshots_below(data_dir, recording_log, latest.log_position)
    return latest.log_position
