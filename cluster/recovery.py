"""Start-up recovery: load the latest snapshot, then replay the log after it.

In a cluster of one, everything durable is committed.  Otherwise only the commit
position saved in ``node-state.json`` is known to be committed: later entries wait in
the log buffer until a leader's commit position covers them (or a new leader truncates
them).  Replay mirrors every entry into the consensus module (sessions, terms, module
state), as a follower applying the log does.

The archive may begin after position 0 (compacted, or reset by a snapshot install:
``cluster.archive.compaction``): recovery only looks at snapshots at or after its
start, and one of them must load.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .agents.log import LogBuffer
from .archive.errors import ArchiveCorruptionError, ArchiveError
from .archive.record import RECORD_HEADER_LENGTH, RecordError, iter_records
from .archive.recording_log import CM_SERVICE_ID, RecordingLog
from .archive.segments import Archive
from .archive.snapshots import read_snapshot, snapshot_path
from .core.consensus import ConsensusModule
from .core.service_container import ServiceContainer
from .core.snapshot import LoadedSnapshot, SnapshotError, load_snapshot, parse_snapshot
from .protocol import LOG, ProtocolError

log = logging.getLogger("cluster.node")

REPLAY_CHUNK = 8 << 20


def load_latest_snapshot(
    data_dir: Path, recording_log: RecordingLog, archive_end: int
) -> LoadedSnapshot | None:
    """The newest valid snapshot in the recording log that loads; older ones if not
    (none below the log's start: no log follows them)."""
    for entry in reversed(recording_log.snapshots(CM_SERVICE_ID)):
        path = snapshot_path(data_dir, entry.log_position, entry.leadership_term_id)
        if entry.log_position > archive_end:
            log.error("snapshot %s is beyond the end of the archive: skipped", path)
            continue
        try:
            return parse_snapshot(read_snapshot(path))
        except (ArchiveError, SnapshotError) as exc:
            log.error("cannot load snapshot %s (%s): trying an older one", path, exc)
    return None


def recover(
    *,
    data_dir: Path,
    recording_log: RecordingLog,
    archive: Archive,
    cm: ConsensusModule,
    container: ServiceContainer,
    log_buffer: LogBuffer,
    known_commit: int | None,
    now_ns: int,
) -> int:
    """Restore ``cm`` and ``container`` from the snapshot and the log; fill ``log_buffer``
    with the log past what was replayed; return the replayed (applied) position.

    ``known_commit`` is the saved commit position, or None when every durable entry is
    committed (a cluster of one)."""
    start = time.perf_counter()
    snapshot = load_latest_snapshot(data_dir, recording_log, archive.position)
    position = 0
    if snapshot is not None:
        load_snapshot(snapshot, cm, container, now_ns)
        position = snapshot.log_position
        container.start(snapshot.service_state)
        log.info(
            "loaded snapshot at log position %d (term %d): %d sessions, %d timers",
            position,
            snapshot.leadership_term_id,
            len(snapshot.sessions),
            len(snapshot.timers),
        )
    elif archive.start_position > 0:
        raise ArchiveError(
            f"{data_dir}: the log begins at {archive.start_position} (compacted) and no "
            "snapshot at or after it loads: wipe the directory to rebuild this member from "
            "its leader"
        )
    else:
        container.start(None)
    snapshot_position = position
    end = archive.position
    limit = end if known_commit is None else min(end, known_commit)
    chunk = REPLAY_CHUNK
    while position < limit:
        data = archive.read(position, min(limit, position + chunk))
        try:
            consumed = container.apply(data, position, mirror_into_consensus=True)
        except RecordError as exc:
            raise ArchiveCorruptionError(
                data_dir / "archive", position + exc.offset, exc.reason
            ) from None
        if consumed == 0:
            chunk *= 2  # one record larger than the chunk
            continue
        position += consumed
    log_buffer.base = log_buffer.applied = position
    tail = bytearray(archive.read(position, end)) if end > position else bytearray()
    ends: list[int] = []
    last: bytes | memoryview = b""
    try:  # the log buffer holds checked records only (it is applied without CRC checks)
        for offset, last in iter_records(tail):
            ends.append(position + offset + RECORD_HEADER_LENGTH + len(last))
        if last:
            # cluster time never goes back (issue 44): should this member lead, its
            # first entry is not stamped before the last one of its log, committed or
            # not (its wall clock may be behind the leader's that stamped it)
            cm.log.observe_timestamp(LOG.decode(last).timestamp)
    except RecordError as exc:
        raise ArchiveCorruptionError(
            data_dir / "archive", position + exc.offset, exc.reason
        ) from None
    except ProtocolError as exc:
        at = ends[-1] - RECORD_HEADER_LENGTH - len(last)
        raise ArchiveCorruptionError(data_dir / "archive", at, str(exc)) from None
    for entry in recording_log.snapshots():  # one with no log after it: its time
        cm.log.observe_timestamp(entry.timestamp)
    log_buffer.data = tail
    cm.restore(position, ends)
    if end:
        log.info(
            "replayed %d bytes of log (%d..%d of %d, %d messages) in %.3fs",
            position - snapshot_position,
            snapshot_position,
            position,
            end,
            container.applied_messages,
            time.perf_counter() - start,
        )
    return position
